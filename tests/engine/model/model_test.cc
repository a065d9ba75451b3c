// The GPT model on the CPU kernels: checkpointing modes are bit-identical, gradient accumulation
// and head chunking agree, activation memory follows the plan.
#include "engine/model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/hash.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "kernels/ops.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

using test::small_model;

struct ModelRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

// A small llama: grouped-query attention (4 heads on 2), SwiGLU, RMSNorm, rotary positions,
// untied embeddings, no biases, document mask.
ModelConfig small_llama() {
  ModelConfig m = small_model();
  m.arch = Arch::kLlama;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.tie_embeddings = false;
  m.bias = false;
  m.doc_mask = true;
  return m;
}

// Document starts of `rows` rows of T tokens: documents every 7 tokens, shifted by the row.
std::vector<int32_t> doc_starts(int rows, int T) {
  std::vector<int32_t> ds(size_t(rows) * T);
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < T; ++t) ds[size_t(r) * T + t] = t < r ? 0 : (t - r) / 7 * 7 + r;
  return ds;
}

// One forward+backward over `rows` sequences split into micro-batches of `micro` rows.
ModelRun run_model(Precision p, Recompute r, int rows, int micro, int64_t head_chunk = 0,
                   const ModelConfig& m = small_model()) {
  ParamStore params(m, p);
  params.init(11);
  auto model = Model::create(&params, micro, r, head_chunk);
  const int T = static_cast<int>(m.seq_len);
  std::vector<int32_t> in(rows * T), tg(rows * T);
  for (int i = 0; i < rows * T; ++i) {
    in[i] = static_cast<int32_t>(random_bits(3, 1, i) % m.vocab_size);
    tg[i] = static_cast<int32_t>(random_bits(3, 2, i) % m.vocab_size);
  }
  tg[5] = -1;  // an ignored position
  const double scale = p == Precision::kFp16 ? 256.0 : 1.0;
  const std::vector<int32_t> ds = doc_starts(rows, T);
  ModelRun out;
  out.losses.resize(rows * T);
  params.zero_grads();
  for (int r0 = 0; r0 < rows; r0 += micro) {
    model->forward_backward(in.data() + r0 * T, tg.data() + r0 * T,
                            static_cast<float>(scale / (rows * T)), out.losses.data() + r0 * T,
                            ds.data() + r0 * T);
  }
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const float* g = params.grad(static_cast<int>(i));
    out.grads.emplace_back(g, g + params.tensors()[i].numel);
  }
  return out;
}

void checkpointing_modes_are_bit_identical(const ModelConfig& m) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    ModelRun none = run_model(p, Recompute::kNone, 4, 4, 0, m);
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      ModelRun other = run_model(p, r, 4, 4, 0, m);
      ASSERT_EQ(0, std::memcmp(none.losses.data(), other.losses.data(), none.losses.size() * 4))
          << precision_name(p) << " " << recompute_name(r);
      for (size_t t = 0; t < none.grads.size(); ++t) {
        ASSERT_EQ(
            0, std::memcmp(none.grads[t].data(), other.grads[t].data(), none.grads[t].size() * 4))
            << precision_name(p) << " " << recompute_name(r) << " tensor " << t;
      }
    }
    EXPECT_EQ(none.losses[5], 0.0f);  // ignored target
    for (size_t t = 0; t < none.grads.size(); ++t) {
      double ss = 0;
      for (float g : none.grads[t]) ss += double(g) * g;
      EXPECT_TRUE(std::isfinite(ss));
      EXPECT_GT(ss, 0.0) << "tensor " << t << " got no gradient";
    }
  }
}

TEST(Model, CheckpointingModesAreBitIdentical) {
  checkpointing_modes_are_bit_identical(small_model());
}

TEST(Model, LlamaCheckpointingModesAreBitIdentical) {
  checkpointing_modes_are_bit_identical(small_llama());
}

