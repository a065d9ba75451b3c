// crossentropy_forward_backward: fused softmax + cross-entropy against the reference, ignored
// targets, padded rows, in-place gradients, low precision, thread-count invariance.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(KernelsCrossEntropy, ReferenceGradientMatchesFiniteDifferences) {
  const int BT = 4, V = 9, Vp = 9;
  auto logits = randn(BT * Vp, 1, 2.0);
  std::vector<int32_t> targets = {3, -1, 0, 8};
  const double dloss = 0.37;
  auto objective = [&] {
    std::vector<double> losses(BT);
    ref::crossentropy_forward_backward<double>(nullptr, losses.data(), logits.data(),
                                               targets.data(), dloss, BT, V, Vp);
    double s = 0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  std::vector<double> dlogits(logits.size()), losses(BT);
  ref::crossentropy_forward_backward(dlogits.data(), losses.data(), logits.data(), targets.data(),
                                     dloss, BT, V, Vp);
  fd_check(logits, dlogits, objective, "dlogits", 100);
  EXPECT_EQ(losses[1], 0.0);
}

template <typename E>
void check_against_reference(int BT, int V, int Vp, double logit_std, double tol_grad,
                             bool in_place) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " BT=" << BT << " V=" << V
                                    << " Vp=" << Vp << " in_place=" << in_place);
  auto logits = quantize<E>(randn(size_t(BT) * Vp, 61, logit_std));
  auto targets = randint(BT, 0, V, 62);
  for (int r = 0; r < BT; r += 5) targets[r] = -1;  // ignored positions
  const float dloss = 1.0f / 3.0f;
  std::vector<double> dl_ref(logits.size()), loss_ref(BT);
  ref::crossentropy_forward_backward(dl_ref.data(), loss_ref.data(), logits.data(), targets.data(),
                                     double(dloss), BT, V, Vp);
  auto lt = to_t<E>(logits);
  std::vector<float> losses(BT), losses_fwd(BT);
  std::vector<E> dl(in_place ? 0 : lt.size());
  E* dptr = in_place ? lt.data() : dl.data();
  cpu::crossentropy_forward_backward<E>(nullptr, losses_fwd.data(), lt.data(), targets.data(),
                                        dloss, BT, V, Vp);
  cpu::crossentropy_forward_backward<E>(dptr, losses.data(), lt.data(), targets.data(), dloss, BT,
                                        V, Vp);
  // Losses are fp32 sums of exp over V terms plus a log: 1e-5 relative to max(1, max loss).
  expect_close(to_d(losses), loss_ref, 1e-5, "losses");
  expect_close(to_d(losses_fwd), loss_ref, 1e-5, "losses (forward only)");
  std::vector<E> got(dptr, dptr + logits.size());
  expect_close(to_d(got), dl_ref, tol_grad, "dlogits");
  for (int r = 0; r < BT; ++r) {
    if (targets[r] < 0) {
      for (int c = 0; c < Vp; ++c) ASSERT_EQ(to_float(got[size_t(r) * Vp + c]), 0.0f);
    }
    for (int c = V; c < Vp; ++c) ASSERT_EQ(to_float(got[size_t(r) * Vp + c]), 0.0f);
  }
}

// dlogits are dloss * (p - onehot) with |.| <= dloss = 1/3. fp32: 1e-6 absolute (exp has 1-2 ulp
// error). bf16/fp16: one rounding: half an ulp of 1/3 = 2^-10 / 2^-13; 2e-3 / 3e-4.
TEST(KernelsCrossEntropy, MatchesReference) {
  for (bool in_place : {false, true}) {
    check_against_reference<float>(1, 1, 1, 1.0, 1e-6, in_place);
    check_against_reference<float>(7, 50, 64, 3.0, 1e-6, in_place);
    check_against_reference<float>(20, 8192, 8192, 2.0, 1e-6, in_place);
    check_against_reference<float>(5, 1000, 1024, 30.0, 1e-6, in_place);  // peaked softmax
    check_against_reference<bf16>(20, 8192, 8192, 2.0, 2e-3, in_place);
    check_against_reference<fp16>(20, 8192, 8192, 2.0, 3e-4, in_place);
  }
}

