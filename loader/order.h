// Internal to loader/: the shuffled sample order of one domain's epoch, the split of an epoch
// into per-rank parts, and the deterministic random numbers behind both.
//
// Everything here is a pure function of its arguments (seed, domain name, epoch, shard index),
// computed with integer arithmetic only, so every rank and every restart computes the same
// orders without communicating and without replaying anything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/random.h"

namespace kiln::loader::detail {

// A seed for one purpose: XXH3 of "what|domain|a|b" under the user's seed.
uint64_t derive_seed(uint64_t seed, std::string_view what, std::string_view domain, uint64_t a,
                     uint64_t b = 0);

// A uniformly random permutation of 0..n-1 (Fisher-Yates) from `seed`.
std::vector<uint32_t> permutation(uint64_t seed, uint32_t n);

// The order of one domain's samples in one epoch: shards in shuffled order, and within each
// shard its samples in shuffled order. Position p (0 <= p < total) names one sample.
class EpochOrder {
 public:
  // shard_ids: the manifest indices of the domain's shards (manifest order);
  // shard_samples: their sample counts.
  EpochOrder(uint64_t seed, const std::string& domain, uint64_t epoch,
             const std::vector<uint32_t>& shard_ids, const std::vector<uint64_t>& shard_samples);

  uint64_t epoch() const { return epoch_; }
  uint64_t total() const { return starts_.back(); }
  // Index k (into shuffled shards) of the shard holding position p.
  size_t shard_at(uint64_t p) const;
  uint32_t shard_id(size_t k) const { return shards_[k]; }     // manifest index
  uint64_t shard_start(size_t k) const { return starts_[k]; }  // first position in shard k
  uint64_t shard_end(size_t k) const { return starts_[k + 1]; }
  // The members (tar-order sample indices) of shard k in this epoch's shuffled order.
  std::vector<uint32_t> members(size_t k) const;

 private:
  uint64_t seed_;
  std::string domain_;
  uint64_t epoch_;
  std::vector<uint32_t> shards_;   // manifest indices, shuffled
  std::vector<uint64_t> counts_;   // samples per shuffled shard
  std::vector<uint64_t> starts_;   // prefix sums, size shards_ + 1
};

// Rank r's part of an epoch of n samples split among w ranks: positions [begin, end).
// Parts are the w contiguous blocks [floor(j*n/w), floor((j+1)*n/w)); rank r takes block
// (r + epoch) mod w, so which ranks get the one-sample-larger blocks rotates every epoch, and
// with n < w every rank still gets samples within w epochs.
struct Block {
  uint64_t begin = 0;
  uint64_t end = 0;
};
Block rank_block(uint64_t n, uint64_t w, uint64_t r, uint64_t epoch);

// The mixture's uniform number for sequence slot `index`: a golden-ratio (Weyl) sequence with a
// seed-derived start, in [0, 1). Any window of consecutive slots is spread almost evenly over
// [0, 1) (low discrepancy), so realised domain shares track the weights closely.
double mix_uniform(uint64_t seed, uint64_t index);

}  // namespace kiln::loader::detail
