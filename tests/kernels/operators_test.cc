// The entries of the operator list (kernels/operators.inc) whose contract is "the plain sequence of
// other operators, or one fused pass": on the CPU (kFusedGemmGelu, kFusedResidualLayernorm,
// kMultiTensorAdamW all false) they must give exactly the bits of that sequence, in every dtype;
// and the vocabulary-parallel embedding's per-rank parts must add up to the whole embedding.
// tests/kernels/kernels_cuda_gpu.cc holds the CUDA side against these.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using testing::randint;
using testing::randn;
using testing::to_t;

static_assert(!CpuBackend::kFusedGemmGelu && !CpuBackend::kFusedResidualLayernorm &&
              !CpuBackend::kMultiTensorAdamW);
static_assert(CudaBackend::kFusedGemmGelu && CudaBackend::kFusedResidualLayernorm &&
              CudaBackend::kMultiTensorAdamW);

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
void residual_layernorm_is_the_sequence() {
  const int B = 2, T_ = 5, C = 48;
  const size_t n = size_t(B) * T_ * C;
  const auto a = to_t<T>(randn(n, 1)), b = to_t<T>(randn(n, 2));
  const auto w = to_t<T>(randn(C, 3, 0.2, 1.0)), bias = to_t<T>(randn(C, 4, 0.1));
  std::vector<T> res1(n), out1(n), res2(n), out2(n);
  std::vector<float> m1(B * T_), r1(B * T_), m2(B * T_), r2(B * T_);
  CpuBackend::residual_layernorm_forward(res1.data(), out1.data(), m1.data(), r1.data(), a.data(),
                                         b.data(), w.data(), bias.data(), B, T_, C);
  CpuBackend::residual_forward(res2.data(), a.data(), b.data(), n);
  CpuBackend::layernorm_forward(out2.data(), m2.data(), r2.data(), res2.data(), w.data(),
                                bias.data(), B, T_, C);
  EXPECT_TRUE(same_bits(res1, res2));
  EXPECT_TRUE(same_bits(out1, out2));
  EXPECT_TRUE(same_bits(m1, m2));
  EXPECT_TRUE(same_bits(r1, r2));
}

TEST(KernelsOperators, ResidualLayernormIsResidualThenLayernorm) {
  residual_layernorm_is_the_sequence<float>();
  residual_layernorm_is_the_sequence<bf16>();
  residual_layernorm_is_the_sequence<fp16>();
}

template <typename T>
void gemm_gelu_is_the_sequence() {
  const int B = 2, T_ = 3, C = 32, OC = 64;
  const auto inp = to_t<T>(randn(size_t(B) * T_ * C, 5));
  const auto w = to_t<T>(randn(size_t(OC) * C, 6, 0.1)), bias = to_t<T>(randn(OC, 7, 0.1));
  const size_t n = size_t(B) * T_ * OC;
  std::vector<T> out1(n), pre1(n), out2(n), pre2(n);
  CpuBackend::matmul_gelu_forward(out1.data(), pre1.data(), inp.data(), w.data(), bias.data(), B,
                                  T_, C, OC);
  CpuBackend::matmul_forward(pre2.data(), inp.data(), w.data(), bias.data(), B, T_, C, OC);
  CpuBackend::gelu_forward(out2.data(), pre2.data(), n);
  EXPECT_TRUE(same_bits(pre1, pre2));
  EXPECT_TRUE(same_bits(out1, out2));

  // Backward of the layer after the GELU: C2 = OC inputs (the GELU's outputs), OC2 outputs.
  const int C2 = OC, OC2 = 24;
  const auto w2 = to_t<T>(randn(size_t(OC2) * C2, 8, 0.1));
  const auto dout = to_t<T>(randn(size_t(B) * T_ * OC2, 9));
  std::vector<T> dpre1(n, from_float<T>(123.0f)), dgelu(n), dpre2(n);  // dpre1 is overwritten
  std::vector<float> dw1(size_t(OC2) * C2, 0.5f), db1(OC2, 0.25f), dw2 = dw1, db2 = db1;
  CpuBackend::matmul_dgelu_backward(dpre1.data(), dw1.data(), db1.data(), dout.data(), out1.data(),
                                    w2.data(), pre1.data(), B, T_, C2, OC2);
  CpuBackend::matmul_backward(dgelu.data(), dw2.data(), db2.data(), dout.data(), out1.data(),
                              w2.data(), B, T_, C2, OC2);
  CpuBackend::gelu_backward(dpre2.data(), pre1.data(), dgelu.data(), n);
  EXPECT_TRUE(same_bits(dpre1, dpre2));
  EXPECT_TRUE(same_bits(dw1, dw2));  // accumulated onto 0.5, as matmul_backward does
  EXPECT_TRUE(same_bits(db1, db2));
}

TEST(KernelsOperators, GemmGeluIsMatmulThenGelu) {
  gemm_gelu_is_the_sequence<float>();
  gemm_gelu_is_the_sequence<bf16>();
  gemm_gelu_is_the_sequence<fp16>();
}

