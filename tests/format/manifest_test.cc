// manifest.json: deterministic bytes, round trip, and field-naming errors on bad input.
#include "format/manifest.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "format/shard_reader.h"
#include "format/shard_writer.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_manifest_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

ShardInfo info(const std::string& path, uint64_t samples, uint64_t tokens, uint64_t bytes,
               uint64_t xxh3) {
  ShardInfo i;
  i.path = path;
  i.samples = samples;
  i.tokens = tokens;
  i.bytes = bytes;
  i.xxh3 = xxh3;
  return i;
}

Manifest sample_manifest(const std::string& root) {
  Manifest m;
  m.tokenizer = {"tokenizer.json", 8192, 0};
  m.add_shard(info(root + "/shards/web/web-000000.tar.zst", 10, 1000, 5000, 0x0123456789abcdefull),
              "web", root);
  m.add_shard(info(root + "/shards/code/code-000000.tar.zst", 3, 300, 700, 42), "code", root);
  m.add_shard(info(root + "/shards/web/web-000001.tar.zst", 5, 500, 2500, ~0ull), "web", root);
  return m;
}

TEST_F(ManifestTest, AddShardDerivesDomainsAndRelativePaths) {
  Manifest m = sample_manifest("out");
  ASSERT_EQ(m.shards.size(), 3u);
  EXPECT_EQ(m.shards[0].path, "shards/web/web-000000.tar.zst");
  EXPECT_EQ(m.shards[1].domain, "code");
  EXPECT_EQ(m.domains["web"].samples, 15u);
  EXPECT_EQ(m.domains["web"].tokens, 1500u);
  EXPECT_EQ(m.domains["web"].shards, 2u);
  EXPECT_EQ(m.domains["web"].bytes, 7500u);
  EXPECT_EQ(m.domains["code"].shards, 1u);
  // Absolute shard path with a relative root (and the reverse) still come out relative.
  Manifest a;
  a.add_shard(info(fs::absolute("out/shards/x.tar").string(), 1, 1, 1, 1), "x", "out");
  EXPECT_EQ(a.shards[0].path, "shards/x.tar");
  Manifest b;
  b.add_shard(info("./out/./shards/y.tar", 1, 1, 1, 1), "y", fs::absolute("out").string());
  EXPECT_EQ(b.shards[0].path, "shards/y.tar");
}

TEST_F(ManifestTest, JsonIsDeterministicAndReadable) {
  std::string json = manifest_to_json(sample_manifest("out"));
  EXPECT_EQ(json, manifest_to_json(sample_manifest("out")));
  const char* want = R"({
  "format": "kiln-shards/1",
  "tokenizer": {"path":"tokenizer.json","vocab_size":8192,"eos_id":0},
  "domains": {
    "code": {"samples":3,"tokens":300,"shards":1,"bytes":700},
    "web": {"samples":15,"tokens":1500,"shards":2,"bytes":7500}
  },
  "shards": [
    {"path":"shards/web/web-000000.tar.zst","domain":"web","samples":10,"tokens":1000,"bytes":5000,"xxh3":"0123456789abcdef"},
    {"path":"shards/code/code-000000.tar.zst","domain":"code","samples":3,"tokens":300,"bytes":700,"xxh3":"000000000000002a"},
    {"path":"shards/web/web-000001.tar.zst","domain":"web","samples":5,"tokens":500,"bytes":2500,"xxh3":"ffffffffffffffff"}
  ]
}
)";
  EXPECT_EQ(json, want);
  // Valid JSON for any reader.
  nlohmann::json parsed = nlohmann::json::parse(json);
  EXPECT_EQ(parsed["shards"][2]["xxh3"], "ffffffffffffffff");
  // Empty manifest.
  Manifest empty;
  std::string e = manifest_to_json(empty);
  Result<Manifest> back = manifest_from_json(e, "empty");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string() << "\n" << e;
  EXPECT_TRUE(back->shards.empty());
}

