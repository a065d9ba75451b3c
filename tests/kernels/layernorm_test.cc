// layernorm_forward / layernorm_backward against the double reference, gradient checks, low
// precision and thread-count invariance.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(KernelsLayernorm, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 7;
  auto inp = randn(B * T * C, 1, 2.0, 0.5), w = randn(C, 2), b = randn(C, 3),
       probe = randn(B * T * C, 4);
  auto objective = [&] {
    std::vector<double> out(inp.size());
    ref::layernorm_forward<double>(out.data(), nullptr, nullptr, inp.data(), w.data(), b.data(), B,
                                   T, C);
    return dot(out, probe);
  };
  std::vector<double> out(inp.size()), mean(B * T), rstd(B * T);
  ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), B, T,
                         C);
  std::vector<double> dinp(inp.size()), dw(C), db(C);
  ref::layernorm_backward(dinp.data(), dw.data(), db.data(), probe.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), B, T, C);
  fd_check(inp, dinp, objective, "dinp", 64, 1e-6, 1e-6, 1e-7);
  fd_check(w, dw, objective, "dweight");
  fd_check(b, db, objective, "dbias");
}

template <typename E>
void check_against_reference(int B, int T, int C, bool with_bias, double tol_out, double tol_dinp) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " B=" << B << " T=" << T
                                    << " C=" << C << " bias=" << with_bias);
  const size_t n = size_t(B) * T * C;
  auto inp = quantize<E>(randn(n, 31, 3.0, 1.0)), w = quantize<E>(randn(C, 32, 0.5, 1.0));
  auto b = quantize<E>(randn(C, 33)), dout = quantize<E>(randn(n, 34));
  auto dinp0 = quantize<E>(randn(n, 35));
  auto dw0 = quantize<float>(randn(C, 36)), db0 = quantize<float>(randn(C, 37));
  std::vector<double> out_ref(n), mean_ref(B * T), rstd_ref(B * T), dinp_ref = dinp0, dw_ref = dw0,
                                                                    db_ref = db0;
  ref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), inp.data(), w.data(),
                         with_bias ? b.data() : nullptr, B, T, C);
  ref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                          w.data(), mean_ref.data(), rstd_ref.data(), B, T, C);
  auto inp_t = to_t<E>(inp), w_t = to_t<E>(w), b_t = to_t<E>(b), dout_t = to_t<E>(dout);
  auto dinp_t = to_t<E>(dinp0);
  std::vector<E> out_t(n);
  std::vector<float> mean(B * T), rstd(B * T), dw = to_t<float>(dw0), db = to_t<float>(db0);
  cpu::layernorm_forward(out_t.data(), mean.data(), rstd.data(), inp_t.data(), w_t.data(),
                         with_bias ? b_t.data() : nullptr, B, T, C);
  cpu::layernorm_backward(dinp_t.data(), dw.data(), db.data(), dout_t.data(), inp_t.data(),
                          w_t.data(), mean.data(), rstd.data(), B, T, C);
  expect_close(to_d(out_t), out_ref, tol_out, "out");
  expect_close(to_d(mean), mean_ref, 1e-6, "mean");
  expect_close(to_d(rstd), rstd_ref, 1e-5, "rstd");
  expect_close(to_d(dinp_t), dinp_ref, tol_dinp, "dinp");
  expect_close(to_d(dw), dw_ref, 1e-5, "dweight");
  expect_close(to_d(db), db_ref, 1e-5, "dbias");
}

// fp32: row sums of C values in fp32, relative error ~1e-6; 1e-5 relative to max|expected|.
// bf16/fp16: one rounding of out / dinp (half an ulp: 3.9e-3 / 4.9e-4 of the value): 5e-3 / 6e-4.
// dweight/dbias are fp32 accumulations of fp32 products: 1e-5.
TEST(KernelsLayernorm, Fp32MatchesReference) {
  for (bool bias : {true, false}) {
    check_against_reference<float>(1, 1, 1, bias, 1e-5, 1e-5);
    check_against_reference<float>(2, 5, 37, bias, 1e-5, 1e-5);
    check_against_reference<float>(4, 64, 256, bias, 1e-5, 1e-5);
    check_against_reference<float>(3, 33, 768, bias, 1e-5, 1e-5);
  }
}

TEST(KernelsLayernorm, LowPrecisionMatchesReference) {
  for (bool bias : {true, false}) {
    check_against_reference<bf16>(2, 5, 37, bias, 5e-3, 5e-3);
    check_against_reference<bf16>(4, 64, 256, bias, 5e-3, 5e-3);
    check_against_reference<fp16>(2, 5, 37, bias, 6e-4, 6e-4);
    check_against_reference<fp16>(4, 64, 256, bias, 6e-4, 6e-4);
  }
}

TEST(KernelsLayernorm, Fp32GradientMatchesFiniteDifferences) {
  const int B = 1, T = 3, C = 6;
  auto inp = quantize<float>(randn(B * T * C, 1)), w = quantize<float>(randn(C, 2));
  auto b = quantize<float>(randn(C, 3)), probe = randn(B * T * C, 4);
  auto objective = [&] {
    auto i = to_t<float>(inp), ww = to_t<float>(w), bb = to_t<float>(b);
    std::vector<float> out(i.size());
    cpu::layernorm_forward<float>(out.data(), nullptr, nullptr, i.data(), ww.data(), bb.data(), B,
                                  T, C);
    return dot(to_d(out), probe);
  };
  auto i = to_t<float>(inp), ww = to_t<float>(w), bb = to_t<float>(b), pr = to_t<float>(probe);
  std::vector<float> out(i.size()), mean(B * T), rstd(B * T), dinp(i.size()), dw(C), db(C);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), i.data(), ww.data(), bb.data(), B, T,
                         C);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), pr.data(), i.data(), ww.data(),
                          mean.data(), rstd.data(), B, T, C);
  fd_check(inp, to_d(dinp), objective, "dinp", 64, 1e-2, 1e-2, 2e-3);
  fd_check(w, to_d(dw), objective, "dweight", 64, 1e-2, 1e-2, 2e-3);
  fd_check(b, to_d(db), objective, "dbias", 64, 1e-2, 1e-2, 2e-3);
}

template <typename E>
void check_thread_invariance() {
  const int B = 3, T = 100, C = 192;
  auto inp = to_t<E>(randn(B * T * C, 1)), w = to_t<E>(randn(C, 2)), b = to_t<E>(randn(C, 3));
  auto dout = to_t<E>(randn(B * T * C, 4));
  std::vector<E> out0, dinp0;
  std::vector<float> dw0, db0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<E> out(inp.size()), dinp(inp.size());
    std::vector<float> mean(B * T), rstd(B * T), dw(C), db(C);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), B,
                           T, C);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data(), B, T, C);
    if (out0.empty()) {
      out0 = out, dinp0 = dinp, dw0 = dw, db0 = db;
      continue;
    }
    EXPECT_TRUE(bits_equal(out, out0)) << n << " threads";
    EXPECT_TRUE(bits_equal(dinp, dinp0)) << n << " threads";
    EXPECT_TRUE(bits_equal(dw, dw0)) << n << " threads";
    EXPECT_TRUE(bits_equal(db, db0)) << n << " threads";
  }
}

TEST(KernelsLayernorm, ThreadCountInvariant) {
  check_thread_invariance<float>();
  check_thread_invariance<bf16>();
}

}  // namespace
}  // namespace kiln
