#include "dataprep/dedup/minhash.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <set>

namespace kiln::prep {
namespace {

__extension__ typedef unsigned __int128 u128;

uint64_t slow_hash(uint64_t a, uint64_t b, uint64_t x) {
  const u128 p = kMersenne61;
  return static_cast<uint64_t>((static_cast<u128>(a) * (x % kMersenne61) + b) % p);
}

TEST(MinHash, UniversalHashMatchesBigIntegerArithmetic) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    uint64_t a = 1 + rng() % (kMersenne61 - 1), b = rng() % kMersenne61, x = rng();
    if (i < 8) x = ~uint64_t{0} - i;            // extremes
    if (i >= 8 && i < 16) a = kMersenne61 - 1;  // largest multiplier
    ASSERT_EQ(universal_hash61(a, b, x), slow_hash(a, b, x));
  }
}

// Every kernel this CPU has gives exactly the scalar values.
TEST(MinHash, KernelsAgreeWithScalar) {
  std::mt19937_64 rng(2);
  for (const char* force : {"", "avx2"}) {
    if (*force)
      setenv("KILN_MINHASH_KERNEL", force, 1);
    else
      unsetenv("KILN_MINHASH_KERNEL");
    for (int np : {1, 7, 32, 100, 128, 200}) {
      MinHasher mh(np, 42);
      for (int n : {1, 2, 3, 17, 500}) {
        std::vector<uint64_t> h(n);
        for (auto& v : h) v = rng();
        if (n > 2) h[1] = ~uint64_t{0};
        std::vector<uint64_t> fast(np), slow(np);
        mh.signature(h.data(), h.size(), fast.data());
        mh.signature_scalar(h.data(), h.size(), slow.data());
        ASSERT_EQ(fast, slow) << mh.kernel() << " np=" << np << " n=" << n;
        for (int k = 0; k < np; ++k) {
          uint64_t m = ~uint64_t{0};
          for (uint64_t x : h) m = std::min(m, slow_hash(mh.a(k), mh.b(k), x));
          ASSERT_EQ(slow[k], m);
        }
      }
    }
  }
  unsetenv("KILN_MINHASH_KERNEL");
}

TEST(MinHash, SeededAndReproducible) {
  MinHasher a(128, 1), b(128, 1), c(128, 2);
  for (int k = 0; k < 128; ++k) {
    EXPECT_EQ(a.a(k), b.a(k));
    EXPECT_EQ(a.b(k), b.b(k));
    EXPECT_GE(a.a(k), 1u);
    EXPECT_LT(a.a(k), kMersenne61);
    EXPECT_LT(a.b(k), kMersenne61);
  }
  EXPECT_NE(a.a(0), c.a(0));
  std::vector<uint64_t> sig(128);
  a.signature(nullptr, 0, sig.data());
  for (uint64_t v : sig) EXPECT_EQ(v, kEmptySlot);
}

TEST(MinHash, JaccardEstimateIsUnbiasedWithinNoise) {
  // Sets of 1000 elements with true Jaccard 0.5, 0.8, 0.95: the estimate over 512 permutations
  // stays within 4 standard deviations.
  std::mt19937_64 rng(3);
  const int np = 512;
  MinHasher mh(np, 9);
  for (double j : {0.5, 0.8, 0.95}) {
    // |A ∩ B| = s, |A ∪ B| = 1000: s = 1000 j; A = common + half of the rest, B = common + other.
    int common = static_cast<int>(1000 * j), rest = 1000 - common;
    std::vector<uint64_t> a, b;
    for (int i = 0; i < common; ++i) {
      uint64_t v = rng();
      a.push_back(v);
      b.push_back(v);
    }
    for (int i = 0; i < rest; ++i) (i % 2 ? a : b).push_back(rng());
    std::vector<uint64_t> sa(np), sb(np);
    mh.signature(a.data(), a.size(), sa.data());
    mh.signature(b.data(), b.size(), sb.data());
    double est = MinHasher::jaccard(sa.data(), sb.data(), np);
    double sd = std::sqrt(j * (1 - j) / np);
    EXPECT_NEAR(est, j, 4 * sd + 1e-9) << "J=" << j;
  }
}

}  // namespace
}  // namespace kiln::prep