TEST_F(ManifestTest, WriteReadRoundTrip) {
  std::string root = dir_.string();
  Manifest m = sample_manifest(root);
  ASSERT_TRUE(write_manifest(root + "/manifest.json", m).is_ok());
  std::string first = *read_file(root + "/manifest.json");
  ASSERT_TRUE(write_manifest(root + "/manifest.json", m).is_ok());
  EXPECT_EQ(*read_file(root + "/manifest.json"), first);  // byte-identical rewrite

  for (const std::string& where : {root, root + "/manifest.json"}) {
    Result<Manifest> r = read_manifest(where);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->dir, root);
    EXPECT_EQ(r->format, kManifestFormat);
    EXPECT_EQ(r->tokenizer.path, "tokenizer.json");
    EXPECT_EQ(r->tokenizer.vocab_size, 8192u);
    EXPECT_EQ(r->tokenizer.eos_id, 0);
    ASSERT_EQ(r->shards.size(), 3u);
    EXPECT_EQ(r->shards[0].xxh3, 0x0123456789abcdefull);
    EXPECT_EQ(r->shards[2].xxh3, ~0ull);
    EXPECT_EQ(r->shard_path(r->shards[1]), root + "/shards/code/code-000000.tar.zst");
    EXPECT_EQ(r->domains.at("web").tokens, 1500u);
    EXPECT_EQ(manifest_to_json(*r), first);
  }
  EXPECT_EQ(read_manifest((dir_ / "nope").string()).status().code(), StatusCode::kNotFound);
}

// The whole prep output path: the same samples written twice (rolling shards per domain plus the
// manifest) give byte-identical files.
TEST_F(ManifestTest, SameSamplesTwiceGiveIdenticalShardsAndManifest) {
  auto write_dataset = [&](const std::string& root) {
    Manifest m;
    m.tokenizer = {"tokenizer.json", 50257, 50256};
    for (const std::string domain : {"code", "web"}) {
      RollingShardWriter::Options o;
      o.dir = root + "/shards/" + domain;
      o.prefix = domain;
      o.max_samples = 7;
      RollingShardWriter w(o);
      for (int i = 0; i < 20; ++i) {
        ShardSample s;
        s.key = domain + "-" + std::to_string(i);
        s.members.push_back({"txt", std::string(100 + i * 13, static_cast<char>('a' + i % 26))});
        s.members.push_back({"json", "{\"id\": " + std::to_string(i) + "}"});
        ASSERT_TRUE(w.add(s, 10 + i).is_ok());
      }
      auto shards = w.finish();
      ASSERT_TRUE(shards.is_ok()) << shards.status().to_string();
      for (const auto& info : *shards) m.add_shard(info, domain, root);
    }
    ASSERT_TRUE(write_manifest(root + "/manifest.json", m).is_ok());
  };
  std::string a = (dir_ / "a").string(), b = (dir_ / "b").string();
  write_dataset(a);
  write_dataset(b);
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (!e.is_regular_file()) continue;
    ++files;
    std::string rel = fs::relative(e.path(), a).string();
    EXPECT_EQ(*read_file(e.path().string()), *read_file(b + "/" + rel)) << rel;
  }
  EXPECT_EQ(files, 7u);  // 3 + 3 shards and the manifest
  Result<Manifest> m = read_manifest(a);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->shards.size(), 6u);
  EXPECT_EQ(m->shards[0].path, "shards/code/code-000000.tar.zst");
  EXPECT_EQ(m->domains.at("web").samples, 20u);
  EXPECT_EQ(m->domains.at("web").tokens, 20u * 10 + 190);
  for (const ManifestShard& s : m->shards) {
    ShardReaderOptions opt;
    opt.expected_xxh3 = s.xxh3;
    auto samples = ShardReader::read_all(m->shard_path(s), opt);
    ASSERT_TRUE(samples.is_ok()) << samples.status().to_string();
    EXPECT_EQ(samples->size(), s.samples);
    EXPECT_EQ(fs::file_size(m->shard_path(s)), s.bytes);
  }
}

