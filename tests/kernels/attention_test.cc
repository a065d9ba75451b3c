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

// ---- grouped-query attention with a document mask (attention_gqa_*) -----------------------------

namespace kiln {
namespace {

using namespace kiln::testing;

struct GqaShape {
  int B, T, NH, NKV, hs;
};

// Document starts for B rows of T tokens: row b has documents every `every[b]` tokens (0: one
// document), plus a one-token document at position 1 in row 0 when T > 2.
std::vector<int32_t> doc_starts(int B, int T, std::initializer_list<int> every) {
  std::vector<int32_t> ds(size_t(B) * T, 0);
  auto it = every.begin();
  for (int b = 0; b < B; ++b, ++it) {
    const int e = it == every.end() ? 0 : *it;
    for (int t = 0; t < T; ++t) ds[size_t(b) * T + t] = e > 0 ? t / e * e : 0;
  }
  if (T > 2) {
    ds[1] = 1;
    for (int t = 2; t < T && ds[t] < 2; ++t) ds[t] = 2;
  }
  return ds;
}

TEST(KernelsAttentionGqa, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 6, NH = 4, NKV = 2, hs = 3;
  const size_t W = size_t(NH + 2 * NKV) * hs;
  auto qkv = randn(B * T * W, 31), probe = randn(B * T * NH * hs, 32);
  const auto ds = doc_starts(B, T, {0, 4});
  for (const int32_t* d : {static_cast<const int32_t*>(nullptr), ds.data()}) {
    auto objective = [&] {
      std::vector<double> out(B * T * NH * hs);
      ref::attention_gqa_forward<double>(out.data(), nullptr, qkv.data(), d, B, T, NH, NKV, hs);
      return dot(out, probe);
    };
    std::vector<double> dqkv(qkv.size());
    ref::attention_gqa_backward(dqkv.data(), probe.data(), qkv.data(), d, B, T, NH, NKV, hs);
    fd_check(qkv, dqkv, objective, "dqkv", 200);
  }
}

TEST(KernelsAttentionGqa, ReferenceWithOneKvHeadPerQueryHeadIsAttention) {
  const int B = 2, T = 9, C = 12, NH = 3;
  auto qkv = randn(B * T * 3 * C, 33), dout = randn(B * T * C, 34);
  std::vector<double> o1(B * T * C), o2 = o1, l1(B * NH * T), l2 = l1, d1(qkv.size()), d2 = d1;
  ref::attention_forward(o1.data(), l1.data(), qkv.data(), B, T, C, NH);
  ref::attention_gqa_forward(o2.data(), l2.data(), qkv.data(), nullptr, B, T, NH, NH, C / NH);
  ref::attention_backward(d1.data(), dout.data(), qkv.data(), B, T, C, NH);
  ref::attention_gqa_backward(d2.data(), dout.data(), qkv.data(), nullptr, B, T, NH, NH, C / NH);
  expect_close(o2, o1, 1e-14, "out");
  expect_close(l2, l1, 1e-14, "lse");
  expect_close(d2, d1, 1e-14, "dqkv");
}

// A document-masked row is its documents computed separately: out and gradients of a row with
// documents [0,4) and [4,9) equal those of two rows computed on their own.
TEST(KernelsAttentionGqa, ReferenceMaskedRowIsItsDocuments) {
  const int T = 9, NH = 2, NKV = 1, hs = 4, split = 4;
  const size_t W = size_t(NH + 2 * NKV) * hs, OC = size_t(NH) * hs;
  auto qkv = randn(T * W, 35), dout = randn(T * OC, 36);
  std::vector<int32_t> ds(T);
  for (int t = 0; t < T; ++t) ds[t] = t < split ? 0 : split;
  std::vector<double> out(T * OC), dqkv(qkv.size());
  ref::attention_gqa_forward(out.data(), static_cast<double*>(nullptr), qkv.data(), ds.data(), 1, T,
                             NH, NKV, hs);
  ref::attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), ds.data(), 1, T, NH, NKV, hs);
  for (int part = 0; part < 2; ++part) {
    const int t0 = part ? split : 0, n = part ? T - split : split;
    std::vector<double> q(qkv.begin() + t0 * W, qkv.begin() + (t0 + n) * W);
    std::vector<double> d(dout.begin() + t0 * OC, dout.begin() + (t0 + n) * OC);
    std::vector<double> o(n * OC), dq(q.size());
    ref::attention_gqa_forward(o.data(), static_cast<double*>(nullptr), q.data(), nullptr, 1, n, NH,
                               NKV, hs);
    ref::attention_gqa_backward(dq.data(), d.data(), q.data(), nullptr, 1, n, NH, NKV, hs);
    expect_close(o, std::vector<double>(out.begin() + t0 * OC, out.begin() + (t0 + n) * OC), 1e-14,
                 "out");
    expect_close(dq, std::vector<double>(dqkv.begin() + t0 * W, dqkv.begin() + (t0 + n) * W), 1e-14,
                 "dqkv");
  }
}

