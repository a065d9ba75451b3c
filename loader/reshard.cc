#include "loader/reshard.h"

#include <algorithm>

#include "common/status.h"
#include "loader/order.h"

namespace kiln::loader::detail {

__extension__ typedef unsigned __int128 U128;

LoaderState::DomainCursor reshard_cursor(const std::vector<LoaderState::DomainCursor>& old,
                                         int old_world, uint64_t samples, int new_world,
                                         int new_rank) {
  KILN_CHECK(static_cast<int>(old.size()) == old_world && new_world > 0 && new_rank >= 0 &&
             new_rank < new_world);
  uint64_t frontier = 0;
  for (const auto& c : old) frontier = std::max(frontier, c.next_epoch);

  std::vector<LoaderState::Interval> left;
  for (int r = 0; r < old_world; ++r) {
    for (const auto& iv : old[r].pending) {
      if (iv.begin < iv.end) left.push_back(iv);
    }
    for (uint64_t e = old[r].next_epoch; e < frontier; ++e) {
      const Block b = rank_block(samples, old_world, r, e);
      if (b.begin < b.end) left.push_back({e, b.begin, b.end, 0});
    }
  }
  std::stable_sort(left.begin(), left.end(), [](const auto& a, const auto& b) {
    return a.epoch != b.epoch ? a.epoch < b.epoch : a.begin < b.begin;
  });

  uint64_t total = 0;
  for (const auto& iv : left) total += iv.end - iv.begin;
  auto cut = [&](uint64_t j) {
    return static_cast<uint64_t>(static_cast<U128>(j) * total / new_world);
  };
  const uint64_t lo = cut(new_rank), hi = cut(new_rank + 1);

  LoaderState::DomainCursor out;
  out.next_epoch = frontier;
  out.sequences = new_rank < old_world ? old[new_rank].sequences : 0;
  uint64_t at = 0;  // index of iv.begin in the concatenation
  for (const auto& iv : left) {
    const uint64_t len = iv.end - iv.begin;
    const uint64_t a = std::max(lo, at), b = std::min(hi, at + len);
    if (a < b) {
      LoaderState::Interval piece{iv.epoch, iv.begin + (a - at), iv.begin + (b - at), 0};
      if (a == at) piece.skip_tokens = iv.skip_tokens;
      out.pending.push_back(piece);
    }
    at += len;
  }
  return out;
}

}  // namespace kiln::loader::detail
