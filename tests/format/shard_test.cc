// Shard writer/reader: round trips, determinism, rolling, and the reader's defences against
// damaged or hostile tar files (crafted here byte by byte, so the checks do not depend on any
// writer's habits).
#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "format/npy.h"
#include "format/shard_reader.h"
#include "format/shard_writer.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_shard_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

ShardSample make_sample(int i) {
  ShardSample s;
  s.key = "doc" + std::to_string(i);
  // Deliberately out of order: the writer must sort to txt, json, tokens.npy, then others.
  s.members.push_back({"meta", "m" + std::to_string(i)});
  std::vector<uint16_t> tokens;
  for (int t = 0; t < i % 7 + 1; ++t) tokens.push_back(static_cast<uint16_t>(i * 31 + t));
  s.members.push_back({"tokens.npy", npy_encode(tokens)});
  s.members.push_back({"json", "{\"id\": " + std::to_string(i) + "}"});
  std::string text;
  for (int r = 0; r < (i * 37) % 300; ++r) text += "line " + std::to_string(r) + " of doc\n";
  s.members.push_back({"txt", text});
  return s;
}

std::vector<ShardSample> make_samples(int n) {
  std::vector<ShardSample> v;
  for (int i = 0; i < n; ++i) v.push_back(make_sample(i));
  return v;
}

Result<ShardInfo> write_shard(const std::string& path, const std::vector<ShardSample>& samples,
                              ShardCompression c) {
  KILN_ASSIGN_OR_RETURN(auto w, ShardWriter::open(path, c));
  for (const auto& s : samples) KILN_RETURN_IF_ERROR(w->add(s, 10));
  return w->close();
}

