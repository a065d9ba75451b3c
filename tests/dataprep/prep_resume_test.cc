// `kiln prep` as a user runs it: kill -9 at many points (deterministic crash points and timed
// kills) and the same command again gives byte-identical output; exit codes; mpirun.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "tests/dataprep/prep_test_util.h"
#include "tests/test_paths.h"

namespace kiln {
namespace {
using namespace testing_prep;

class PrepCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir("prep_cli");
    CorpusGen gen(5);
    auto docs = gen.make(900, 0.3, {0.0, 0.005, 0.01, 0.03, 0.2}, 2);
    write_corpus(docs, *tmp_ / "in", 6);
    write_file(*tmp_ / "in/bad.jsonl", "{\"text\": 3}\n{oops\n");
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string cmd(const std::string& out, const std::string& extra = "") {
    return std::string(kiln::test::kiln_binary()) + " prep --input " + *tmp_ / "in" + " --output " +
           out + " --shard-samples 60 --vocab-size 300 --set tokenizer.train_bytes=200000 " +
           extra + " >/dev/null 2>" + out + ".log";
  }
  static const std::map<std::string, std::string>& reference() {
    static std::map<std::string, std::string> ref;
    if (ref.empty()) {
      std::string out = *tmp_ / "ref";
      EXPECT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 " + cmd(out)), 0) << read_text(out + ".log");
      ref = output_tree(out);
    }
    return ref;
  }
  static TempDir* tmp_;
};
TempDir* PrepCli::tmp_ = nullptr;

TEST_F(PrepCli, KillAtAnyStageThenResumeIsByteIdentical) {
  const auto& ref = reference();
  ASSERT_GT(ref.size(), 5u);
  ASSERT_TRUE(ref.count("tokenizer.json"));
  const char* points[] = {"scan-batch:2",  "scan-unit:3",    "stage-scan",    "stage-exact",
                          "stage-dedup",   "stage-annotate", "write-doc:1",   "write-doc:70",
                          "write-doc:700", "stage-write",    "final-removed", "final-cleanup"};
  int n = 0;
  for (const char* point : points) {
    std::string out = *tmp_ / ("crash" + std::to_string(n++));
    int rc = run_shell("KILN_PREP_UNIT_FILES=1 KILN_PREP_CRASH_AT=" + std::string(point) + " " +
                       cmd(out));
    EXPECT_EQ(rc, 128 + SIGKILL) << point << ": the crash point was not reached";
    // A kill inside an atomic write leaves its temporary behind; the rerun must clear it.
    write_file(out + "/rejects/rejects-00000.jsonl.tmp.4242", "torn");
    rc = run_shell("KILN_PREP_UNIT_FILES=1 " + cmd(out));
    ASSERT_EQ(rc, 0) << point << ": " << read_text(out + ".log");
    // (Units are scanned in parallel, so a kill inside the scan may find none finished yet.)
    // (final-cleanup: the dataset was complete; the rerun only finishes the cleanup.)
    if (std::string(point).rfind("scan-batch", 0) != 0 && std::string(point) != "final-cleanup")
      EXPECT_NE(read_text(out + ".log").find("resuming"), std::string::npos) << point;
    auto tree = output_tree(out);
    EXPECT_EQ(tree.size(), ref.size()) << point;
    for (const auto& [path, bytes] : ref) {
      auto it = tree.find(path);
      ASSERT_NE(it, tree.end()) << point << ": missing " << path;
      EXPECT_TRUE(it->second == bytes) << point << ": " << path << " differs";
    }
  }
}

// Found by UBSan (full_disk_prep_enospc under ASan + UBSan): resuming a prep whose corpus has no
// exact duplicates restored the empty exact-stage blob with memcpy(nullptr, ..., 0), which is
// undefined (likewise an empty removed list). A corpus without duplicates, killed after the exact
// and after the dedup stage, resumes to the uninterrupted run's output.
TEST_F(PrepCli, ResumeWithNoDuplicatesRestoresEmptyDedupStages) {
  CorpusGen gen(11);
  write_corpus(gen.make(120, 0.2, {0.0}, 0), *tmp_ / "nodup_in", 2);
  auto command = [&](const std::string& out) {
    return std::string(kiln::test::kiln_binary()) + " prep --input " + *tmp_ / "nodup_in" +
           " --output " + out + " --shard-samples 60 --vocab-size 300" +
           " --set tokenizer.train_bytes=200000 >/dev/null 2>" + out + ".log";
  };
  const std::string ref_out = *tmp_ / "nodup_ref";
  ASSERT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 " + command(ref_out)), 0)
      << read_text(ref_out + ".log");
  const auto ref = output_tree(ref_out);
  for (const std::string point : {"stage-exact", "stage-dedup"}) {
    const std::string out = *tmp_ / ("nodup_" + point);
    EXPECT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 KILN_PREP_CRASH_AT=" + point + " " + command(out)),
              128 + SIGKILL)
        << point;
    ASSERT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 " + command(out)), 0)
        << point << ": " << read_text(out + ".log");
    EXPECT_NE(read_text(out + ".log").find("resuming"), std::string::npos) << point;
    EXPECT_TRUE(output_tree(out) == ref) << point << ": the resumed output differs";
  }
}

