// engine/parallel/tensor_parallel.h and the tensor-parallel ParamStore layout
// (engine/model/params.h): every rank's slices, initialised on their own, are exactly the whole
// model's values; the slices of all ranks reassemble the whole tensors; kiln plan's unit sizes are
// the sliced store's. (The layers themselves run under mpirun: tests/train_tp.sh.)
#include <gtest/gtest.h>

#include <cstring>

#include "engine/config/train_config.h"
#include "engine/model/params.h"
#include "engine/parallel/layout_plan.h"

namespace kiln::engine {
namespace {

ModelConfig small_model(InitScheme init) {
  ModelConfig m;
  m.vocab_size = 1000;
  m.d_model = 48;
  m.n_layers = 3;
  m.n_heads = 4;
  m.seq_len = 24;
  m.init = init;
  return m;
}

TEST(TensorParallelLayout, SlicesInitialiseToTheWholeModelAndReassemble) {
  for (InitScheme init : {InitScheme::kGpt2, InitScheme::kDeepNet}) {
    const ModelConfig m = small_model(init);
    ParamStore whole(m, Precision::kFp32);
    whole.init(17);
    for (int tp : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << "tp=" << tp);
      std::vector<std::vector<float>> rebuilt(whole.tensors().size());
      for (size_t t = 0; t < whole.tensors().size(); ++t)
        rebuilt[t].assign(whole.tensors()[t].numel, NAN);
      for (int r = 0; r < tp; ++r) {
        ParamStore part(m, Precision::kFp32, false, nullptr, TpShard{r, tp});
        part.init(17);
        ASSERT_EQ(part.tensors().size(), whole.tensors().size());
        const auto units = unit_numels(m, tp);
        ASSERT_EQ(units.size(), part.units().size());
        for (size_t u = 0; u < units.size(); ++u) EXPECT_EQ(units[u], part.units()[u].numel) << u;
        for (size_t t = 0; t < part.tensors().size(); ++t) {
          const ParamTensor& pt = part.tensors()[t];
          EXPECT_EQ(pt.global_shape, whole.tensors()[t].shape) << pt.name;
          size_t n = 1;
          for (int64_t d : pt.shape) n *= static_cast<size_t>(d);
          EXPECT_EQ(n, pt.numel) << pt.name;
          if (pt.split_dim < 0) {
            EXPECT_EQ(pt.numel, whole.tensors()[t].numel) << pt.name;
            EXPECT_EQ(0, std::memcmp(part.master(int(t)), whole.master(int(t)), pt.numel * 4))
                << pt.name << " (replicated) differs on rank " << r;
          } else {
            EXPECT_EQ(pt.numel * tp, whole.tensors()[t].numel) << pt.name;
          }
          copy_from_shard(pt, TpShard{r, tp}, part.master(int(t)), rebuilt[t].data());
          // The round trip through the whole tensor gives the slice back.
          std::vector<float> back(pt.numel);
          copy_to_shard(pt, TpShard{r, tp}, rebuilt[t].data(), back.data());
          EXPECT_EQ(0, std::memcmp(back.data(), part.master(int(t)), pt.numel * 4)) << pt.name;
        }
      }
      for (size_t t = 0; t < whole.tensors().size(); ++t) {
        EXPECT_EQ(0, std::memcmp(rebuilt[t].data(), whole.master(int(t)), rebuilt[t].size() * 4))
            << whole.tensors()[t].name << ": the slices of " << tp << " ranks are not the whole";
      }
    }
  }
}

TEST(TensorParallelLayout, QkvSlicesHoldTheSameHeadsOfQKAndV) {
  const ModelConfig m = small_model(InitScheme::kGpt2);
  ParamStore part(m, Precision::kFp32, false, nullptr, TpShard{1, 2});
  const int t = part.find("blocks.0.attn.qkv.weight");
  ASSERT_GE(t, 0);
  const ParamTensor& pt = part.tensors()[t];
  EXPECT_EQ(pt.shape, (std::vector<int64_t>{3 * 48 / 2, 48}));
  // Rank 1 of 2 holds rows [24, 48) of q, of k and of v: global rows 24.., 72.., 120..
  std::vector<float> whole(3 * 48 * 48);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i / 48);  // row index
  std::vector<float> slice(pt.numel);
  copy_to_shard(pt, part.tp_shard(), whole.data(), slice.data());
  EXPECT_EQ(slice[0], 24.0f);
  EXPECT_EQ(slice[24 * 48], 72.0f);
  EXPECT_EQ(slice[48 * 48], 120.0f);
  EXPECT_EQ(slice.back(), 143.0f);
  // attn.proj is split by columns: rank 1 holds columns [24, 48) of every row.
  const ParamTensor& proj = part.tensors()[part.find("blocks.0.attn.proj.weight")];
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{48, 24}));
  std::vector<float> cols(48 * 48), got(proj.numel);
  for (size_t i = 0; i < cols.size(); ++i) cols[i] = static_cast<float>(i % 48);  // column index
  copy_to_shard(proj, part.tp_shard(), cols.data(), got.data());
  EXPECT_EQ(got[0], 24.0f);
  EXPECT_EQ(got[23], 47.0f);
  EXPECT_EQ(got[24], 24.0f);
}

}  // namespace
}  // namespace kiln::engine
