// The Llama block's operators (kernels/cpu/llama.cc): RMSNorm, RoPE (rotate-half) and SwiGLU, each
// reference against finite differences, the CPU kernels against the double reference in fp32,
// bf16 and fp16, and thread-count invariance. Grouped-query / document-masked attention is in
// attention_test.cc.
#include <cmath>

#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

// ---- RMSNorm ------------------------------------------------------------------------------------

TEST(KernelsRmsnorm, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 7;
  const double eps = 1e-5;
  auto x = randn(B * T * C, 1), w = randn(C, 2, 0.3, 1.0), probe = randn(B * T * C, 3);
  auto objective = [&] {
    std::vector<double> out(x.size());
    ref::rmsnorm_forward<double>(out.data(), nullptr, x.data(), w.data(), eps, B, T, C);
    return dot(out, probe);
  };
  std::vector<double> out(x.size()), rstd(B * T), dx(x.size()), dw(C);
  ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), eps, B, T, C);
  ref::rmsnorm_backward(dx.data(), dw.data(), probe.data(), x.data(), w.data(), rstd.data(), B, T,
                        C);
  fd_check(x, dx, objective, "dx");
  fd_check(w, dw, objective, "dw");
}

TEST(KernelsRmsnorm, ReferenceIsTheDefinition) {
  // x = (3, 4): mean square 12.5; out = x / sqrt(12.5 + eps) * w.
  std::vector<double> x = {3, 4}, w = {2, -1}, out(2), rstd(1);
  ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1e-6, 1, 1, 2);
  EXPECT_NEAR(out[0], 6 / std::sqrt(12.5 + 1e-6), 1e-14);
  EXPECT_NEAR(out[1], -4 / std::sqrt(12.5 + 1e-6), 1e-14);
}

template <typename E>
void rmsnorm_against_reference(double tol_out, double tol_grad) {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const int B = 3, T = 37, C = 72;  // rows across the 32-row chunks
  const float eps = 1e-6f;
  const size_t n = size_t(B) * T * C;
  auto x = quantize<E>(randn(n, 4)), w = quantize<E>(randn(C, 5, 0.2, 1.0));
  auto dout = quantize<E>(randn(n, 6)), dx0 = quantize<E>(randn(n, 7));
  std::vector<double> out_r(n), rstd_r(B * T), dx_r = dx0, dw_r(C, 0.5);
  ref::rmsnorm_forward(out_r.data(), rstd_r.data(), x.data(), w.data(), double(eps), B, T, C);
  ref::rmsnorm_backward(dx_r.data(), dw_r.data(), dout.data(), x.data(), w.data(), rstd_r.data(), B,
                        T, C);
  auto xt = to_t<E>(x), wt = to_t<E>(w), dt = to_t<E>(dout), dxt = to_t<E>(dx0);
  std::vector<E> out(n);
  std::vector<float> rstd(B * T), dw(C, 0.5f);
  cpu::rmsnorm_forward(out.data(), rstd.data(), xt.data(), wt.data(), eps, B, T, C);
  cpu::rmsnorm_backward(dxt.data(), dw.data(), dt.data(), xt.data(), wt.data(), rstd.data(), B, T,
                        C);
  expect_close(to_d(out), out_r, tol_out, "out");
  expect_close(to_d(rstd), rstd_r, 1e-5, "rstd");
  expect_close(to_d(dxt), dx_r, tol_grad, "dx (accumulated)");
  expect_close(to_d(dw), dw_r, 1e-4, "dweight (accumulated, fp32)");
}

// fp32: sums of C terms, 1e-5. Low precision: one rounding of each output (half an ulp of the
// largest values; inputs are the same rounded values as the reference sees).
TEST(KernelsRmsnorm, MatchesReference) {
  rmsnorm_against_reference<float>(1e-5, 1e-5);
  rmsnorm_against_reference<bf16>(8e-3, 8e-3);
  rmsnorm_against_reference<fp16>(1e-3, 1e-3);
}

// ---- RoPE ---------------------------------------------------------------------------------------

