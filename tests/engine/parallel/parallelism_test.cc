// engine/parallel/parallelism.h: where a rank runs on a GPU machine, and the errors of device:
// cuda under mpirun that need no GPU to check (tests/train_gpu_dist.sh runs the real thing).
#include "engine/parallel/parallelism.h"

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

TEST(Parallelism, LocalPlaceCountsTheRanksOfTheSameHostInRankOrder) {
  const std::vector<std::string> hosts{"a", "a", "b", "b", "a"};
  EXPECT_EQ(local_place(hosts, 0).rank, 0);
  EXPECT_EQ(local_place(hosts, 1).rank, 1);
  EXPECT_EQ(local_place(hosts, 4).rank, 2);
  EXPECT_EQ(local_place(hosts, 4).size, 3);
  EXPECT_EQ(local_place(hosts, 2).rank, 0);
  EXPECT_EQ(local_place(hosts, 3).rank, 1);
  EXPECT_EQ(local_place(hosts, 3).size, 2);
  EXPECT_EQ(local_place({"only"}, 0).size, 1);
}

TEST(Parallelism, EachLocalRankGetsItsOwnGpuUnlessTheLauncherBoundOne) {
  EXPECT_EQ(cuda_device_for({3, 4}, nullptr), 3);
  EXPECT_EQ(cuda_device_for({3, 4}, ""), 3);
  EXPECT_EQ(cuda_device_for({3, 4}, "0,1,2,3"), 3);  // all visible: the local rank's
  EXPECT_EQ(cuda_device_for({3, 4}, "5"), 0);        // one GPU bound to this rank
  EXPECT_EQ(cuda_device_for({0, 1}, nullptr), 0);
}

TEST(Parallelism, TooFewGpusIsAConfigErrorNamingDeviceAndTheCount) {
  const Status why = Status::internal(
      "CUDA set device 3: invalid device ordinal (this process "
      "sees 2 CUDA devices)");
  const Status st = cuda_group_error(7, {3, 4}, "node1", 3, why);
  EXPECT_EQ(st.exit_code(), 2);
  const std::string text = st.to_string();
  EXPECT_NE(text.find("key 'device'"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 7 (local rank 3 of 4 on node1)"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU 3"), std::string::npos) << text;
  EXPECT_NE(text.find("sees 2 CUDA devices"), std::string::npos) << text;
  EXPECT_NE(text.find("4 ranks on node1 need 4 GPUs"), std::string::npos) << text;
}

TEST(Parallelism, OneProcessOnCudaOpensNoDeviceGroup) {
  // Without mpirun the world is one process: nothing to reduce, no NCCL, no GPU touched here.
  auto dp = Parallelism::create(ParallelConfig{}, Recompute::kNone, Device::kCuda);
  ASSERT_TRUE(dp.is_ok()) << dp.status().to_string();
  EXPECT_EQ((*dp)->world_size(), 1);
  EXPECT_EQ((*dp)->cuda_device(), -1);
  EXPECT_STREQ((*dp)->data_dp().backend(), "local");
}

}  // namespace
}  // namespace kiln::engine
