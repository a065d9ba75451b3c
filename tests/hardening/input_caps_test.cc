// Caps on what an input can make Kiln spend (issue 13): each cap gets an input just past it (an
// error naming the file and the limit) and one at it (accepted). Tests are named after the cap.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/atomic_file.h"
#include "common/json.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/ingest/doc_parser.h"
#include "dataprep/ingest/line_reader.h"
#include "dataprep/tagging/tagger.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "dataprep/tokenizer/tokenizer_io.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/mixing/control_file.h"
#include "engine/mixing/policy.h"
#include "engine/stability/monitor.h"
#include "engine/train/metrics.h"
#include "format/manifest.h"
#include "format/npy.h"
#include "format/shard_reader.h"
#include "format/shard_writer.h"
#include "tests/compress_util.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

class InputCaps : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_caps_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void spit(const std::string& name, const std::string& bytes) const {
    std::ofstream f(path(name), std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  fs::path dir_;
};

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

ShardSample sample(const std::string& key, int members, size_t bytes_each) {
  ShardSample s;
  s.key = key;
  for (int m = 0; m < members; ++m) {
    s.members.push_back({"part" + std::to_string(m), std::string(bytes_each, 'x')});
  }
  return s;
}

Result<ShardInfo> write_shard(const std::string& path, const std::vector<ShardSample>& samples) {
  KILN_ASSIGN_OR_RETURN(auto w, ShardWriter::open(path, shard_compression_for_path(path).value()));
  for (const auto& s : samples) KILN_RETURN_IF_ERROR(w->add(s, 0));
  return w->close();
}

Status read_through(const std::string& path, const ShardReaderOptions& opt) {
  return ShardReader::read_all(path, opt).status();
}

// ---- shards -----------------------------------------------------------------------------------

TEST_F(InputCaps, SampleMemberCountJustPastCap) {
  ASSERT_TRUE(write_shard(path("m.tar"), {sample("a", 5, 10), sample("b", 4, 10)}).is_ok());
  ShardReaderOptions opt;
  opt.max_sample_members = 4;
  Status st = read_through(path("m.tar"), opt);
  ASSERT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("more than 4 members (max_sample_members)"), std::string::npos)
      << st.to_string();
  EXPECT_NE(st.to_string().find(path("m.tar")), std::string::npos) << st.to_string();
  opt.max_sample_members = 5;
  EXPECT_TRUE(read_through(path("m.tar"), opt).is_ok());
}

TEST_F(InputCaps, SampleBytesJustPastCap) {
  ASSERT_TRUE(write_shard(path("b.tar.zst"), {sample("a", 3, 100), sample("b", 1, 300)}).is_ok());
  ShardReaderOptions opt;
  opt.max_sample_bytes = 299;  // sample b's single member is 300 bytes
  Status st = read_through(path("b.tar.zst"), opt);
  ASSERT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("more than 299 bytes (max_sample_bytes)"), std::string::npos)
      << st.to_string();
  opt.max_sample_bytes = 300;
  EXPECT_TRUE(read_through(path("b.tar.zst"), opt).is_ok());
}

