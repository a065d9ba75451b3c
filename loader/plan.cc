#include "loader/plan.h"

#include <algorithm>

#include "common/status.h"

namespace kiln::loader::detail {

using Interval = LoaderState::Interval;
using DomainCursor = LoaderState::DomainCursor;

Planner::Planner(const DomainInfo& info, uint64_t seed, int world, int rank,
                 const DomainCursor& start)
    : info_(info), seed_(seed), world_(world), rank_(rank) {
  for (const auto& iv : start.pending) {
    if (iv.begin < iv.end) queue_.push_back(iv);
  }
  next_epoch_ = start.next_epoch;
}

UnitPlan Planner::next() {
  KILN_CHECK(info_.samples > 0, "planning a unit of an empty domain");
  while (!have_cur_) {
    if (queue_.empty()) {
      // With samples < world some parts are empty; rotation gives every rank a non-empty
      // part within `world` epochs.
      for (int guard = 0; queue_.empty(); ++guard) {
        KILN_CHECK(guard <= world_ + 1);
        const auto b = rank_block(info_.samples, world_, rank_, next_epoch_);
        if (b.begin < b.end) queue_.push_back({next_epoch_, b.begin, b.end, 0});
        ++next_epoch_;
      }
    }
    cur_ = queue_.front();
    queue_.pop_front();
    if (cur_.begin >= cur_.end) continue;
    cur_rest_ = std::make_shared<const std::vector<Interval>>(queue_.begin(), queue_.end());
    cur_next_epoch_ = next_epoch_;
    have_cur_ = true;
  }
  const EpochOrder& order = order_for(cur_.epoch);
  const size_t k = order.shard_at(cur_.begin);
  const uint64_t start = order.shard_start(k);
  const uint64_t end = std::min(cur_.end, order.shard_end(k));
  if (k != members_k_ || cur_.epoch != members_epoch_) {
    members_ = order.members(k);
    members_k_ = k;
    members_epoch_ = cur_.epoch;
  }
  UnitPlan plan;
  plan.seq = seq_++;
  plan.epoch = cur_.epoch;
  plan.shard = order.shard_id(k);
  plan.pos_begin = cur_.begin;
  plan.pos_end = end;
  plan.skip_tokens = cur_.skip_tokens;
  plan.members.assign(members_.begin() + (cur_.begin - start), members_.begin() + (end - start));
  plan.interval_end = cur_.end;
  plan.rest = cur_rest_;
  plan.next_epoch = cur_next_epoch_;
  cur_.begin = end;
  cur_.skip_tokens = 0;
  if (cur_.begin == cur_.end) have_cur_ = false;
  return plan;
}

const EpochOrder& Planner::order_for(uint64_t epoch) {
  if (!order_ || order_->epoch() != epoch) {
    order_ = std::make_unique<EpochOrder>(seed_, info_.name, epoch, info_.shard_ids,
                                          info_.shard_samples);
    members_k_ = SIZE_MAX;
  }
  return *order_;
}

DomainCursor cursor_at(const UnitPlan& plan, uint64_t doc, uint64_t tok, uint64_t sequences) {
  DomainCursor c;
  c.next_epoch = plan.next_epoch;
  c.sequences = sequences;
  const uint64_t pos = plan.pos_begin + doc;
  if (pos < plan.interval_end) {
    c.pending.push_back({plan.epoch, pos, plan.interval_end, (doc == 0 ? plan.skip_tokens : 0) + tok});
  }
  c.pending.insert(c.pending.end(), plan.rest->begin(), plan.rest->end());
  return c;
}

}  // namespace kiln::loader::detail