TEST(KernelsRope, ReferenceIsRotateHalf) {
  // One q head of size 4 at position 3 (NKV 1: the k head follows, then v), theta 100:
  // pairs (0,2) at angle 3 and (1,3) at angle 3 / 100^(1/2) = 0.3.
  std::vector<double> qkv(4 * 4 * 3, 0.0);  // B 1, T 4, W = (1 + 2) * 4
  double* q3 = qkv.data() + 3 * 12;
  q3[0] = 1, q3[1] = 2, q3[2] = 3, q3[3] = 4;
  q3[8] = 7;  // v: untouched
  ref::rope_forward(qkv.data(), nullptr, 100.0, 1, 4, 1, 1, 4);
  EXPECT_NEAR(q3[0], 1 * std::cos(3.0) - 3 * std::sin(3.0), 1e-12);
  EXPECT_NEAR(q3[2], 3 * std::cos(3.0) + 1 * std::sin(3.0), 1e-12);
  EXPECT_NEAR(q3[1], 2 * std::cos(0.3) - 4 * std::sin(0.3), 1e-12);
  EXPECT_NEAR(q3[3], 4 * std::cos(0.3) + 2 * std::sin(0.3), 1e-12);
  EXPECT_EQ(q3[8], 7);
  // A document starting at 2 puts token 3 at position 1.
  std::vector<double> a(qkv.size(), 0.0);
  a[3 * 12] = 1;
  std::vector<int32_t> ds = {0, 0, 2, 2};
  ref::rope_forward(a.data(), ds.data(), 100.0, 1, 4, 1, 1, 4);
  EXPECT_NEAR(a[3 * 12], std::cos(1.0), 1e-12);
  EXPECT_NEAR(a[3 * 12 + 2], std::sin(1.0), 1e-12);
}

TEST(KernelsRope, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 5, NH = 4, NKV = 2, hs = 6;
  const size_t n = size_t(B) * T * (NH + 2 * NKV) * hs;
  auto x = randn(n, 8), probe = randn(n, 9);
  std::vector<int32_t> ds = {0, 0, 0, 3, 3, 0, 1, 1, 1, 4};
  auto objective = [&] {
    auto y = x;
    ref::rope_forward(y.data(), ds.data(), 10000.0, B, T, NH, NKV, hs);
    return dot(y, probe);
  };
  auto dx = probe;
  ref::rope_backward(dx.data(), ds.data(), 10000.0, B, T, NH, NKV, hs);
  fd_check(x, dx, objective, "dqkv", 120);
}

template <typename E>
void rope_against_reference(double tol, const int32_t* ds) {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const int B = 2, T = 70, NH = 4, NKV = 2, hs = 16;
  const size_t n = size_t(B) * T * (NH + 2 * NKV) * hs;
  auto x = quantize<E>(randn(n, 10));
  auto y_r = x, d_r = x;
  ref::rope_forward(y_r.data(), ds, 500000.0, B, T, NH, NKV, hs);
  ref::rope_backward(d_r.data(), ds, 500000.0, B, T, NH, NKV, hs);
  auto y = to_t<E>(x), d = to_t<E>(x);
  cpu::rope_forward(y.data(), ds, 500000.0f, B, T, NH, NKV, hs);
  cpu::rope_backward(d.data(), ds, 500000.0f, B, T, NH, NKV, hs);
  expect_close(to_d(y), y_r, tol, "rotated");
  expect_close(to_d(d), d_r, tol, "inverse rotated");
}