TEST_F(InputCaps, DecompressedShardBytesJustPastManifestFigure) {
  auto info = write_shard(path("z.tar.zst"), {sample("a", 3, 5000), sample("b", 3, 5000)});
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  ASSERT_GT(info->tar_bytes, info->bytes);  // compressed
  // The manifest records the figure and the reader enforces it.
  Manifest m;
  m.add_shard(*info, "web", dir_.string());
  ASSERT_EQ(m.shards[0].tar_bytes, info->tar_bytes);
  auto back = manifest_from_json(manifest_to_json(m), "manifest.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->shards[0].tar_bytes, info->tar_bytes);
  ShardReaderOptions opt = Manifest::reader_options(back->shards[0], true);
  EXPECT_TRUE(read_through(path("z.tar.zst"), opt).is_ok());
  opt.max_tar_bytes = info->tar_bytes - 1;
  Status st = read_through(path("z.tar.zst"), opt);
  ASSERT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("longer than " + std::to_string(info->tar_bytes - 1) + " bytes"),
            std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("tar_bytes"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find(path("z.tar.zst")), std::string::npos) << st.to_string();
}

TEST_F(InputCaps, ManifestWithoutTarBytesStillReads) {
  auto info = write_shard(path("old.tar"), {sample("a", 2, 10)});
  ASSERT_TRUE(info.is_ok());
  Manifest m;
  m.add_shard(*info, "web", dir_.string());
  std::string json = manifest_to_json(m);
  size_t at = json.find(",\"tar_bytes\":");
  ASSERT_NE(at, std::string::npos);
  json.erase(at, json.find('}', at) - at);  // a manifest from before the field
  auto back = manifest_from_json(json, "manifest.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->shards[0].tar_bytes, 0u);
  EXPECT_FALSE(Manifest::reader_options(back->shards[0], true).max_tar_bytes.has_value());
}

TEST_F(InputCaps, ShardSymlinkOutsideDatasetRefused) {
  fs::create_directories(dir_ / "data/shards/web");
  fs::create_directories(dir_ / "elsewhere");
  auto inside = write_shard(path("data/shards/web/web-000000.tar"), {sample("a", 1, 10)});
  auto outside = write_shard(path("elsewhere/web-000001.tar"), {sample("b", 1, 10)});
  ASSERT_TRUE(inside.is_ok() && outside.is_ok());
  fs::create_symlink(dir_ / "elsewhere/web-000001.tar", dir_ / "data/shards/web/web-000001.tar");
  fs::create_symlink("web-000000.tar", dir_ / "data/shards/web/alias.tar");  // stays inside
  Manifest m;
  m.dir = path("data");
  ManifestShard a, b, c;
  a.path = "shards/web/web-000000.tar";
  b.path = "shards/web/web-000001.tar";
  c.path = "shards/web/alias.tar";
  EXPECT_TRUE(m.checked_shard_path(a).is_ok());
  EXPECT_TRUE(m.checked_shard_path(c).is_ok());
  auto st = m.checked_shard_path(b);
  ASSERT_EQ(st.status().code(), StatusCode::kData);
  EXPECT_NE(st.status().message().find("outside the dataset folder"), std::string::npos)
      << st.status().to_string();
  EXPECT_NE(st.status().message().find("shards/web/web-000001.tar"), std::string::npos);
}

// ---- JSON nesting -----------------------------------------------------------------------------

TEST_F(InputCaps, JsonNestingJustPastCap) {
  EXPECT_TRUE(check_json_depth(nested(kMaxJsonDepth)).is_ok());
  Status st = check_json_depth(nested(kMaxJsonDepth + 1));
  ASSERT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("limit of " + std::to_string(kMaxJsonDepth) + " levels"),
            std::string::npos)
      << st.message();
  // Brackets inside strings do not count.
  EXPECT_TRUE(check_json_depth("[\"" + std::string(1000, '[') + "\\\"\"]").is_ok());
}

TEST_F(InputCaps, JsonNestingJustPastCapInEveryReader) {
  const std::string deep = nested(kMaxJsonDepth + 1);
  auto expect_named = [&](const Status& st, const std::string& file) {
    ASSERT_EQ(st.code(), StatusCode::kData) << file;
    EXPECT_NE(st.to_string().find(file), std::string::npos) << st.to_string();
    EXPECT_NE(st.to_string().find("levels"), std::string::npos) << st.to_string();
  };
  expect_named(manifest_from_json("{\"format\": " + deep + "}", "m.json").status(), "m.json");
  expect_named(prep::Tokenizer::from_json("{\"vocab\": " + deep + "}", "t.json").status(),
               "t.json");
  expect_named(engine::parse_mixture_json("{\"weights\": " + deep + "}", "mix.json").status(),
               "mix.json");
  std::string header = "{\"a\": " + deep + "}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  spit("deep.safetensors", file + header);
  expect_named(engine::SafetensorsFile::read(path("deep.safetensors")).status(),
               "deep.safetensors");
  // The JSONL document parser rejects the line (counted as invalid_json) naming the limit.
  prep::Document doc;
  prep::ParseResult r = parse_jsonl_line("{\"text\": \"x\", \"meta\": {\"a\": " + deep + "}}", "f",
                                         1, prep::ParseOptions{}, &doc);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, prep::RejectReason::kInvalidJson);
  EXPECT_NE(r.detail.find("limit of " + std::to_string(kMaxJsonDepth)), std::string::npos)
      << r.detail;
  r = prep::parse_jsonl_line(
      "{\"text\": \"x\", \"meta\": {\"a\": " + nested(kMaxJsonDepth - 3) + "}}", "f", 1,
      prep::ParseOptions{}, &doc);
  EXPECT_TRUE(r.ok) << r.detail;
}

// ---- .npy ---------------------------------------------------------------------------------------

TEST_F(InputCaps, NpyHeaderLengthJustPastCap) {
  // Version 2.0 (4-byte header length) with a header of 65537 bytes: refused before parsing it.
  std::string npy = std::string("\x93NUMPY\x02\x00", 8);
  uint32_t len = (1u << 16) + 1;
  npy.append(reinterpret_cast<const char*>(&len), 4);
  npy.append(len, ' ');
  auto r = npy_parse(npy);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_NE(r.status().message().find("header length 65537"), std::string::npos)
      << r.status().message();
}

TEST_F(InputCaps, NpyDimensionsPastOneOrOverflowing) {
  auto header = [](const std::string& shape) {
    std::string dict = "{'descr': '<u4', 'fortran_order': False, 'shape': " + shape + ", }";
    dict.append(63 - (10 + dict.size()) % 64, ' ');
    dict += '\n';
    std::string out("\x93NUMPY\x01\x00", 8);
    out.push_back(static_cast<char>(dict.size() & 0xff));
    out.push_back(static_cast<char>(dict.size() >> 8));
    return out + dict;
  };
  auto two_d = npy_parse(header("(2, 2)") + std::string(16, '\0'));
  ASSERT_EQ(two_d.status().code(), StatusCode::kData);
  EXPECT_NE(two_d.status().message().find("1-D"), std::string::npos) << two_d.status().message();
  // 2^62 elements of 4 bytes overflow 64 bits: refused without multiplying.
  auto huge = npy_parse(header("(4611686018427387904,)") + std::string(16, '\0'));
  ASSERT_EQ(huge.status().code(), StatusCode::kData);
  EXPECT_NE(huge.status().message().find("too many"), std::string::npos) << huge.status().message();
  auto overflow = npy_parse(header("(99999999999999999999999,)"));
  ASSERT_EQ(overflow.status().code(), StatusCode::kData);
  EXPECT_NE(overflow.status().message().find("overflows"), std::string::npos);
}

