// ZeRO on one rank (engine/parallel/zero.h): the shards are whole units, so what ZeRO computes can
// be held against the unsharded store exactly. Multi-rank sharding, reduce-scatter and resharded
// checkpoints are tests/train_mpi.sh's (mpirun); ZeRO's update against AdamW on every device is
// tests/engine/device/engine_device_test.cc's ZeroStagesMatchAdamWBitForBit.
#include "engine/parallel/zero.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "engine/device/runtime.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"

namespace kiln::engine {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 40;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 2;
  m.seq_len = 8;
  return m;
}

std::vector<std::vector<float>> partition_copy(const ZeroOptimizer& zero) {
  std::deque<std::vector<float>> scratch;
  std::vector<std::vector<float>> out;
  for (const TensorView& v : zero.checkpoint_partition(&scratch)) {
    const float* p = static_cast<const float*>(v.data);
    out.emplace_back(p, p + v.bytes / sizeof(float));
  }
  return out;
}

// Every stage names its checkpoint partition per unit and field; overflow is found in the shards
// and named by the first unit in backward order; reload() brings back the states of the source.
TEST(Zero, OneRankPartitionNonFiniteAndReload) {
  auto group = comm::make_local_group();
  OptimizerConfig oc;
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    ParamStore zp(small_model(), Precision::kFp32, false, &host_runtime(), {}, /*allocate=*/false);
    InitSource init(zp, 5);
    auto made = ZeroOptimizer::create(zp, init, *group, oc, stage, 1);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    ZeroOptimizer& zero = **made;
    EXPECT_EQ(zero.stage(), stage);

    std::deque<std::vector<float>> scratch;
    const auto views = zero.checkpoint_partition(&scratch);
    ASSERT_EQ(views.size(), 3 * zp.units().size());
    for (size_t u = 0; u < zp.units().size(); ++u) {
      EXPECT_EQ(views[3 * u].name, zp.units()[u].name + ".master");
      EXPECT_EQ(views[3 * u + 1].name, zp.units()[u].name + ".exp_avg");
      EXPECT_EQ(views[3 * u + 2].name, zp.units()[u].name + ".exp_avg_sq");
      EXPECT_GE(views[3 * u].bytes / sizeof(float), zp.units()[u].numel);  // one shard: all of it
    }
    const auto initial = partition_copy(zero);

    // Three updates move the states away from the initialisation.
    for (int step = 1; step <= 3; ++step) {
      zero.zero_grads();
      for (size_t u = 0; u < zp.units().size(); ++u) {
        float* g = zero.shard_grad(static_cast<int>(u));
        for (size_t i = 0; i < zp.units()[u].numel; ++i)
          g[i] = static_cast<float>(random_normal(step, u, i));
      }
      auto stats = zero.inspect(1.0);
      ASSERT_TRUE(stats.is_ok());
      ASSERT_TRUE(stats->finite);
      ASSERT_TRUE(zero.apply(1e-2, 1.0, *stats, step).is_ok());
    }
    EXPECT_NE(partition_copy(zero), initial);

    // An inf and a NaN in the embedding and the last block: the last block comes first in
    // backward order.
    zero.zero_grads();
    const int embed = 0, last_block = static_cast<int>(zp.units().size()) - 2;
    zero.shard_grad(embed)[3] = std::numeric_limits<float>::infinity();
    zero.shard_grad(last_block)[0] = std::nanf("");
    auto nf = zero.find_nonfinite();
    ASSERT_TRUE(nf.is_ok());
    EXPECT_EQ(nf->count, 2);
    EXPECT_EQ(nf->first_unit, zp.units()[last_block].name);
    auto stats = zero.inspect(1.0);
    ASSERT_TRUE(stats.is_ok());
    EXPECT_FALSE(stats->finite);

    InitSource again(zp, 5);
    ASSERT_TRUE(zero.reload(again).is_ok());
    EXPECT_EQ(partition_copy(zero), initial);
  }
}

}  // namespace
}  // namespace kiln::engine
