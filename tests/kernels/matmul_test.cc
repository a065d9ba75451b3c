// matmul_forward / matmul_backward: gradient check of the reference, fast vs reference in fp32,
// bf16 and fp16, null gradients, accumulation, and thread-count invariance. The bf16 tests run
// on every bf16 GEMM this machine has (Kiln's own everywhere, oneDNN where it works).
#include "kernels/cpu_isa.h"
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

struct Shape {
  int B, T, C, OC;
};

// Runs fn() once per bf16 GEMM available here (Kiln's own always), then restores the choice.
template <typename Fn>
void for_each_bf16_gemm(const Fn& fn) {
  const cpu::Bf16Gemm chosen = cpu::cpu_runtime().bf16_gemm;
  for (cpu::Bf16Gemm g : {cpu::Bf16Gemm::kKiln, cpu::Bf16Gemm::kOneDnn}) {
    if (!cpu::set_bf16_gemm(g)) {
      EXPECT_NE(g, cpu::Bf16Gemm::kKiln) << "Kiln's own bf16 GEMM must always be available";
      continue;
    }
    SCOPED_TRACE(::testing::Message() << "bf16 GEMM " << cpu::bf16_gemm_name(g));
    fn();
  }
  EXPECT_TRUE(cpu::set_bf16_gemm(chosen));
}

TEST(KernelsMatmul, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 5, OC = 4;
  auto inp = randn(B * T * C, 1), w = randn(OC * C, 2), bias = randn(OC, 3),
       probe = randn(B * T * OC, 4);
  auto objective = [&] {
    std::vector<double> out(B * T * OC);
    ref::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC);
    return dot(out, probe);
  };
  std::vector<double> dinp(inp.size()), dw(w.size()), db(bias.size());
  ref::matmul_backward(dinp.data(), dw.data(), db.data(), probe.data(), inp.data(), w.data(), B, T,
                       C, OC);
  fd_check(inp, dinp, objective, "dinp");
  fd_check(w, dw, objective, "dweight");
  fd_check(bias, db, objective, "dbias");
}

// Runs the fast kernel in type T on inputs quantised to T and compares with the double
// reference on the same (quantised) inputs. Gradients start non-zero to check accumulation.
template <typename E>
void check_against_reference(const Shape& s, bool with_bias, double tol_out, double tol_dinp,
                             double tol_dparam) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " B=" << s.B << " T=" << s.T
                                    << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
  const size_t n_in = size_t(s.B) * s.T * s.C, n_out = size_t(s.B) * s.T * s.OC;
  auto inp = quantize<E>(randn(n_in, 11)), w = quantize<E>(randn(size_t(s.OC) * s.C, 12, 0.05));
  auto bias = quantize<E>(randn(s.OC, 13)), dout = quantize<E>(randn(n_out, 14));
  auto dinp0 = quantize<E>(randn(n_in, 15)), dw0 = randn(w.size(), 16), db0 = randn(s.OC, 17);

  std::vector<double> out_ref(n_out), dinp_ref = dinp0, dw_ref = dw0, db_ref = db0;
  ref::matmul_forward(out_ref.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.B,
                      s.T, s.C, s.OC);
  ref::matmul_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                       w.data(), s.B, s.T, s.C, s.OC);

  auto inp_t = to_t<E>(inp), w_t = to_t<E>(w), bias_t = to_t<E>(bias), dout_t = to_t<E>(dout);
  std::vector<E> out_t(n_out);
  cpu::matmul_forward(out_t.data(), inp_t.data(), w_t.data(), with_bias ? bias_t.data() : nullptr,
                      s.B, s.T, s.C, s.OC);
  auto dinp_t = to_t<E>(dinp0);
  std::vector<float> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
  std::vector<double> dw_start(dw.begin(), dw.end()), db_start(db.begin(), db.end());
  // Reference accumulates onto the float-rounded starting values too.
  dw_ref = dw_start;
  db_ref = db_start;
  ref::matmul_backward<double>(nullptr, dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                               w.data(), s.B, s.T, s.C, s.OC);
  cpu::matmul_backward(dinp_t.data(), dw.data(), db.data(), dout_t.data(), inp_t.data(), w_t.data(),
                       s.B, s.T, s.C, s.OC);
  expect_close(to_d(out_t), out_ref, tol_out, "out");
  expect_close(to_d(dinp_t), dinp_ref, tol_dinp, "dinp");
  expect_close(to_d(dw), dw_ref, tol_dparam, "dweight");
  expect_close(to_d(db), db_ref, tol_dparam, "dbias");
}

const Shape kShapes[] = {{1, 1, 1, 1}, {2, 7, 33, 19}, {3, 50, 64, 130}, {4, 64, 256, 768}};