std::string slurp(const std::string& path) {
  Result<std::string> r = read_file(path);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::string();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string zstd_compress(const std::string& raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string zstd_decompress(const std::string& z) {
  std::string out;
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ZSTD_inBuffer in{z.data(), z.size(), 0};
  std::vector<char> buf(1 << 16);
  while (in.pos < in.size) {
    ZSTD_outBuffer o{buf.data(), buf.size(), 0};
    size_t r = ZSTD_decompressStream(d, &o, &in);
    EXPECT_FALSE(ZSTD_isError(r));
    if (ZSTD_isError(r)) break;
    out.append(buf.data(), o.pos);
  }
  ZSTD_freeDCtx(d);
  return out;
}

// ---- raw ustar crafting --------------------------------------------------------------------

// One 512-byte ustar header. typeflag '0' file, '2' symlink, '5' directory.
std::string ustar_header(const std::string& name, size_t size, char typeflag = '0',
                         const std::string& linkname = "") {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011zo", size);
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = typeflag;
  std::memcpy(h.data() + 157, linkname.data(), std::min<size_t>(linkname.size(), 100));
  std::memcpy(h.data() + 257, "ustar", 6);
  h[263] = '0';
  h[264] = '0';
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

std::string padded(const std::string& data) {
  std::string out = data;
  out.resize((data.size() + 511) / 512 * 512, '\0');
  return out;
}

struct RawMember {
  RawMember(std::string n, std::string d, char t = '0', std::string l = "")
      : name(std::move(n)), data(std::move(d)), type(t), link(std::move(l)) {}
  std::string name;
  std::string data;
  char type;
  std::string link;
};

std::string raw_tar(const std::vector<RawMember>& members, bool end_marker = true) {
  std::string t;
  for (const auto& m : members) {
    t += ustar_header(m.name, m.type == '0' ? m.data.size() : 0, m.type, m.link);
    if (m.type == '0') t += padded(m.data);
  }
  if (end_marker) t += std::string(1024, '\0');
  return t;
}

// Reads a shard to the end; returns the first error (or ok).
Status read_fully(const std::string& path, ShardReaderOptions opt = {}) {
  Result<std::vector<ShardSample>> r = ShardReader::read_all(path, opt);
  return r.is_ok() ? Status::ok() : r.status();
}

#define EXPECT_DATA_ERROR(status, ...)                                       \
  do {                                                                       \
    Status _st = (status);                                                   \
    EXPECT_EQ(_st.code(), StatusCode::kData) << _st.to_string();             \
    for (const std::string& _want : std::vector<std::string>{__VA_ARGS__}) { \
      EXPECT_NE(_st.message().find(_want), std::string::npos)                \
          << "message lacks '" << _want << "': " << _st.message();           \
    }                                                                        \
  } while (0)

// ---- round trips ---------------------------------------------------------------------------

TEST_F(ShardTest, RoundTripZstdAndPlain) {
  auto samples = make_samples(50);
  for (ShardCompression c : {ShardCompression::kZstd, ShardCompression::kNone}) {
    std::string p = path(std::string("a") + shard_extension(c));
    Result<ShardInfo> info = write_shard(p, samples, c);
    ASSERT_TRUE(info.is_ok()) << info.status().to_string();
    EXPECT_EQ(info->path, p);
    EXPECT_EQ(info->samples, 50u);
    EXPECT_EQ(info->tokens, 500u);
    EXPECT_EQ(info->bytes, fs::file_size(p));
    EXPECT_EQ(info->xxh3, *xxh3_file(p));
    EXPECT_FALSE(fs::exists(p + ".partial"));
    if (c == ShardCompression::kNone) {
      EXPECT_EQ(info->tar_bytes, info->bytes);
    }
    EXPECT_EQ(info->tar_bytes % 10240, 0u);

    ShardReaderOptions opt;
    opt.expected_xxh3 = info->xxh3;
    Result<std::vector<ShardSample>> back = ShardReader::read_all(p, opt);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_EQ(back->size(), samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      const ShardSample& got = (*back)[i];
      EXPECT_EQ(got.key, samples[i].key);
      ASSERT_EQ(got.members.size(), 4u);
      // File order is the fixed order: txt, json, tokens.npy, then others.
      EXPECT_EQ(got.members[0].ext, "txt");
      EXPECT_EQ(got.members[1].ext, "json");
      EXPECT_EQ(got.members[2].ext, "tokens.npy");
      EXPECT_EQ(got.members[3].ext, "meta");
      for (const ShardMember& m : samples[i].members) {
        const ShardMember* g = got.find(m.ext);
        ASSERT_NE(g, nullptr) << m.ext;
        EXPECT_EQ(g->data, m.data) << samples[i].key << "." << m.ext;
      }
    }
  }
}

TEST_F(ShardTest, ReaderReusesSampleAcrossCalls) {
  auto samples = make_samples(20);
  ASSERT_TRUE(write_shard(path("r.tar.zst"), samples, ShardCompression::kZstd).is_ok());
  auto reader = ShardReader::open(path("r.tar.zst"));
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  ShardSample s;
  s.members.resize(9);  // leftovers from a previous use must not leak into the result
  for (size_t i = 0; i < samples.size(); ++i) {
    Result<bool> more = (*reader)->next(&s);
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();
    ASSERT_TRUE(*more);
    EXPECT_EQ(s.key, samples[i].key);
    EXPECT_EQ(s.members.size(), 4u);
    EXPECT_EQ(s.find("txt")->data, samples[i].find("txt")->data);
  }
  Result<bool> end = (*reader)->next(&s);
  ASSERT_TRUE(end.is_ok()) << end.status().to_string();
  EXPECT_FALSE(*end);
  EXPECT_FALSE(*(*reader)->next(&s));  // stays at the end
}

TEST_F(ShardTest, MemberFilterSkipsDataButKeepsEveryCheck) {
  auto samples = make_samples(30);
  ASSERT_TRUE(write_shard(path("f.tar.zst"), samples, ShardCompression::kZstd).is_ok());
  ShardReaderOptions opt;
  std::vector<std::pair<uint64_t, std::string>> asked;
  // Only the tokens of even samples (and the json of sample 3).
  opt.want = [&](uint64_t i, std::string_view ext) {
    asked.emplace_back(i, std::string(ext));
    return (i % 2 == 0 && ext == "tokens.npy") || (i == 3 && ext == "json");
  };
  auto reader = ShardReader::open(path("f.tar.zst"), opt);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  ShardSample s;
  for (size_t i = 0; i < samples.size(); ++i) {
    Result<bool> more = (*reader)->next(&s);
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();
    ASSERT_TRUE(*more);
    EXPECT_EQ(s.key, samples[i].key);
    ASSERT_EQ(s.members.size(), 4u);  // every member comes back, skipped or not
    for (const ShardMember& m : s.members) {
      const bool wanted = (i % 2 == 0 && m.ext == "tokens.npy") || (i == 3 && m.ext == "json");
      EXPECT_EQ(m.skipped, !wanted) << i << " " << m.ext;
      EXPECT_EQ(m.data, wanted ? samples[i].find(m.ext)->data : std::string()) << i << " " << m.ext;
    }
  }
  EXPECT_FALSE(*(*reader)->next(&s));
  ASSERT_EQ(asked.size(), 4 * samples.size());  // once per member, with its sample's index
  for (size_t k = 0; k < asked.size(); ++k) EXPECT_EQ(asked[k].first, k / 4);

  // Skipping reads nothing less of the structure: a truncated shard is still an error naming
  // the shard, and a damaged one still fails its checksum.
  ShardReaderOptions none;
  none.want = [](uint64_t, std::string_view) { return false; };
  std::string bytes = slurp(path("f.tar.zst"));
  spit(path("cut.tar.zst"), bytes.substr(0, bytes.size() * 3 / 4));
  EXPECT_DATA_ERROR(read_fully(path("cut.tar.zst"), none), path("cut.tar.zst"));
  auto info = write_shard(path("g.tar"), samples, ShardCompression::kNone);
  ASSERT_TRUE(info.is_ok());
  std::string plain = slurp(path("g.tar"));
  plain.resize(plain.size() - 3 * 10240);  // the end-of-archive marker and the last members
  spit(path("g.tar"), plain);
  EXPECT_DATA_ERROR(read_fully(path("g.tar"), none), path("g.tar"));
  none.expected_xxh3 = info->xxh3;
  EXPECT_DATA_ERROR(read_fully(path("g.tar"), none), "checksum mismatch");
}

TEST_F(ShardTest, EmptyMembersAndEmptyShard) {
  ShardSample s;
  s.key = "empty";
  s.members.push_back({"txt", ""});
  s.members.push_back({"json", "{}"});
  ASSERT_TRUE(write_shard(path("e.tar.zst"), {s}, ShardCompression::kZstd).is_ok());
  auto back = ShardReader::read_all(path("e.tar.zst"));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].find("txt")->data, "");

  // A shard with no samples is a valid (empty) archive.
  ASSERT_TRUE(write_shard(path("none.tar"), {}, ShardCompression::kNone).is_ok());
  auto none = ShardReader::read_all(path("none.tar"));
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_TRUE(none->empty());
}

TEST_F(ShardTest, LongKeyUsesPaxAndRoundTrips) {
  ShardSample s;
  s.key = std::string(200, 'k');
  s.members.push_back({"tokens.npy", npy_encode(std::vector<uint16_t>{1, 2, 3})});
  s.members.push_back({"txt", "hello"});
  ASSERT_TRUE(write_shard(path("long.tar"), {s, make_sample(1)}, ShardCompression::kNone).is_ok());
  auto back = ShardReader::read_all(path("long.tar"));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].key, s.key);
  EXPECT_EQ((*back)[0].members[0].ext, "txt");
}

