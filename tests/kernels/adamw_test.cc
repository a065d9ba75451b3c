// adamw_update against the textbook AdamW in double, the low-precision parameter copy, gradient
// scaling, and thread-count invariance.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(KernelsAdamW, TenStepsMatchDoubleReference) {
  const size_t n = 50001;
  auto p0 = randn(n, 1, 0.02);
  std::vector<double> p = quantize<float>(p0), m(n, 0.0), v(n, 0.0);
  std::vector<float> pf = to_t<float>(p0), mf(n, 0.0f), vf(n, 0.0f);
  AdamWParams hp;
  hp.lr = 3e-3f, hp.beta1 = 0.9f, hp.beta2 = 0.95f, hp.eps = 1e-8f, hp.weight_decay = 0.1f;
  for (int step = 1; step <= 10; ++step) {
    auto g = quantize<float>(randn(n, 100 + step, 0.01));
    hp.step = step;
    hp.grad_scale = step % 2 ? 1.0f : 0.5f;  // e.g. clipping on even steps
    ref::adamw_update(p.data(), m.data(), v.data(), g.data(), n, hp);
    auto gf = to_t<float>(g);
    cpu::adamw_update(pf.data(), mf.data(), vf.data(), gf.data(), n, hp);
  }
  // fp32 vs fp64 over ten steps: parameters move by ~lr per step; fp32 error per step is a few
  // ulps of |p| ~ 0.02-0.05 and of the update; 1e-6 absolute bounds it comfortably.
  expect_close(to_d(pf), p, 1e-6, "params");
  expect_close(to_d(mf), m, 1e-8, "m");
  expect_close(to_d(vf), v, 1e-10, "v");
}

TEST(KernelsAdamW, FirstStepMovesByLearningRate) {
  // With zero state, step 1, no decay: update = lr * g / (|g| + eps) ~ lr * sign(g).
  std::vector<float> p = {1.0f, -1.0f, 0.5f}, m(3), v(3), g = {0.3f, -2.0f, 1e-3f};
  AdamWParams hp;
  hp.lr = 0.01f;
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), 3, hp);
  EXPECT_NEAR(p[0], 1.0f - 0.01f, 1e-6);
  EXPECT_NEAR(p[1], -1.0f + 0.01f, 1e-6);
  EXPECT_NEAR(p[2], 0.5f - 0.01f, 1e-6);
  // Decoupled weight decay with zero gradient: p *= 1 - lr * wd, moments stay 0.
  std::vector<float> q = {2.0f}, mq(1), vq(1), gq = {0.0f};
  hp.weight_decay = 0.5f;
  cpu::adamw_update(q.data(), mq.data(), vq.data(), gq.data(), 1, hp);
  EXPECT_FLOAT_EQ(q[0], 2.0f * (1.0f - 0.01f * 0.5f));
  EXPECT_EQ(mq[0], 0.0f);
}

TEST(KernelsAdamW, GradScaleEqualsScaledGradients) {
  const size_t n = 4097;
  auto g = to_t<float>(randn(n, 3));
  std::vector<float> g2(n);
  for (size_t i = 0; i < n; ++i) g2[i] = g[i] * 0.25f;
  std::vector<float> p1 = to_t<float>(randn(n, 4)), p2 = p1, m1(n), v1(n), m2(n), v2(n);
  AdamWParams hp;
  hp.step = 3;
  hp.grad_scale = 0.25f;
  cpu::adamw_update(p1.data(), m1.data(), v1.data(), g.data(), n, hp);
  hp.grad_scale = 1.0f;
  cpu::adamw_update(p2.data(), m2.data(), v2.data(), g2.data(), n, hp);
  EXPECT_TRUE(bits_equal(p1, p2));
  EXPECT_TRUE(bits_equal(m1, m2));
}

TEST(KernelsAdamW, LowPrecisionCopyIsRoundedParams) {
  const size_t n = 70000;
  auto p = to_t<float>(randn(n, 5)), g = to_t<float>(randn(n, 6));
  std::vector<float> m(n), v(n);
  std::vector<bf16> pb(n);
  std::vector<fp16> ph(n);
  AdamWParams hp;
  auto p2 = p;
  std::vector<float> m2(n), v2(n);
  cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n, hp, pb.data());
  cpu::adamw_update(p2.data(), m2.data(), v2.data(), g.data(), n, hp, ph.data());
  EXPECT_TRUE(bits_equal(p, p2));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(pb[i].bits, float_to_bf16(p[i]).bits);
    ASSERT_EQ(ph[i].bits, float_to_fp16(p[i]).bits);
  }
}

TEST(KernelsAdamW, ThreadCountInvariant) {
  const size_t n = 100003;
  auto p0 = to_t<float>(randn(n, 7)), g = to_t<float>(randn(n, 8));
  std::vector<float> first;
  for (int t : thread_counts()) {
    ThreadCount tc(t);
    auto p = p0;
    std::vector<float> m(n), v(n);
    AdamWParams hp;
    hp.weight_decay = 0.1f;
    cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n, hp);
    if (first.empty()) first = p;
    EXPECT_TRUE(bits_equal(p, first));
  }
}

}  // namespace
}  // namespace kiln
