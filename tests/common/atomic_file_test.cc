// Atomic file output (temp + fsync + rename) and the progress reporter's counting and text.
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "common/hash.h"
#include "common/progress.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_atomic_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  size_t entries() const {
    size_t n = 0;
    for (auto it = fs::recursive_directory_iterator(dir_); it != fs::recursive_directory_iterator();
         ++it) {
      if (it->is_regular_file()) ++n;
    }
    return n;
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WriteReadAndReplace) {
  ASSERT_TRUE(write_file_atomic(path("a.txt"), "first").is_ok());
  EXPECT_EQ(*read_file(path("a.txt")), "first");
  ASSERT_TRUE(write_file_atomic(path("a.txt"), "second, longer").is_ok());
  EXPECT_EQ(*read_file(path("a.txt")), "second, longer");
  EXPECT_EQ(entries(), 1u);  // no temporaries left behind
  // Binary data and empty files.
  std::string bin("\0\x01\xff", 3);
  ASSERT_TRUE(write_file_atomic(path("b.bin"), bin).is_ok());
  EXPECT_EQ(*read_file(path("b.bin")), bin);
  ASSERT_TRUE(write_file_atomic(path("empty"), "").is_ok());
  EXPECT_EQ(*read_file(path("empty")), "");
}

TEST_F(AtomicFileTest, CreatesParentDirectories) {
  ASSERT_TRUE(write_file_atomic(path("x/y/z.json"), "{}").is_ok());
  EXPECT_EQ(*read_file(path("x/y/z.json")), "{}");
}

TEST_F(AtomicFileTest, UncommittedLeavesTargetUntouched) {
  ASSERT_TRUE(write_file_atomic(path("keep.txt"), "old").is_ok());
  {
    AtomicFile f;
    ASSERT_TRUE(f.open(path("keep.txt")).is_ok());
    ASSERT_TRUE(f.write("new content").is_ok());
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_NE(f.temp_path(), path("keep.txt"));
    EXPECT_EQ(*read_file(path("keep.txt")), "old");  // not visible before commit
  }
  EXPECT_EQ(*read_file(path("keep.txt")), "old");
  EXPECT_EQ(entries(), 1u);  // the temporary is gone

  AtomicFile g;
  ASSERT_TRUE(g.open(path("keep.txt")).is_ok());
  ASSERT_TRUE(g.write("aborted").is_ok());
  std::string temp = g.temp_path();
  g.abort();
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(*read_file(path("keep.txt")), "old");
}

TEST_F(AtomicFileTest, StreamedWritesCommit) {
  AtomicFile f;
  ASSERT_TRUE(f.open(path("s.txt")).is_ok());
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(f.write(std::to_string(i) + "\n").is_ok());
  ASSERT_TRUE(f.commit().is_ok());
  std::string text = *read_file(path("s.txt"));
  EXPECT_EQ(text.substr(0, 4), "0\n1\n");
  EXPECT_EQ(text.substr(text.size() - 4), "999\n");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFileTest, Errors) {
  Result<std::string> missing = read_file(path("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().to_string().find("missing"), std::string::npos);
  // A path whose parent is a file cannot be created.
  ASSERT_TRUE(write_file_atomic(path("file"), "x").is_ok());
  EXPECT_FALSE(write_file_atomic(path("file/child"), "y").is_ok());
  EXPECT_FALSE(fsync_dir(path("no/such/dir")).is_ok());
  EXPECT_TRUE(fsync_dir(dir_.string()).is_ok());
}

TEST_F(AtomicFileTest, RenameDurableAndFileHash) {
  ASSERT_TRUE(write_file_atomic(path("from"), "payload").is_ok());
  ASSERT_TRUE(rename_durable(path("from"), path("to")).is_ok());
  EXPECT_FALSE(fs::exists(path("from")));
  EXPECT_EQ(*read_file(path("to")), "payload");
  Result<uint64_t> h = xxh3_file(path("to"));
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(*h, xxh3_64("payload"));
  EXPECT_EQ(hex64(*h).size(), 16u);
  EXPECT_EQ(*parse_hex64(hex64(*h)), *h);
  EXPECT_FALSE(rename_durable(path("absent"), path("to2")).is_ok());
}

TEST_F(AtomicFileTest, RemovesStaleTemporariesOnly) {
  for (const char* name : {"a.json.tmp.123", "sub/deep/b.tar.zst.tmp.9", "keep.json", "keep.tmp.x",
                           "keep.tmp.", "sub/keep.tmp", "sub/tmp.77"}) {
    ASSERT_TRUE(write_file_atomic(path(name), "x").is_ok()) << name;
  }
  auto removed = remove_stale_temporaries(dir_.string());
  ASSERT_TRUE(removed.is_ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, 2u);
  EXPECT_FALSE(fs::exists(path("a.json.tmp.123")));
  EXPECT_FALSE(fs::exists(path("sub/deep/b.tar.zst.tmp.9")));
  EXPECT_EQ(entries(), 5u);
  EXPECT_EQ(*remove_stale_temporaries(path("no-such-dir")), 0u);
}

TEST(ProgressTest, CountsFromManyThreads) {
  Progress p("test", 0, "docs", 3600);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) p.add();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(p.count(), 40000u);
  p.add(5);
  EXPECT_EQ(p.count(), 40005u);
  std::string line = p.line();
  EXPECT_NE(line.find("test"), std::string::npos) << line;
  EXPECT_NE(line.find("40005"), std::string::npos) << line;
  EXPECT_NE(line.find("docs"), std::string::npos) << line;
  p.finish();
  p.finish();  // idempotent
}

TEST(ProgressTest, LineShowsTotalShareAndEta) {
  Progress p("prep", 200, "docs", 3600);
  p.add(50);
  std::string line = p.line();
  EXPECT_NE(line.find("50/200"), std::string::npos) << line;
  EXPECT_NE(line.find("25.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA"), std::string::npos) << line;
}

}  // namespace
}  // namespace kiln