template <typename E>
void gqa_against_reference(const GqaShape& s, const std::vector<int32_t>* ds, double tol_out,
                           double tol_grad) {
  SCOPED_TRACE(::testing::Message()
               << dtype_name(dtype_of<E>()) << " B=" << s.B << " T=" << s.T << " NH=" << s.NH
               << " NKV=" << s.NKV << " hs=" << s.hs << (ds ? " doc mask" : ""));
  const size_t W = size_t(s.NH + 2 * s.NKV) * s.hs;
  const size_t n_qkv = size_t(s.B) * s.T * W, n_out = size_t(s.B) * s.T * s.NH * s.hs;
  const size_t n_lse = size_t(s.B) * s.NH * s.T;
  const int32_t* d = ds ? ds->data() : nullptr;
  auto qkv = quantize<E>(randn(n_qkv, 41));
  auto dout = quantize<E>(randn(n_out, 42));
  auto dqkv0 = quantize<E>(randn(n_qkv, 43));
  std::vector<double> out_ref(n_out), lse_ref(n_lse), dqkv_ref = dqkv0;
  ref::attention_gqa_forward(out_ref.data(), lse_ref.data(), qkv.data(), d, s.B, s.T, s.NH, s.NKV,
                             s.hs);
  ref::attention_gqa_backward(dqkv_ref.data(), dout.data(), qkv.data(), d, s.B, s.T, s.NH, s.NKV,
                              s.hs);
  auto qkv_t = to_t<E>(qkv), dout_t = to_t<E>(dout), dqkv_t = to_t<E>(dqkv0);
  std::vector<E> out_t(n_out);
  std::vector<float> lse(n_lse);
  cpu::attention_gqa_forward(out_t.data(), lse.data(), qkv_t.data(), d, s.B, s.T, s.NH, s.NKV,
                             s.hs);
  cpu::attention_gqa_backward(dqkv_t.data(), dout_t.data(), qkv_t.data(), out_t.data(), lse.data(),
                              d, s.B, s.T, s.NH, s.NKV, s.hs);
  expect_close(to_d(out_t), out_ref, tol_out, "out");
  expect_close(to_d(lse), lse_ref, 1e-5, "lse");
  expect_close(to_d(dqkv_t), dqkv_ref, tol_grad, "dqkv");
}

// Shapes: MQA, GQA, MHA; T below / across the 64-row blocks; documents shorter than, equal to and
// longer than a block, a one-token document, and a boundary inside a block.
TEST(KernelsAttentionGqa, MatchesReference) {
  const GqaShape shapes[] = {
      {2, 7, 4, 1, 8}, {2, 130, 4, 2, 16}, {1, 200, 6, 3, 32}, {2, 150, 2, 2, 8}};
  for (const GqaShape& s : shapes) {
    const auto ds = doc_starts(s.B, s.T, {17, 64});
    const auto ds_long = doc_starts(s.B, s.T, {100, 0});
    for (const auto* d : {static_cast<const std::vector<int32_t>*>(nullptr), &ds, &ds_long}) {
      gqa_against_reference<float>(s, d, 1e-5, 1e-5);
      gqa_against_reference<bf16>(s, d, 5e-3, 1.5e-2);  // bounds as attention_forward's above
      gqa_against_reference<fp16>(s, d, 6e-4, 2e-3);
    }
  }
}