TEST_F(ShardTest, DeterministicBytes) {
  auto samples = make_samples(40);
  for (ShardCompression c : {ShardCompression::kZstd, ShardCompression::kNone}) {
    std::string ext = shard_extension(c);
    auto a = write_shard(path("one" + ext), samples, c);
    // Same samples, members given in another order: same bytes.
    auto shuffled = samples;
    for (auto& s : shuffled) std::reverse(s.members.begin(), s.members.end());
    auto b = write_shard(path("two" + ext), shuffled, c);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(a->xxh3, b->xxh3);
    EXPECT_EQ(slurp(path("one" + ext)), slurp(path("two" + ext)));
  }
  // The .tar.zst is exactly the .tar, compressed whole.
  EXPECT_EQ(zstd_decompress(slurp(path("one.tar.zst"))), slurp(path("one.tar")));
}

TEST_F(ShardTest, HeadersAreNormalised) {
  ASSERT_TRUE(write_shard(path("h.tar"), make_samples(3), ShardCompression::kNone).is_ok());
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  ASSERT_EQ(archive_read_open_filename(a, path("h.tar").c_str(), 10240), ARCHIVE_OK);
  struct archive_entry* e;
  std::vector<std::string> names;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    names.push_back(archive_entry_pathname(e));
    EXPECT_EQ(archive_entry_mtime(e), 0);
    EXPECT_EQ(archive_entry_uid(e), 0);
    EXPECT_EQ(archive_entry_gid(e), 0);
    EXPECT_EQ(archive_entry_perm(e), 0644);
    EXPECT_EQ(archive_entry_filetype(e), AE_IFREG);
    EXPECT_EQ(std::string(archive_entry_uname(e) ? archive_entry_uname(e) : ""), "");
    EXPECT_EQ(std::string(archive_entry_gname(e) ? archive_entry_gname(e) : ""), "");
  }
  archive_read_free(a);
  // No user or group names in the raw header either (ustar uname at 265, gname at 297).
  std::string raw = slurp(path("h.tar"));
  EXPECT_EQ(raw.substr(265, 64), std::string(64, '\0'));
  EXPECT_EQ(raw.substr(257, 8), std::string("ustar\0"
                                            "00",
                                            8));
  std::vector<std::string> want = {"doc0.txt", "doc0.json", "doc0.tokens.npy", "doc0.meta",
                                   "doc1.txt", "doc1.json", "doc1.tokens.npy", "doc1.meta",
                                   "doc2.txt", "doc2.json", "doc2.tokens.npy", "doc2.meta"};
  EXPECT_EQ(names, want);
}

