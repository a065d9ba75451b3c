// Loader state: exact resume (bit for bit, across weight changes), resume with a different
// data-parallel world size, and restore without replaying.
#include <gtest/gtest.h>

#include "loader/loader.h"
#include "tests/loader/loader_testutil.h"

namespace kiln::loader {
namespace {

using testing::Coverage;
using testing::Dataset;
using testing::DatasetSpec;

const Dataset& dataset() {
  static const Dataset* ds = [] {
    DatasetSpec spec;
    spec.domains = {{"alpha", 47, 10, 0, 30}, {"beta", 23, 4, 0, 30}, {"gamma", 31, 6, 2, 12}};
    auto r = testing::make_dataset(testing::test_tmpdir("resume"), spec);
    KILN_CHECK(r.is_ok(), r.status().to_string());
    return new Dataset(std::move(r).value());
  }();
  return *ds;
}

LoaderOptions options(int rank = 0, int world = 1) {
  LoaderOptions o;
  o.seq_len = 7;
  o.micro_batch = 4;
  o.seed = 77;
  o.dp_rank = rank;
  o.dp_world = world;
  o.workers = 2;
  o.prefetch_depth = 3;
  return o;
}

std::unique_ptr<Loader> open_loader(LoaderOptions o) {
  auto l = Loader::open(dataset().manifest, o);
  KILN_CHECK(l.is_ok(), l.status().to_string());
  return std::move(l).value();
}

// Weight changes applied right before the batch of the given step.
const std::map<int64_t, std::map<std::string, double>>& changes() {
  static const std::map<int64_t, std::map<std::string, double>> c = {
      {20, {{"alpha", 0.2}, {"beta", 0.8}}},
      {50, {{"gamma", 3}, {"alpha", 1}}},
  };
  return c;
}

// A batch flattened to comparable values: tokens, domains, and every span field.
std::vector<uint64_t> flat(const Batch& b) {
  std::vector<uint64_t> v = {static_cast<uint64_t>(b.step)};
  v.insert(v.end(), b.tokens.begin(), b.tokens.end());
  v.insert(v.end(), b.domains.begin(), b.domains.end());
  for (const auto& row : b.docs) {
    for (const auto& s : row) {
      v.insert(v.end(), {s.shard, s.member, s.epoch, s.doc_offset, s.length, s.seq_offset,
                         static_cast<uint64_t>(s.ends)});
    }
  }
  return v;
}

// Fetches batches [from, to), applying the scheduled weight changes.
void run(Loader* l, int64_t from, int64_t to, std::vector<std::vector<uint64_t>>* out) {
  for (int64_t step = from; step < to; ++step) {
    auto it = changes().find(step);
    if (it != changes().end()) {
      ASSERT_TRUE(l->set_weights(it->second).is_ok());
    }
    auto b = l->next_batch();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    ASSERT_EQ(b->step, step);
    out->push_back(flat(*b));
  }
}

TEST(LoaderResume, StopRestoreContinueIsBitForBitAcrossWeightChanges) {
  constexpr int64_t kSteps = 240;  // every partition of every domain reaches epoch 1
  std::vector<std::vector<uint64_t>> reference;
  {
    auto l = open_loader(options());
    run(l.get(), 0, kSteps, &reference);
    // The run crosses epoch boundaries of every domain.
    for (const auto& d : l->stats().domains) EXPECT_GE(d.epoch, 1u) << d.name;
  }
  for (int64_t k : {0, 1, 7, 20, 21, 49, 50, 63, 89, 239}) {
    std::vector<std::vector<uint64_t>> got;
    std::string saved;
    {
      auto l = open_loader(options());
      run(l.get(), 0, k, &got);
      saved = l->state().to_json();
    }
    auto state = LoaderState::from_json(saved);
    ASSERT_TRUE(state.is_ok()) << state.status().to_string();
    // Different seed and weights in the options: the state's win.
    LoaderOptions o = options();
    o.seed = 1;
    o.weights = {{"beta", 1}};
    o.workers = 1;
    o.prefetch_depth = 1;
    auto l = open_loader(o);
    ASSERT_TRUE(l->restore(*state).is_ok());
    run(l.get(), k, kSteps, &got);
    ASSERT_EQ(got.size(), reference.size());
    for (int64_t i = 0; i < kSteps; ++i)
      ASSERT_EQ(got[i], reference[i]) << "k=" << k << " step " << i;
  }
}

TEST(LoaderResume, RestoringTwiceAndRestoringTheSameLoader) {
  std::vector<std::vector<uint64_t>> reference;
  auto l = open_loader(options());
  run(l.get(), 0, 40, &reference);
  // Restore the same loader to an earlier state (prefetched batches are dropped).
  auto early = open_loader(options());
  std::vector<std::vector<uint64_t>> tmp;
  run(early.get(), 0, 25, &tmp);
  const LoaderState s25 = early->state();
  ASSERT_TRUE(l->restore(s25).is_ok());
  std::vector<std::vector<uint64_t>> again;
  run(l.get(), 25, 40, &again);
  for (int64_t i = 25; i < 40; ++i) ASSERT_EQ(again[i - 25], reference[i]);
}

// Runs `world` ranks in lockstep for steps [from, to), recording coverage.
void run_ranks(std::vector<std::unique_ptr<Loader>>& ranks, int64_t from, int64_t to, Coverage* cov,
               int rank_offset, std::vector<std::vector<std::vector<uint64_t>>>* out = nullptr,
               bool scheduled_changes = true) {
  for (int64_t step = from; step < to; ++step) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      auto it = changes().find(step);
      if (scheduled_changes && it != changes().end()) {
        ASSERT_TRUE(ranks[r]->set_weights(it->second).is_ok());
      }
      auto b = ranks[r]->next_batch();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      ASSERT_EQ(b->step, step);
      ASSERT_EQ(cov->add(*b, 0, rank_offset + static_cast<int>(r)), "");
      if (out) (*out)[r].push_back(flat(*b));
    }
  }
}