TEST_F(PrepCli, TimedKillsThenResume) {
  const auto& ref = reference();
  int n = 0;
  for (int ms : {40, 150, 400, 900}) {
    std::string out = *tmp_ / ("timed" + std::to_string(n++));
    std::string c = cmd(out);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("KILN_PREP_UNIT_FILES", "1", 1);
      ::execl("/bin/sh", "sh", "-c", ("exec " + c).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ASSERT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 " + c), 0) << read_text(out + ".log");
    EXPECT_TRUE(output_tree(out) == ref) << "killed after " << ms << " ms";
  }
}

// Preemption: SIGTERM (raised by the process itself at a named point, so the test is exact)
// stops prep at the next safe point with a message; the same command resumes to the
// uninterrupted output. Points inside the scan stop after the running units; later points stop
// after the stage that is running.
TEST_F(PrepCli, StopSignalStopsAtSafePointThenRerunResumes) {
  const auto& ref = reference();
  int n = 0;
  for (const char* point : {"scan-unit:2", "stage-exact", "write-doc:70"}) {
    std::string out = *tmp_ / ("sigterm" + std::to_string(n++));
    int rc = run_shell("KILN_PREP_UNIT_FILES=1 KILN_PREP_CRASH_SIGNAL=" + std::to_string(SIGTERM) +
                       " KILN_PREP_CRASH_AT=" + std::string(point) + " " + cmd(out));
    std::string log = read_text(out + ".log");
    EXPECT_EQ(rc, 1) << point << ": " << log;
    EXPECT_NE(log.find("stopped by SIGTERM"), std::string::npos) << point << ": " << log;
    EXPECT_NE(log.find("run the same command again"), std::string::npos) << point;
    EXPECT_FALSE(fs::exists(out + "/manifest.json")) << point;
    ASSERT_EQ(run_shell("KILN_PREP_UNIT_FILES=1 " + cmd(out)), 0)
        << point << ": " << read_text(out + ".log");
    EXPECT_NE(read_text(out + ".log").find("resuming"), std::string::npos) << point;
    EXPECT_TRUE(output_tree(out) == ref) << point;
  }
}

TEST_F(PrepCli, ExitCodes) {
  std::string out = *tmp_ / "exit3";
  // 2 of ~2000 records are bad; a limit below that share exits 3 naming the file.
  EXPECT_EQ(run_shell(cmd(out, "--tokenizer none --max-reject-fraction 0.0001")), 3);
  std::string log = read_text(out + ".log");
  EXPECT_NE(log.find("bad.jsonl: 2 of 2 rejected"), std::string::npos) << log;
  EXPECT_EQ(run_shell(cmd(*tmp_ / "exit2", "--threshold 1.5")), 2);
  EXPECT_NE(read_text(*tmp_ / "exit2.log").find("dedup.threshold"), std::string::npos);
  EXPECT_EQ(run_shell(cmd(*tmp_ / "exit2b", "--set dedup.tresholds=1")), 2);
  EXPECT_NE(read_text(*tmp_ / "exit2b.log").find("did you mean"), std::string::npos);
  EXPECT_EQ(run_shell(std::string(kiln::test::kiln_binary()) +
                      " prep --input /no/such/path --output " + *tmp_ / "x 2>/dev/null"),
            2);
  std::string help = *tmp_ / "help.txt";
  ASSERT_EQ(run_shell(std::string(kiln::test::kiln_binary()) + " prep --help > " + help), 0);
  std::string h = read_text(help);
  for (const char* flag : {"--input", "--output", "--threshold", "--memory", "--threads",
                           "--config", "--set", "removed.jsonl", "mpirun", "Resume"})
    EXPECT_NE(h.find(flag), std::string::npos) << flag;
}

TEST_F(PrepCli, MpirunMatchesSingleProcessAndResumes) {
  if (run_shell("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string mpi =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "mpirun -np 2 --oversubscribe ";
  std::string one = *tmp_ / "np1", two = *tmp_ / "np2";
  ASSERT_EQ(run_shell(cmd(one, "--tokenizer none")), 0);
  ASSERT_EQ(run_shell(mpi + cmd(two, "--tokenizer none")), 0) << read_text(two + ".log");
  if (read_text(two + ".log").find("2 rank(s)") == std::string::npos)
    GTEST_SKIP() << "kiln was built without MPI";
  EXPECT_EQ(read_text(one + "/dedup/removed.jsonl"), read_text(two + "/dedup/removed.jsonl"));
  auto s1 = nlohmann::json::parse(read_text(one + "/stats.json"));
  auto s2 = nlohmann::json::parse(read_text(two + "/stats.json"));
  for (auto* s : {&s1, &s2}) {
    s->erase("timings_s");
    s->erase("cpu_s");
    s->erase("ranks");
  }
  EXPECT_EQ(s1, s2);
  // Killed mid-run under mpirun, the same command resumes to the uninterrupted 2-rank output.
  auto ref2 = output_tree(two);
  for (const char* point : {"stage-dedup", "write-doc:40"}) {
    std::string out = *tmp_ / (std::string("np2-") + point);
    std::string c = cmd(out, "--tokenizer none");
    EXPECT_NE(run_shell("KILN_PREP_CRASH_AT=" + std::string(point) + " " + mpi + c), 0);
    ASSERT_EQ(run_shell(mpi + c), 0) << read_text(out + ".log");
    EXPECT_NE(read_text(out + ".log").find("resuming"), std::string::npos) << point;
    EXPECT_TRUE(output_tree(out) == ref2) << point;
  }
}

}  // namespace
}  // namespace kiln
