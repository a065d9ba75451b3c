// attention_forward / attention_backward: the blocked online-softmax kernel against naive softmax
// attention (double), gradient checks, low precision, and thread-count invariance.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

struct Shape {
  int B, T, C, NH;
};

TEST(KernelsAttention, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 1), probe = randn(B * T * C, 2);
  auto objective = [&] {
    std::vector<double> out(B * T * C);
    ref::attention_forward<double>(out.data(), nullptr, qkv.data(), B, T, C, NH);
    return dot(out, probe);
  };
  std::vector<double> dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), probe.data(), qkv.data(), B, T, C, NH);
  fd_check(qkv, dqkv, objective, "dqkv", 240);
}

TEST(KernelsAttention, ReferenceIsCausalSoftmaxAttention) {
  // One head, T=2, hs=1: out_0 = v_0; out_1 = softmax([q1 k0, q1 k1]) . [v0, v1]; lse as defined.
  const double q0 = 0.3, q1 = -1.2, k0 = 0.5, k1 = 2.0, v0 = 1.5, v1 = -4.0;
  std::vector<double> qkv = {q0, k0, v0, q1, k1, v1}, out(2), lse(2);
  ref::attention_forward(out.data(), lse.data(), qkv.data(), 1, 2, 1, 1);
  const double s0 = q1 * k0, s1 = q1 * k1;
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  EXPECT_NEAR(out[0], v0, 1e-15);
  EXPECT_NEAR(out[1], p0 * v0 + (1 - p0) * v1, 1e-15);
  EXPECT_NEAR(lse[0], q0 * k0, 1e-15);
  EXPECT_NEAR(lse[1], std::log(std::exp(s0) + std::exp(s1)), 1e-15);
}

template <typename E>
void check_against_reference(const Shape& s, double tol_out, double tol_grad) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " B=" << s.B << " T=" << s.T
                                    << " C=" << s.C << " NH=" << s.NH);
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  const size_t n_lse = size_t(s.B) * s.NH * s.T;
  auto qkv = quantize<E>(randn(n_qkv, 21, 1.0));
  auto dout = quantize<E>(randn(n_out, 22));
  auto dqkv0 = quantize<E>(randn(n_qkv, 23));
  std::vector<double> out_ref(n_out), lse_ref(n_lse), dqkv_ref = dqkv0;
  ref::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  ref::attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), s.B, s.T, s.C, s.NH);

  auto qkv_t = to_t<E>(qkv), dout_t = to_t<E>(dout), dqkv_t = to_t<E>(dqkv0);
  std::vector<E> out_t(n_out);
  std::vector<float> lse(n_lse);
  cpu::attention_forward(out_t.data(), lse.data(), qkv_t.data(), s.B, s.T, s.C, s.NH);
  cpu::attention_backward(dqkv_t.data(), dout_t.data(), qkv_t.data(), out_t.data(), lse.data(), s.B,
                          s.T, s.C, s.NH);
  expect_close(to_d(out_t), out_ref, tol_out, "out");
  expect_close(to_d(lse), lse_ref, 1e-5, "lse");
  expect_close(to_d(dqkv_t), dqkv_ref, tol_grad, "dqkv");
}

// Shapes cover T below, at, and across the 64-row block size, T = 1, head sizes 1..64.
const Shape kShapes[] = {{1, 1, 4, 2},     {2, 7, 6, 3},     {2, 64, 32, 2},
                         {2, 130, 128, 2}, {1, 256, 256, 4}, {1, 700, 16, 1}};

// fp32: all sums in fp32 over <= T terms of O(1) values: 1e-5 relative to max|expected|.
TEST(KernelsAttention, Fp32MatchesNaiveAttention) {
  for (const Shape& s : kShapes) check_against_reference<float>(s, 1e-5, 1e-5);
}

// bf16/fp16: outputs are rounded once (half an ulp: 3.9e-3 / 4.9e-4 relative). Backward uses the
// rounded output O in D = rowsum(dO * O) (as FlashAttention does with its stored output), which
// adds about one more rounding error of O times |dO| to each score gradient, so the gradient
// tolerance is a few half-ulps: 1.5e-2 (bf16) and 2e-3 (fp16).
TEST(KernelsAttention, Bf16MatchesNaiveAttention) {
  for (const Shape& s : kShapes) check_against_reference<bf16>(s, 5e-3, 1.5e-2);
}

TEST(KernelsAttention, Fp16MatchesNaiveAttention) {
  for (const Shape& s : kShapes) check_against_reference<fp16>(s, 6e-4, 2e-3);
}

TEST(KernelsAttention, Fp32GradientMatchesFiniteDifferences) {
  const int B = 1, T = 4, C = 4, NH = 2;
  auto qkv = quantize<float>(randn(B * T * 3 * C, 5)), probe = randn(B * T * C, 6);
  auto objective = [&] {
    auto q = to_t<float>(qkv);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), q.data(), B, T, C, NH);
    return dot(to_d(out), probe);
  };
  auto q = to_t<float>(qkv), pr = to_t<float>(probe);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(qkv.size());
  cpu::attention_forward(out.data(), lse.data(), q.data(), B, T, C, NH);
  cpu::attention_backward(dqkv.data(), pr.data(), q.data(), out.data(), lse.data(), B, T, C, NH);
  fd_check(qkv, to_d(dqkv), objective, "dqkv", 48, 1e-2, 1e-2, 1e-3);
}

TEST(KernelsAttention, LargeScoresStayFinite) {
  // Scores of +-hundreds: the online softmax must rescale without overflow.
  const int B = 1, T = 100, C = 8, NH = 2;
  auto qkv = quantize<float>(randn(B * T * 3 * C, 7, 12.0));
  std::vector<double> out_ref(B * T * C), lse_ref(B * NH * T);
  ref::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), B, T, C, NH);
  auto q = to_t<float>(qkv);
  std::vector<float> out(B * T * C), lse(B * NH * T);
  cpu::attention_forward(out.data(), lse.data(), q.data(), B, T, C, NH);
  expect_close(to_d(out), out_ref, 1e-4, "out");
  expect_close(to_d(lse), lse_ref, 1e-5, "lse");
}

template <typename E>
void check_thread_invariance() {
  const int B = 2, T = 150, C = 64, NH = 4;
  auto qkv = to_t<E>(randn(B * T * 3 * C, 1)), dout = to_t<E>(randn(B * T * C, 2));
  std::vector<E> out0, dqkv0;
  std::vector<float> lse0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<E> out(B * T * C), dqkv(qkv.size());
    std::vector<float> lse(B * NH * T);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                            NH);
    if (out0.empty()) {
      out0 = out, dqkv0 = dqkv, lse0 = lse;
      continue;
    }
    EXPECT_TRUE(bits_equal(out, out0)) << n << " threads";
    EXPECT_TRUE(bits_equal(lse, lse0)) << n << " threads";
    EXPECT_TRUE(bits_equal(dqkv, dqkv0)) << n << " threads";
  }
}

TEST(KernelsAttention, ThreadCountInvariant) {
  check_thread_invariance<float>();
  check_thread_invariance<bf16>();
}

}  // namespace
}  // namespace kiln