// ---- safetensors --------------------------------------------------------------------------------

std::string safetensors_bytes(const std::string& header, size_t data_bytes,
                              uint64_t claimed_len = 0) {
  uint64_t n = claimed_len ? claimed_len : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST_F(InputCaps, SafetensorsHeaderJustPastCap) {
  spit("big.safetensors", safetensors_bytes("{}", 0, engine::kMaxSafetensorsHeaderBytes + 1));
  auto r = engine::SafetensorsFile::read(path("big.safetensors"));
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_NE(r.status().message().find("over the limit of " +
                                      std::to_string(engine::kMaxSafetensorsHeaderBytes)),
            std::string::npos)
      << r.status().to_string();
  EXPECT_EQ(r.status().file(), path("big.safetensors"));
}

TEST_F(InputCaps, SafetensorsShapeProductOverflow) {
  // 2^32 * 2^32 * 4 bytes wraps to 0 in 64 bits; data_offsets [0, 0] would then "match".
  spit("wrap.safetensors",
       safetensors_bytes(
           R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
           0));
  auto r = engine::SafetensorsFile::read(path("wrap.safetensors"));
  ASSERT_EQ(r.status().code(), StatusCode::kData) << "a wrapped shape product was accepted";
  EXPECT_NE(r.status().message().find("overflows"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().key(), "w");
  spit("ok.safetensors",
       safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})",
                         24));
  EXPECT_TRUE(engine::SafetensorsFile::read(path("ok.safetensors")).is_ok());
}

// Fuzz finding shape-dimension-past-int64-is-a-double: nlohmann reads an integer past 64 bits as a
// double, and converting it to int64 was undefined behaviour (UBSan). Non-integer shape entries and
// data_offsets are a data error naming the file and the tensor.
TEST_F(InputCaps, SafetensorsShapeAndOffsetsMustBeIntegers) {
  for (const char* entry :
       {R"({"w": {"dtype": "F16", "shape": [3184467440737095516160, 6], "data_offsets": [0, 0]}})",
        R"({"w": {"dtype": "F16", "shape": [2.5], "data_offsets": [0, 4]}})",
        R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 1e30]}})"}) {
    spit("float.safetensors", safetensors_bytes(entry, 4));
    auto r = engine::SafetensorsFile::read(path("float.safetensors"));
    ASSERT_EQ(r.status().code(), StatusCode::kData) << entry;
    EXPECT_EQ(r.status().file(), path("float.safetensors"));
    EXPECT_EQ(r.status().key(), "w");
  }
}

// ---- tokenizer ----------------------------------------------------------------------------------

TEST_F(InputCaps, TokenizerVocabAndMergesJustPastCap) {
  std::vector<std::string> texts = {"the cat sat on the mat with the hat"};
  std::vector<std::string_view> views(texts.begin(), texts.end());
  prep::TokenizerTrainOptions topt;
  topt.vocab_size = 262;
  auto tok = prep::Tokenizer::train(views, topt);
  ASSERT_TRUE(tok.is_ok());
  const uint64_t vocab = tok->vocab_size(), merges = tok->num_merges();
  ASSERT_GT(merges, 0u);
  std::string json = tok->to_json();
  prep::TokenizerLimits at{vocab, merges};
  EXPECT_TRUE(prep::Tokenizer::from_json(json, "t.json", at).is_ok());
  prep::TokenizerLimits small_vocab{vocab - 1, merges};
  auto r = prep::Tokenizer::from_json(json, "t.json", small_vocab);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_NE(r.status().to_string().find("t.json"), std::string::npos);
  EXPECT_NE(
      r.status().message().find("over the limit of " + std::to_string(vocab - 1) + " (max_vocab)"),
      std::string::npos)
      << r.status().to_string();
  prep::TokenizerLimits small_merges{vocab, merges - 1};
  r = prep::Tokenizer::from_json(json, "t.json", small_merges);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_NE(r.status().message().find("(max_merges)"), std::string::npos) << r.status().to_string();
  // The GPT-2 pair: merges.txt past the cap names the file and the line.
  ASSERT_TRUE(tok->save_gpt2(path("vocab.json"), path("merges.txt")).is_ok());
  EXPECT_TRUE(prep::Tokenizer::load_gpt2(path("vocab.json"), path("merges.txt"), at).is_ok());
  r = prep::Tokenizer::load_gpt2(path("vocab.json"), path("merges.txt"), small_merges);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().file(), path("merges.txt"));
  EXPECT_GT(r.status().line(), 0);
  r = prep::Tokenizer::load_gpt2(path("vocab.json"), path("merges.txt"), small_vocab);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().file(), path("vocab.json"));
}

