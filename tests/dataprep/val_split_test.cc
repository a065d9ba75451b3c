// The validation split of `kiln prep` (split.val_fraction / split.val_min_docs): val shards named
// <domain>-val-NNNNNN and marked "split": "val", a deterministic choice by id hash, at least the
// minimum per domain, and never a validation document in a training batch (checked by id through
// `kiln stream` and the loader); `kiln stream --split val` reads the held-out slice.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "format/manifest.h"
#include "format/shard_reader.h"
#include "loader/loader.h"
#include "tests/dataprep/prep_test_util.h"
#include "tests/kiln_cli.h"

namespace kiln::prep {
namespace {

using json = nlohmann::json;
using testing_cli::run_kiln;
using testing_prep::TempDir;

// 120 distinct documents in two domains ("code" by a rule on the source, the rest "web").
void write_corpus(const std::string& path) {
  const char* words[] = {"river", "stone", "cloud", "paper", "light", "water",
                         "amber", "delta", "maple", "orbit", "prism", "quartz"};
  std::string lines;
  std::mt19937 rng(1);  // independent random texts: no near-duplicates for dedup to remove
  for (int i = 0; i < 120; ++i) {
    std::string t;
    for (int k = 0; k < 30; ++k) t += std::string(words[rng() % 12]) + " ";
    json l = {{"text", t + std::to_string(i)}, {"id", "doc-" + std::to_string(i)}};
    l["domain"] = i % 4 == 0 ? "code" : "web";
    lines += l.dump() + "\n";
  }
  testing_prep::write_file(path, lines);
}

// The ids of every sample in the shards of one split.
std::set<std::string> shard_ids(const std::string& out, bool val) {
  auto m = read_manifest(out + "/manifest.json");
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  std::set<std::string> ids;
  for (const auto& sh : m->shards) {
    if (sh.val != val) continue;
    auto samples = ShardReader::read_all(out + "/" + sh.path);
    EXPECT_TRUE(samples.is_ok()) << samples.status().to_string();
    for (const ShardSample& s : *samples)
      ids.insert(json::parse(s.find("json")->data)["id"].dump());
  }
  return ids;
}

std::set<std::string> streamed_ids(const std::string& args) {
  auto r = run_kiln("stream " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> ids;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const json seq = json::parse(line);
    for (const json& id : seq["samples"]) ids.insert(id.dump());
  }
  return ids;
}

TEST(ValSplit, HoldsOutADeterministicSliceTheTrainingLoaderNeverReads) {
  TempDir tmp("val_split");
  write_corpus(tmp / "in/corpus.jsonl");
  const std::string prep = "prep --input " + tmp / "in" + " --vocab-size 300 --threads 1 " +
                           "--set split.val_fraction=0.1 --set split.val_min_docs=8 --output ";
  auto r = run_kiln(prep + tmp / "a");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  auto m = read_manifest(tmp / "a/manifest.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  std::map<std::string, uint64_t> val_docs, train_docs;
  for (const auto& sh : m->shards) {
    const std::string name = std::filesystem::path(sh.path).filename().string();
    EXPECT_EQ(name.rfind(sh.domain + (sh.val ? "-val-" : "-0"), 0), 0u) << sh.path;
    (sh.val ? val_docs : train_docs)[sh.domain] += sh.samples;
  }
  // 30 code and 90 web documents: at least 8 held out of each (the minimum), about 10% of web.
  ASSERT_EQ(val_docs.size(), 2u);
  EXPECT_GE(val_docs["code"], 8u);
  EXPECT_GE(val_docs["web"], 8u);
  EXPECT_LE(val_docs["web"], 25u);
  EXPECT_EQ(val_docs["code"] + train_docs["code"], 30u);
  EXPECT_EQ(val_docs["web"] + train_docs["web"], 90u);
  // The domain totals are the training split's.
  EXPECT_EQ(m->domains["code"].samples, train_docs["code"]);
  // The manifest marks validation shards, and stats.json counts them.
  EXPECT_NE(testing_prep::read_text(tmp / "a/manifest.json").find("\"split\":\"val\""),
            std::string::npos);
  json stats = json::parse(testing_prep::read_text(tmp / "a/stats.json"));
  EXPECT_EQ(stats["domains"]["code"]["val_docs"].get<uint64_t>(), val_docs["code"]);
  EXPECT_EQ(stats["docs_out"].get<uint64_t>(), 120u);

  const std::set<std::string> val = shard_ids(tmp / "a", true);
  const std::set<std::string> train = shard_ids(tmp / "a", false);
  EXPECT_EQ(val.size() + train.size(), 120u);
  // Training batches (enough steps for several epochs) never hold a validation id ...
  const std::set<std::string> trained =
      streamed_ids(tmp / "a --steps 200 --seq-len 32 --micro-batch 4");
  EXPECT_EQ(trained, train);
  for (const auto& id : val) EXPECT_FALSE(trained.count(id)) << id;
  // ... and --split val reads exactly the held-out documents.
  EXPECT_EQ(streamed_ids(tmp / "a --steps 60 --seq-len 32 --micro-batch 4 --split val"), val);

  // Deterministic: the same input and settings give the same manifest (same shards, checksums).
  r = run_kiln(prep + tmp / "b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing_prep::read_text(tmp / "a/manifest.json"),
            testing_prep::read_text(tmp / "b/manifest.json"));
  // Another seed holds out other documents.
  r = run_kiln(prep + tmp / "c --set dedup.seed=7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(shard_ids(tmp / "c", true), val);
}

TEST(ValSplit, OffByDefaultAndBadValuesNameTheKey) {
  TempDir tmp("val_split_off");
  write_corpus(tmp / "in/corpus.jsonl");
  auto r = run_kiln("prep --input " + tmp / "in" + " --output " + tmp / "out" +
                    " --vocab-size 300 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing_prep::read_text(tmp / "out/manifest.json").find("split"), std::string::npos);
  r = run_kiln("prep --input " + tmp / "in" + " --output " + tmp / "bad" +
               " --set split.val_fraction=0.9");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("split.val_fraction"), std::string::npos) << r.output;
}

TEST(ValSplit, ManifestRejectsAnUnknownSplit) {
  const std::string text = R"({"format": "kiln-shards/1",
    "tokenizer": {"path": "", "vocab_size": 0, "eos_id": -1},
    "domains": {"web": {"samples": 1, "tokens": 1, "shards": 1}},
    "shards": [{"path": "shards/web/web-000000.tar", "domain": "web", "samples": 1, "tokens": 1,
                "bytes": 1, "xxh3": "0000000000000000"},
               {"path": "shards/web/web-val-000000.tar", "domain": "web", "samples": 5,
                "tokens": 5, "bytes": 5, "xxh3": "0000000000000000", "split": "test"}]})";
  auto m = manifest_from_json(text, "m.json");
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find("shards[1].split"), std::string::npos);
  // "val" is accepted, and the validation shard is not in the domain totals.
  std::string ok = text;
  ok.replace(ok.find("\"test\""), 6, "\"val\"");
  m = manifest_from_json(ok, "m.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE(m->shards[1].val);
  Manifest val = select_split(*m, true);
  ASSERT_EQ(val.shards.size(), 1u);
  EXPECT_EQ(val.domains["web"].samples, 5u);
  EXPECT_EQ(select_split(*m, false).domains["web"].samples, 1u);
}

}  // namespace
}  // namespace kiln::prep
