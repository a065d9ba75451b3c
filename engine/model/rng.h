// Counter-based random numbers for reproducible initialisation and synthetic data.
//
// Every value is a pure function of (seed, stream, index): element i of a tensor gets the same
// value however the tensor is later sharded across ranks or threads, and a resumed run needs to
// store nothing but the counters. The mixer is SplitMix64's finaliser applied to a combination of
// the three words (statistically fine for initialisation and synthetic data; not cryptographic).
// All functions are pure and thread-safe.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/random.h"

namespace kiln::engine {

inline uint64_t mix64(uint64_t z) { return splitmix64_mix(z); }

// 64 random bits for (seed, stream, index).
inline uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ (stream * 0xD6E8FEB86659FD93ull)) ^ index);
}

// Uniform in (0, 1): never exactly 0 or 1 (53-bit mantissa, offset by half a step).
inline double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(random_bits(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal for (seed, stream, index) by Box-Muller on two uniforms of a pair of counters.
inline double random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = random_uniform(seed, stream, 2 * index);
  const double u2 = random_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// dst[r * cols + c] = row_std[r] * random_normal(seed, stream, r * cols + c) for a rows x cols
// host array, rows in parallel (values independent of the thread count).
void random_normal_rows(float* dst, size_t rows, size_t cols, const double* row_std, uint64_t seed,
                        uint64_t stream);

}  // namespace kiln::engine
