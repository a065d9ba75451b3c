// The GPT model on the CPU kernels: checkpointing modes are bit-identical, gradient accumulation
// and head chunking agree, initialisation follows its scheme and is reproducible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/hash.h"
#include "engine/model/model.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "kernels/ops.h"

namespace kiln::engine {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 67;
  m.d_model = 32;
  m.n_layers = 3;
  m.n_heads = 4;
  m.seq_len = 20;
  return m;
}

struct ModelRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
};

// One forward+backward over `rows` sequences split into micro-batches of `micro` rows.
ModelRun run_model(Precision p, Recompute r, int rows, int micro, int64_t head_chunk = 0) {
  ModelConfig m = small_model();
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
  ModelRun out;
  out.losses.resize(rows * T);
  params.zero_grads();
  for (int r0 = 0; r0 < rows; r0 += micro) {
    model->forward_backward(in.data() + r0 * T, tg.data() + r0 * T,
                            static_cast<float>(scale / (rows * T)), out.losses.data() + r0 * T);
  }
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const float* g = params.grad(static_cast<int>(i));
    out.grads.emplace_back(g, g + params.tensors()[i].numel);
  }
  return out;
}

TEST(Model, CheckpointingModesAreBitIdentical) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    ModelRun none = run_model(p, Recompute::kNone, 4, 4);
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      ModelRun other = run_model(p, r, 4, 4);
      ASSERT_EQ(0, std::memcmp(none.losses.data(), other.losses.data(), none.losses.size() * 4))
          << precision_name(p) << " " << recompute_name(r);
      for (size_t t = 0; t < none.grads.size(); ++t) {
        ASSERT_EQ(0, std::memcmp(none.grads[t].data(), other.grads[t].data(),
                                 none.grads[t].size() * 4))
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

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
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
  EXPECT_EQ(gpu.working_bytes - cpu.working_bytes, (gpu_rows - cpu_rows) * row);
  EXPECT_EQ(gpu.kept_bytes, cpu.kept_bytes);
  // A micro-batch whose logits fit in 1 GiB is one chunk: the whole B*T rows.
  const auto small =
      plan_activation_memory(m, 2, Precision::kBf16, Recompute::kNone, 1, Device::kCuda);
  const auto small_cpu =
      plan_activation_memory(m, 2, Precision::kBf16, Recompute::kNone, 1, Device::kCpu);
  EXPECT_EQ(small.working_bytes - small_cpu.working_bytes, (2048 - cpu_rows) * row);
}