// `kiln tokenizer train` streams its inputs; one text (a whole text file, or one JSONL line) is
// capped after decompression (--max-text-bytes), so a small .gz cannot expand into all memory.
// The cap is past one read chunk (1 MiB) so the text arrives in several pieces.
void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST_F(InputCaps, TokenizerTrainingTextFileJustPastCap) {
  const uint64_t cap = (3u << 20) + 17;
  write_gzip(path("at.txt.gz"), std::string(cap, 'a'));
  auto ok = prep::read_training_texts({path("at.txt.gz")}, 0, cap);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  ASSERT_EQ(ok->texts.size(), 1u);
  EXPECT_EQ(ok->texts[0].size(), cap);
  write_gzip(path("past.txt.gz"), std::string(cap + 1, 'a'));
  auto r = prep::read_training_texts({path("past.txt.gz")}, 0, cap);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().file(), path("past.txt.gz"));
  EXPECT_NE(
      r.status().message().find("limit of " + std::to_string(cap) + " bytes (--max-text-bytes)"),
      std::string::npos)
      << r.status().to_string();
  // The same cap for a plain (uncompressed) file, and for read_maybe_compressed's callers.
  spit("past.txt", std::string(cap + 1, 'b'));
  EXPECT_EQ(prep::read_training_texts({path("past.txt")}, 0, cap).status().code(),
            StatusCode::kData);
  auto whole = prep::read_maybe_compressed(path("past.txt.gz"), cap);
  ASSERT_EQ(whole.status().code(), StatusCode::kData);
  EXPECT_EQ(whole.status().file(), path("past.txt.gz"));
  EXPECT_NE(whole.status().message().find(std::to_string(cap)), std::string::npos);
  EXPECT_TRUE(prep::read_maybe_compressed(path("past.txt.gz"), cap + 1).is_ok());
}

TEST_F(InputCaps, TokenizerTrainingJsonlLineJustPastCap) {
  const uint64_t cap = (2u << 20) + 5;
  auto line_of = [](uint64_t bytes) {  // {"text":"xxx"} of exactly `bytes` bytes
    const std::string head = "{\"text\":\"", tail = "\"}";
    return head + std::string(bytes - head.size() - tail.size(), 'x') + tail;
  };
  const std::string small = "{\"text\":\"hello\"}\n";
  write_gzip(path("at.jsonl.gz"), small + line_of(cap) + "\n" + small);
  auto ok = prep::read_training_texts({path("at.jsonl.gz")}, 0, cap);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->texts.size(), 3u);
  write_gzip(path("past.jsonl.gz"), small + line_of(cap + 1) + "\n" + small);
  auto r = prep::read_training_texts({path("past.jsonl.gz")}, 0, cap);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().file(), path("past.jsonl.gz"));
  EXPECT_NE(r.status().message().find("line 2 is longer than the limit of " + std::to_string(cap)),
            std::string::npos)
      << r.status().to_string();
}

TEST_F(InputCaps, TokenizerTrainingStopsMidFileAtMaxBytes) {
  // Streaming: --max-bytes stops inside a JSONL file (the rest is never read), and a last line
  // without a newline still counts.
  std::string jsonl;
  for (int i = 0; i < 1000; ++i) jsonl += "{\"text\":\"0123456789\"}\n";
  jsonl += "{\"text\":\"last\"}";
  write_gzip(path("many.jsonl.gz"), jsonl);
  auto r = prep::read_training_texts({path("many.jsonl.gz")}, 95);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->truncated);
  EXPECT_EQ(r->texts.size(), 10u);
  auto all = prep::read_training_texts({path("many.jsonl.gz")});
  ASSERT_TRUE(all.is_ok());
  EXPECT_FALSE(all->truncated);
  ASSERT_EQ(all->texts.size(), 1001u);
  EXPECT_EQ(all->texts.back(), "last");
}

// `kiln tagger train` streams its labelled JSONL one line at a time (it used to read each file
// whole); one line is capped after decompression (--max-text-bytes). Past it: an error naming the
// file, the line and the limit, and no training file left behind.
TEST_F(InputCaps, TaggerTrainingLineJustPastCap) {
  const uint64_t cap = (2u << 20) + 3;
  auto labelled = [](const std::string& text, const std::string& domain) {
    return "{\"text\":\"" + text + "\",\"domain\":\"" + domain + "\"}";
  };
  auto line_of = [&](uint64_t bytes) {  // a "web" line of exactly `bytes` bytes
    const std::string empty = labelled("", "web");
    return labelled(std::string(bytes - empty.size(), 'w'), "web");
  };
  std::string docs;
  for (int i = 0; i < 40; ++i)
    docs += labelled(i % 2 ? "int main ( ) { return 0 ; }" : "the river and the village",
                     i % 2 ? "code" : "web") +
            "\n";
  prep::TaggerTrainOptions o;
  o.output = path("tagger.bin");
  o.epochs = 2;
  o.dim = 8;
  o.bucket = 1000;
  o.max_text_bytes = cap;
  write_gzip(path("at.jsonl.gz"), docs + line_of(cap) + "\n" + docs);
  o.inputs = {path("at.jsonl.gz")};
  auto ok = prep::train_tagger(o);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->train_docs + ok->holdout_docs, 81u);
  EXPECT_EQ(ok->label_docs.at("web"), 41u);

  write_gzip(path("past.jsonl.gz"), docs + line_of(cap + 1) + "\n" + docs);
  o.inputs = {path("past.jsonl.gz")};
  o.output = path("past.bin");
  auto r = prep::train_tagger(o);
  ASSERT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().file(), path("past.jsonl.gz"));
  EXPECT_NE(r.status().message().find("line 41 is longer than the limit of " + std::to_string(cap) +
                                      " bytes (--max-text-bytes)"),
            std::string::npos)
      << r.status().to_string();
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("past.bin"), std::string::npos) << e.path();
}