TEST_F(ShardTest, WriterRejectsBadSamples) {
  auto w = ShardWriter::open(path("bad.tar.zst"), ShardCompression::kZstd);
  ASSERT_TRUE(w.is_ok());
  ShardSample s;
  s.members.push_back({"txt", "x"});
  for (const std::string& key :
       std::vector<std::string>{"", "a.b", "a/b", std::string("a\0b", 3), std::string(201, 'x'),
                                "caf\xc3\xa9", "tab\there"}) {
    s.key = key;
    EXPECT_EQ((*w)->add(s).code(), StatusCode::kData) << key;
  }
  s.key = "ok";
  s.members.push_back({"txt", "y"});
  Status dup = (*w)->add(s);
  EXPECT_EQ(dup.code(), StatusCode::kData);
  EXPECT_NE(dup.message().find("duplicate"), std::string::npos) << dup.message();
  s.members.pop_back();
  for (const std::string& ext :
       std::vector<std::string>{"", ".npy", "a..b", "a/b", "tokens.", "sp ace"}) {
    s.members[0].ext = ext;
    EXPECT_EQ((*w)->add(s).code(), StatusCode::kData) << ext;
  }
  // Rejected samples leave the writer usable.
  s.members[0].ext = "txt";
  EXPECT_TRUE((*w)->add(s).is_ok());
  EXPECT_EQ((*w)->samples(), 1u);
  ASSERT_TRUE((*w)->close().is_ok());
  EXPECT_TRUE(validate_sample_key("Doc_12-x y").is_ok());
  EXPECT_TRUE(validate_member_ext("tokens.npy").is_ok());
  EXPECT_EQ(member_order("txt"), 0);
  EXPECT_EQ(member_order("json"), 1);
  EXPECT_EQ(member_order("tokens.npy"), 2);
  EXPECT_EQ(member_order("zzz"), 3);
}

TEST_F(ShardTest, WriterPathMustMatchCompression) {
  EXPECT_FALSE(ShardWriter::open(path("x.tar"), ShardCompression::kZstd).is_ok());
  EXPECT_FALSE(ShardWriter::open(path("x.zip"), ShardCompression::kNone).is_ok());
  EXPECT_FALSE(fs::exists(path("x.tar.partial")));
}

TEST_F(ShardTest, ZstdLevels) {
  auto samples = make_samples(20);
  uint64_t size_1 = 0, size_19 = 0;
  for (int level : {1, 19, -5}) {
    std::string p = path("l" + std::to_string(level + 10) + ".tar.zst");
    auto w = ShardWriter::open(p, ShardCompression::kZstd, level);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    for (const auto& s : samples) ASSERT_TRUE((*w)->add(s).is_ok());
    auto info = (*w)->close();
    ASSERT_TRUE(info.is_ok());
    if (level == 1) size_1 = info->bytes;
    if (level == 19) size_19 = info->bytes;
    auto back = ShardReader::read_all(p);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->size(), samples.size());
  }
  EXPECT_LT(size_19, size_1);
  for (int level : {0, 23, -200000}) {
    auto w = ShardWriter::open(path("bad.tar.zst"), ShardCompression::kZstd, level);
    EXPECT_EQ(w.status().code(), StatusCode::kConfig) << level;
  }
  EXPECT_FALSE(fs::exists(path("bad.tar.zst.partial")));
}

TEST_F(ShardTest, UnclosedWriterLeavesNothing) {
  {
    auto w = ShardWriter::open(path("u.tar.zst"), ShardCompression::kZstd);
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->add(make_sample(1)).is_ok());
    EXPECT_TRUE(fs::exists(path("u.tar.zst.partial")));
  }
  EXPECT_FALSE(fs::exists(path("u.tar.zst.partial")));
  EXPECT_FALSE(fs::exists(path("u.tar.zst")));
}

// ---- rolling -------------------------------------------------------------------------------

TEST_F(ShardTest, RollingOnMaxSamples) {
  RollingShardWriter::Options o;
  o.dir = path("roll");
  o.prefix = "web";
  o.max_samples = 4;
  o.max_tar_bytes = 0;
  RollingShardWriter w(o);
  auto samples = make_samples(10);
  for (const auto& s : samples) ASSERT_TRUE(w.add(s, 3).is_ok());
  auto shards = w.finish();
  ASSERT_TRUE(shards.is_ok()) << shards.status().to_string();
  ASSERT_EQ(shards->size(), 3u);
  EXPECT_EQ((*shards)[0].path, path("roll") + "/web-000000.tar.zst");
  EXPECT_EQ((*shards)[1].path, path("roll") + "/web-000001.tar.zst");
  EXPECT_EQ((*shards)[2].path, path("roll") + "/web-000002.tar.zst");
  EXPECT_EQ((*shards)[0].samples, 4u);
  EXPECT_EQ((*shards)[1].samples, 4u);
  EXPECT_EQ((*shards)[2].samples, 2u);
  EXPECT_EQ((*shards)[2].tokens, 6u);
  size_t i = 0;
  for (const auto& info : *shards) {
    ShardReaderOptions opt;
    opt.expected_xxh3 = info.xxh3;
    auto back = ShardReader::read_all(info.path, opt);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    for (const auto& s : *back) EXPECT_EQ(s.key, samples[i++].key);
  }
  EXPECT_EQ(i, samples.size());
  for (const auto& e : fs::directory_iterator(path("roll"))) {
    EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
  }
}