TEST(Params, InitSchemesAndReproducibility) {
  ModelConfig m = small_model();
  m.n_layers = 8;
  m.d_model = 64;
  ParamStore a(m, Precision::kFp32), b(m, Precision::kFp32), c(m, Precision::kFp32);
  a.init(5);
  b.init(5);
  c.init(6);
  auto std_of = [](ParamStore& s, const std::string& name) {
    int t = s.find(name);
    EXPECT_GE(t, 0) << name;
    const float* w = s.master(t);
    double sq = 0;
    size_t n = s.tensors()[t].numel;
    for (size_t i = 0; i < n; ++i) sq += double(w[i]) * w[i];
    return std::sqrt(sq / n);
  };
  for (size_t u = 0; u < a.units().size(); ++u) {
    EXPECT_EQ(0, std::memcmp(a.units()[u].master.data(), b.units()[u].master.data(),
                             a.units()[u].master.bytes()));
  }
  EXPECT_NE(0, std::memcmp(a.units()[0].master.data(), c.units()[0].master.data(), 64));
  EXPECT_NEAR(std_of(a, "wte"), 0.02, 0.001);
  EXPECT_NEAR(std_of(a, "blocks.0.attn.qkv.weight"), 0.02, 0.001);
  EXPECT_NEAR(std_of(a, "blocks.3.mlp.proj.weight"), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(std_of(a, "blocks.3.attn.proj.weight"), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_EQ(a.master(a.find("blocks.2.ln1.weight"))[3], 1.0f);
  EXPECT_EQ(a.master(a.find("blocks.2.mlp.fc.bias"))[3], 0.0f);
  EXPECT_FALSE(a.tensors()[a.find("blocks.2.mlp.fc.bias")].decay);
  EXPECT_FALSE(a.tensors()[a.find("ln_f.weight")].decay);
  EXPECT_TRUE(a.tensors()[a.find("wte")].decay);

  m.init = InitScheme::kDeepNet;
  ParamStore d(m, Precision::kFp32);
  d.init(5);
  const double beta = std::pow(8.0 * 8, -0.25);
  EXPECT_NEAR(std_of(d, "blocks.1.mlp.fc.weight"), beta * std::sqrt(2.0 / (64 + 256)), 0.002);
  EXPECT_NEAR(std_of(d, "blocks.1.attn.proj.weight"), beta * std::sqrt(2.0 / 128), 0.003);

  // Low-precision copies are the rounded masters; unit buffers are padded and aligned.
  ParamStore h(m, Precision::kBf16);
  h.init(5);
  int t = h.find("wte");
  EXPECT_EQ(h.work<bf16>(t)[7].bits, float_to_bf16(h.master(t)[7]).bits);
  for (const auto& u : h.units()) {
    EXPECT_EQ(u.numel % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(u.master.data()) % 64, 0u);
  }
  for (const auto& tt : h.tensors()) EXPECT_EQ(tt.offset % 16, 0u);
}

// The initial values are defined tensor by tensor: element g of a whole (rows x cols) tensor is
// row_std(row) * random_normal(seed, xxh3_64(name), g). A tensor-parallel slice, any range of a
// unit (a ZeRO shard: init_values) and a store made without buffers give exactly those values.
TEST(Params, InitValuesAreTheWholeTensorsValuesForAnySliceAndRange) {
  for (InitScheme scheme : {InitScheme::kGpt2, InitScheme::kDeepNet}) {
    ModelConfig m;
    m.vocab_size = 96;
    m.d_model = 24;
    m.n_layers = 2;
    m.n_heads = 6;
    m.seq_len = 8;
    m.init = scheme;
    const double L = m.n_layers, C = static_cast<double>(m.d_model);
    const double beta = std::pow(8.0 * L, -0.25), s0 = m.init_std;
    for (int tp : {1, 2, 3}) {
      for (int rank = 0; rank < tp; ++rank) {
        SCOPED_TRACE("scheme " + std::to_string(static_cast<int>(scheme)) + ", tp rank " +
                     std::to_string(rank) + " of " + std::to_string(tp));
        ParamStore p(m, Precision::kFp32, false, nullptr, TpShard{rank, tp});
        p.init(77);
        for (size_t i = 0; i < p.tensors().size(); ++i) {
          const ParamTensor& t = p.tensors()[i];
          std::vector<float> want(t.numel, 0.0f);
          if (t.role == TensorRole::kNormGain) want.assign(t.numel, 1.0f);
          if (t.role == TensorRole::kEmbedding || t.role == TensorRole::kMatrix ||
              t.role == TensorRole::kResidualOut) {
            const size_t rows = static_cast<size_t>(t.global_shape[0]);
            const size_t cols = static_cast<size_t>(t.global_shape.back());
            std::vector<double> stds(rows);
            for (size_t r = 0; r < rows; ++r) {
              if (scheme == InitScheme::kGpt2) {
                stds[r] = t.role == TensorRole::kResidualOut ? s0 / std::sqrt(2.0 * L) : s0;
              } else if (t.role == TensorRole::kEmbedding) {
                stds[r] = s0;
              } else if (t.name.find("attn.qkv") != std::string::npos) {
                stds[r] = std::sqrt(2.0 / (C + C)) * (r >= 2 * rows / 3 ? beta : 1.0);
              } else {
                stds[r] = beta * std::sqrt(2.0 / (static_cast<double>(rows) + cols));
              }
            }
            std::vector<float> whole(rows * cols);
            random_normal_rows(whole.data(), rows, cols, stds.data(), 77, xxh3_64(t.name));
            copy_to_shard(t, {rank, tp}, whole.data(), want.data());
          }
          ASSERT_EQ(0, std::memcmp(want.data(), p.master(static_cast<int>(i)),
                                   t.numel * sizeof(float)))
              << t.name;
        }
        // Any range of a unit, from a store without buffers: the same bits (padding zero).
        ParamStore layout(m, Precision::kFp32, false, nullptr, TpShard{rank, tp}, false);
        EXPECT_EQ(layout.state_bytes(), 0u);
        for (size_t u = 0; u < p.units().size(); ++u) {
          const size_t n = p.units()[u].numel;
          for (size_t begin : {size_t{0}, size_t{5}, n / 3, n - 17}) {
            const size_t count = std::min<size_t>(n - begin, 1 + n / 2);
            std::vector<float> got(count, -1.0f);
            layout.init_values(77, static_cast<int>(u), begin, count, got.data());
            ASSERT_EQ(0, std::memcmp(got.data(), p.units()[u].master.data() + begin,
                                     count * sizeof(float)))
                << p.units()[u].name << " [" << begin << ", " << begin + count << ")";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::engine