TEST_F(ManifestTest, ReadsDesignDocExampleWithoutDomainBytes) {
  const char* text = R"({"format": "kiln-shards/1",
 "tokenizer": {"path": "tokenizer.json", "vocab_size": 8192, "eos_id": 0},
 "domains": {"code": {"samples": 2, "tokens": 9, "shards": 1}},
 "shards": [{"path": "shards/code/code-000000.tar.zst", "domain": "code",
             "samples": 2, "tokens": 9, "bytes": 77, "xxh3": "00000000000000ff",
             "future_field": true}]})";
  Result<Manifest> r = manifest_from_json(text, "design.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->domains.at("code").bytes, 77u);
  EXPECT_EQ(r->shards[0].xxh3, 0xffu);
}

// Replaces the value at a JSON pointer in the sample manifest (or removes it when value is
// discarded) and parses the result.
Status parse_edited(const std::string& pointer, const nlohmann::json& value, bool remove = false) {
  nlohmann::json j = nlohmann::json::parse(manifest_to_json(sample_manifest("out")));
  nlohmann::json::json_pointer p(pointer);
  if (remove) {
    j[p.parent_pointer()].erase(p.back());
  } else {
    j[p] = value;
  }
  Result<Manifest> r = manifest_from_json(j.dump(), "edited.json");
  return r.is_ok() ? Status::ok() : r.status();
}

TEST_F(ManifestTest, ErrorsNameTheField) {
  struct Case {
    std::string pointer;
    nlohmann::json value;
    bool remove;
    std::string key;  // the field the error must name
  };
  std::vector<Case> cases = {
      {"/format", "kiln-shards/2", false, "format"},
      {"/format", nullptr, true, "format"},
      {"/tokenizer/vocab_size", -1, false, "tokenizer.vocab_size"},
      {"/tokenizer/vocab_size", "8192", false, "tokenizer.vocab_size"},
      {"/tokenizer/eos_id", 9000, false, "tokenizer.eos_id"},
      {"/tokenizer/path", "../tok.json", false, "tokenizer.path"},
      {"/tokenizer", nullptr, true, "tokenizer"},
      {"/domains", nlohmann::json::array(), false, "domains"},
      {"/domains/web/samples", 14, false, "domains.web.samples"},
      {"/domains/web/shards", 1.5, false, "domains.web.shards"},
      {"/shards", nlohmann::json::object(), false, "shards"},
      {"/shards/1/path", "/etc/passwd.tar", false, "shards[1].path"},
      {"/shards/1/path", "../x.tar.zst", false, "shards[1].path"},
      {"/shards/1/path", "shards/a/../../../x.tar.zst", false, "shards[1].path"},
      {"/shards/1/path", "shards/code/x.zip", false, "shards[1].path"},
      {"/shards/1/path", "shards/web/web-000000.tar.zst", false, "shards[1].path"},
      {"/shards/1/path", nullptr, true, "shards[1].path"},
      {"/shards/1/domain", "nope", false, "shards[1].domain"},
      {"/shards/0/xxh3", "xyz", false, "shards[0].xxh3"},
      {"/shards/0/xxh3", 12, false, "shards[0].xxh3"},
      {"/shards/0/bytes", -5, false, "shards[0].bytes"},
      {"/shards/2/samples", 6, false, "domains.web.samples"},
      {"/shards/2", "not an object", false, "shards[2]"},
  };
  for (const Case& c : cases) {
    Status st = parse_edited(c.pointer, c.value, c.remove);
    EXPECT_EQ(st.code(), StatusCode::kData) << c.pointer << " " << c.value;
    EXPECT_EQ(st.key(), c.key) << c.pointer << ": " << st.to_string();
    EXPECT_EQ(st.file(), "edited.json");
  }
  Result<Manifest> bad = manifest_from_json("{\"format\": ", "broken.json");
  EXPECT_EQ(bad.status().code(), StatusCode::kData);
  EXPECT_NE(bad.status().to_string().find("broken.json"), std::string::npos);
  EXPECT_EQ(manifest_from_json("[]", "x").status().code(), StatusCode::kData);
}

}  // namespace
}  // namespace kiln
