// Locality-sensitive hashing over MinHash signatures: bands x rows.
//
// Two documents become candidates when all `rows` values of at least one of `bands` bands are
// equal; at Jaccard s that happens with probability 1 - (1 - s^rows)^bands (the S-curve).
// optimal_lsh_params() picks (bands, rows), bands * rows <= num_perm, minimising
//   fp_weight * integral_0^t P(s) ds  +  fn_weight * integral_t^1 (1 - P(s)) ds
// exactly as datasketch's MinHashLSH does (ties: the first found, bands ascending, then rows).
// Band keys are XXH3-64 of the band's rows values (little-endian), seeded with the band index,
// so equal keys in different bands never mean the same thing. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::prep {

struct LshParams {
  int bands = 0;
  int rows = 0;
};

LshParams optimal_lsh_params(double threshold, int num_perm, double fp_weight, double fn_weight);

// 1 - (1 - s^rows)^bands.
double lsh_candidate_probability(double jaccard, const LshParams& params);

// keys[0..bands): one key per band of sig (which has at least bands * rows values).
void lsh_band_keys(const uint64_t* sig, const LshParams& params, uint64_t* keys);

// "b x r = 14 x 9; P(candidate) at J=0.5: 0.027, 0.7: 0.438, ..." for logs and --help examples.
std::string describe_lsh(const LshParams& params);

}  // namespace kiln::prep
