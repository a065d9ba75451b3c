// The host-side planning of the fused CUDA kernels (kernels/cuda/launch_plan.h) and the
// multi-tensor AdamW seam (Runtime::adamw_update_multi), checked on the CPU: these run on every
// machine, while the kernels that use them are tested on a GPU (tests/kernels/kernels_cuda_gpu.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "engine/device/runtime.h"
#include "kernels/cuda/launch_plan.h"
#include "kernels/ops.h"

namespace kiln {
namespace {

using cuda::TensorChunk;

// Every element of every tensor is covered by exactly one chunk, chunks are in tensor then chunk
// order, no chunk is empty, and none is longer than chunk_elems.
void check_cover(const std::vector<size_t>& sizes, size_t chunk_elems) {
  SCOPED_TRACE(::testing::Message()
               << "chunk " << chunk_elems << ", " << sizes.size() << " tensors");
  const auto chunks =
      cuda::plan_tensor_chunks(sizes.data(), static_cast<int>(sizes.size()), chunk_elems);
  std::vector<std::vector<int>> seen(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) seen[t].assign(sizes[t], 0);
  size_t expected = 0;
  for (size_t s : sizes) expected += (s + chunk_elems - 1) / chunk_elems;
  ASSERT_EQ(chunks.size(), expected);
  for (size_t b = 0; b < chunks.size(); ++b) {
    const TensorChunk c = chunks[b];
    ASSERT_LT(c.tensor, sizes.size());
    if (b > 0) {
      const TensorChunk p = chunks[b - 1];
      EXPECT_TRUE(p.tensor < c.tensor || (p.tensor == c.tensor && p.chunk + 1 == c.chunk))
          << "block " << b;
    }
    const size_t begin = size_t(c.chunk) * chunk_elems;
    const size_t end = std::min(sizes[c.tensor], begin + chunk_elems);
    ASSERT_LT(begin, end) << "empty chunk at block " << b;
    for (size_t i = begin; i < end; ++i) ++seen[c.tensor][i];
  }
  for (size_t t = 0; t < sizes.size(); ++t)
    for (size_t i = 0; i < sizes[t]; ++i)
      ASSERT_EQ(seen[t][i], 1) << "tensor " << t << " element " << i;
}

TEST(CudaLaunchPlan, TensorChunksCoverEveryElementOnce) {
  check_cover({0, 1, 4, 5, 11, 0, 12, 3}, 4);
  check_cover({}, 4);
  check_cover({0, 0}, 4);
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> sizes(1 + rng() % 9);
    for (auto& s : sizes) s = rng() % 200;
    check_cover(sizes, 1 + rng() % 37);
  }
  // The default chunk on a GPT-2-like parameter list: the table stays small.
  std::vector<size_t> gpt2{50257 * 768, 1024 * 768, 768, 768, 3 * 768 * 768, 3 * 768};
  const auto chunks = cuda::plan_tensor_chunks(gpt2.data(), static_cast<int>(gpt2.size()));
  size_t total = 0;
  for (size_t s : gpt2) total += s;
  EXPECT_GE(chunks.size(), total / cuda::kMultiTensorChunk);
  EXPECT_LE(chunks.size(), total / cuda::kMultiTensorChunk + gpt2.size());
  EXPECT_EQ(cuda::plan_tensor_chunks(gpt2.data(), 0).size(), 0u);
  EXPECT_EQ(cuda::plan_tensor_chunks(gpt2.data(), 1, 0).size(), 0u);  // no chunk size: no plan
}

TEST(CudaLaunchPlan, SwitchValues) {
  using cuda::SwitchValue;
  EXPECT_EQ(cuda::parse_switch(nullptr), SwitchValue::kDefault);
  EXPECT_EQ(cuda::parse_switch(""), SwitchValue::kDefault);
  for (const char* on : {"1", "on", "ON", "true", "True", "yes"})
    EXPECT_EQ(cuda::parse_switch(on), SwitchValue::kOn) << on;
  for (const char* off : {"0", "off", "Off", "false", "FALSE", "no"})
    EXPECT_EQ(cuda::parse_switch(off), SwitchValue::kOff) << off;
  for (const char* bad : {"2", "of", "enable", " 1", "mma"})
    EXPECT_EQ(cuda::parse_switch(bad), SwitchValue::kBad) << bad;
}

TEST(CudaLaunchPlan, GemmKeysSeparateEveryField) {
  using cuda::GemmEpilogue;
  using cuda::GemmKey;
  GemmKey base;
  base.transa = 1;
  base.m = 768;
  base.n = 8192;
  base.k = 3072;
  base.atype = base.btype = base.ctype = 14;
  base.lda = base.ldb = 3072;
  base.ldc = 768;
  // One variant per field: each must be a distinct cache entry.
  std::vector<GemmKey> keys{base};
  auto vary = [&](auto change) {
    GemmKey k = base;
    change(k);
    keys.push_back(k);
  };
  vary([](GemmKey& k) { k.transa = 0; });
  vary([](GemmKey& k) { k.transb = 1; });
  vary([](GemmKey& k) { k.m = 769; });
  vary([](GemmKey& k) { k.n = 8193; });
  vary([](GemmKey& k) { k.k = 3073; });
  vary([](GemmKey& k) { k.atype = 0; });
  vary([](GemmKey& k) { k.lda = 3080; });
  vary([](GemmKey& k) { k.btype = 0; });
  vary([](GemmKey& k) { k.ldb = 3080; });
  vary([](GemmKey& k) { k.ctype = 0; });
  vary([](GemmKey& k) { k.ldc = 776; });
  vary([](GemmKey& k) { k.accumulate = true; });
  vary([](GemmKey& k) { k.epilogue = GemmEpilogue::kBias; });
  vary([](GemmKey& k) { k.epilogue = GemmEpilogue::kGeluAuxBias; });
  vary([](GemmKey& k) { k.epilogue = GemmEpilogue::kDGelu; });
  vary([](GemmKey& k) {
    k.epilogue = GemmEpilogue::kGeluAuxBias;
    k.aux_ld = 3072;
  });
  vary([](GemmKey& k) { k.align_a = 32; });
  vary([](GemmKey& k) { k.align_b = 128; });
  vary([](GemmKey& k) { k.align_c = 64; });
  std::map<GemmKey, int> cache;
  for (size_t i = 0; i < keys.size(); ++i) cache.emplace(keys[i], static_cast<int>(i));
  EXPECT_EQ(cache.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(cache.at(keys[i]), static_cast<int>(i)) << keys[i].describe();
    for (size_t j = 0; j < keys.size(); ++j) EXPECT_EQ(keys[i] == keys[j], i == j);
  }
  GemmKey same = base;
  EXPECT_TRUE(same == base);
  EXPECT_FALSE(same < base || base < same);
  EXPECT_NE(keys[16].describe().find("epilogue=gelu_aux_bias aux_ld=3072"), std::string::npos)
      << keys[16].describe();
  EXPECT_NE(keys.back().describe().find("align=256/256/64"), std::string::npos)
      << keys.back().describe();
  EXPECT_NE(base.describe().find("m=768 n=8192 k=3072"), std::string::npos) << base.describe();
}

TEST(CudaLaunchPlan, PointerAlignment) {
  alignas(256) static unsigned char buf[1024];
  EXPECT_EQ(cuda::pointer_alignment(buf), 256u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 512), 256u);  // capped at cuBLASLt's default
  EXPECT_EQ(cuda::pointer_alignment(buf + 128), 128u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 32), 32u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 48), 16u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 2), 2u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 1), 1u);
  EXPECT_EQ(cuda::pointer_alignment(nullptr), 256u);
}