// ---- JSONL lines --------------------------------------------------------------------------------

// input.max_line_bytes: a line of exactly the cap is read, one byte more is skipped as it streams
// and reported as too long with its line number and length (prep counts it as `too_long`, with
// the file and line, in its rejects), and the next line is intact - plain and gzip.
TEST_F(InputCaps, JsonlLineJustPastCap) {
  constexpr size_t kCap = 3000;
  const std::string at(kCap, 'a'), past(kCap + 1, 'p');
  const std::string text = "first\n" + at + "\n" + past + "\nafter\n";
  spit("lines.jsonl", text);
  spit("lines.jsonl.gz", testing_compress::gzip(text));
  for (const auto& [name, compression] :
       {std::pair{"lines.jsonl", prep::InputCompression::kNone},
        std::pair{"lines.jsonl.gz", prep::InputCompression::kGzip}}) {
    auto reader = prep::LineReader::open(path(name), compression, kCap);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    std::vector<std::pair<prep::LineEventKind, std::string>> events;
    prep::LineEvent ev;
    uint64_t past_line = 0, past_length = 0;
    for (;;) {
      ASSERT_TRUE((*reader)->next(&ev).is_ok()) << name;
      if (ev.kind == prep::LineEventKind::kEnd) break;
      if (ev.kind == prep::LineEventKind::kTooLong) {
        past_line = ev.line;
        past_length = ev.length;
      }
      events.emplace_back(ev.kind, std::string(ev.text));
    }
    ASSERT_EQ(events.size(), 4u) << name;
    EXPECT_EQ(events[1].first, prep::LineEventKind::kLine) << name;
    EXPECT_EQ(events[1].second, at) << name;
    EXPECT_EQ(events[2].first, prep::LineEventKind::kTooLong) << name;
    EXPECT_EQ(past_line, 3u) << name;
    EXPECT_EQ(past_length, kCap + 1) << name;
    EXPECT_EQ(events[3].second, "after") << name;
  }
}

// ---- mixture control file -----------------------------------------------------------------------

// RUN/control/mixture.json is capped at 1 MiB: a file of exactly 1 MiB is parsed, one byte more
// is refused with the file named (and the trainer's watcher, which checks the size before reading,
// counts it as rejected and keeps the current weights).
TEST_F(InputCaps, MixtureControlFileJustPastCap) {
  constexpr size_t kCap = size_t{1} << 20;
  std::string at = R"({"weights": {"web": 1, "code": 3}})";
  at.resize(kCap, ' ');
  auto ok = engine::parse_mixture_json(at, "at-cap.json", {"web", "code"});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_DOUBLE_EQ(ok->normalised().at("code"), 0.75);
  const std::string past = at + " ";
  auto refused = engine::parse_mixture_json(past, "past-cap.json", {"web", "code"});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().to_string().find("past-cap.json"), std::string::npos)
      << refused.status().to_string();
  EXPECT_NE(refused.status().to_string().find("larger than 1 MiB"), std::string::npos)
      << refused.status().to_string();

  const std::string run = path("run");
  engine::MixtureWatcher watcher(run, {"web", "code"});
  ASSERT_TRUE(write_file_atomic(engine::mixture_path(run), past).is_ok());
  EXPECT_FALSE(watcher.poll().has_value());
  EXPECT_EQ(watcher.rejected(), 1);
  ASSERT_TRUE(write_file_atomic(engine::mixture_path(run), at).is_ok());
  auto applied = watcher.poll();
  ASSERT_TRUE(applied.has_value());
  EXPECT_DOUBLE_EQ(applied->at("code"), 3.0);
}

// ---- integers read back from JSON ---------------------------------------------------------------