TEST_F(ShardTest, RollingOnMaxTarBytes) {
  RollingShardWriter::Options o;
  o.dir = path("bytes");
  o.prefix = "code";
  o.compression = ShardCompression::kNone;
  o.max_samples = 0;
  o.max_tar_bytes = 8 * 1024;
  o.first_index = 7;
  RollingShardWriter w(o);
  // Each sample: one 512-byte header + 3000 bytes of data padded to 3072 = 3584 tar bytes, so
  // two fit in 8 KiB and the third rolls.
  for (int i = 0; i < 5; ++i) {
    ShardSample s;
    s.key = "s" + std::to_string(i);
    s.members.push_back({"txt", std::string(3000, 'a' + i)});
    ASSERT_TRUE(w.add(s).is_ok());
  }
  // One sample larger than the limit gets a shard of its own.
  ShardSample big;
  big.key = "big";
  big.members.push_back({"txt", std::string(20000, 'b')});
  ASSERT_TRUE(w.add(big).is_ok());
  auto shards = w.finish();
  ASSERT_TRUE(shards.is_ok()) << shards.status().to_string();
  ASSERT_EQ(shards->size(), 4u);
  EXPECT_EQ(fs::path((*shards)[0].path).filename(), "code-000007.tar");
  EXPECT_EQ(fs::path((*shards)[3].path).filename(), "code-000010.tar");
  EXPECT_EQ((*shards)[0].samples, 2u);
  EXPECT_EQ((*shards)[1].samples, 2u);
  EXPECT_EQ((*shards)[2].samples, 1u);
  EXPECT_EQ((*shards)[3].samples, 1u);
  // The tar stream: members, then 1024 bytes of end marker, padded to a 10 KiB record.
  EXPECT_EQ((*shards)[0].tar_bytes, 10240u);
  EXPECT_EQ((*shards)[3].tar_bytes, 30720u);
}

TEST_F(ShardTest, RollingFinishWithoutSamplesWritesNothing) {
  RollingShardWriter::Options o;
  o.dir = path("nothing");
  o.prefix = "p";
  RollingShardWriter w(o);
  auto shards = w.finish();
  ASSERT_TRUE(shards.is_ok());
  EXPECT_TRUE(shards->empty());
  EXPECT_FALSE(fs::exists(path("nothing")) && !fs::is_empty(path("nothing")));
}

TEST_F(ShardTest, WriterTarBytesTracksStream) {
  auto w = ShardWriter::open(path("t.tar"), ShardCompression::kNone);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ((*w)->tar_bytes(), 0u);
  ShardSample s;
  s.key = "a";
  s.members.push_back({"txt", std::string(100, 'x')});
  s.members.push_back({"json", std::string(600, 'y')});
  ASSERT_TRUE((*w)->add(s).is_ok());
  EXPECT_EQ((*w)->tar_bytes(), 512u + 512u + 512u + 1024u);
  ASSERT_TRUE((*w)->close().is_ok());
}

// ---- hostile and damaged input -------------------------------------------------------------

TEST_F(ShardTest, ReadsForeignTarWithWebDatasetKeys) {
  std::string t = raw_tar({{"a.txt", "A"},
                           {"a.tokens.npy", npy_encode(std::vector<uint16_t>{5})},
                           {"b.json", "{}"},
                           {"b.txt", "B"}});
  spit(path("f.tar"), t);
  spit(path("f.tar.zst"), zstd_compress(t));
  for (const char* name : {"f.tar", "f.tar.zst"}) {
    auto back = ShardReader::read_all(path(name));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_EQ(back->size(), 2u);
    EXPECT_EQ((*back)[0].key, "a");
    ASSERT_EQ((*back)[0].members.size(), 2u);
    EXPECT_EQ((*back)[0].members[1].ext, "tokens.npy");
    EXPECT_EQ((*back)[1].key, "b");
    EXPECT_EQ((*back)[1].members[0].ext, "json");  // file order, whatever it is
  }
}

