#include "dataprep/dedup/lsh.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kiln::prep {
namespace {

TEST(Lsh, OptimalParamsLikeDatasketch) {
  // datasketch MinHashLSH(threshold=0.8, num_perm=128) picks b=9, r=13 with equal weights.
  LshParams p = optimal_lsh_params(0.8, 128, 0.5, 0.5);
  EXPECT_EQ(p.bands, 9);
  EXPECT_EQ(p.rows, 13);
  // Weighting misses more (candidates are verified) moves the S-curve left.
  LshParams q = optimal_lsh_params(0.8, 128, 0.05, 0.95);
  EXPECT_EQ(q.bands, 16);
  EXPECT_EQ(q.rows, 8);
  EXPECT_LE(q.bands * q.rows, 128);
  LshParams r = optimal_lsh_params(0.5, 64, 0.5, 0.5);
  EXPECT_LE(r.bands * r.rows, 64);
  EXPECT_NEAR(lsh_candidate_probability(0.5, r), 0.5, 0.25);
}

TEST(Lsh, CandidateProbability) {
  LshParams p{16, 8};
  EXPECT_DOUBLE_EQ(lsh_candidate_probability(1.0, p), 1.0);
  EXPECT_DOUBLE_EQ(lsh_candidate_probability(0.0, p), 0.0);
  EXPECT_NEAR(lsh_candidate_probability(0.85, p), 1 - std::pow(1 - std::pow(0.85, 8), 16), 1e-12);
  EXPECT_GT(lsh_candidate_probability(0.85, p), 0.99);
  std::string d = describe_lsh(p);
  EXPECT_NE(d.find("16 x 8"), std::string::npos);
  EXPECT_NE(d.find("0.95"), std::string::npos);
}

TEST(Lsh, BandKeys) {
  LshParams p{4, 3};
  std::vector<uint64_t> a(12), b(12), ka(4), kb(4);
  for (int i = 0; i < 12; ++i) a[i] = b[i] = 1000 + i;
  b[4] = 7;  // band 1 differs
  lsh_band_keys(a.data(), p, ka.data());
  lsh_band_keys(b.data(), p, kb.data());
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  EXPECT_EQ(ka[2], kb[2]);
  // The same values in different bands give different keys.
  std::vector<uint64_t> same(12, 5), ks(4);
  lsh_band_keys(same.data(), p, ks.data());
  EXPECT_NE(ks[0], ks[1]);
}

}  // namespace
}  // namespace kiln::prep