TEST(KernelsRope, MatchesReference) {
  std::vector<int32_t> ds(2 * 70);
  for (int t = 0; t < 70; ++t) ds[t] = t < 30 ? 0 : (t < 31 ? 30 : 31), ds[70 + t] = t / 9 * 9;
  for (const int32_t* d :
       {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(ds.data())}) {
    // fp32: cos/sin rounded to fp32 and two products: a few ulp of fp32.
    rope_against_reference<float>(2e-6, d);
    rope_against_reference<bf16>(8e-3, d);  // one rounding of the output
    rope_against_reference<fp16>(1e-3, d);
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------

TEST(KernelsSwiglu, ReferenceGradientMatchesFiniteDifferences) {
  const size_t rows = 4;
  const int F = 5;
  auto x = randn(rows * 2 * F, 11, 2.0), probe = randn(rows * F, 12);
  auto objective = [&] {
    std::vector<double> out(rows * F);
    ref::swiglu_forward(out.data(), x.data(), rows, F);
    return dot(out, probe);
  };
  std::vector<double> dx(x.size());
  ref::swiglu_backward(dx.data(), x.data(), probe.data(), rows, F);
  fd_check(x, dx, objective, "dinp");
}

template <typename E>
void swiglu_against_reference(double tol_out, double tol_grad) {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const size_t rows = 75;
  const int F = 40;
  auto x = quantize<E>(randn(rows * 2 * F, 13, 2.0)), dout = quantize<E>(randn(rows * F, 14));
  auto dx0 = quantize<E>(randn(rows * 2 * F, 15));
  std::vector<double> out_r(rows * F), dx_r = dx0;
  ref::swiglu_forward(out_r.data(), x.data(), rows, F);
  ref::swiglu_backward(dx_r.data(), x.data(), dout.data(), rows, F);
  auto xt = to_t<E>(x), dt = to_t<E>(dout), dxt = to_t<E>(dx0);
  std::vector<E> out(rows * F);
  cpu::swiglu_forward(out.data(), xt.data(), rows, F);
  cpu::swiglu_backward(dxt.data(), xt.data(), dt.data(), rows, F);
  expect_close(to_d(out), out_r, tol_out, "out");
  expect_close(to_d(dxt), dx_r, tol_grad, "dinp (accumulated)");
}

TEST(KernelsSwiglu, MatchesReference) {
  swiglu_against_reference<float>(1e-5, 1e-5);
  swiglu_against_reference<bf16>(1e-2, 1e-2);
  swiglu_against_reference<fp16>(1.5e-3, 1.5e-3);
}

// ---- every op: the same bits for any thread count -----------------------------------------------

template <typename E>
void llama_ops_thread_invariant() {
  const int B = 2, T = 90, C = 64, NH = 4, NKV = 2, hs = 16;
  const size_t n = size_t(B) * T * C, nqkv = size_t(B) * T * (NH + 2 * NKV) * hs;
  auto x = to_t<E>(randn(n, 16)), w = to_t<E>(randn(C, 17, 0.2, 1.0)), dy = to_t<E>(randn(n, 18));
  auto qkv = to_t<E>(randn(nqkv, 19));
  std::vector<int32_t> ds(size_t(B) * T);
  for (size_t i = 0; i < ds.size(); ++i) ds[i] = int32_t(i % T) / 25 * 25;
  std::vector<std::vector<E>> first;
  std::vector<std::vector<float>> first_f;
  for (int threads : thread_counts()) {
    ThreadCount tc(threads);
    std::vector<E> out(n), dx(n), q = qkv, sw(n / 2), dsw(n);
    std::vector<float> rstd(B * T), dw(C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1e-5f, B, T, C);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), B, T,
                          C);
    cpu::rope_forward(q.data(), ds.data(), 10000.0f, B, T, NH, NKV, hs);
    cpu::swiglu_forward(sw.data(), x.data(), size_t(B) * T, C / 2);
    cpu::swiglu_backward(dsw.data(), x.data(), sw.data(), size_t(B) * T, C / 2);
    std::vector<std::vector<E>> got = {out, dx, q, sw, dsw};
    std::vector<std::vector<float>> got_f = {rstd, dw};
    if (first.empty()) {
      first = got, first_f = got_f;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bits_equal(got[i], first[i])) << i;
    for (size_t i = 0; i < got_f.size(); ++i) EXPECT_TRUE(bits_equal(got_f[i], first_f[i])) << i;
  }
}

TEST(KernelsLlamaOps, ThreadCountInvariant) {
  llama_ops_thread_invariant<float>();
  llama_ops_thread_invariant<bf16>();
}

}  // namespace
}  // namespace kiln
