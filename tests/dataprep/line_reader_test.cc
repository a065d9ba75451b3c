#include "dataprep/ingest/line_reader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/compress_util.h"

namespace kiln::prep {
namespace {

class LineReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("kiln_line_reader_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string gzip(const std::string& data) { return testing_compress::gzip(data); }
  static std::string zstd(const std::string& data) { return testing_compress::zstd(data); }
  struct Ev {
    LineEventKind kind;
    std::string text;
    uint64_t line, length;
  };
  static std::vector<Ev> read_all(const std::string& path, InputCompression c, size_t max_line) {
    auto r = LineReader::open(path, c, max_line);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    std::vector<Ev> evs;
    for (;;) {
      LineEvent ev;
      EXPECT_TRUE((*r)->next(&ev).is_ok());
      if (ev.kind == LineEventKind::kEnd) break;
      evs.push_back({ev.kind, std::string(ev.text), ev.line, ev.length});
    }
    return evs;
  }
  std::filesystem::path dir_;
};

TEST_F(LineReaderTest, PlainLines) {
  auto evs = read_all(write("a.jsonl", "one\r\ntwo\n\nthree"), InputCompression::kNone, 100);
  ASSERT_EQ(evs.size(), 4u);
  EXPECT_EQ(evs[0].text, "one");
  EXPECT_EQ(evs[1].text, "two");
  EXPECT_EQ(evs[2].text, "");
  EXPECT_EQ(evs[3].text, "three");
  EXPECT_EQ(evs[3].line, 4u);
}

TEST_F(LineReaderTest, OverlongLineIsSkippedNotLoaded) {
  // A 3 MiB line with a 1 KiB limit: reported with its length; the next line is intact.
  std::string big(3 << 20, 'x');
  auto evs =
      read_all(write("b.jsonl", "short\n" + big + "\nafter\n"), InputCompression::kNone, 1024);
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[1].kind, LineEventKind::kTooLong);
  EXPECT_EQ(evs[1].length, big.size());
  EXPECT_EQ(evs[1].line, 2u);
  EXPECT_EQ(evs[2].text, "after");
  // Also as the last line without a newline.
  evs = read_all(write("c.jsonl", "a\n" + big), InputCompression::kNone, 1024);
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs[1].kind, LineEventKind::kTooLong);
  EXPECT_EQ(evs[1].length, big.size());
}

TEST_F(LineReaderTest, GzipWholeConcatenatedTruncatedCorrupt) {
  std::string data;
  for (int i = 0; i < 5000; ++i) data += "line " + std::to_string(i) + "\n";
  auto evs = read_all(write("d.jsonl.gz", gzip(data)), InputCompression::kGzip, 100);
  ASSERT_EQ(evs.size(), 5000u);
  EXPECT_EQ(evs[4999].text, "line 4999");
  evs = read_all(write("e.jsonl.gz", gzip("a\nb\n") + gzip("c\n")), InputCompression::kGzip, 100);
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[2].text, "c");
  std::string gz = gzip(data);
  evs = read_all(write("f.jsonl.gz", gz.substr(0, gz.size() / 2)), InputCompression::kGzip, 100);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().kind, LineEventKind::kTruncated);
  EXPECT_GT(evs.size(), 10u);
  for (size_t i = 0; i + 1 < evs.size(); ++i) EXPECT_EQ(evs[i].kind, LineEventKind::kLine);
  std::string bad = gz;
  for (size_t i = 20; i < 60; ++i) bad[i] ^= 0x5a;
  evs = read_all(write("g.jsonl.gz", bad), InputCompression::kGzip, 100);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().kind, LineEventKind::kCorrupt);
}

TEST_F(LineReaderTest, ZstdWholeAndTruncated) {
  std::string data;
  for (int i = 0; i < 20000; ++i) data += "{\"text\": \"row " + std::to_string(i) + "\"}\n";
  std::string z = zstd(data);
  auto evs = read_all(write("h.jsonl.zst", z), InputCompression::kZstd, 100);
  ASSERT_EQ(evs.size(), 20000u);
  evs = read_all(write("i.jsonl.zst", z.substr(0, z.size() - 7)), InputCompression::kZstd, 100);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().kind, LineEventKind::kTruncated);
  evs = read_all(write("j.jsonl.zst", zstd("x\n") + zstd("y\n")), InputCompression::kZstd, 100);
  ASSERT_EQ(evs.size(), 2u);
}

TEST_F(LineReaderTest, ReadAllDocument) {
  auto r = LineReader::open(write("k.txt", "whole\nfile\n"), InputCompression::kNone, 100);
  ASSERT_TRUE(r.is_ok());
  LineEvent ev;
  ASSERT_TRUE((*r)->read_all(&ev).is_ok());
  EXPECT_EQ(ev.kind, LineEventKind::kLine);
  EXPECT_EQ(ev.text, "whole\nfile\n");
  r = LineReader::open(write("l.txt", std::string(5000, 'y')), InputCompression::kNone, 100);
  ASSERT_TRUE((*r)->read_all(&ev).is_ok());
  EXPECT_EQ(ev.kind, LineEventKind::kTooLong);
  EXPECT_EQ(ev.length, 5000u);
}

}  // namespace
}  // namespace kiln::prep