// nlohmann keeps an integer past 64 bits, or one written 1e3 or 1.5, as a double, and
// get<int64_t>() of a double outside int64's range is undefined behaviour (UBSan; the safetensors
// fuzz finding shape-dimension-past-int64-is-a-double). Every integer Kiln reads back from a file
// goes through json_integer*() (common/json.h), which takes only JSON integers in range.
TEST_F(InputCaps, JsonIntegersMustBeIntegersInRange) {
  const auto j = nlohmann::json::parse(R"({"ok": 7, "neg": -3, "frac": 1.5, "sci": 1e3,
      "huge": 1e30, "past64": 18446744073709551616, "u64max": 18446744073709551615,
      "str": "7", "arr": [1, 2.5], "map": {"a": 1, "b": -1}})");
  EXPECT_EQ(json_integer_at<int64_t>(j, "ok"), 7);
  EXPECT_EQ(json_integer_at<int>(j, "neg"), -3);
  EXPECT_EQ(json_integer_at<uint64_t>(j, "u64max"), UINT64_MAX);
  EXPECT_EQ(json_integer_or(j, "absent", int64_t{-1}), -1);
  EXPECT_EQ(json_integer_or(j, "ok", int64_t{-1}), 7);
  auto refused = [&](auto parse, const std::string& what) {
    try {
      parse();
    } catch (const nlohmann::json::type_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << what << " was accepted";
  };
  refused([&] { (void)json_integer_at<int64_t>(j, "frac"); }, "'frac' must be an integer from");
  refused([&] { (void)json_integer_at<int64_t>(j, "sci"); }, "not 1000.0");
  refused([&] { (void)json_integer_at<int64_t>(j, "huge"); }, "not 1e+30");
  refused([&] { (void)json_integer_at<uint64_t>(j, "past64"); }, "'past64'");
  refused([&] { (void)json_integer_at<int64_t>(j, "u64max"); }, "to 9223372036854775807");
  refused([&] { (void)json_integer_at<uint64_t>(j, "neg"); }, "from 0 to 18446744073709551615");
  EXPECT_EQ(json_integer_at<uint8_t>(j, "ok"), 7);
  refused([&] { (void)json_integer<uint8_t>(nlohmann::json(256), "x"); },
          "'x' must be an integer from 0 to 255, not 256");
  refused([&] { (void)json_integer_at<int64_t>(j, "str"); }, "not \"7\"");
  refused([&] { (void)json_integers<int64_t>(j.at("arr"), "arr"); }, "not 2.5");
  refused([&] { (void)json_integers<int64_t>(j.at("ok"), "ok"); },
          "'ok' must be an array of integers");
  refused([&] { (void)json_integer_map<uint64_t>(j.at("map"), "map"); },
          "'map.b' must be an integer");
  EXPECT_EQ(json_integer_map<int64_t>(j.at("map"), "map").at("b"), -1);
  EXPECT_THROW((void)json_integer_at<int64_t>(j, "absent"), nlohmann::json::out_of_range);
}

// A checkpoint's state.json as the trainer writes it (fp32, step 4), for the tests that edit it.
nlohmann::json checkpoint_state() {
  return nlohmann::json::parse(R"({"format": "kiln-checkpoint/2",
      "model": {"vocab_size": 64, "d_model": 16, "n_layers": 1, "n_heads": 2, "seq_len": 8},
      "precision": "fp32", "step": 4, "adam_updates": 4, "tokens": 128, "skipped_steps": 0,
      "seed": 1, "loss_scaler": {"scale": 1.0, "clean_steps": 0, "hysteresis_left": 2,
      "overflows": 0}, "data_state": "", "mixture_hash": "0000000000000000"})");
}

// A checkpoint's state.json with a count that is not a JSON integer in range (a hand edit, a
// foreign writer, a damaged file) is a data error naming state.json and the key.
TEST_F(InputCaps, CheckpointStateIntegersMustBeJsonIntegers) {
  const std::string ckpt = path("step-00000004");
  fs::create_directories(ckpt);
  const nlohmann::json good = checkpoint_state();
  auto write = [&](const nlohmann::json& j) {
    ASSERT_TRUE(write_file_atomic(ckpt + "/state.json", j.dump()).is_ok());
  };
  write(good);
  auto model = engine::checkpoint_model(ckpt);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ(model->first.d_model, 16);
  auto state = engine::read_trainer_state(ckpt);
  ASSERT_TRUE(state.is_ok()) << state.status().to_string();
  EXPECT_EQ(state->tokens, 128);

  struct Case {
    std::string pointer;
    nlohmann::json value;
    std::string key;
  };
  const std::vector<Case> cases = {
      {"/model/d_model", 1e30, "'d_model'"},
      {"/model/vocab_size", 64.5, "'vocab_size'"},
      {"/model/seq_len", nlohmann::json::parse("18446744073709551616"), "'seq_len'"},
      {"/step", 1e30, "'step'"},
      {"/tokens", 1.5, "'tokens'"},
      {"/seed", -1, "'seed'"},
      {"/loss_scaler/overflows", 1e19, "'overflows'"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = good;
    bad[nlohmann::json::json_pointer(c.pointer)] = c.value;
    write(bad);
    Status st = c.pointer.starts_with("/model") ? engine::checkpoint_model(ckpt).status()
                                                : engine::read_trainer_state(ckpt).status();
    EXPECT_EQ(st.code(), StatusCode::kData) << c.pointer;
    EXPECT_EQ(st.file(), ckpt + "/state.json") << c.pointer;
    EXPECT_NE(st.message().find(c.key + " must be an integer"), std::string::npos)
        << c.pointer << ": " << st.to_string();
  }
}

// The manifest's counts: a double, a fraction or a negative count is refused naming the field.
TEST_F(InputCaps, ManifestCountsMustBeJsonIntegers) {
  const nlohmann::json good = nlohmann::json::parse(R"({"format": "kiln-shards/1",
      "tokenizer": {"path": "tokenizer.json", "vocab_size": 8192, "eos_id": 0},
      "domains": {"code": {"samples": 2, "tokens": 9, "shards": 1}},
      "shards": [{"path": "shards/code/code-000000.tar.zst", "domain": "code", "samples": 2,
                  "tokens": 9, "bytes": 77, "tar_bytes": 2048, "xxh3": "00000000000000ff"}]})");
  ASSERT_TRUE(manifest_from_json(good.dump(), "manifest.json").is_ok());
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"/shards/0/tokens", 1e30},
      {"/shards/0/tar_bytes", 1.5},
      {"/shards/0/bytes", -77},
      {"/shards/0/samples", nlohmann::json::parse("18446744073709551616")},
      {"/tokenizer/vocab_size", 8192.5},
      {"/domains/code/tokens", 9e0},
  };
  for (const auto& [pointer, value] : cases) {
    nlohmann::json bad = good;
    bad[nlohmann::json::json_pointer(pointer)] = value;
    auto r = manifest_from_json(bad.dump(), "manifest.json");
    ASSERT_FALSE(r.is_ok()) << pointer;
    EXPECT_EQ(r.status().code(), StatusCode::kData) << pointer;
    EXPECT_EQ(r.status().file(), "manifest.json") << pointer;
    std::string key = pointer.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    if (key.starts_with("shards.0.")) key = "shards[0]." + key.substr(9);
    EXPECT_EQ(r.status().key(), key) << r.status().to_string();
  }
}

