#include "dataprep/dedup/lsh.h"

#include <cmath>
#include <cstdio>

#include "common/hash.h"

namespace kiln::prep {
namespace {

// Composite Simpson's rule; the integrands are smooth polynomials, so 512 panels are ample.
template <typename F>
double integrate(F f, double lo, double hi) {
  const int n = 512;
  if (hi <= lo) return 0.0;
  const double h = (hi - lo) / n;
  double sum = f(lo) + f(hi);
  for (int i = 1; i < n; ++i) sum += f(lo + i * h) * (i % 2 ? 4.0 : 2.0);
  return sum * h / 3.0;
}

}  // namespace

double lsh_candidate_probability(double s, const LshParams& p) {
  return 1.0 - std::pow(1.0 - std::pow(s, p.rows), p.bands);
}

LshParams optimal_lsh_params(double threshold, int num_perm, double fp_weight, double fn_weight) {
  LshParams best{1, num_perm};
  double best_error = INFINITY;
  for (int b = 1; b <= num_perm; ++b) {
    for (int r = 1; r <= num_perm / b; ++r) {
      LshParams p{b, r};
      double fp = integrate([&](double s) { return lsh_candidate_probability(s, p); }, 0.0,
                            threshold);
      double fn = integrate([&](double s) { return 1.0 - lsh_candidate_probability(s, p); },
                            threshold, 1.0);
      double error = fp * fp_weight + fn * fn_weight;
      if (error < best_error) {
        best_error = error;
        best = p;
      }
    }
  }
  return best;
}

void lsh_band_keys(const uint64_t* sig, const LshParams& params, uint64_t* keys) {
  for (int band = 0; band < params.bands; ++band) {
    keys[band] = xxh3_64(sig + static_cast<size_t>(band) * params.rows,
                         sizeof(uint64_t) * params.rows, static_cast<uint64_t>(band));
  }
}

std::string describe_lsh(const LshParams& params) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "bands x rows = %d x %d; P(candidate) at J=0.5: %.3f, 0.7: %.3f, 0.8: %.3f, "
                "0.9: %.3f, 0.95: %.3f",
                params.bands, params.rows, lsh_candidate_probability(0.5, params),
                lsh_candidate_probability(0.7, params), lsh_candidate_probability(0.8, params),
                lsh_candidate_probability(0.9, params), lsh_candidate_probability(0.95, params));
  return buf;
}

}  // namespace kiln::prep