TEST_F(ShardTest, RejectsParentAndAbsolutePaths) {
  for (const std::string& bad :
       std::vector<std::string>{"../x.txt", "/etc/x.txt", "a/../../x.txt", "..", "/etc/x"}) {
    std::string t = raw_tar({{"ok.txt", "fine"}, {bad, "evil"}});
    for (bool z : {false, true}) {
      std::string p = path(z ? "p.tar.zst" : "p.tar");
      spit(p, z ? zstd_compress(t) : t);
      EXPECT_DATA_ERROR(read_fully(p), p.c_str(), ("'" + bad + "'").c_str());
    }
  }
  spit(path("abs.tar"), raw_tar({{"/etc/x", "evil"}}));
  EXPECT_DATA_ERROR(read_fully(path("abs.tar")), "absolute");
  spit(path("up.tar"), raw_tar({{"../x", "evil"}}));
  EXPECT_DATA_ERROR(read_fully(path("up.tar")), "'..'");
}

TEST_F(ShardTest, RejectsNonRegularMembers) {
  std::string sym = raw_tar({{"a.txt", "A"}, {"a.json", "", '2', "/etc/passwd"}});
  spit(path("sym.tar"), sym);
  EXPECT_DATA_ERROR(read_fully(path("sym.tar")), path("sym.tar").c_str(), "'a.json'",
                    "symbolic link");
  spit(path("dir.tar"), raw_tar({{"d.txt/", "", '5'}}));
  EXPECT_DATA_ERROR(read_fully(path("dir.tar")), "directory");
  spit(path("hard.tar"), raw_tar({{"a.txt", "A"}, {"a.json", "", '1', "a.txt"}}));
  EXPECT_DATA_ERROR(read_fully(path("hard.tar")), "'a.json'", "hard link");
  spit(path("dev.tar"), raw_tar({{"c.txt", "", '3'}}));
  EXPECT_DATA_ERROR(read_fully(path("dev.tar")), "'c.txt'", "device");
  spit(path("fifo.tar"), raw_tar({{"f.txt", "", '6'}}));
  EXPECT_DATA_ERROR(read_fully(path("fifo.tar")), "'f.txt'", "FIFO");
}

TEST_F(ShardTest, RejectsDuplicateExtAndRepeatedKey) {
  spit(path("dup.tar"), raw_tar({{"a.txt", "1"}, {"a.json", "{}"}, {"a.txt", "2"}}));
  EXPECT_DATA_ERROR(read_fully(path("dup.tar")), path("dup.tar").c_str(), "'a.txt'",
                    "duplicate ext");
  spit(path("again.tar"), raw_tar({{"a.txt", "1"}, {"b.txt", "2"}, {"a.json", "{}"}}));
  EXPECT_DATA_ERROR(read_fully(path("again.tar")), "'a.json'", "appears again");
}

TEST_F(ShardTest, RejectsInvalidNames) {
  for (const std::string& bad : std::vector<std::string>{"noext", "dir/a.txt", "a.", ".txt",
                                                         "a..txt", "a.t xt", "caf\xc3\xa9.txt"}) {
    spit(path("n.tar"), raw_tar({{bad, "x"}}));
    EXPECT_DATA_ERROR(read_fully(path("n.tar")), path("n.tar").c_str(), "member");
  }
}

TEST_F(ShardTest, RejectsOversizedMember) {
  spit(path("big.tar"), raw_tar({{"a.txt", std::string(5000, 'x')}}));
  ShardReaderOptions opt;
  opt.max_member_bytes = 4096;
  EXPECT_DATA_ERROR(read_fully(path("big.tar"), opt), path("big.tar").c_str(), "'a.txt'",
                    "max_member_bytes");
  opt.max_member_bytes = 5000;
  EXPECT_TRUE(read_fully(path("big.tar"), opt).is_ok());
}

// Text that compresses only about 2x, so a shard spans many zstd blocks.
std::vector<ShardSample> make_noisy_samples(int n) {
  std::vector<ShardSample> v;
  uint64_t x = 12345;
  for (int i = 0; i < n; ++i) {
    ShardSample s;
    s.key = "doc" + std::to_string(i);
    std::string text;
    for (int w = 0; w < 400; ++w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += static_cast<char>('a' + (x >> 59));
      text += static_cast<char>('a' + ((x >> 40) & 15));
      text += (x >> 33) % 5 ? ' ' : '\n';
    }
    s.members.push_back({"txt", text});
    s.members.push_back({"json", "{\"id\": " + std::to_string(i) + "}"});
    v.push_back(std::move(s));
  }
  return v;
}