LoaderState merged_state(std::vector<std::unique_ptr<Loader>>& ranks) {
  std::vector<LoaderState> states;
  for (auto& l : ranks) {
    auto s = LoaderState::from_json(l->state().to_json());
    KILN_CHECK(s.is_ok());
    states.push_back(*s);
  }
  auto m = LoaderState::merge(states);
  KILN_CHECK(m.is_ok(), m.status().to_string());
  return *m;
}

void check_world_change(int old_world, int new_world, int64_t k) {
  Coverage cov(&dataset());
  std::vector<std::unique_ptr<Loader>> old_ranks;
  for (int r = 0; r < old_world; ++r) old_ranks.push_back(open_loader(options(r, old_world)));
  run_ranks(old_ranks, 0, k, &cov, 0);
  const LoaderState merged = merged_state(old_ranks);
  // The newest epoch any old rank started, per domain.
  std::map<std::string, uint64_t> frontier;
  for (const auto& rc : merged.cursors) {
    for (const auto& [name, c] : rc.domains) {
      frontier[name] = std::max(frontier[name], c.next_epoch);
    }
  }
  // A single rank's state cannot be restored into a different world size.
  {
    auto l = open_loader(options(0, new_world));
    const Status st = l->restore(old_ranks[0]->state());
    EXPECT_EQ(st.code(), StatusCode::kConfig) << st.to_string();
  }
  old_ranks.clear();

  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < new_world; ++r) {
    // Another global batch (micro_batch x world): the same sequence cannot continue, so this is
    // the repartition fallback, which must still not repeat or skip a sample.
    LoaderOptions o = options(r, new_world);
    EXPECT_EQ(open_loader(o)->restore(merged).code(), StatusCode::kConfig);
    o.repartition = true;
    ranks.push_back(open_loader(o));
    ASSERT_TRUE(ranks.back()->restore(merged).is_ok());
  }
  auto past_frontier = [&] {
    for (auto& l : ranks) {
      for (const auto& d : l->stats().domains) {
        if (d.epoch <= frontier[d.name]) return false;
      }
    }
    return true;
  };
  // Every domain weighted from here on (the schedule's later change gives beta weight 0, and with
  // one row per partition and step a partition's part of an epoch can outlast step 50), so every
  // epoch in progress completes.
  for (auto& l : ranks) {
    ASSERT_TRUE(l->set_weights({{"alpha", 1}, {"beta", 1}, {"gamma", 1}}).is_ok());
  }
  int64_t step = k;
  while (!past_frontier()) {
    ASSERT_LT(step, k + 5000);
    run_ranks(ranks, step, step + 1, &cov, 100, nullptr, /*scheduled_changes=*/false);
    ++step;
  }
  // Every epoch that was in progress at the restore, and the first one started after it, holds
  // every token of every document exactly once (old and new ranks together; a document an old
  // rank had partly emitted is finished by one new rank).
  for (const auto& [name, e] : frontier) {
    for (uint64_t epoch = 0; epoch <= e; ++epoch) {
      EXPECT_EQ(cov.check_epoch(name, epoch, 0, /*one_rank=*/false), "")
          << old_world << "->" << new_world << " k=" << k << " " << name << " epoch " << epoch;
    }
  }
}