// Tolerances (relative to max(1, max|expected|)):
//  fp32: sgemm accumulates in fp32: error ~ sqrt(K) * 2^-24 * |terms|, far below 1e-5.
//  bf16/fp16 outputs and dinp are rounded once to 8 (bf16) / 11 (fp16) significant bits:
//  half an ulp is at most 2^-8 = 3.9e-3 (bf16) and 2^-11 = 4.9e-4 (fp16) of the value, so
//  5e-3 / 6e-4 (the fp32 accumulation error is orders of magnitude smaller).
//  dweight/dbias are fp32 sums of exactly representable products: fp32 tolerance.
TEST(KernelsMatmul, Fp32MatchesReference) {
  for (const Shape& s : kShapes)
    for (bool bias : {true, false}) check_against_reference<float>(s, bias, 1e-5, 1e-5, 1e-5);
}

TEST(KernelsMatmul, Bf16MatchesReference) {
  for (const Shape& s : kShapes)
    for (bool bias : {true, false})
      for_each_bf16_gemm([&] { check_against_reference<bf16>(s, bias, 5e-3, 5e-3, 1e-5); });
}

TEST(KernelsMatmul, Fp16MatchesReference) {
  for (const Shape& s : kShapes)
    for (bool bias : {true, false}) check_against_reference<fp16>(s, bias, 6e-4, 6e-4, 1e-5);
}

TEST(KernelsMatmul, NullGradientsAreSkipped) {
  const int B = 2, T = 5, C = 8, OC = 6;
  auto inp = to_t<float>(randn(B * T * C, 1)), w = to_t<float>(randn(OC * C, 2));
  auto dout = to_t<float>(randn(B * T * OC, 3));
  std::vector<float> dw(OC * C, 0.0f), dw2(OC * C, 0.0f), dinp(B * T * C, 0.0f);
  cpu::matmul_backward<float>(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), B, T,
                              C, OC);
  cpu::matmul_backward<float>(dinp.data(), dw2.data(), nullptr, dout.data(), inp.data(), w.data(),
                              B, T, C, OC);
  EXPECT_TRUE(bits_equal(dw, dw2));
  EXPECT_GT(max_abs(to_d(dinp)), 0.0);
}

// A fast-kernel gradient check straight on fp32 (the op is linear, so central differences of the
// fp32 forward are exact up to rounding of the objective).
TEST(KernelsMatmul, Fp32GradientMatchesFiniteDifferences) {
  const int B = 2, T = 4, C = 6, OC = 5;
  auto inp = randn(B * T * C, 1), w = randn(OC * C, 2), bias = randn(OC, 3),
       probe = randn(B * T * OC, 4);
  auto objective = [&] {
    auto i = to_t<float>(inp), ww = to_t<float>(w), bb = to_t<float>(bias);
    std::vector<float> out(B * T * OC);
    cpu::matmul_forward(out.data(), i.data(), ww.data(), bb.data(), B, T, C, OC);
    return dot(to_d(out), probe);
  };
  inp = quantize<float>(inp), w = quantize<float>(w), bias = quantize<float>(bias);
  auto i = to_t<float>(inp), ww = to_t<float>(w), pr = to_t<float>(probe);
  std::vector<float> dinp(inp.size()), dw(w.size()), db(bias.size());
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), pr.data(), i.data(), ww.data(), B, T, C,
                       OC);
  fd_check(inp, to_d(dinp), objective, "dinp", 64, 1e-2, 1e-3, 1e-4);
  fd_check(w, to_d(dw), objective, "dweight", 64, 1e-2, 1e-3, 1e-4);
  fd_check(bias, to_d(db), objective, "dbias", 64, 1e-2, 1e-3, 1e-4);
}

template <typename E>
void check_thread_invariance() {
  const int B = 4, T = 48, C = 96, OC = 200;
  auto inp = to_t<E>(randn(B * T * C, 1)), w = to_t<E>(randn(OC * C, 2, 0.1));
  auto bias = to_t<E>(randn(OC, 3)), dout = to_t<E>(randn(B * T * OC, 4));
  std::vector<E> out0, dinp0;
  std::vector<float> dw0, db0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<E> out(B * T * OC), dinp(B * T * C);
    std::vector<float> dw(OC * C), db(OC);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC);
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B, T,
                         C, OC);
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