TEST_F(ShardTest, RejectsTruncatedShards) {
  auto samples = make_noisy_samples(400);  // ~700 KB of tar, several zstd blocks
  ASSERT_TRUE(write_shard(path("full.tar.zst"), samples, ShardCompression::kZstd).is_ok());
  ASSERT_TRUE(write_shard(path("full.tar"), samples, ShardCompression::kNone).is_ok());
  for (const char* name : {"full.tar.zst", "full.tar"}) {
    std::string bytes = slurp(path(name));
    std::string cut_path =
        path(std::string("cut") + (std::string(name).ends_with(".zst") ? ".tar.zst" : ".tar"));
    // Every cut, including those at exact member boundaries of the plain tar (libarchive takes
    // those as a clean end), must be an error that names the shard and a member.
    std::vector<size_t> cuts = {1, 100, 512, 1024, 1536};
    for (size_t f = 1; f < 20; ++f) cuts.push_back(bytes.size() * f / 20);
    for (size_t b = 512; b < bytes.size(); b += 512 * 37) cuts.push_back(b);
    cuts.push_back(bytes.size() - 1);
    // In a plain tar, the zero record padding after the end-of-archive marker carries nothing;
    // cutting into it loses no data, so only cuts before the marker's end must fail.
    size_t last_nonzero = bytes.find_last_not_of('\0');
    size_t complete_at = (last_nonzero / 512 + 1) * 512 + 1024;
    bool plain = !std::string(name).ends_with(".zst");
    for (size_t cut : cuts) {
      if (cut >= bytes.size() || (plain && cut >= complete_at)) continue;
      spit(cut_path, bytes.substr(0, cut));
      Status st = read_fully(cut_path);
      EXPECT_EQ(st.code(), StatusCode::kData)
          << name << " cut at " << cut << ": " << st.to_string();
      EXPECT_NE(st.message().find(cut_path), std::string::npos) << st.message();
      // zstd emits nothing of a block until the block is whole, so a cut in the first block
      // (128 KiB of tar) fails before any member; past it, the member is named.
      if (cut > bytes.size() / 4) {
        EXPECT_NE(st.message().find("member"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("'doc"), std::string::npos) << st.message();
      }
    }
  }
}

TEST_F(ShardTest, RejectsTarWithoutEndMarkerOrWithTrailingData) {
  std::string t = raw_tar({{"a.txt", "A"}, {"b.txt", "B"}}, /*end_marker=*/false);
  spit(path("noend.tar"), t);
  EXPECT_DATA_ERROR(read_fully(path("noend.tar")), "end-of-archive", "'b.txt'");
  spit(path("half.tar"), t + std::string(512, '\0'));
  EXPECT_DATA_ERROR(read_fully(path("half.tar")), "end-of-archive");
  // Two archives glued together: the second would silently vanish behind the first end marker.
  std::string two = raw_tar({{"a.txt", "A"}}) + raw_tar({{"b.txt", "B"}});
  spit(path("two.tar"), two);
  EXPECT_DATA_ERROR(read_fully(path("two.tar")), "follows the end-of-archive");
  spit(path("two.tar.zst"),
       zstd_compress(raw_tar({{"a.txt", "A"}})) + zstd_compress(raw_tar({{"b.txt", "B"}})));
  EXPECT_DATA_ERROR(read_fully(path("two.tar.zst")), "follows the end-of-archive");
  // Plain zero padding after the marker (as tar's 10 KiB records leave) is fine.
  spit(path("pad.tar"), raw_tar({{"a.txt", "A"}}) + std::string(20 * 512, '\0'));
  EXPECT_TRUE(read_fully(path("pad.tar")).is_ok());
}

TEST_F(ShardTest, FlippedByteIsCaught) {
  auto info = write_shard(path("flip.tar.zst"), make_samples(30), ShardCompression::kZstd);
  ASSERT_TRUE(info.is_ok());
  std::string bytes = slurp(path("flip.tar.zst"));
  ShardReaderOptions opt;
  opt.expected_xxh3 = info->xxh3;
  for (size_t f = 1; f < 10; ++f) {
    std::string bad = bytes;
    bad[bad.size() * f / 10] ^= 0x20;
    spit(path("flipped.tar.zst"), bad);
    // With the manifest checksum: always caught, before any sample is returned.
    EXPECT_DATA_ERROR(read_fully(path("flipped.tar.zst"), opt), path("flipped.tar.zst").c_str(),
                      "checksum mismatch", "member");
    // Without it, zstd's own frame checksum still catches it.
    EXPECT_EQ(read_fully(path("flipped.tar.zst")).code(), StatusCode::kData);
  }
  // Plain tar: a flipped header byte breaks the header checksum; a flipped data byte is only
  // visible to the manifest checksum.
  auto plain = write_shard(path("flip.tar"), make_samples(5), ShardCompression::kNone);
  ASSERT_TRUE(plain.is_ok());
  std::string tar = slurp(path("flip.tar"));
  std::string bad = tar;
  bad[600 + 512] ^= 0x01;  // inside a later member's header or data
  bad[512 * 3 + 10] ^= 0x01;
  spit(path("flipped.tar"), bad);
  opt.expected_xxh3 = plain->xxh3;
  EXPECT_DATA_ERROR(read_fully(path("flipped.tar"), opt), path("flipped.tar").c_str(),
                    "checksum mismatch", "member");
  bad = tar;
  bad[10] ^= 0x01;  // the first header's name
  spit(path("flipped.tar"), bad);
  EXPECT_DATA_ERROR(read_fully(path("flipped.tar")), path("flipped.tar").c_str());
}

TEST_F(ShardTest, CorruptZstdNamesMember) {
  auto info = write_shard(path("c.tar.zst"), make_samples(200), ShardCompression::kZstd);
  ASSERT_TRUE(info.is_ok());
  std::string bytes = slurp(path("c.tar.zst"));
  // Overwrite a run in the middle of the compressed stream.
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 64; ++i) bytes[i] = '\x55';
  spit(path("c2.tar.zst"), bytes);
  EXPECT_DATA_ERROR(read_fully(path("c2.tar.zst")), path("c2.tar.zst").c_str(), "member");
  // Not zstd at all.
  spit(path("c3.tar.zst"), std::string(5000, 'z'));
  EXPECT_DATA_ERROR(read_fully(path("c3.tar.zst")), path("c3.tar.zst").c_str());
  // Not a tar at all.
  spit(path("c4.tar"), std::string(5000, 'z'));
  EXPECT_DATA_ERROR(read_fully(path("c4.tar")), path("c4.tar").c_str());
  // An empty file.
  spit(path("c5.tar.zst"), "");
  EXPECT_EQ(read_fully(path("c5.tar.zst")).code(), StatusCode::kData);
}

