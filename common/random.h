// SplitMix64: Kiln's one small, fully specified random number generator.
//
// Used wherever a result must be reproducible bit for bit on every machine and rank (shuffles,
// MinHash permutations, synthetic data, initialisation, test data): std:: distributions are
// implementation-defined, so they are never used for that. Not cryptographic. Pure functions and
// a value type; thread-safe as long as each thread has its own generator.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace kiln {

// SplitMix64's output for state `z`: z advanced by the golden-ratio increment, then finalised.
// Also a good 64-bit mixer of any word (the counter-based generators in engine/model/rng.h build on
// it).
inline uint64_t splitmix64_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sequential generator: next() = splitmix64_mix(state), then state += the increment.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    const uint64_t out = splitmix64_mix(state_);
    state_ += 0x9E3779B97F4A7C15ull;
    return out;
  }
  // Uniform in [0, n) (Lemire's multiply-shift with rejection; n > 0).
  uint64_t below(uint64_t n) {
    KILN_CHECK(n > 0);
    __extension__ typedef unsigned __int128 U128;
    U128 m = static_cast<U128>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<U128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace kiln
