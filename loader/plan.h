// Internal to loader/: the plan — which samples this rank reads next, in what order.
//
// A domain's cursor (LoaderState::DomainCursor: pending intervals of shuffled epoch orders, then
// this rank's regular part of every later epoch) is turned into "units": the members of one shard
// that one epoch's order visits consecutively, i.e. what a worker reads in one go. Every unit
// carries enough to turn a position inside it back into a cursor (cursor_at), which is how the
// loader's state is saved. Pure computation from (seed, domain, epoch, world, rank); no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "loader/loader.h"
#include "loader/order.h"

namespace kiln::loader::detail {

// A domain of the manifest: its shards (manifest order) and totals.
struct DomainInfo {
  std::string name;
  std::vector<uint32_t> shard_ids;      // manifest indices, manifest order
  std::vector<uint64_t> shard_samples;  // per shard
  uint64_t samples = 0;
  uint64_t tokens = 0;
};

// One shard's worth of one epoch's order: what a worker reads in one go.
struct UnitPlan {
  uint64_t seq = 0;  // per-domain sequence number (0 after open / restore)
  uint64_t epoch = 0;
  uint32_t shard = 0;  // manifest index
  uint64_t pos_begin = 0, pos_end = 0;  // positions in the epoch order
  uint64_t skip_tokens = 0;             // already emitted tokens of the first member
  std::vector<uint32_t> members;        // tar-order sample indices, in visiting order
  // Enough to turn a position inside this unit back into a DomainCursor:
  uint64_t interval_end = 0;  // end of the pending interval this unit is cut from
  std::shared_ptr<const std::vector<LoaderState::Interval>> rest;  // pending intervals after it
  uint64_t next_epoch = 0;                                         // the regular epoch after `rest`
};

// Cursor -> units, one after the other, forever (epochs follow each other). Keeps a reference to
// `info`, which must outlive it. Not thread-safe.
class Planner {
 public:
  Planner(const DomainInfo& info, uint64_t seed, int world, int rank,
          const LoaderState::DomainCursor& start);
  // The next unit. The domain must have samples.
  UnitPlan next();

 private:
  const EpochOrder& order_for(uint64_t epoch);

  const DomainInfo& info_;
  uint64_t seed_;
  int world_, rank_;
  std::deque<LoaderState::Interval> queue_;
  uint64_t next_epoch_ = 0;
  bool have_cur_ = false;
  LoaderState::Interval cur_;
  std::shared_ptr<const std::vector<LoaderState::Interval>> cur_rest_;
  uint64_t cur_next_epoch_ = 0;
  uint64_t seq_ = 0;
  std::unique_ptr<EpochOrder> order_;
  std::vector<uint32_t> members_;
  size_t members_k_ = SIZE_MAX;
  uint64_t members_epoch_ = 0;
};

// The cursor of the position (document `doc`, token `tok` of the stored tokens) in unit `plan`,
// with `sequences` emitted so far: where a restored loader continues.
LoaderState::DomainCursor cursor_at(const UnitPlan& plan, uint64_t doc, uint64_t tok,
                                    uint64_t sequences);

}  // namespace kiln::loader::detail
