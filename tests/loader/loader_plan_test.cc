// loader/plan.h: cursors -> units. Units cover this rank's part of each epoch in order, members
// lie in their shard, and a cursor taken inside a unit continues exactly where it was taken.
#include <gtest/gtest.h>

#include <set>

#include "loader/plan.h"

namespace kiln::loader::detail {
namespace {

DomainInfo domain() {
  DomainInfo d;
  d.name = "web";
  d.shard_ids = {0, 1, 2};
  d.shard_samples = {5, 3, 4};
  d.samples = 12;
  return d;
}

// The (epoch, shard, member) sequence of the first n samples a planner gives.
std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> samples(Planner& p, size_t n) {
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> out;
  while (out.size() < n) {
    const UnitPlan u = p.next();
    for (uint32_t m : u.members) out.emplace_back(u.epoch, u.shard, m);
  }
  out.resize(n);
  return out;
}

TEST(LoaderPlan, UnitsCoverEachRanksPartOfEveryEpochOnce) {
  const DomainInfo info = domain();
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<std::pair<uint32_t, uint32_t>> seen;
    for (int rank = 0; rank < 2; ++rank) {
      LoaderState::DomainCursor start;
      start.next_epoch = epoch;
      Planner p(info, /*seed=*/7, /*world=*/2, rank, start);
      const Block b = rank_block(info.samples, 2, rank, epoch);
      uint64_t pos = b.begin, seq = 0;
      while (pos < b.end) {
        const UnitPlan u = p.next();
        EXPECT_EQ(u.seq, seq++);
        EXPECT_EQ(u.epoch, epoch);
        EXPECT_EQ(u.pos_begin, pos);
        EXPECT_EQ(u.pos_end - u.pos_begin, u.members.size());
        for (uint32_t m : u.members) {
          EXPECT_LT(m, info.shard_samples[u.shard]);
          EXPECT_TRUE(seen.insert({u.shard, m}).second) << "sample read twice in an epoch";
        }
        pos = u.pos_end;
      }
      EXPECT_EQ(pos, b.end);
    }
    EXPECT_EQ(seen.size(), info.samples) << "epoch " << epoch;
  }
}

TEST(LoaderPlan, CursorInsideAUnitContinuesExactly) {
  const DomainInfo info = domain();
  Planner full(info, 3, 1, 0, {});
  const auto expected = samples(full, 30);  // two and a half epochs
  // Take a cursor at every document of the first units and continue from it.
  Planner p(info, 3, 1, 0, {});
  size_t done = 0;
  for (int unit = 0; unit < 4; ++unit) {
    const UnitPlan u = p.next();
    for (uint64_t doc = 0; doc < u.members.size(); ++doc) {
      const LoaderState::DomainCursor c = cursor_at(u, doc, /*tok=*/doc == 1 ? 5 : 0, 9);
      EXPECT_EQ(c.sequences, 9u);
      if (doc == 1) {
        ASSERT_FALSE(c.pending.empty());
        EXPECT_EQ(c.pending.front().skip_tokens, 5u);
      }
      Planner resumed(info, 3, 1, 0, c);
      const auto rest = samples(resumed, 10);
      for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], expected[done + doc + i]);
    }
    done += u.members.size();
  }
}

}  // namespace
}  // namespace kiln::loader::detail