TEST(LoaderResume, WorldSizeChangeContinuesTheEpochWithoutRepeatsOrGaps) {
  check_world_change(4, 2, 13);
  check_world_change(4, 2, 31);  // after a weight change
  check_world_change(2, 5, 17);
  check_world_change(3, 1, 9);
}

TEST(LoaderResume, AfterWorldSizeChangeResumeIsBitForBit) {
  Coverage cov(&dataset());
  std::vector<std::unique_ptr<Loader>> old_ranks;
  for (int r = 0; r < 4; ++r) old_ranks.push_back(open_loader(options(r, 4)));
  run_ranks(old_ranks, 0, 15, &cov, 0);
  const LoaderState merged = merged_state(old_ranks);

  // The same global batch (16 rows) on 2 ranks: micro-batch 8.
  auto options2 = [](int r) {
    LoaderOptions o = options(r, 2);
    o.micro_batch = 8;
    return o;
  };
  std::vector<std::unique_ptr<Loader>> a;  // uninterrupted after the 4 -> 2 restore
  for (int r = 0; r < 2; ++r) {
    a.push_back(open_loader(options2(r)));
    ASSERT_TRUE(a.back()->restore(merged).is_ok());
  }
  Coverage cov_a(&dataset());
  std::vector<std::vector<std::vector<uint64_t>>> ref(2);
  run_ranks(a, 15, 60, &cov_a, 0, &ref);

  std::vector<std::unique_ptr<Loader>> b;  // stopped at 30 and restored from its own states
  for (int r = 0; r < 2; ++r) {
    b.push_back(open_loader(options2(r)));
    ASSERT_TRUE(b.back()->restore(merged).is_ok());
  }
  Coverage cov_b(&dataset());
  std::vector<std::vector<std::vector<uint64_t>>> got(2);
  run_ranks(b, 15, 30, &cov_b, 0, &got);
  std::vector<LoaderState> own;
  for (auto& l : b) own.push_back(l->state());
  b.clear();
  for (int r = 0; r < 2; ++r) {
    b.push_back(open_loader(options2(r)));
    auto s = LoaderState::from_json(own[r].to_json());
    ASSERT_TRUE(s.is_ok());
    ASSERT_TRUE(b.back()->restore(*s).is_ok());
  }
  run_ranks(b, 30, 60, &cov_b, 0, &got);
  EXPECT_EQ(got, ref);
}

// Every row of every global step, keyed by (step, global row): tokens, domain and spans.
using GlobalRows = std::map<std::pair<int64_t, int64_t>, std::vector<uint64_t>>;