// The shapes of the train_cpu model (2048 tokens, d_model 256, LM head in 256-row chunks of a
// vocab of 8192), fp32 through OpenBLAS with its own threads: bits must not depend on them.
TEST(KernelsMatmul, ThreadCountInvariantAtModelShapes) {
  struct S {
    int rows, C, OC;
  };
  for (S s : {S{2048, 256, 768}, S{2048, 1024, 256}, S{256, 256, 8192}}) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.C << "x" << s.OC);
    auto inp = to_t<float>(randn(size_t(s.rows) * s.C, 1)),
         w = to_t<float>(randn(size_t(s.OC) * s.C, 2, 0.05));
    auto dout = to_t<float>(randn(size_t(s.rows) * s.OC, 3));
    std::vector<float> out0, dinp0, dw0;
    for (int n : thread_counts()) {
      ThreadCount tc(n);
      std::vector<float> out(size_t(s.rows) * s.OC), dinp(size_t(s.rows) * s.C),
          dw(size_t(s.OC) * s.C);
      cpu::matmul_forward<float>(out.data(), inp.data(), w.data(), nullptr, 1, s.rows, s.C, s.OC);
      cpu::matmul_backward<float>(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(),
                                  w.data(), 1, s.rows, s.C, s.OC);
      if (out0.empty()) {
        out0 = out, dinp0 = dinp, dw0 = dw;
        continue;
      }
      EXPECT_TRUE(bits_equal(out, out0)) << n << " threads";
      EXPECT_TRUE(bits_equal(dinp, dinp0)) << n << " threads";
      EXPECT_TRUE(bits_equal(dw, dw0)) << n << " threads";
    }
  }
}

// Kiln's own bf16/fp16 GEMM (kernels/cpu/gemm_lp.cc: every fp16 matmul, and bf16 wherever
// oneDNN has no bf16 matmul) defines its bits exactly: each output element is one fp32 FMA chain
// over k in order starting from the bias (or 0), then rounded once (out), or added to the old
// value, rounded once (dinp; dweight in fp32). Checked bit for bit for every thread count at a
// shape with several k blocks, outputs split into row and column groups, and partial 6x16 tiles.
template <typename E>
void check_fma_chain_bits() {
  const int BT = 331, C = 337, OC = 401;
  auto inp = to_t<E>(randn(size_t(BT) * C, 21)), w = to_t<E>(randn(size_t(OC) * C, 22, 0.05));
  auto bias = to_t<E>(randn(OC, 23)), dout = to_t<E>(randn(size_t(BT) * OC, 24));
  auto dinp0 = to_t<E>(randn(size_t(BT) * C, 25));
  auto dw0 = to_t<float>(randn(size_t(OC) * C, 26));
  auto f = [](E x) { return to_float(x); };
  std::vector<E> out_ref(size_t(BT) * OC), dinp_ref = dinp0;
  std::vector<float> dw_ref = dw0;
  for (int m = 0; m < BT; ++m)
    for (int n = 0; n < OC; ++n) {
      float acc = f(bias[n]);
      for (int k = 0; k < C; ++k)
        acc = std::fma(f(inp[size_t(m) * C + k]), f(w[size_t(n) * C + k]), acc);
      out_ref[size_t(m) * OC + n] = from_float<E>(acc);
    }
  for (int m = 0; m < BT; ++m)
    for (int n = 0; n < C; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < OC; ++k)
        acc = std::fma(f(dout[size_t(m) * OC + k]), f(w[size_t(k) * C + n]), acc);
      dinp_ref[size_t(m) * C + n] = from_float<E>(f(dinp0[size_t(m) * C + n]) + acc);
    }
  for (int m = 0; m < OC; ++m)
    for (int n = 0; n < C; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < BT; ++k)
        acc = std::fma(f(dout[size_t(k) * OC + m]), f(inp[size_t(k) * C + n]), acc);
      dw_ref[size_t(m) * C + n] += acc;
    }
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<E> out(size_t(BT) * OC), dinp = dinp0;
    std::vector<float> dw = dw0;
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), 1, BT, C, OC);
    cpu::matmul_backward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), 1, BT,
                         C, OC);
    EXPECT_TRUE(bits_equal(out, out_ref)) << n << " threads";
    EXPECT_TRUE(bits_equal(dinp, dinp_ref)) << n << " threads";
    EXPECT_TRUE(bits_equal(dw, dw_ref)) << n << " threads";
  }
}

TEST(KernelsMatmul, KilnLowPrecisionGemmIsOneFmaChainPerElement) {
  const cpu::Bf16Gemm chosen = cpu::cpu_runtime().bf16_gemm;
  ASSERT_TRUE(cpu::set_bf16_gemm(cpu::Bf16Gemm::kKiln));
  check_fma_chain_bits<bf16>();
  EXPECT_TRUE(cpu::set_bf16_gemm(chosen));
  check_fma_chain_bits<fp16>();
}

TEST(KernelsMatmul, ThreadCountInvariant) {
  check_thread_invariance<float>();
  for_each_bf16_gemm([] { check_thread_invariance<bf16>(); });
  check_thread_invariance<fp16>();
}

}  // namespace
}  // namespace kiln
