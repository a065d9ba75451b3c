// MinHash signatures with num_perm universal-hash permutations of 64-bit shingle hashes:
//   h_k(x) = (a_k * x + b_k) mod (2^61 - 1),   sig[k] = min over the shingles of h_k(x),
// with a_k in [1, p-1] and b_k in [0, p-1] drawn from a SplitMix64 stream of `seed`, so the same
// seed gives the same permutations on every machine and run. The fast kernel (AVX-512 or AVX2,
// chosen at run time) and the scalar one compute exactly the same values. A text without shingles
// gets kEmptySlot in every position (such documents take part in exact dedup only).
// Thread-safe after construction (const).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::prep {

inline constexpr uint64_t kMersenne61 = (uint64_t{1} << 61) - 1;
inline constexpr uint64_t kEmptySlot = ~uint64_t{0};

class MinHasher {
 public:
  MinHasher(int num_perm, uint64_t seed);

  int num_perm() const { return num_perm_; }
  uint64_t a(int k) const { return a_[k]; }
  uint64_t b(int k) const { return b_[k]; }

  // sig[0..num_perm) from n shingle hashes, with the fastest kernel this CPU has.
  void signature(const uint64_t* hashes, size_t n, uint64_t* sig) const;
  // The portable scalar kernel (same values).
  void signature_scalar(const uint64_t* hashes, size_t n, uint64_t* sig) const;
  // "avx512", "avx2" or "scalar": what signature() uses here.
  const char* kernel() const;

  // Estimated Jaccard similarity: the share of equal positions.
  static double jaccard(const uint64_t* a, const uint64_t* b, int num_perm);

 private:
  int num_perm_;
  int padded_;  // num_perm rounded up to the vector block
  std::vector<uint64_t> a_, b_;
  std::vector<uint64_t> a_lo31_, a_hi31_, a_hi31x2_;  // 31-bit limbs for the vector kernels
  int kernel_;
};

// (a * x + b) mod (2^61 - 1) for a, b < p and any 64-bit x; the scalar building block.
uint64_t universal_hash61(uint64_t a, uint64_t b, uint64_t x);

}  // namespace kiln::prep