TEST(KernelsOperators, MultiTensorAdamWIsAdamWPerTensor) {
  const size_t sizes[] = {1000, 1, 70001};
  const float decays[] = {0.1f, 0.0f, 0.1f};
  AdamWParams hp;
  hp.lr = 3e-3f;
  hp.step = 7;
  hp.grad_scale = 0.5f;
  hp.weight_decay = 99.0f;  // ignored by the multi-tensor form: each tensor has its own
  for (DType lp : {DType::kF32, DType::kBF16}) {
    std::vector<std::vector<float>> p1, m1, v1, g, p2, m2, v2;
    std::vector<std::vector<bf16>> lp1, lp2;
    std::vector<AdamWTensor> tensors;
    for (size_t i = 0; i < 3; ++i) {
      const auto init = randn(sizes[i], 10 + i);
      p1.emplace_back(init.begin(), init.end());
      const auto grad = randn(sizes[i], 20 + i);
      g.emplace_back(grad.begin(), grad.end());
      m1.emplace_back(sizes[i], 0.01f);
      v1.emplace_back(sizes[i], 0.02f);
      lp1.emplace_back(sizes[i]);
    }
    p2 = p1, m2 = m1, v2 = v1, lp2 = lp1;
    for (size_t i = 0; i < 3; ++i) {
      AdamWTensor t;
      t.params = p1[i].data(), t.m = m1[i].data(), t.v = v1[i].data(), t.grads = g[i].data();
      t.params_lp = i == 1 ? nullptr : lp1[i].data();  // a tensor without a low-precision copy
      t.n = sizes[i], t.weight_decay = decays[i];
      tensors.push_back(t);
    }
    CpuBackend::adamw_update_multi(tensors.data(), 3, hp, lp);
    for (size_t i = 0; i < 3; ++i) {
      AdamWParams h = hp;
      h.weight_decay = decays[i];
      if (lp == DType::kBF16 && i != 1) {
        CpuBackend::adamw_update(p2[i].data(), m2[i].data(), v2[i].data(), g[i].data(), sizes[i], h,
                                 lp2[i].data());
      } else {
        CpuBackend::adamw_update(p2[i].data(), m2[i].data(), v2[i].data(), g[i].data(), sizes[i],
                                 h);
      }
      EXPECT_TRUE(same_bits(p1[i], p2[i])) << i;
      EXPECT_TRUE(same_bits(m1[i], m2[i])) << i;
      EXPECT_TRUE(same_bits(v1[i], v2[i])) << i;
      EXPECT_TRUE(same_bits(lp1[i], lp2[i])) << i;
    }
  }
}

// tp ranks each hold V/tp rows of wte; the parts (rank 0 adds wpe) sum to the embedding, and the
// rows' gradients together are encoder_backward's.
// With doc_start (model.doc_mask) the position rows restart at each document start.
template <typename T>
void tp_embedding_parts_add_up(int tp, bool masked) {
  SCOPED_TRACE(::testing::Message() << "tp " << tp << " masked " << masked);
  const int B = 2, T_ = 6, C = 16, V = 24, Vl = V / tp;
  const std::vector<int32_t> starts = {0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1};
  const int32_t* ds = masked ? starts.data() : nullptr;
  const auto tokens = randint(size_t(B) * T_, 0, V, 11);
  const auto wte = to_t<T>(randn(size_t(V) * C, 12)), wpe = to_t<T>(randn(size_t(T_) * C, 13));
  const size_t n = size_t(B) * T_ * C;
  std::vector<float> sum(n, 0.0f), part(n, 7.0f);  // part is overwritten
  std::vector<float> dwte_parts(size_t(V) * C, 0.0f);
  const auto dout = to_t<T>(randn(n, 14));
  for (int r = 0; r < tp; ++r) {
    const T* local = wte.data() + size_t(r) * Vl * C;
    CpuBackend::tp_embedding_forward(part.data(), tokens.data(), ds, local,
                                     r == 0 ? wpe.data() : nullptr, B, T_, C, r * Vl, Vl);
    for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    CpuBackend::tp_embedding_backward_wte(dwte_parts.data() + size_t(r) * Vl * C, dout.data(),
                                          tokens.data(), B, T_, C, r * Vl, Vl);
  }
  std::vector<float> full(n);
  CpuBackend::encoder_forward(full.data(), tokens.data(), ds,
                              testing::to_t<float>(testing::to_d(wte)).data(),
                              testing::to_t<float>(testing::to_d(wpe)).data(), B, T_, C);
  EXPECT_TRUE(same_bits(sum, full));  // each element is one wte value + one wpe value
  std::vector<float> dwte(size_t(V) * C, 0.0f);
  CpuBackend::encoder_backward(dwte.data(), static_cast<float*>(nullptr), dout.data(),
                               tokens.data(), ds, B, T_, C);
  EXPECT_TRUE(same_bits(dwte_parts, dwte));
}

TEST(KernelsOperators, TpEmbeddingPartsAddUpToTheEmbedding) {
  for (int tp : {1, 2, 4}) {
    for (bool masked : {false, true}) {
      tp_embedding_parts_add_up<float>(tp, masked);
      tp_embedding_parts_add_up<bf16>(tp, masked);
    }
  }
}

}  // namespace
}  // namespace kiln
