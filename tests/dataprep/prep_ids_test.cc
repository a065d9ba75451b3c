// Input ids end to end (docs/PREP.md "Input", docs/FORMATS.md "Samples", `kiln stream`): a numeric
// input "id" stays a JSON number in the sample's <key>.json and in `kiln stream`'s "samples";
// string ids stay strings; a missing id becomes "<file stem>:<line>". Runs the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "dataprep/stages/sample_metadata.h"
#include "format/manifest.h"
#include "format/shard_reader.h"
#include "tests/dataprep/prep_test_util.h"
#include "tests/kiln_cli.h"

namespace kiln::prep {
namespace {

using nlohmann::json;
using testing_prep::TempDir;

// "string", "integer" or "float" (nlohmann splits integers into signed and unsigned).
std::string kind(const json& j) {
  return j.is_string()           ? "string"
         : j.is_number_integer() ? "integer"
         : j.is_number_float()   ? "float"
                                 : j.type_name();
}

int run(const std::string& args, std::string* out) {
  testing_cli::CliRun r = testing_cli::run_kiln(args);
  *out += r.out;
  return r.exit_code;
}
// Both ways of writing <key>.json (the fast one, and nlohmann's when fields are carried) keep a
// numeric id a number, byte-identical to nlohmann's dump.
TEST(PrepIds, SampleMetadataWritesNumericIdsAsNumbers) {
  for (const char* id : {"291", "-7", "1.5", "18446744073709551615", "1e+20"}) {
    for (bool carried : {false, true}) {
      Document d;
      d.id = id;
      d.id_is_number = true;
      d.domain = "web";
      d.domain_by = "default";
      d.tokens.resize(3);
      if (carried) d.carried["meta"] = {{"k", 1}};
      json j = d.carried;
      j["id"] = json::parse(id);
      j["domain"] = "web";
      j["domain_by"] = "default";
      j["source"] = "";
      j["tokens"] = 3;
      EXPECT_EQ(detail::sample_metadata(d), j.dump()) << id;
      EXPECT_TRUE(json::parse(detail::sample_metadata(d))["id"].is_number()) << id;
    }
  }
  Document d;
  d.id = "291";
  d.domain = "web";
  EXPECT_TRUE(json::parse(detail::sample_metadata(d))["id"].is_string());
}

TEST(PrepIds, NumericIdsStayNumbersInShardsAndStream) {
  TempDir tmp("prep_ids");
  // Distinct texts (no duplicates), so every document is written.
  const char* words[] = {"river", "stone", "cloud", "paper", "light", "water", "amber", "delta"};
  auto text = [&](int i) {
    std::string t;
    for (int k = 0; k < 40; ++k) t += std::string(words[(i * 7 + k * k + k * i) % 8]) + " ";
    return t + std::to_string(i);
  };
  std::string lines;
  std::map<std::string, json> expected;  // text -> expected id
  const json ids[] = {291, "291", -7, 1.5, 18446744073709551615ull, "doc-a", nullptr};
  for (int i = 0; i < 7; ++i) {
    json l = {{"text", text(i)}};
    if (!ids[i].is_null()) l["id"] = ids[i];
    lines += l.dump() + "\n";
    expected[text(i)] = ids[i].is_null() ? json("corpus:" + std::to_string(i + 1)) : ids[i];
  }
  // Exact copies: removed.jsonl names them and their kept documents with the input's types.
  lines += json({{"text", text(0)}, {"id", 77}}).dump() + "\n";
  lines += json({{"text", text(5)}, {"id", 78.5}}).dump() + "\n";
  testing_prep::write_file(tmp / "in/corpus.jsonl", lines);
  std::string out;
  ASSERT_EQ(run("prep --input " + tmp / "in" + " --output " + tmp / "out" +
                    " --vocab-size 300 --threads 1",
                &out),
            0);

  std::vector<json> removed;
  {
    std::istringstream in(testing_prep::read_text(tmp / "out/dedup/removed.jsonl"));
    for (std::string l; std::getline(in, l);) removed.push_back(json::parse(l));
  }
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].dump(), R"({"id":77,"kept":291,"similarity":1.0})");
  EXPECT_EQ(removed[1].dump(), R"({"id":78.5,"kept":"doc-a","similarity":1.0})");

  auto manifest = read_manifest(tmp / "out/manifest.json");
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  std::set<std::string> stream_ids_expected;
  size_t seen = 0;
  for (const auto& sh : manifest->shards) {
    auto samples = ShardReader::read_all(tmp / "out/" + sh.path);
    ASSERT_TRUE(samples.is_ok()) << samples.status().to_string();
    for (const ShardSample& s : *samples) {
      const ShardMember* t = s.find("txt");
      const ShardMember* j = s.find("json");
      ASSERT_TRUE(t && j);
      json meta = json::parse(j->data);
      ASSERT_TRUE(expected.count(t->data));
      const json& want = expected[t->data];
      EXPECT_EQ(kind(meta["id"]), kind(want)) << j->data;
      EXPECT_EQ(meta["id"], want) << j->data;
      stream_ids_expected.insert(want.dump());
      ++seen;
    }
  }
  EXPECT_EQ(seen, expected.size());

  // kiln stream prints the same ids, with the same JSON types.
  out.clear();
  ASSERT_EQ(run("stream " + tmp / "out" + " --steps 40 --seq-len 16 --micro-batch 2", &out), 0);
  std::set<std::string> streamed;
  size_t at = 0;
  while (at < out.size()) {
    size_t nl = out.find('\n', at);
    if (nl == std::string::npos) nl = out.size();
    json l = json::parse(out.substr(at, nl - at));
    for (const json& id : l["samples"]) streamed.insert(id.dump());
    at = nl + 1;
  }
  EXPECT_EQ(streamed, stream_ids_expected);
}

}  // namespace
}  // namespace kiln::prep
