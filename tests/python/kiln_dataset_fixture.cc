// Writes the small two-domain dataset the Python module tests read
// (tests/loader/loader_testutil.h's make_dataset: zstd shards + manifest.json), and DIR/truth.json:
// {"<id>": [tokens...]} so the tests can check every token a batch holds.
//   kiln_dataset_fixture DIR [SEED]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/loader/loader_testutil.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: kiln_dataset_fixture DIR [SEED]\n");
    return 2;
  }
  kiln::testing::DatasetSpec spec;
  spec.domains = {{"code", 70, 9, 1, 50}, {"web", 110, 12, 1, 60}};
  spec.vocab_size = 500;
  spec.seed = argc == 3 ? std::strtoull(argv[2], nullptr, 10) : 7;
  auto ds = kiln::testing::make_dataset(argv[1], spec);
  if (!ds.is_ok()) {
    std::fprintf(stderr, "kiln_dataset_fixture: %s\n", ds.status().to_string().c_str());
    return 1;
  }
  nlohmann::json truth = nlohmann::json::object();
  for (const auto& [key, doc] : ds->docs) {
    truth[nlohmann::json::parse(doc.id).get<std::string>()] = doc.tokens;
  }
  std::ofstream(std::string(argv[1]) + "/truth.json") << truth.dump() << "\n";
  return 0;
}
