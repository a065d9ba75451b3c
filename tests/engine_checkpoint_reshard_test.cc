// engine/checkpoint.h: resuming on another tensor-parallel size reads the source TP ranks' files
// one at a time and keeps only the elements this rank's slices share with them - the values are
// the whole tensors' slices, and the host memory held is at most one source TP rank's states.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/params.h"

namespace kiln::engine {
namespace {

namespace fs = std::filesystem;

// 6 heads and a vocabulary of 96: splits over 1, 2 and 3 ranks whose slices overlap partly.
ModelConfig model() {
  ModelConfig m;
  m.vocab_size = 96;
  m.d_model = 24;
  m.n_layers = 2;
  m.n_heads = 6;
  m.seq_len = 8;
  return m;
}

// The whole model's states: initialised weights, moments a function of (tensor, element).
void fill_whole(ParamStore& whole) {
  whole.init(1234);
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const int ti = static_cast<int>(i);
    for (size_t k = 0; k < whole.tensors()[i].numel; ++k) {
      whole.exp_avg(ti)[k] = 0.001f * static_cast<float>(k) + static_cast<float>(i);
      whole.exp_avg_sq(ti)[k] = std::sqrt(static_cast<float>(k + i));
    }
  }
}

// A checkpoint of the whole model written by `tp` tensor-parallel ranks (one process with tp 1),
// as the trainer writes it; in a child process, so the parent never holds the whole model.
std::string write_checkpoint(int tp) {
  const fs::path path = fs::temp_directory_path() / ("kiln_reshard_" + std::to_string(getpid()) +
                                                      "_tp" + std::to_string(tp));
  fs::remove_all(path);
  const std::string run = path.string();
  const pid_t pid = fork();
  if (pid == 0) {
    ParamStore whole(model(), Precision::kFp32);
    fill_whole(whole);
    TrainerState st;
    st.step = 3;
    Status s = Status::ok();
    if (tp == 1) {
      s = save_checkpoint(run, whole, st, "x: 1\n", 0, CheckpointLayout{});
    } else {
      auto tmp = begin_checkpoint(run, st.step);
      std::vector<uint64_t> hashes;
      std::unique_ptr<ParamStore> first;
      for (int t = 0; t < tp && tmp.is_ok() && s.is_ok(); ++t) {
        auto slice = std::make_unique<ParamStore>(model(), Precision::kFp32, false, nullptr,
                                                  TpShard{t, tp});
        for (size_t i = 0; i < whole.tensors().size(); ++i) {
          const int ti = static_cast<int>(i);
          const ParamTensor& pt = slice->tensors()[i];
          copy_to_shard(pt, {t, tp}, whole.master(ti), slice->master(ti));
          copy_to_shard(pt, {t, tp}, whole.exp_avg(ti), slice->exp_avg(ti));
          copy_to_shard(pt, {t, tp}, whole.exp_avg_sq(ti), slice->exp_avg_sq(ti));
        }
        std::deque<std::vector<float>> scratch;
        auto h = write_checkpoint_partition(*tmp, 0, 1, unit_partition(*slice, &scratch), t, tp);
        if (!h.is_ok()) s = h.status();
        else hashes.push_back(*h);
        if (t == 0) first = std::move(slice);
      }
      if (!tmp.is_ok()) s = tmp.status();
      CheckpointLayout lay;
      lay.world = lay.tp = lay.tp_partitions = tp;
      if (s.is_ok()) s = finish_checkpoint(run, *tmp, *first, st, "x: 1\n", 0, lay, hashes);
    }
    if (!s.is_ok()) std::fprintf(stderr, "writing: %s\n", s.to_string().c_str());
    std::_Exit(s.is_ok() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the writer failed";
  return run;
}

// Loads the checkpoint into rank `rank` of `tp`: the most host memory held beyond the rank's
// own slices is at most one source TP rank's store (weights, moments and a gradient buffer that
// is freed before reading), and the values are the whole tensors' slices.
void check_load_here(const std::string& run, int from_tp, int rank, int tp, int64_t sources) {
  SCOPED_TRACE("tp " + std::to_string(from_tp) + " -> rank " + std::to_string(rank) + " of " +
               std::to_string(tp));
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  Backend& host = cpu_backend();
  ParamStore mine(model(), Precision::kFp32, false, nullptr, TpShard{rank, tp});
  const uint64_t before = host.memory().in_use;
  const bool measurable = host.memory().peak == before;  // nothing larger held before
  TrainerState st;
  LoadStats stats;
  ASSERT_TRUE(load_checkpoint(*dir, &mine, &st, nullptr, &stats).is_ok());
  const uint64_t peak = host.memory().peak - before;
  EXPECT_EQ(host.memory().in_use, before) << "the load kept memory";
  // One source TP rank's store (the largest is TP rank 0's: replicated tensors on every rank).
  const uint64_t piece =
      ParamStore(model(), Precision::kFp32, false, nullptr, TpShard{0, from_tp}).state_bytes();
  const uint64_t whole_bytes = ParamStore(model(), Precision::kFp32).state_bytes();
  if (measurable) {
    EXPECT_LE(peak, piece) << "held more than one source TP rank's states (whole model: "
                           << whole_bytes << " bytes)";
  } else {
    ADD_FAILURE() << "run this test alone (ctest does): an earlier test raised the peak";
  }
  EXPECT_EQ(stats.reshard_host_bytes, piece / 4 * 3) << "weights and both moments of one source";
  EXPECT_EQ(stats.reshard_sources, sources) << "read only the TP ranks that hold its slices";
  ParamStore whole(model(), Precision::kFp32);
  fill_whole(whole);
  std::vector<float> want;
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const int ti = static_cast<int>(i);
    const ParamTensor& pt = mine.tensors()[i];
    want.assign(pt.numel, -1.0f);
    for (auto [w, got, name] : {std::tuple{whole.master(ti), mine.master(ti), "master"},
                                std::tuple{whole.exp_avg(ti), mine.exp_avg(ti), "exp_avg"},
                                std::tuple{whole.exp_avg_sq(ti), mine.exp_avg_sq(ti), "exp_avg_sq"}}) {
      copy_to_shard(pt, {rank, tp}, w, want.data());
      for (size_t k = 0; k < pt.numel; ++k) {
        ASSERT_EQ(got[k], want[k]) << pt.name << "." << name << "[" << k << "]";
      }
    }
  }
}

// check_load_here in a child process: the CPU backend's peak counter then starts from this
// process's, which holds nothing (every load is measured on its own).
void check_load(const std::string& run, int from_tp, int rank, int tp, int64_t sources) {
  const pid_t pid = fork();
  if (pid == 0) {
    check_load_here(run, from_tp, rank, tp, sources);
    std::fflush(stdout);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "loading tp " << from_tp << " into rank " << rank << " of " << tp
      << " failed (the messages are above)";
}

TEST(CheckpointReshard, TwoToThreeRanksHoldsOneSourceRankAtATime) {
  const std::string run = write_checkpoint(2);
  // Rank 0 of 3 lies inside source rank 0, rank 1 straddles both, rank 2 inside source 1.
  check_load(run, 2, 0, 3, 1);
  check_load(run, 2, 1, 3, 2);
  check_load(run, 2, 2, 3, 1);
}

TEST(CheckpointReshard, ThreeToTwoRanks) {
  const std::string run = write_checkpoint(3);
  check_load(run, 3, 0, 2, 2);
  check_load(run, 3, 1, 2, 2);
}

TEST(CheckpointReshard, TwoRanksToOneProcessAndBack) {
  check_load(write_checkpoint(2), 2, 0, 1, 2);
  const std::string one = write_checkpoint(1);
  for (int r = 0; r < 2; ++r) check_load(one, 1, r, 2, 1);
}

}  // namespace
}  // namespace kiln::engine