TEST(KernelsAttentionGqa, FullHeadsIsAttentionBitForBit) {
  const int B = 2, T = 150, C = 64, NH = 4;
  auto qkv = to_t<bf16>(randn(B * T * 3 * C, 44)), dout = to_t<bf16>(randn(B * T * C, 45));
  std::vector<bf16> o1(B * T * C), o2 = o1, d1(qkv.size()), d2 = d1;
  std::vector<float> l1(B * NH * T), l2 = l1;
  cpu::attention_forward(o1.data(), l1.data(), qkv.data(), B, T, C, NH);
  cpu::attention_gqa_forward(o2.data(), l2.data(), qkv.data(), nullptr, B, T, NH, NH, C / NH);
  cpu::attention_backward(d1.data(), dout.data(), qkv.data(), o1.data(), l1.data(), B, T, C, NH);
  cpu::attention_gqa_backward(d2.data(), dout.data(), qkv.data(), o2.data(), l2.data(), nullptr, B,
                              T, NH, NH, C / NH);
  EXPECT_TRUE(bits_equal(o1, o2));
  EXPECT_TRUE(bits_equal(l1, l2));
  EXPECT_TRUE(bits_equal(d1, d2));
}

TEST(KernelsAttentionGqa, Fp32GradientMatchesFiniteDifferences) {
  const int B = 1, T = 70, NH = 2, NKV = 1, hs = 4;
  const size_t W = size_t(NH + 2 * NKV) * hs;
  auto qkv = quantize<float>(randn(B * T * W, 46)), probe = randn(B * T * NH * hs, 47);
  const auto ds = doc_starts(B, T, {30});
  auto objective = [&] {
    auto q = to_t<float>(qkv);
    std::vector<float> out(B * T * NH * hs), lse(B * NH * T);
    cpu::attention_gqa_forward(out.data(), lse.data(), q.data(), ds.data(), B, T, NH, NKV, hs);
    return dot(to_d(out), probe);
  };
  auto q = to_t<float>(qkv), pr = to_t<float>(probe);
  std::vector<float> out(B * T * NH * hs), lse(B * NH * T), dqkv(qkv.size());
  cpu::attention_gqa_forward(out.data(), lse.data(), q.data(), ds.data(), B, T, NH, NKV, hs);
  cpu::attention_gqa_backward(dqkv.data(), pr.data(), q.data(), out.data(), lse.data(), ds.data(),
                              B, T, NH, NKV, hs);
  fd_check(qkv, to_d(dqkv), objective, "dqkv", 64, 1e-2, 1e-2, 1e-3);
}

TEST(KernelsAttentionGqa, ThreadCountInvariant) {
  const int B = 2, T = 150, NH = 4, NKV = 2, hs = 16;
  const size_t W = size_t(NH + 2 * NKV) * hs, OC = size_t(NH) * hs;
  auto qkv = to_t<bf16>(randn(B * T * W, 48)), dout = to_t<bf16>(randn(B * T * OC, 49));
  const auto ds = doc_starts(B, T, {40, 0});
  std::vector<bf16> out0, dqkv0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<bf16> out(B * T * OC), dqkv(qkv.size());
    std::vector<float> lse(B * NH * T);
    cpu::attention_gqa_forward(out.data(), lse.data(), qkv.data(), ds.data(), B, T, NH, NKV, hs);
    cpu::attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                ds.data(), B, T, NH, NKV, hs);
    if (out0.empty()) {
      out0 = out, dqkv0 = dqkv;
      continue;
    }
    EXPECT_TRUE(bits_equal(out, out0)) << n << " threads";
    EXPECT_TRUE(bits_equal(dqkv, dqkv0)) << n << " threads";
  }
}

}  // namespace
}  // namespace kiln
