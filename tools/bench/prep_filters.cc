// The quality-filter stage alone (dataprep/filter/), one thread, in MB of input text per
// CPU-second: each filter by itself with its defaults over every document, then the chain the
// script passes. Run by tools/bench/prep_filters (which also measures whole `kiln prep` runs and
// the Python reference); usage: bench_prep_filters CHAIN_JSON FILE.jsonl...
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataprep/filter/filter.h"

namespace {

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Doc {
  std::string text, url;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_prep_filters CHAIN_JSON FILE.jsonl...\n");
    return 2;
  }
  std::vector<Doc> docs;
  uint64_t bytes = 0;
  for (int a = 2; a < argc; ++a) {
    std::ifstream in(argv[a]);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("text")) continue;
      docs.push_back({j["text"].get<std::string>(), j.value("url", std::string())});
      bytes += docs.back().text.size();
    }
  }
  auto run = [&](const std::string& label, const std::string& chain_json) {
    auto chain = kiln::prep::filter::FilterChain::from_yaml(YAML::Load(chain_json));
    if (!chain.is_ok()) {
      std::fprintf(stderr, "%s\n", chain.status().to_string().c_str());
      std::exit(2);
    }
    std::string text;
    uint64_t kept = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first pass warms the scratch buffers and caches
      kept = 0;
      const double t0 = thread_cpu_seconds();
      for (const Doc& d : docs) {
        text = d.text;
        kept += (*chain)->run(&text, d.url).keep;
      }
      const double cpu = thread_cpu_seconds() - t0;
      if (rep == 1)
        std::printf(
            "{\"what\": \"%s\", \"mb\": %.3f, \"cpu_s\": %.3f, \"mb_per_cpu_s\": %.1f, "
            "\"kept\": %llu, \"docs\": %zu}\n",
            label.c_str(), bytes / 1e6, cpu, bytes / 1e6 / cpu, (unsigned long long)kept,
            docs.size());
    }
  };
  if (!std::getenv("KILN_BENCH_CHAIN_ONLY")) {
    run("copy only (no filter)", "[]");
    for (const char* f : {"gopher_quality", "gopher_repetition", "c4", "fineweb", "pii"})
      run(f, std::string("[{\"name\": \"") + f + "\"}]");
  }
  run("chain", argv[1]);
  return 0;
}