// The document mask reaches the model: masked and unmasked runs differ, and a row's tokens after
// a document start do not depend on the tokens before it.
TEST(Model, LlamaDocumentMaskSeparatesDocuments) {
  ModelConfig m = small_llama();
  ModelRun masked = run_model(Precision::kFp32, Recompute::kNone, 4, 4, 0, m);
  m.doc_mask = false;
  ModelRun plain = run_model(Precision::kFp32, Recompute::kNone, 4, 4, 0, m);
  EXPECT_GT(rel_diff(masked.losses, plain.losses), 1e-4);
  // Row 0's second document starts at 7: change the tokens before it, its losses stay.
  m.doc_mask = true;
  ParamStore params(m, Precision::kFp32);
  params.init(11);
  auto model = Model::create(&params, 1, Recompute::kNone);
  const int T = static_cast<int>(m.seq_len);
  std::vector<int32_t> in(T), tg(T), ds = doc_starts(1, T);
  for (int i = 0; i < T; ++i) {
    in[i] = static_cast<int32_t>(random_bits(5, 1, i) % m.vocab_size);
    tg[i] = static_cast<int32_t>(random_bits(5, 2, i) % m.vocab_size);
  }
  std::vector<float> a(T), b(T);
  model->forward(in.data(), tg.data(), a.data(), ds.data());
  for (int i = 0; i < 7; ++i) in[i] = (in[i] + 1) % static_cast<int32_t>(m.vocab_size);
  model->forward(in.data(), tg.data(), b.data(), ds.data());
  for (int i = 0; i < 7; ++i) EXPECT_NE(a[i], b[i]) << i;
  for (int i = 7; i < T; ++i) EXPECT_EQ(a[i], b[i]) << i;
}

// GPT-2 with model.doc_mask: a packed row (documents at 0, 7 and 14 of 20) gives each token the
// loss its document gives alone (its own row from position 0: the learned positions restart),
// and the gradients are the sum of the documents' gradients. Without the mask the later
// documents' losses differ, so the comparison can fail.
TEST(Model, Gpt2PackedRowIsItsDocumentsAlone) {
  ModelConfig m = small_model();
  m.doc_mask = true;
  const int T = static_cast<int>(m.seq_len);
  ParamStore params(m, Precision::kFp32);
  params.init(11);
  std::vector<int32_t> in(T), tg(T), ds = doc_starts(1, T);
  for (int i = 0; i < T; ++i) {
    in[i] = static_cast<int32_t>(random_bits(5, 1, i) % m.vocab_size);
    tg[i] = static_cast<int32_t>(random_bits(5, 2, i) % m.vocab_size);
  }
  std::vector<float> packed(T);
  params.zero_grads();
  Model::create(&params, 1, Recompute::kNone)
      ->forward_backward(in.data(), tg.data(), 1.0f, packed.data(), ds.data());
  std::vector<std::vector<float>> grads, sum;
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const float* g = params.grad(static_cast<int>(i));
    grads.emplace_back(g, g + params.tensors()[i].numel);
    sum.emplace_back(params.tensors()[i].numel, 0.0f);
  }
  std::vector<float> alone(T);
  for (int s0 = 0; s0 < T; s0 += 7) {
    const int n = std::min(7, T - s0);
    ModelConfig md = m;
    md.seq_len = n;  // wpe (n, C): the first n rows of the packed model's
    ParamStore pd(md, Precision::kFp32);
    ASSERT_EQ(pd.tensors().size(), params.tensors().size());
    for (size_t i = 0; i < pd.tensors().size(); ++i)
      std::memcpy(pd.master(static_cast<int>(i)), params.master(static_cast<int>(i)),
                  pd.tensors()[i].numel * sizeof(float));
    pd.sync_low_precision();
    pd.zero_grads();
    const std::vector<int32_t> zeros(n, 0);
    Model::create(&pd, 1, Recompute::kNone)
        ->forward_backward(in.data() + s0, tg.data() + s0, 1.0f, alone.data() + s0, zeros.data());
    for (size_t i = 0; i < pd.tensors().size(); ++i) {
      const float* g = pd.grad(static_cast<int>(i));
      for (size_t k = 0; k < pd.tensors()[i].numel; ++k) sum[i][k] += g[k];
    }
  }
  for (int i = 0; i < T; ++i) EXPECT_NEAR(packed[i], alone[i], 2e-6) << "token " << i;
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_LT(rel_diff(grads[i], sum[i]), 1e-5) << params.tensors()[i].name;

  // Without the mask, the tokens of the later documents see earlier ones and other positions.
  m.doc_mask = false;
  ParamStore plain_params(m, Precision::kFp32);
  plain_params.init(11);
  std::vector<float> plain(T);
  Model::create(&plain_params, 1, Recompute::kNone)
      ->forward(in.data(), tg.data(), plain.data(), ds.data());
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(plain[i], alone[i], 2e-6) << "token " << i;
  double later = 0;
  for (int i = 7; i < T; ++i) later = std::max(later, double(std::abs(plain[i] - alone[i])));
  EXPECT_GT(later, 1e-3);
}

