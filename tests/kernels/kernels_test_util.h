// Shared helpers for the kernels_*_test.cc suites: random tensors, dtype conversion of test
// vectors, error measures, finite-difference gradient checks and a thread-count guard.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace kiln::testing {

inline std::vector<double> randn(size_t n, uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> randint(size_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Values of type T from doubles (rounded through float, then to T).
template <typename T>
std::vector<T> to_t(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_float<T>(static_cast<float>(v[i]));
  return out;
}

template <typename T>
std::vector<double> to_d(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}
inline std::vector<double> to_d(const std::vector<double>& v) { return v; }

// Round-trips doubles through T (so a double reference sees exactly the kernel's inputs).
template <typename T>
std::vector<double> quantize(const std::vector<double>& v) {
  return to_d(to_t<T>(v));
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// ||a - b|| / ||b||
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Expects max|a-b| <= tol * max(1, max|b|) and reports the worst element.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = std::max(1.0, max_abs(want));
  size_t worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(got[i] - want[i]);
    if (!(e <= worst_err)) {
      worst_err = e;
      worst = i;
    }
  }
  EXPECT_LE(worst_err, tol * scale) << what << ": worst element " << worst << " got " << got[worst]
                                    << " want " << want[worst] << " (scale " << scale << ")";
}

template <typename T>
bool bits_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Central finite-difference check of d(objective)/d(x[i]) against `analytic` for up to
// `max_checks` indices (all when x is small). objective() reads x. Tolerance is on
// |fd - an| <= atol + rtol * |an|.
inline void fd_check(std::vector<double>& x, const std::vector<double>& analytic,
                     const std::function<double()>& objective, const char* what,
                     size_t max_checks = 64, double h = 1e-6, double rtol = 1e-6,
                     double atol = 1e-8) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  if (idx.size() > max_checks) {
    std::mt19937_64 rng(x.size() * 7919 + 13);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(max_checks);
  }
  int failures = 0;
  for (size_t i : idx) {
    const double old = x[i];
    const double step = h * std::max(1.0, std::fabs(old));
    x[i] = old + step;
    const double fp = objective();
    x[i] = old - step;
    const double fm = objective();
    x[i] = old;
    const double fd = (fp - fm) / (2 * step);
    if (std::fabs(fd - analytic[i]) > atol + rtol * std::fabs(analytic[i])) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: finite difference " << fd << " vs analytic "
                      << analytic[i];
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Sets the kernel thread count for a scope and restores the previous value.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : old_(cpu::num_threads()) { cpu::set_num_threads(n); }
  ~ThreadCount() { cpu::set_num_threads(old_); }

 private:
  int old_;
};

// The thread counts used by the invariance checks (1, 2, 3 and 4 even on a 2-core machine:
// oversubscription is fine for correctness).
inline std::vector<int> thread_counts() { return {1, 2, 3, 4}; }

}  // namespace kiln::testing
