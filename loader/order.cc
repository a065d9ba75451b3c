#include "loader/order.h"

#include <algorithm>
#include <string>

#include "common/hash.h"
#include "common/status.h"

namespace kiln::loader::detail {

__extension__ typedef unsigned __int128 U128;

uint64_t derive_seed(uint64_t seed, std::string_view what, std::string_view domain, uint64_t a,
                     uint64_t b) {
  // Chained XXH3: seed -> purpose -> domain -> (a, b) as 16 little-endian bytes.
  uint64_t h = xxh3_64(what, seed);
  h = xxh3_64(domain, h);
  unsigned char ab[16];
  for (int i = 0; i < 8; ++i) {
    ab[i] = static_cast<unsigned char>(a >> (8 * i));
    ab[8 + i] = static_cast<unsigned char>(b >> (8 * i));
  }
  return xxh3_64(ab, sizeof(ab), h);
}

std::vector<uint32_t> permutation(uint64_t seed, uint32_t n) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 rng(seed);
  for (uint32_t i = n; i > 1; --i) {
    const uint32_t j = static_cast<uint32_t>(rng.below(i));
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

EpochOrder::EpochOrder(uint64_t seed, const std::string& domain, uint64_t epoch,
                       const std::vector<uint32_t>& shard_ids,
                       const std::vector<uint64_t>& shard_samples)
    : seed_(seed), domain_(domain), epoch_(epoch) {
  KILN_CHECK(shard_ids.size() == shard_samples.size());
  const auto perm = permutation(derive_seed(seed, "shards", domain, epoch),
                                static_cast<uint32_t>(shard_ids.size()));
  starts_.reserve(perm.size() + 1);
  starts_.push_back(0);
  for (uint32_t k : perm) {
    if (shard_samples[k] == 0) continue;  // an empty shard holds no position
    shards_.push_back(shard_ids[k]);
    counts_.push_back(shard_samples[k]);
    starts_.push_back(starts_.back() + shard_samples[k]);
  }
}

size_t EpochOrder::shard_at(uint64_t p) const {
  KILN_CHECK(p < total());
  auto it = std::upper_bound(starts_.begin(), starts_.end(), p);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

std::vector<uint32_t> EpochOrder::members(size_t k) const {
  return permutation(derive_seed(seed_, "samples", domain_, epoch_, shards_[k]),
                     static_cast<uint32_t>(counts_[k]));
}

Block rank_block(uint64_t n, uint64_t w, uint64_t r, uint64_t epoch) {
  KILN_CHECK(w > 0 && r < w);
  const uint64_t j = (r + epoch % w) % w;
  auto cut = [&](uint64_t i) {
    return static_cast<uint64_t>(static_cast<U128>(i) * n / w);
  };
  return {cut(j), cut(j + 1)};
}

double mix_uniform(uint64_t seed, uint64_t index) {
  // 2^64 / golden ratio: consecutive multiples are the most evenly spread sequence mod 1.
  const uint64_t start = xxh3_64(std::string_view("mixture"), seed);
  const uint64_t x = start + index * 0x9E3779B97F4A7C15ull;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

}  // namespace kiln::loader::detail