TEST_F(ShardTest, ErrorIsSticky) {
  spit(path("s.tar"), raw_tar({{"a.txt", "1"}, {"/abs.txt", "2"}, {"c.txt", "3"}}));
  auto r = ShardReader::open(path("s.tar"));
  ASSERT_TRUE(r.is_ok());
  ShardSample s;
  Result<bool> first = (*r)->next(&s);
  EXPECT_FALSE(first.is_ok());  // the bad member is read while closing sample 'a'
  EXPECT_FALSE((*r)->next(&s).is_ok());
}

TEST_F(ShardTest, MissingFileAndBadPath) {
  EXPECT_EQ(read_fully(path("missing.tar.zst")).code(), StatusCode::kNotFound);
  EXPECT_EQ(read_fully(path("x.zip")).code(), StatusCode::kData);
  fs::create_directories(path("dir.tar"));
  EXPECT_EQ(read_fully(path("dir.tar")).code(), StatusCode::kData);
}

// ---- crash safety --------------------------------------------------------------------------

// A child writes shards slowly and is SIGKILLed mid-write: only complete shards (renamed) and
// the .partial of the one in progress may exist, and every complete one must read cleanly.
TEST_F(ShardTest, KilledWriterLeavesOnlyPartial) {
  std::string out = path("killed");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    RollingShardWriter::Options o;
    o.dir = out;
    o.prefix = "k";
    o.max_samples = 0;
    o.max_tar_bytes = 16 << 20;
    RollingShardWriter w(o);
    std::string text(64 << 10, 'x');
    for (uint64_t i = 0;; ++i) {
      ShardSample s;
      s.key = "s" + std::to_string(i);
      text[i % text.size()] = static_cast<char>('a' + i % 26);
      // 900 large samples fill 3 shards (255 per 16 MiB) and start a fourth whose first chunk
      // (8 MiB) goes to the background writer; after that, small samples keep the fourth shard
      // open (slowly) until the kill.
      s.members.push_back({"txt", i <= 900 ? text : std::to_string(i)});
      if (!w.add(s).is_ok()) ::_exit(3);
      if (i == 900) (void)!::write(ready[1], "r", 1);
      if (i > 900) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  // Shards are written in the background: wait until the three full ones are complete and the
  // fourth exists as .partial, then kill the writer mid-shard.
  auto count = [&](const char* suffix) {
    int n = 0;
    std::error_code ec;  // the folder appears with the first shard
    for (const auto& e : fs::directory_iterator(out, ec)) n += e.path().string().ends_with(suffix);
    return n;
  };
  for (int waited = 0; waited < 60000 && (count(".tar.zst") < 3 || count(".partial") < 1);
       waited += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(ready[0]);
  ASSERT_TRUE(WIFSIGNALED(status));
  int partial = 0, complete = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    std::string name = e.path().filename().string();
    if (name.ends_with(".partial")) {
      ++partial;
      // The unfinished shard does not read as a complete one.
      std::string renamed = path("as_final.tar.zst");
      fs::copy_file(e.path(), renamed, fs::copy_options::overwrite_existing);
      EXPECT_EQ(read_fully(renamed).code(), StatusCode::kData);
    } else {
      ASSERT_TRUE(name.ends_with(".tar.zst")) << name;
      ++complete;
      EXPECT_TRUE(read_fully(e.path().string()).is_ok()) << name;
    }
  }
  EXPECT_EQ(partial, 1);
  EXPECT_EQ(complete, 3);
}

}  // namespace
}  // namespace kiln
