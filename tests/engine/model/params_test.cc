// The ParamStore: initialisation follows its scheme (GPT-2's, scaled residual projections) and is
// reproducible, and any tensor-parallel slice or range of a tensor initialises to the whole
// tensor's values.
#include "engine/model/params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/hash.h"
#include "engine/model/rng.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

using test::small_model;

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
          ASSERT_EQ(
              0, std::memcmp(want.data(), p.master(static_cast<int>(i)), t.numel * sizeof(float)))
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

// Llama's tensors: no position table or norm biases, no biases with model.bias false, an LM head
// when untied, SwiGLU's gate and up rows; grouped-query q, k, v split by heads over TP ranks.
TEST(Params, LlamaTensorsAndGroupedQueryTpSlices) {
  ModelConfig m;
  m.arch = Arch::kLlama;
  m.vocab_size = 64;
  m.d_model = 24;
  m.n_layers = 2;
  m.n_heads = 6;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.seq_len = 8;
  m.tie_embeddings = false;
  m.bias = false;
  ParamStore whole(m, Precision::kFp32);
  EXPECT_EQ(whole.wpe(), -1);
  EXPECT_EQ(whole.lnf_b(), -1);
  EXPECT_NE(whole.lm_head(), whole.wte());
  EXPECT_EQ(whole.find("blocks.0.attn.qkv.bias"), -1);
  EXPECT_EQ(whole.find("blocks.0.ln1.bias"), -1);
  const int qkv = whole.find("blocks.0.attn.qkv.weight");
  ASSERT_GE(qkv, 0);
  const int64_t hs = 4;
  EXPECT_EQ(whole.tensors()[qkv].shape, (std::vector<int64_t>{(6 + 2 * 2) * hs, 24}));
  EXPECT_EQ(whole.tensors()[whole.find("blocks.0.mlp.fc.weight")].shape,
            (std::vector<int64_t>{80, 24}));
  EXPECT_EQ(whole.tensors()[whole.find("blocks.0.mlp.proj.weight")].shape,
            (std::vector<int64_t>{24, 40}));
  // Per block: ln1 24, qkv 40x24, proj 24x24, ln2 24, fc 80x24, proj 24x40; wte and lm_head.
  EXPECT_EQ(whole.num_params(), size_t(2 * (24 + 960 + 576 + 24 + 1920 + 960) + 2 * 64 * 24 + 24));
  // tp 2: each rank holds 3 query heads, 1 key and 1 value head - rows [q 12 | k 4 | v 4].
  const ParamTensor& t = whole.tensors()[qkv];
  std::vector<float> w(t.numel), back(t.numel, -1.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  for (int rank = 0; rank < 2; ++rank) {
    ParamStore part(m, Precision::kFp32, false, nullptr, TpShard{rank, 2}, false);
    const ParamTensor& pt = part.tensors()[qkv];
    ASSERT_EQ(pt.shape, (std::vector<int64_t>{20, 24}));
    std::vector<float> slice(pt.numel);
    copy_to_shard(pt, {rank, 2}, w.data(), slice.data());
    const size_t C = 24;
    auto whole_row = [&](size_t local_row) { return slice[local_row * C] / C; };
    EXPECT_EQ(whole_row(0), rank * 12);           // q heads 3r .. 3r+2
    EXPECT_EQ(whole_row(12), 24 + rank * 4);      // k head r
    EXPECT_EQ(whole_row(16), 24 + 8 + rank * 4);  // v head r
    copy_from_shard(pt, {rank, 2}, slice.data(), back.data());
  }
  EXPECT_EQ(back, w);
}

// Pipeline stages: a split by hand is taken as it is; the balanced split gives every stage a
// block, puts fewer blocks on the last stage when the LM head is costly, and is the same for equal
// blocks whatever the order of evaluation; a stage's store holds exactly its units.
TEST(Params, PipelineStageSplitAndHeldUnits) {
  ModelConfig m = small_model();
  m.n_layers = 8;
  EXPECT_EQ(pp_stage_split(m, 2, {3, 5}), (std::vector<int64_t>{0, 3, 8}));
  EXPECT_EQ(pp_stage_split(m, 1), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(pp_stage_split(m, 8), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  // A tiny vocabulary: the head costs less than a block, so the blocks split evenly.
  EXPECT_EQ(pp_stage_split(m, 2), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(pp_stage_split(m, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  // GPT-2's vocabulary at d_model 32: the head costs several blocks, the last stage gets fewer.
  m.vocab_size = 50257;
  const std::vector<int64_t> b = pp_stage_split(m, 2);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_GT(b[1], 4);
  EXPECT_LT(b[1], 8);

  m = small_model();
  m.n_layers = 4;
  for (int r = 0; r < 2; ++r) {
    const PpStage st = pp_stage(m, r, 2);
    ParamStore p(m, Precision::kBf16, false, nullptr, {}, true, st);
    const auto& u = p.units();
    ASSERT_EQ(u.size(), 6u);  // embed, 4 blocks, final
    EXPECT_EQ(p.holds(0), true) << "tied head: the embeddings on both ends";
    EXPECT_EQ(p.holds(1), r == 0);
    EXPECT_EQ(p.holds(2), r == 0);
    EXPECT_EQ(p.holds(3), r == 1);
    EXPECT_EQ(p.holds(5), r == 1);
    for (size_t i = 0; i < u.size(); ++i) {
      EXPECT_GT(u[i].numel, 0u);
      EXPECT_EQ(u[i].master.empty(), !p.holds(static_cast<int>(i))) << u[i].name;
      EXPECT_EQ(u[i].lp.empty(), !p.holds(static_cast<int>(i))) << u[i].name;
    }
    p.init(7);  // only the held units; the same values as the whole model's
    ParamStore whole(m, Precision::kBf16);
    whole.init(7);
    for (size_t i = 0; i < u.size(); ++i) {
      if (!p.holds(static_cast<int>(i))) continue;
      std::vector<float> a(u[i].numel), w(u[i].numel);
      std::memcpy(a.data(), u[i].master.data(), a.size() * 4);
      std::memcpy(w.data(), whole.units()[i].master.data(), w.size() * 4);
      EXPECT_EQ(a, w) << u[i].name;
    }
  }
  m.tie_embeddings = false;
  ParamStore last(m, Precision::kFp32, false, nullptr, {}, true, pp_stage(m, 1, 2));
  EXPECT_FALSE(last.holds(0)) << "untied: the embeddings on the first stage only";
}

}  // namespace
}  // namespace kiln::engine
