// engine/checkpoint/checkpoint.h: resuming on another tensor-parallel size reads, from the source
// TP ranks' files, only the byte ranges of the elements this rank's slices share with them - the
// values are the whole tensors' slices, and nothing but the rank's own slices is held
// (CheckpointReader).
#include "engine/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/params.h"
#include "engine/parallel/layout_plan.h"
#include "tests/engine/engine_test_util.h"

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

// The whole model's states: every element distinct (engine_test_util.h).
void fill_whole(ParamStore& whole) { test::fill_distinct_states(whole, 1234); }

// A checkpoint of the whole model written by `tp` tensor-parallel ranks (one process with tp 1),
// as the trainer writes it; in a child process, so the parent never holds the whole model.
std::string write_checkpoint(int tp) {
  const fs::path path = fs::temp_directory_path() /
                        ("kiln_reshard_" + std::to_string(getpid()) + "_tp" + std::to_string(tp));
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
        auto slice =
            std::make_unique<ParamStore>(model(), Precision::kFp32, false, nullptr, TpShard{t, tp});
        for (size_t i = 0; i < whole.tensors().size(); ++i) {
          const int ti = static_cast<int>(i);
          const ParamTensor& pt = slice->tensors()[i];
          copy_to_shard(pt, {t, tp}, whole.master(ti), slice->master(ti));
          copy_to_shard(pt, {t, tp}, whole.exp_avg(ti), slice->exp_avg(ti));
          copy_to_shard(pt, {t, tp}, whole.exp_avg_sq(ti), slice->exp_avg_sq(ti));
        }
        std::deque<std::vector<float>> scratch;
        auto h = write_checkpoint_partition(*tmp, 0, 1, unit_partition(*slice, &scratch), t, tp);
        if (!h.is_ok())
          s = h.status();
        else
          hashes.push_back(*h);
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

// Loads the checkpoint into rank `rank` of `tp`: no host memory is allocated beyond the rank's
// own slices (the reads go straight into them), and the values are the whole tensors' slices.
void check_load_here(const std::string& run, int from_tp, int rank, int tp, int64_t sources) {
  SCOPED_TRACE("tp " + std::to_string(from_tp) + " -> rank " + std::to_string(rank) + " of " +
               std::to_string(tp));
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  Runtime& host = host_runtime();
  ParamStore mine(model(), Precision::kFp32, false, nullptr, TpShard{rank, tp});
  const uint64_t before = host.memory().in_use;
  const bool measurable = host.memory().peak == before;  // nothing larger held before
  TrainerState st;
  LoadStats stats;
  const Status loaded = load_checkpoint(*dir, &mine, &st, nullptr, &stats);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  const uint64_t peak = host.memory().peak - before;
  EXPECT_EQ(host.memory().in_use, before) << "the load kept memory";
  const uint64_t whole_bytes = ParamStore(model(), Precision::kFp32).state_bytes();
  if (measurable) {
    EXPECT_EQ(peak, 0u) << "held memory beside this rank's slices (whole model: " << whole_bytes
                        << " bytes)";
  } else {
    ADD_FAILURE() << "run this test alone (ctest does): an earlier test raised the peak";
  }
  EXPECT_EQ(stats.reshard_sources, sources) << "read only the TP ranks that hold its slices";
  ParamStore whole(model(), Precision::kFp32);
  fill_whole(whole);
  std::vector<float> want;
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const int ti = static_cast<int>(i);
    const ParamTensor& pt = mine.tensors()[i];
    want.assign(pt.numel, -1.0f);
    for (auto [w, got, name] :
         {std::tuple{whole.master(ti), mine.master(ti), "master"},
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

TEST(CheckpointReshard, TwoToThreeRanksReadsOnlyTheOverlappingSources) {
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

// A ZeRO checkpoint of P data-parallel partitions (each the units' flat elements [p*S, p*S+S)):
// any range of any unit reads back the whole model's values, across partition boundaries, and
// only the files that hold the range are opened (a ZeRO rank reads its own shard's).
TEST(CheckpointReshard, PartitionedCheckpointReadsAnyRange) {
  const fs::path path =
      fs::temp_directory_path() / ("kiln_reshard_" + std::to_string(getpid()) + "_dp3");
  fs::remove_all(path);
  const int64_t P = 3;
  ParamStore whole(model(), Precision::kFp32);
  fill_whole(whole);
  TrainerState st;
  st.step = 4;
  auto tmp = begin_checkpoint(path.string(), st.step);
  ASSERT_TRUE(tmp.is_ok()) << tmp.status().to_string();
  std::vector<uint64_t> hashes;
  for (int64_t p = 0; p < P; ++p) {
    std::deque<std::vector<float>> keep;
    std::vector<TensorView> views;
    for (const ParamUnit& u : whole.units()) {
      const size_t S = shard_numel(u.numel, P), begin = S * static_cast<size_t>(p);
      for (auto [suffix, buf] : {std::pair{".master", &u.master}, std::pair{".exp_avg", &u.m},
                                 std::pair{".exp_avg_sq", &u.v}}) {
        keep.emplace_back(S, 0.0f);
        for (size_t k = begin; k < std::min(begin + S, u.numel); ++k)
          keep.back()[k - begin] = buf->data()[k];
        views.push_back({u.name + suffix,
                         "F32",
                         {static_cast<int64_t>(S)},
                         keep.back().data(),
                         S * sizeof(float)});
      }
    }
    auto h = write_checkpoint_partition(*tmp, p, P, views);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    hashes.push_back(*h);
  }
  CheckpointLayout lay;
  lay.world = lay.dp = lay.partitions = P;
  lay.zero_stage = 3;
  ASSERT_TRUE(finish_checkpoint(path.string(), *tmp, whole, st, "x: 1\n", 0, lay, hashes).is_ok());
  auto dir = latest_checkpoint(path.string());
  ASSERT_TRUE(dir.is_ok());
  // Partition 1 is damaged: a reader that never touches it does not notice.
  const std::string broken = (fs::path(*dir) / partition_file_name(1, P)).string();
  const std::string ok_copy = broken + ".ok";
  fs::copy_file(broken, ok_copy);
  {
    std::FILE* f = std::fopen(broken.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -4, SEEK_END);
    std::fputc(0x55, f);
    std::fclose(f);
  }
  const ParamStore layout(model(), Precision::kFp32, false, nullptr, {}, false);
  TrainerState got_state;
  auto reader = CheckpointReader::open(*dir, layout, &got_state);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_EQ(got_state.step, 4);
  const ParamUnit& u = whole.units()[1];  // a block
  const size_t S = shard_numel(u.numel, P);
  std::vector<float> got(S);
  ASSERT_TRUE((*reader)->read(1, ParamField::kExpAvg, 0, S, got.data()).is_ok());
  EXPECT_EQ(0, std::memcmp(got.data(), u.m.data(), S * sizeof(float)));
  // Reading partition 1 finds the damage and names the file.
  Status bad = (*reader)->read(1, ParamField::kMaster, S - 5, 10, got.data());
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.to_string().find("checksum mismatch"), std::string::npos) << bad.to_string();
  EXPECT_NE(bad.to_string().find(partition_file_name(1, P)), std::string::npos) << bad.to_string();
  fs::rename(ok_copy, broken);
  auto fresh = CheckpointReader::open(*dir, layout, &got_state);
  ASSERT_TRUE(fresh.is_ok());
  for (size_t ui = 0; ui < whole.units().size(); ++ui) {
    const ParamUnit& w = whole.units()[ui];
    for (auto [f, buf] :
         {std::pair{ParamField::kMaster, &w.master}, std::pair{ParamField::kExpAvg, &w.m},
          std::pair{ParamField::kExpAvgSq, &w.v}}) {
      const size_t n = w.numel;
      for (auto [begin, count] :
           {std::pair<size_t, size_t>{0, n}, {n / 3 - 7, n / 3 + 14}, {n - 1, 1}}) {
        got.assign(count, -1.0f);
        ASSERT_TRUE((*fresh)->read(static_cast<int>(ui), f, begin, count, got.data()).is_ok());
        ASSERT_EQ(0, std::memcmp(got.data(), buf->data() + begin, count * sizeof(float)))
            << w.name << " [" << begin << ", " << begin + count << ")";
      }
    }
  }
  EXPECT_EQ((*fresh)->tp_sources_read(), 1);
  fs::remove_all(path);
}

// A hand-edited or foreign meta.json is refused naming it, before anything is read: a
// tensor-parallel size the model does not split over (it aborted in the ParamStore, or allocated
// 2^32 source layouts), and tensors that are not where this model's layout puts them (another
// order or alignment inside a unit reads other tensors' values with the same unit sizes).
TEST(CheckpointReshard, ForeignMetaJsonIsRefusedNamingIt) {
  const std::string run = write_checkpoint(2);
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  const std::string meta_path = (fs::path(*dir) / "meta.json").string();
  std::string original;
  {
    std::ifstream in(meta_path);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  const nlohmann::json good = nlohmann::json::parse(original);
  auto load_with = [&](const nlohmann::json& meta) {
    std::ofstream(meta_path, std::ios::trunc) << meta.dump();
    ParamStore mine(model(), Precision::kFp32, false, nullptr, TpShard{0, 2});
    TrainerState st;
    return load_checkpoint(*dir, &mine, &st);
  };
  ASSERT_TRUE(load_with(good).is_ok());
  for (int64_t tp : {int64_t{4}, int64_t{5}, (int64_t{1} << 32) + 2}) {
    nlohmann::json bad = good;
    bad["tp_partitions"] = tp;
    const Status st = load_with(bad);
    EXPECT_EQ(st.code(), StatusCode::kData) << tp;
    EXPECT_EQ(st.file(), meta_path) << tp;
    EXPECT_NE(st.message().find("does not split the model"), std::string::npos) << st.to_string();
  }
  nlohmann::json moved = good;  // two tensors of a unit swapped: the same unit sizes
  size_t i = 0;
  while (i + 1 < moved["tensors"].size() &&
         moved["tensors"][i]["unit"] != moved["tensors"][i + 1]["unit"])
    ++i;
  ASSERT_LT(i + 1, moved["tensors"].size());
  std::swap(moved["tensors"][i]["offset"], moved["tensors"][i + 1]["offset"]);
  Status st = load_with(moved);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_EQ(st.file(), meta_path);
  EXPECT_NE(st.message().find("is not where this model's"), std::string::npos) << st.to_string();
  nlohmann::json fewer = good;
  fewer["tensors"].erase(fewer["tensors"].size() - 1);
  st = load_with(fewer);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("as tensors, the model has"), std::string::npos) << st.to_string();
  ASSERT_TRUE(load_with(good).is_ok());
}

}  // namespace
}  // namespace kiln::engine