TEST(Model, LlamaAccumulationAndHeadChunksAgree) {
  const ModelConfig m = small_llama();
  ModelRun whole = run_model(Precision::kFp32, Recompute::kNone, 4, 4, 0, m);
  ModelRun accum = run_model(Precision::kFp32, Recompute::kNone, 4, 2, 0, m);
  ModelRun chunked = run_model(Precision::kFp32, Recompute::kNone, 4, 4, 7, m);
  for (size_t t = 0; t < whole.grads.size(); ++t) {
    EXPECT_LT(rel_diff(accum.grads[t], whole.grads[t]), 1e-5) << t;
    EXPECT_LT(rel_diff(chunked.grads[t], whole.grads[t]), 1e-5) << t;
  }
}

TEST(Model, AccumulationAndHeadChunksAgree) {
  ModelRun whole = run_model(Precision::kFp32, Recompute::kNone, 4, 4);
  ModelRun accum = run_model(Precision::kFp32, Recompute::kNone, 4, 2);
  ModelRun chunked = run_model(Precision::kFp32, Recompute::kNone, 4, 4, /*head_chunk=*/7);
  for (size_t t = 0; t < whole.grads.size(); ++t) {
    EXPECT_LT(rel_diff(accum.grads[t], whole.grads[t]), 1e-5) << t;
    EXPECT_LT(rel_diff(chunked.grads[t], whole.grads[t]), 1e-5) << t;
  }
  EXPECT_LT(rel_diff(accum.losses, whole.losses), 1e-6);
  EXPECT_LT(rel_diff(chunked.losses, whole.losses), 1e-6);
}

TEST(Model, ActivationMemoryShrinksWithCheckpointing) {
  ModelConfig m;
  m.vocab_size = 8192;
  m.d_model = 256;
  m.n_layers = 4;
  m.n_heads = 4;
  m.seq_len = 256;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto none = plan_activation_memory(m, 8, p, Recompute::kNone);
    auto sel = plan_activation_memory(m, 8, p, Recompute::kSelective);
    auto full = plan_activation_memory(m, 8, p, Recompute::kFull);
    EXPECT_GT(none.kept_bytes, sel.kept_bytes + sel.recompute_bytes);
    EXPECT_GT(sel.kept_bytes + sel.recompute_bytes, full.kept_bytes + full.recompute_bytes);
    EXPECT_EQ(none.recompute_bytes, 0u);
  }
  // bf16 halves the activation values.
  auto f32 = plan_activation_memory(m, 8, Precision::kFp32, Recompute::kNone);
  auto b16 = plan_activation_memory(m, 8, Precision::kBf16, Recompute::kNone);
  EXPECT_LT(b16.kept_bytes, f32.kept_bytes * 0.6);
}

// The LM head's logits chunk: ~8 MiB on the CPU (cache-sized), up to 1 GiB on a GPU (wide GEMMs,
// and each chunk's weight-gradient GEMM passes over the whole fp32 dwte, so few chunks).
TEST(Model, GpuLogitsChunkIsWideAndBounded) {
  ModelConfig m;  // GPT-2 124M's head at micro-batch 16
  m.vocab_size = 50304;
  m.d_model = 768;
  m.n_layers = 1;
  m.n_heads = 12;
  m.seq_len = 1024;
  const auto cpu =
      plan_activation_memory(m, 16, Precision::kBf16, Recompute::kNone, 1, Device::kCpu);
  const auto gpu =
      plan_activation_memory(m, 16, Precision::kBf16, Recompute::kNone, 1, Device::kCuda);
  const size_t row = size_t(m.vocab_size) * 2;
  const size_t cpu_rows = (size_t{8} << 20) / row, gpu_rows = (size_t{1} << 30) / row;
  EXPECT_EQ(cpu_rows, 83u);
  // (The GPU's GEMM takes the GELU's derivative in its epilogue: no buffer for it.)
  const auto dgelu = [&](int64_t B) { return size_t(B * m.seq_len * m.ffn()) * 2; };
  EXPECT_EQ(gpu.working_bytes + dgelu(16) - cpu.working_bytes, (gpu_rows - cpu_rows) * row);
  EXPECT_EQ(gpu.kept_bytes, cpu.kept_bytes);
  // A micro-batch whose logits fit in 1 GiB is one chunk: the whole B*T rows.
  const auto small =
      plan_activation_memory(m, 2, Precision::kBf16, Recompute::kNone, 1, Device::kCuda);
  const auto small_cpu =
      plan_activation_memory(m, 2, Precision::kBf16, Recompute::kNone, 1, Device::kCpu);
  EXPECT_EQ(small.working_bytes + dgelu(2) - small_cpu.working_bytes, (2048 - cpu_rows) * row);
}

}  // namespace
}  // namespace kiln::engine