TEST(KernelsCrossEntropy, UniformLogitsGiveLogV) {
  const int BT = 3, V = 1000;
  std::vector<float> logits(BT * V, 0.25f), losses(BT);
  std::vector<int32_t> targets = {0, 999, 500};
  cpu::crossentropy_forward_backward<float>(nullptr, losses.data(), logits.data(), targets.data(),
                                            1.0f, BT, V, V);
  for (float l : losses) EXPECT_NEAR(l, std::log(1000.0), 1e-5);
}

TEST(KernelsCrossEntropy, ThreadCountInvariant) {
  const int BT = 37, V = 3000;
  auto logits = to_t<float>(randn(BT * V, 1, 2.0));
  auto targets = randint(BT, 0, V, 2);
  std::vector<float> l0, d0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<float> l(BT), d(logits.size());
    cpu::crossentropy_forward_backward(d.data(), l.data(), logits.data(), targets.data(), 0.5f, BT,
                                       V, V);
    if (l0.empty()) {
      l0 = l, d0 = d;
      continue;
    }
    EXPECT_TRUE(bits_equal(l, l0));
    EXPECT_TRUE(bits_equal(d, d0));
  }
}

// The vocabulary-parallel pieces: logits split into `ranks` column blocks, the row statistics
// combined as engine/parallel/tensor_parallel.cc does (max, then sums), give the fused op's losses
// and gradients (the same fp32 arithmetic: only the order of the sum of exponentials differs).
TEST(KernelsCrossEntropy, ShardedStatisticsMatchTheFusedOp) {
  const int BT = 13, V = 96;
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << "ranks=" << ranks);
    const int Vl = V / ranks;
    auto logits = to_t<float>(randn(size_t(BT) * V, 71, 3.0));
    auto targets = randint(BT, 0, V, 72);
    targets[4] = -1;
    const float dloss = 0.25f;
    std::vector<float> want_loss(BT), want_d(logits.size());
    cpu::crossentropy_forward_backward<float>(want_d.data(), want_loss.data(), logits.data(),
                                              targets.data(), dloss, BT, V, V);
    std::vector<std::vector<float>> shard(ranks, std::vector<float>(size_t(BT) * Vl));
    for (int k = 0; k < ranks; ++k)
      for (int r = 0; r < BT; ++r)
        for (int c = 0; c < Vl; ++c)
          shard[k][size_t(r) * Vl + c] = logits[size_t(r) * V + k * Vl + c];
    std::vector<float> mx(BT, -INFINITY), se(BT, 0.0f), xt(BT, 0.0f), m(BT), s(BT), t(BT);
    for (int k = 0; k < ranks; ++k) {
      cpu::crossentropy_shard_max<float>(m.data(), shard[k].data(), BT, Vl);
      for (int r = 0; r < BT; ++r) mx[r] = std::max(mx[r], m[r]);
    }
    for (int k = 0; k < ranks; ++k) {
      cpu::crossentropy_shard_sum<float>(s.data(), t.data(), shard[k].data(), mx.data(),
                                         targets.data(), BT, Vl, k * Vl);
      for (int r = 0; r < BT; ++r) {
        se[r] += s[r];
        xt[r] += t[r];
      }
    }
    std::vector<float> loss(BT, -1.0f);
    cpu::crossentropy_shard_loss(loss.data(), mx.data(), se.data(), xt.data(), targets.data(), BT);
    for (int r = 0; r < BT; ++r) {
      EXPECT_NEAR(loss[r], want_loss[r], 1e-5 * std::fabs(want_loss[r])) << "row " << r;
    }
    EXPECT_EQ(loss[4], 0.0f);  // the ignored row
    for (int k = 0; k < ranks; ++k) {
      // In place, as the model calls it.
      cpu::crossentropy_shard_backward<float>(shard[k].data(), shard[k].data(), mx.data(),
                                              se.data(), targets.data(), dloss, BT, Vl, k * Vl);
      for (int r = 0; r < BT; ++r)
        for (int c = 0; c < Vl; ++c) {
          const float want = want_d[size_t(r) * V + k * Vl + c];
          ASSERT_NEAR(shard[k][size_t(r) * Vl + c], want, 1e-7 + 1e-5 * std::fabs(want))
              << "row " << r << " column " << k * Vl + c;
        }
    }
  }
}

}  // namespace
}  // namespace kiln