void collect(Loader* l, int64_t calls, GlobalRows* out, bool scheduled_changes = true) {
  for (int64_t c = 0; c < calls; ++c) {
    const int64_t next_step = l->state().step;
    auto it = changes().find(next_step);
    if (scheduled_changes && it != changes().end() && l->state().micro == 0) {
      ASSERT_TRUE(l->set_weights(it->second).is_ok());
    }
    auto b = l->next_batch();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    const int64_t width = b->seq_len + 1;
    for (int64_t r = 0; r < b->micro_batch; ++r) {
      std::vector<uint64_t> v(b->tokens.begin() + r * width, b->tokens.begin() + (r + 1) * width);
      v.push_back(static_cast<uint64_t>(b->domains[r]));
      for (const auto& sp : b->docs[r]) {
        v.insert(v.end(), {sp.shard, sp.member, sp.epoch, sp.doc_offset, sp.length});
      }
      const auto key = std::make_pair(b->step, b->global_rows[r]);
      ASSERT_EQ(out->count(key), 0u) << "row given twice";
      (*out)[key] = std::move(v);
    }
  }
}

struct Layout {
  int world;
  int64_t micro_batch;  // global batch 8 = world x micro_batch x accumulation
};

LoaderOptions layout_options(const Layout& l, int rank) {
  LoaderOptions o = options(rank, l.world);
  o.micro_batch = l.micro_batch;
  o.global_batch = 8;
  return o;
}

// Steps [0, steps) of a layout, every rank, with the scheduled weight changes.
GlobalRows run_layout(const Layout& l, int64_t steps) {
  GlobalRows rows;
  const int64_t calls = steps * 8 / (l.world * l.micro_batch);
  for (int r = 0; r < l.world; ++r) {
    auto loader = open_loader(layout_options(l, r));
    collect(loader.get(), calls, &rows);
  }
  return rows;
}

TEST(LoaderGlobalBatch, TheSameRowsAtEveryDataParallelSizeAndAccumulation) {
  // DP 1 x mb 8, DP 2 x mb 4, DP 4 x mb 2, DP 2 x mb 2 x accumulation 2, DP 8 x mb 1, DP 1 x mb 1
  // x accumulation 8: 60 steps across two weight changes and epoch ends.
  const GlobalRows ref = run_layout({1, 8}, 60);
  ASSERT_EQ(ref.size(), 60u * 8);
  for (const Layout& l : {Layout{2, 4}, Layout{4, 2}, Layout{2, 2}, Layout{8, 1}, Layout{1, 1}}) {
    EXPECT_TRUE(run_layout(l, 60) == ref)
        << "world " << l.world << " micro_batch " << l.micro_batch;
  }
}

TEST(LoaderGlobalBatch, ResumeOnAnotherLayoutContinuesTheSameRows) {
  const GlobalRows ref = run_layout({2, 4}, 40);
  // Stop the 2-rank run at step 10 (after its first weight change is scheduled at 20: also
  // restore past it), merge, continue on 4 ranks, on 1 rank, and on 2 ranks x accumulation 2.
  for (int64_t stop : {10, 25}) {
    std::vector<LoaderState> states;
    GlobalRows got;
    for (int r = 0; r < 2; ++r) {
      auto l = open_loader(layout_options({2, 4}, r));
      collect(l.get(), stop, &got);
      states.push_back(l->state());
    }
    auto merged = LoaderState::merge(states);
    ASSERT_TRUE(merged.is_ok()) << merged.status().to_string();
    for (const Layout& to : {Layout{4, 2}, Layout{1, 8}, Layout{2, 2}}) {
      GlobalRows rows = got;
      for (int r = 0; r < to.world; ++r) {
        auto l = open_loader(layout_options(to, r));
        ASSERT_TRUE(l->restore(*merged).is_ok());
        collect(l.get(), (40 - stop) * 8 / (to.world * to.micro_batch), &rows);
      }
      EXPECT_TRUE(rows == ref) << "2 -> " << to.world << " x " << to.micro_batch << " at " << stop;
    }
    // A size that does not divide the 8 partitions is refused, naming the allowed sizes.
    LoaderOptions o = options(0, 3);
    o.micro_batch = 1;
    o.global_batch = 9;
    auto l = open_loader(o);
    const Status st = l->restore(*merged);
    EXPECT_EQ(st.code(), StatusCode::kConfig);
    EXPECT_NE(st.to_string().find("1, 2, 4, 8"), std::string::npos) << st.to_string();
  }
}

