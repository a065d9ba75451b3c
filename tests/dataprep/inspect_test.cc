// `kiln inspect`: the summary of a dataset built here by hand (shards + manifest + stats +
// tokenizer), and --verify catching every kind of damage: a changed byte, tokens that are not the
// tokenizer's encoding, counts that disagree, a missing shard.
#include "dataprep/inspect.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "format/manifest.h"
#include "format/npy.h"
#include "format/shard_reader.h"
#include "format/shard_writer.h"

namespace kiln::prep {
namespace fs = std::filesystem;
namespace {

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_inspect_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::vector<std::string> texts = {"hello world, hello tokens", "int main() { return 0; }",
                                      "中文文本的例子", "more English text here"};
    std::vector<std::string_view> views(texts.begin(), texts.end());
    TokenizerTrainOptions opts;
    opts.vocab_size = 300;
    tok_ = std::move(Tokenizer::train(views, opts)).value();
    ASSERT_TRUE(tok_.save((dir_ / "tokenizer.json").string()).is_ok());
    manifest_.dir = dir_.string();
    manifest_.tokenizer = {"tokenizer.json", tok_.vocab_size(), tok_.eos_id()};
    nlohmann::json stats_domains = nlohmann::json::object();
    std::map<std::string, std::vector<std::string>> by_domain = {
        {"code", {texts[1]}}, {"web", {texts[0], texts[3]}}, {"zh", {texts[2]}}};
    int key = 0;
    for (const auto& [domain, docs] : by_domain) {
      std::string shard = (dir_ / "shards" / domain / (domain + "-000000.tar")).string();
      fs::create_directories(fs::path(shard).parent_path());
      auto w = ShardWriter::open(shard, ShardCompression::kNone);
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      uint64_t tokens = 0;
      for (const auto& text : docs) {
        auto ids = tok_.encode(text);
        tokens += ids.size();
        ShardSample s;
        s.key = "k" + std::to_string(key++);
        nlohmann::json meta = {
            {"id", s.key}, {"domain", domain}, {"tokens", ids.size()}, {"domain_by", "rule:test"}};
        s.members = {{"txt", text},
                     {"json", meta.dump()},
                     {"tokens.npy", npy_encode(ids, npy_token_dtype(tok_.vocab_size()))}};
        ASSERT_TRUE((*w)->add(s, ids.size()).is_ok());
      }
      auto info = (*w)->close();
      ASSERT_TRUE(info.is_ok());
      manifest_.add_shard(*info, domain, dir_.string());
      stats_domains[domain] = {{"docs", docs.size()},
                               {"tokens", tokens},
                               {"bytes", 0},
                               {"domain_by", {{"rule:test", docs.size()}}}};
    }
    stats_ = {{"docs_in", 6},
              {"docs_out", 4},
              {"exact_dups", 1},
              {"near_dups", 1},
              {"rejected", 0},
              {"rejected_by_reason", {{"invalid_json", 0}}},
              {"domains", stats_domains}};
    write();
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write() {
    ASSERT_TRUE(write_manifest((dir_ / "manifest.json").string(), manifest_).is_ok());
    ASSERT_TRUE(write_file_atomic((dir_ / "stats.json").string(), stats_.dump()).is_ok());
  }
  InspectResult inspect(bool verify, uint64_t sample = 0) {
    InspectOptions o;
    o.verify = verify;
    o.sample = sample;
    auto r = inspect_dataset(dir_.string(), o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : InspectResult{};
  }
  bool has_problem(const InspectResult& r, const std::string& needle) {
    for (const auto& p : r.problems)
      if (p.find(needle) != std::string::npos) return true;
    ADD_FAILURE() << "no problem mentions '" << needle << "'; problems: " << r.problems.size();
    return false;
  }
  // Rewrites one shard with a sample changed by `edit`, keeping the manifest's checksum fields
  // consistent with the new file (so only the content check can notice).
  void rewrite_shard(const std::string& domain, const std::function<void(ShardSample&)>& edit) {
    for (auto& shard : manifest_.shards) {
      if (shard.domain != domain) continue;
      std::string path = manifest_.shard_path(shard);
      auto samples = ShardReader::read_all(path);
      ASSERT_TRUE(samples.is_ok());
      fs::remove(path);
      auto w = ShardWriter::open(path, ShardCompression::kNone);
      ASSERT_TRUE(w.is_ok());
      for (auto& s : *samples) {
        edit(s);
        ASSERT_TRUE((*w)->add(s).is_ok());
      }
      auto info = (*w)->close();
      ASSERT_TRUE(info.is_ok());
      shard.bytes = info->bytes;
      shard.xxh3 = info->xxh3;
    }
    write();
  }

  fs::path dir_;
  Tokenizer tok_;
  Manifest manifest_;
  nlohmann::json stats_;
};

TEST_F(InspectTest, SummaryAndCleanVerify) {
  InspectResult r = inspect(true, 2);
  EXPECT_TRUE(r.problems.empty()) << r.problems[0];
  EXPECT_EQ(r.shards_checked, 3u);
  EXPECT_EQ(r.samples_checked, 4u);
  for (const char* s : {"code", "web", "zh", "total", "balanced", "rule:test=2", "share"})
    EXPECT_NE(r.summary.find(s), std::string::npos) << s << "\n" << r.summary;
  EXPECT_NE(r.samples.find("sample 1/2"), std::string::npos);
  EXPECT_NE(r.samples.find("sample 2/2"), std::string::npos);
  EXPECT_NE(r.samples.find("decoded"), std::string::npos);
}

TEST_F(InspectTest, ChecksumMismatch) {
  std::string path = manifest_.shard_path(manifest_.shards[0]);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(600);
  f.put('#');
  f.close();
  EXPECT_TRUE(has_problem(inspect(true), manifest_.shards[0].path));
  EXPECT_TRUE(inspect(false).problems.empty());  // without --verify shards are not read
}

TEST_F(InspectTest, TokensThatAreNotTheEncodingOfTheText) {
  rewrite_shard("web", [&](ShardSample& s) {
    for (auto& m : s.members)
      if (m.ext == "txt") m.data += "!";  // text changed, tokens not
  });
  EXPECT_TRUE(has_problem(inspect(true), "differs from the tokenizer's encoding"));
}

TEST_F(InspectTest, MetadataAndCountsThatDisagree) {
  rewrite_shard("zh", [&](ShardSample& s) {
    for (auto& m : s.members)
      if (m.ext == "json") m.data = R"({"id": "x", "domain": "web", "tokens": 1})";
  });
  auto r = inspect(true);
  EXPECT_TRUE(has_problem(r, "domain is not 'zh'"));
  EXPECT_TRUE(has_problem(r, ".json says 1 tokens"));
  stats_["docs_in"] = 7;
  manifest_.shards[0].samples += 1;  // the reader checks domain totals against the shards
  manifest_.domains[manifest_.shards[0].domain].samples += 1;
  write();
  r = inspect(true);
  EXPECT_TRUE(has_problem(r, "docs_in != docs_out"));
  EXPECT_TRUE(has_problem(r, "manifest says 2"));
}

TEST_F(InspectTest, MissingShardAndDuplicateKeys) {
  rewrite_shard("zh", [&](ShardSample& s) { s.key = "k0"; });  // k0 is also in code
  fs::remove(manifest_.shard_path(manifest_.shards[1]));
  auto r = inspect(true);
  EXPECT_TRUE(has_problem(r, "cannot read"));
  EXPECT_TRUE(has_problem(r, "used more than once"));
}

TEST_F(InspectTest, UnreadableManifestIsAnError) {
  fs::remove(dir_ / "manifest.json");
  EXPECT_FALSE(inspect_dataset(dir_.string(), {}).is_ok());
}

}  // namespace
}  // namespace kiln::prep