// The trainer's mixing and stability state (kept in checkpoints and RUN/control/): a count that
// is not a JSON integer in range is a data error naming the key.
TEST_F(InputCaps, MixingAndStabilityStateIntegersMustBeJsonIntegers) {
  engine::MixState mix;
  mix.policy = "static";
  mix.weights = {{"web", 0.5}, {"code", 0.5}};
  nlohmann::json m = nlohmann::json::parse(mix.to_json());
  ASSERT_TRUE(engine::MixState::from_json(m.dump(), "mixing.json").is_ok());
  for (const nlohmann::json& v : {nlohmann::json(1e30), nlohmann::json(2.5), nlohmann::json("3")}) {
    m["updates"] = v;
    auto r = engine::MixState::from_json(m.dump(), "mixing.json");
    ASSERT_FALSE(r.is_ok()) << v;
    EXPECT_EQ(r.status().code(), StatusCode::kData);
    EXPECT_EQ(r.status().file(), "mixing.json");
    EXPECT_NE(r.status().message().find("'updates'"), std::string::npos) << r.status().to_string();
  }

  const engine::SpikeDetector detector{engine::StabilityConfig::Spike{}};
  nlohmann::json s = nlohmann::json::parse(engine::StabilityState{}.to_json(detector));
  engine::StabilityState back;
  ASSERT_TRUE(engine::StabilityState::from_json(s.dump(), &back, nullptr).is_ok());
  s["rollbacks"] = 1e30;
  Status st = engine::StabilityState::from_json(s.dump(), &back, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("'rollbacks'"), std::string::npos) << st.to_string();
  s["rollbacks"] = 0;
  s["sequences"] = {{"web", -1}};
  st = engine::StabilityState::from_json(s.dump(), &back, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("'sequences.web'"), std::string::npos) << st.to_string();
}

// A dataset's dedup index settings (read by --against / --append): an int field past int's range
// used to be narrowed silently, a double past it was undefined behaviour.
TEST_F(InputCaps, DedupIndexSettingsMustBeJsonIntegers) {
  nlohmann::json j = prep::DedupSettings{}.to_json();
  ASSERT_TRUE(prep::DedupSettings::from_json(j, "index.json").is_ok());
  for (const nlohmann::json& v :
       {nlohmann::json(int64_t{1} << 40), nlohmann::json(1e30), nlohmann::json(128.5)}) {
    j["num_perm"] = v;
    auto r = prep::DedupSettings::from_json(j, "index.json");
    ASSERT_FALSE(r.is_ok()) << v;
    EXPECT_EQ(r.status().code(), StatusCode::kData);
    EXPECT_EQ(r.status().file(), "index.json");
    EXPECT_NE(r.status().message().find("'num_perm' must be an integer from -2147483648"),
              std::string::npos)
        << r.status().to_string();
  }
}

// ---- checkpoint and run files (review 7) ------------------------------------------------------