TEST(LoaderResume, RestoreDeepIntoAnEpochReadsOnlyWhatItNeeds) {
  DatasetSpec spec;
  spec.domains = {{"big", 400, 10, 5, 25}};  // 40 shards
  auto ds = testing::make_dataset(testing::test_tmpdir("deep"), spec);
  ASSERT_TRUE(ds.is_ok());
  LoaderOptions o;
  o.seq_len = 63;
  o.micro_batch = 2;
  o.partitions = 1;  // one stream: the bound below is per stream (2 partitions read 2 positions)
  o.workers = 1;
  o.prefetch_depth = 1;
  auto l = Loader::open(ds->manifest, o);
  ASSERT_TRUE(l.is_ok());
  std::vector<uint64_t> expected_next;
  LoaderState deep;
  for (int i = 0; i < 50; ++i) ASSERT_TRUE((*l)->next_batch().is_ok());
  deep = (*l)->state();
  auto b = (*l)->next_batch();
  ASSERT_TRUE(b.is_ok());
  EXPECT_GT((*l)->stats().shards_read, 25u);  // the run is deep into the epoch

  auto r = Loader::open(ds->manifest, o);
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE((*r)->restore(deep).is_ok());
  auto c = (*r)->next_batch();
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(flat(*c), flat(*b));
  // Reaching the position needed at most the shard it is in, the next one and one read ahead.
  EXPECT_LE((*r)->stats().shards_read, 4u);
}

TEST(LoaderGlobalBatch, HostedPartitionsShareTheReadOfAShard) {
  // One domain of 2 shards x 100 samples, 8 partitions: blocks of 25 samples, 4 in each shard.
  // One rank hosting all 8 decodes each shard once for them; 8 ranks, one partition each, decode
  // one shard each (the same rows either way: LoaderGlobalBatch.TheSameRows...).
  DatasetSpec spec;
  spec.domains = {{"d", 200, 100, 10, 30}};
  auto ds = testing::make_dataset(testing::test_tmpdir("shared-read"), spec);
  ASSERT_TRUE(ds.is_ok());
  auto reads = [&](int world, int rank, int64_t steps, std::vector<std::vector<uint64_t>>* rows) {
    LoaderOptions o;
    o.seq_len = 31;
    o.micro_batch = 8 / world;
    o.global_batch = 8;
    o.dp_world = world;
    o.dp_rank = rank;
    o.seed = 5;
    o.workers = 1;
    o.prefetch_depth = 1;
    auto l = Loader::open(ds->manifest, o);
    EXPECT_TRUE(l.is_ok());
    for (int64_t i = 0; i < steps; ++i) {
      auto b = (*l)->next_batch();
      EXPECT_TRUE(b.is_ok());
      if (b.is_ok()) rows->push_back(flat(*b));
    }
    return (*l)->stats().shards_read;
  };
  std::vector<std::vector<uint64_t>> one, eight;
  // The first step needs every partition's first unit: 2 shards (+ at most 2 units read ahead).
  EXPECT_LE(reads(1, 0, 1, &one), 4u);
  uint64_t separate = 0;
  for (int r = 0; r < 8; ++r) separate += reads(8, r, 1, &eight);
  EXPECT_GE(separate, 8u);
  // Over about three epochs (each partition takes 16 sequences of its 25 samples per epoch):
  // about 2 reads per epoch, not 8.
  one.clear();
  EXPECT_LE(reads(1, 0, 48, &one), 2u * 4 + 2);
}

}  // namespace
}  // namespace kiln::loader
