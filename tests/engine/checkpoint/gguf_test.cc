// engine/checkpoint/gguf.h pieces on their own: the RoPE row permutation (by what it must do to
// the rotation, not by its index formula), Q8_0 (by its error bound and layout), and the tensor
// parts of a grouped-query Llama. The file as a whole is tested against llama.cpp itself in
// tests/gguf_llama_cpp.sh.
#include "engine/checkpoint/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "kernels/dtype.h"

namespace kiln::engine {
namespace {

// Rotates one head's vector at position pos: pairs (i, i + d/2) (rotate-half: Kiln,
// transformers) or (2i, 2i + 1) (adjacent pairs: llama.cpp's LLAMA_ROPE_TYPE_NORM), pair i by
// pos * theta^(-2i/d).
std::vector<double> rope(const std::vector<double>& x, int pos, bool adjacent) {
  const int d = int(x.size());
  std::vector<double> y(x);
  for (int i = 0; i < d / 2; ++i) {
    const double a = pos * std::pow(10000.0, -2.0 * i / d);
    const int u = adjacent ? 2 * i : i, v = adjacent ? 2 * i + 1 : i + d / 2;
    y[u] = x[u] * std::cos(a) - x[v] * std::sin(a);
    y[v] = x[u] * std::sin(a) + x[v] * std::cos(a);
  }
  return y;
}

TEST(Gguf, RopePermutationTurnsRotateHalfIntoAdjacentPairs) {
  // q = W x for a projection W of `heads` heads: rotating the rows of W permuted, adjacent-pair
  // style, must give the permutation of q rotated rotate-half style - for every head and
  // position, so llama.cpp's attention scores equal Kiln's.
  const int64_t heads = 3, hd = 8;
  const size_t cols = 5;
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  std::vector<float> w(size_t(heads * hd) * cols), wp(w.size());
  for (auto& v : w) v = g(rng);
  permute_rope_rows(w.data(), wp.data(), heads, hd, cols);
  std::vector<double> x(cols);
  for (auto& v : x) v = g(rng);
  auto project = [&](const std::vector<float>& m, int64_t h) {
    std::vector<double> q(size_t(hd), 0.0);
    for (int64_t r = 0; r < hd; ++r)
      for (size_t c = 0; c < cols; ++c) q[size_t(r)] += m[size_t(h * hd + r) * cols + c] * x[c];
    return q;
  };
  for (int64_t h = 0; h < heads; ++h) {
    for (int pos : {0, 1, 5, 63}) {
      std::vector<double> kiln = rope(project(w, h), pos, /*adjacent=*/false);
      std::vector<double> gguf = rope(project(wp, h), pos, /*adjacent=*/true);
      // gguf row 2j + s is Kiln's row s * hd/2 + j, before and after rotating.
      for (int64_t j = 0; j < hd / 2; ++j)
        for (int64_t s = 0; s < 2; ++s)
          EXPECT_NEAR(gguf[size_t(2 * j + s)], kiln[size_t(s * hd / 2 + j)], 1e-9)
              << "head " << h << " pos " << pos;
    }
  }
  // A permutation: every row once.
  std::map<float, int> seen;
  for (float v : wp) ++seen[v];
  EXPECT_EQ(seen.size(), w.size());
}

TEST(Gguf, Q8_0BlocksHoldAnFp16ScaleAnd32RoundedValues) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> x(32 * 5);
  for (auto& v : x) v = g(rng);
  for (int j = 0; j < 32; ++j) x[size_t(64 + j)] = 0.0f;  // an all-zero block
  x[100] = 1.5f;                                          // a block with one large value
  std::vector<uint8_t> q(5 * 34);
  quantize_q8_0(x.data(), x.size(), q.data());
  for (int b = 0; b < 5; ++b) {
    uint16_t dh;
    std::memcpy(&dh, &q[size_t(b) * 34], 2);
    const float d = fp16_to_float(fp16{dh});
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 32 + j)]));
    EXPECT_NEAR(d, amax / 127.0f, amax / 127.0f * 1e-3f) << b;
    for (int j = 0; j < 32; ++j) {
      const int8_t v = static_cast<int8_t>(q[size_t(b) * 34 + 2 + size_t(j)]);
      EXPECT_GE(v, -127);
      // round(x / d) with the unrounded scale; the fp16 scale adds at most 127 |d - fp16(d)|.
      EXPECT_NEAR(d * v, x[size_t(b * 32 + j)], d * 0.5f + 127 * amax / 127.0f * 1e-3f + 1e-7f)
          << b << " " << j;
    }
  }
  EXPECT_EQ(q[2 * 34], 0);  // zero block: scale 0
  EXPECT_EQ(q[2 * 34 + 1], 0);
  EXPECT_EQ(static_cast<int8_t>(q[3 * 34 + 2 + 4]), 127);  // x[100] is its block's maximum
}

TEST(Gguf, LlamaPartsSplitFusedTensorsInLlamaCppNames) {
  ModelConfig m;
  m.arch = Arch::kLlama;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.seq_len = 16;
  m.tie_embeddings = false;
  m.bias = true;
  ParamStore params(m, Precision::kFp32, false, nullptr, TpShard{}, /*allocate=*/false);
  std::map<std::string, GgufPart> parts;
  for (const ParamTensor& t : params.tensors()) {
    auto r = gguf_tensor_parts(m, t);
    ASSERT_TRUE(r.is_ok()) << t.name << ": " << r.status().to_string();
    size_t covered = 0;
    for (GgufPart& p : *r) {
      EXPECT_EQ(p.first, covered) << p.name;
      covered += p.numel;
      parts[p.name] = p;
    }
    EXPECT_EQ(covered, t.numel) << t.name;
  }
  EXPECT_EQ(parts.at("token_embd.weight").dims, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(parts.at("output.weight").dims, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(parts.at("blk.0.attn_q.weight").dims, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(parts.at("blk.0.attn_k.weight").dims, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(parts.at("blk.0.attn_v.weight").dims, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(parts.at("blk.0.attn_q.weight").rope_heads, 4);
  EXPECT_EQ(parts.at("blk.0.attn_k.weight").rope_heads, 2);
  EXPECT_EQ(parts.at("blk.0.attn_v.weight").rope_heads, 0);
  EXPECT_EQ(parts.at("blk.0.attn_k.bias").rope_heads, 2);
  EXPECT_EQ(parts.at("blk.0.ffn_gate.weight").dims, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(parts.at("blk.0.ffn_up.weight").first, size_t(48 * 32));
  EXPECT_EQ(parts.at("blk.0.ffn_down.weight").dims, (std::vector<int64_t>{48, 32}));
  for (const char* n : {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight",
                        "blk.0.attn_output.weight", "blk.0.attn_output.bias"})
    EXPECT_TRUE(parts.count(n)) << n;
}

}  // namespace
}  // namespace kiln::engine