TEST(CudaLaunchPlan, GeluEpilogueNeedsAlignedAux) {
  alignas(16) static uint16_t buf[64];
  EXPECT_TRUE(cuda::gelu_epilogue_fits(3072, buf));
  EXPECT_FALSE(cuda::gelu_epilogue_fits(3076, buf));      // ld not a multiple of 8
  EXPECT_FALSE(cuda::gelu_epilogue_fits(3072, buf + 1));  // pointer not 16-byte aligned
}

// The backend's multi-tensor AdamW on the CPU (the default: adamw_update per tensor, each with its
// own weight decay) gives the same bits as the per-tensor calls the optimizer made before.
TEST(CudaLaunchPlan, AdamWTensorsMatchesPerTensorUpdates) {
  engine::Runtime& rt = engine::host_runtime();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const std::vector<size_t> sizes{1, 37, 1000, 4097};
  const std::vector<float> wd{0.1f, 0.0f, 0.1f, 0.05f};
  struct State {
    std::vector<float> p, m, v, g;
    std::vector<bf16> lp;
  };
  std::vector<State> a(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (auto* vec : {&a[t].p, &a[t].m, &a[t].g}) {
      vec->resize(sizes[t]);
      for (auto& x : *vec) x = nd(rng);
    }
    a[t].v.resize(sizes[t]);
    for (auto& x : a[t].v) x = std::abs(nd(rng));
    a[t].lp.resize(sizes[t]);
  }
  const std::vector<State> init = a;
  std::vector<State> b = a;
  AdamWParams hp;
  hp.lr = 3e-3f;
  hp.step = 7;
  hp.grad_scale = 0.5f;
  hp.weight_decay = 123.0f;  // ignored by adamw_update_multi
  std::vector<AdamWTensor> batch;
  for (size_t t = 0; t < sizes.size(); ++t) {
    batch.push_back(AdamWTensor{a[t].p.data(), a[t].m.data(), a[t].v.data(), a[t].g.data(),
                                t == 1 ? nullptr : a[t].lp.data(), sizes[t], wd[t]});
  }
  rt.adamw_update_multi(batch.data(), static_cast<int>(batch.size()), hp, DType::kBF16);
  for (size_t t = 0; t < sizes.size(); ++t) {
    AdamWParams h = hp;
    h.weight_decay = wd[t];
    if (t == 1) {
      cpu::adamw_update(b[t].p.data(), b[t].m.data(), b[t].v.data(), b[t].g.data(), sizes[t], h);
    } else {
      cpu::adamw_update(b[t].p.data(), b[t].m.data(), b[t].v.data(), b[t].g.data(), sizes[t], h,
                        b[t].lp.data());
    }
    EXPECT_EQ(0, std::memcmp(a[t].p.data(), b[t].p.data(), sizes[t] * 4)) << "params " << t;
    EXPECT_EQ(0, std::memcmp(a[t].m.data(), b[t].m.data(), sizes[t] * 4)) << "m " << t;
    EXPECT_EQ(0, std::memcmp(a[t].v.data(), b[t].v.data(), sizes[t] * 4)) << "v " << t;
    EXPECT_EQ(0, std::memcmp(a[t].lp.data(), b[t].lp.data(), sizes[t] * 2)) << "lp " << t;
  }
  // And it changed every tensor (the comparison would pass vacuously on a no-op).
  for (size_t t = 0; t < sizes.size(); ++t) {
    EXPECT_NE(0, std::memcmp(a[t].p.data(), init[t].p.data(), sizes[t] * 4)) << "params " << t;
  }
}

}  // namespace
}  // namespace kiln