// state.json, a metrics.jsonl line and the mixing state nested far past the cap: a data error
// naming the file and the limit, or the line dropped - never the crash a recursive dump() of the
// value gave (a stack overflow at ~100,000 levels, while building the error message).
TEST_F(InputCaps, CheckpointAndRunJsonNestingCapped) {
  const std::string ckpt = path("step-00000004");
  fs::create_directories(ckpt);
  for (size_t depth : {kMaxJsonDepth + 1, size_t{300000}}) {
    SCOPED_TRACE(depth);
    spit("step-00000004/state.json", "{\"format\": " + nested(depth) + ", \"step\": 1}");
    for (const Status& st :
         {engine::checkpoint_model(ckpt).status(), engine::read_trainer_state(ckpt).status()}) {
      EXPECT_EQ(st.code(), StatusCode::kData);
      EXPECT_EQ(st.file(), ckpt + "/state.json");
      EXPECT_NE(st.message().find("limit of " + std::to_string(kMaxJsonDepth)), std::string::npos)
          << st.to_string();
    }
    fs::create_directories(path("run"));
    spit("run/metrics.jsonl", "{\"step\": 1, \"loss\": 2.0}\n{\"step\": " + nested(depth) +
                                  ", \"domain_weights\": {\"web\": 1}}\n");
    EXPECT_FALSE(engine::last_logged_weights(path("run")).has_value());
    auto log = engine::MetricsLog::open(path("run"), 5);
    ASSERT_TRUE(log.is_ok()) << log.status().to_string();
    log->reset();
    EXPECT_EQ(*read_file(path("run/metrics.jsonl")), "{\"step\": 1, \"loss\": 2.0}\n");
    engine::StabilityState back;
    Status st =
        engine::StabilityState::from_json("{\"spikes\": " + nested(depth) + "}", &back, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kData);
  }
  // A structured value where an integer belongs is shown by kind and size, not dumped.
  try {
    (void)json_integer<int64_t>(nlohmann::json::parse(nested(200)), "step");
    ADD_FAILURE() << "no error";
  } catch (const nlohmann::json::type_error& e) {
    EXPECT_NE(std::string(e.what()).find("not an array of 1"), std::string::npos) << e.what();
  }
}

// state.json's values are held to what a run writes: an AdamW step after -1 updates would turn
// every weight to NaN, a negative step names checkpoints "step--0000006" and overwrites good ones.
TEST_F(InputCaps, CheckpointStateValuesMustBeInRange) {
  const std::string ckpt = path("step-00000004");
  fs::create_directories(ckpt);
  nlohmann::json good = checkpoint_state();  // an fp16 run with one overflow skipped
  good["precision"] = "fp16";
  good["adam_updates"] = 3;
  good["skipped_steps"] = 1;
  good["loss_scaler"]["scale"] = 0.5;
  good["loss_scaler"]["overflows"] = 1;
  auto write = [&](const nlohmann::json& j) {
    ASSERT_TRUE(write_file_atomic(ckpt + "/state.json", j.dump()).is_ok());
  };
  write(good);
  ASSERT_TRUE(engine::read_trainer_state(ckpt).is_ok());
  ASSERT_TRUE(engine::checkpoint_model(ckpt).is_ok());
  struct Case {
    std::string pointer;
    nlohmann::json value;
    std::string key;
  };
  const std::vector<Case> state_cases = {
      {"/step", -1, "step"},
      {"/adam_updates", -1, "adam_updates"},
      {"/adam_updates", 5, "adam_updates"},  // more updates than steps
      {"/skipped_steps", -2, "skipped_steps"},
      {"/tokens", -128, "tokens"},
      {"/loss_scaler/scale", 0.0, "loss_scaler.scale"},
      {"/loss_scaler/scale", -65536.0, "loss_scaler.scale"},
      {"/loss_scaler/hysteresis_left", -1, "loss_scaler.hysteresis_left"},
  };
  for (const Case& c : state_cases) {
    nlohmann::json bad = good;
    bad[nlohmann::json::json_pointer(c.pointer)] = c.value;
    write(bad);
    Status st = engine::read_trainer_state(ckpt).status();
    EXPECT_EQ(st.code(), StatusCode::kData) << c.pointer;
    EXPECT_EQ(st.file(), ckpt + "/state.json") << c.pointer;
    EXPECT_EQ(st.key(), c.key) << c.pointer << ": " << st.to_string();
  }
  // The model shape `kiln checkpoint consolidate` builds from: the config's bounds, before any
  // allocation (0, negative and INT64_MIN sizes aborted in the ParamStore).
  const std::vector<Case> model_cases = {
      {"/model/d_model", 0, "model.d_model"},
      {"/model/d_model", -16, "model.d_model"},
      {"/model/d_model", std::numeric_limits<int64_t>::min(), "model.d_model"},
      {"/model/n_layers", int64_t{1} << 40, "model.n_layers"},
      {"/model/vocab_size", 1, "model.vocab_size"},
      {"/model/n_heads", 3, "model.n_heads"},  // does not divide d_model 16
  };
  for (const Case& c : model_cases) {
    nlohmann::json bad = good;
    bad[nlohmann::json::json_pointer(c.pointer)] = c.value;
    write(bad);
    Status st = engine::checkpoint_model(ckpt).status();
    EXPECT_EQ(st.code(), StatusCode::kData) << c.pointer;
    EXPECT_EQ(st.file(), ckpt + "/state.json") << c.pointer;
    EXPECT_EQ(st.key(), c.key) << c.pointer << ": " << st.to_string();
  }
}

}  // namespace
}  // namespace kiln
