// The NCCL backend (comm/nccl.h) on device memory, under `mpirun -np 2` with one GPU per rank
// (tests/comm/comm_nccl.cmake): every collective's result against the value computed on the host
// (integer-valued floats, so any summation order gives the same bits), the asynchronous forms,
// ordering after work queued on the compute stream, and the byte counters (the same as the MPI
// backend's). Built with NCCL; skips with the reason without mpirun or with fewer GPUs than ranks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/nccl.h"

namespace kiln::comm {
namespace {

// The NCCL group of the world (one per process), or why there is none: `skip` when this machine
// cannot run the tests, `error` when it can and creating the group failed (a failure, not a skip).
struct Fixture {
  std::unique_ptr<ProcessGroup> g;
  std::string skip, error;
};
Fixture& nccl() {
  static Fixture f = [] {
    Fixture out;
    ProcessGroup& w = world();
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    (void)cudaGetLastError();
    int fewest = count;
    (void)allreduce(w, &fewest, 1, ReduceOp::kMin);
    if (w.size() < 2) {
      out.skip = "run under mpirun -np 2 (tests/comm/comm_nccl.cmake does)";
    } else if (fewest < w.size()) {
      out.skip = "needs " + std::to_string(w.size()) +
                 " GPUs (one per rank; NCCL refuses two "
                 "ranks on one); this machine has " +
                 std::to_string(fewest);
    } else {
      auto g = make_nccl_group(w, w.rank() % count);
      if (!g.is_ok())
        out.error = "make_nccl_group failed: " + g.status().to_string();
      else
        out.g = std::move(g).value();
    }
    return out;
  }();
  return f;
}

// Device copies of host vectors.
template <typename T>
struct Dev {
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T));
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t count) : n(count) { cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)); }
  ~Dev() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  T* p = nullptr;
  size_t n;
};

#define NCCL_GROUP_OR_SKIP()                 \
  Fixture& fx = nccl();                      \
  if (!fx.error.empty()) FAIL() << fx.error; \
  if (!fx.g) GTEST_SKIP() << fx.skip;        \
  ProcessGroup& g = *fx.g;                   \
  const int n = g.size(), me = g.rank();     \
  (void)n;                                   \
  (void)me

float value(int r, size_t i) {
  return static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 997));
}

TEST(CommNccl, AllreduceSumMinMaxOnDeviceMemory) {
  NCCL_GROUP_OR_SKIP();
  const size_t count = 4099;
  std::vector<float> x(count), sum(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    x[i] = value(me, i);
    for (int r = 0; r < n; ++r) sum[i] += value(r, i);
  }
  Dev<float> d(x);
  g.reset_counters();
  ASSERT_TRUE(g.allreduce(d.p, count, DType::kFloat32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(d.host(), sum);
  EXPECT_EQ(g.counters().at("all_reduce").bytes, 2 * count * sizeof(float));
  std::vector<int64_t> v{me, -me, 7};
  Dev<int64_t> dv(v);
  ASSERT_TRUE(g.allreduce(dv.p, 3, DType::kInt64, ReduceOp::kMax).is_ok());
  EXPECT_EQ(dv.host(), (std::vector<int64_t>{n - 1, 0, 7}));
}

TEST(CommNccl, AllgatherReduceScatterBroadcastAndTheirAsyncForms) {
  NCCL_GROUP_OR_SKIP();
  const size_t per = 1000;
  std::vector<float> mine(per), all(per * n), scattered(per, 0.0f), full(per * n);
  for (size_t i = 0; i < per; ++i) mine[i] = value(me, i);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < per; ++i) all[r * per + i] = value(r, i);
  Dev<float> dm(mine), dall(per * n);
  ASSERT_TRUE(g.allgather(dm.p, per * sizeof(float), dall.p).is_ok());
  EXPECT_EQ(dall.host(), all);
  // Reduce-scatter of every rank's copy of `all`: block me summed over n ranks.
  for (size_t i = 0; i < per; ++i) scattered[i] = static_cast<float>(n) * all[me * per + i];
  Dev<float> din(all), dout(per);
  ASSERT_TRUE(g.reduce_scatter(din.p, dout.p, per, DType::kFloat32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(dout.host(), scattered);
  // The asynchronous forms complete to the same values.
  Dev<float> dall2(per * n), dout2(per);
  auto a = g.iallgather(dm.p, per * sizeof(float), dall2.p);
  auto b = g.ireduce_scatter(din.p, dout2.p, per, DType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(a->wait().is_ok());
  ASSERT_TRUE(b->wait().is_ok());
  EXPECT_EQ(dall2.host(), all);
  EXPECT_EQ(dout2.host(), scattered);
  std::vector<float> root(per, me == 0 ? 42.0f : 0.0f);
  Dev<float> dr(root);
  ASSERT_TRUE(g.bcast(dr.p, per * sizeof(float), 0).is_ok());
  EXPECT_EQ(dr.host(), std::vector<float>(per, 42.0f));
  ASSERT_TRUE(g.barrier().is_ok());
}

TEST(CommNccl, CollectivesFollowTheComputeStream) {
  NCCL_GROUP_OR_SKIP();
  // A buffer written on the legacy default stream (where Kiln's kernels run) just before the
  // collective, with no host synchronisation between: the all-reduce must see the write.
  const size_t count = 1 << 22;
  Dev<float> d(count);
  std::vector<float> ones(count, 1.0f);
  float* pinned = nullptr;
  cudaMallocHost(&pinned, count * sizeof(float));
  std::copy(ones.begin(), ones.end(), pinned);
  cudaMemsetAsync(d.p, 0, count * sizeof(float), nullptr);
  cudaMemcpyAsync(d.p, pinned, count * sizeof(float), cudaMemcpyHostToDevice, nullptr);
  ASSERT_TRUE(g.allreduce(d.p, count, DType::kFloat32, ReduceOp::kSum).is_ok());
  const std::vector<float> got = d.host();
  EXPECT_EQ(got.front(), static_cast<float>(n));
  EXPECT_EQ(got.back(), static_cast<float>(n));
  cudaFreeHost(pinned);
}

TEST(CommNccl, VariableSizeGathersAndAllToAll) {
  NCCL_GROUP_OR_SKIP();
  // Rank r sends r + 1 values r.
  std::vector<size_t> bytes(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += bytes[r] = (r + 1) * sizeof(float);
  std::vector<float> mine(me + 1, static_cast<float>(me)), want;
  for (int r = 0; r < n; ++r) want.insert(want.end(), r + 1, static_cast<float>(r));
  Dev<float> dm(mine), dout(total / sizeof(float));
  ASSERT_TRUE(g.allgatherv(dm.p, bytes[me], dout.p, bytes.data()).is_ok());
  EXPECT_EQ(dout.host(), want);
  // All-to-all: rank me sends value me*10 + r to rank r.
  std::vector<float> send(n), expect(n);
  for (int r = 0; r < n; ++r) {
    send[r] = static_cast<float>(me * 10 + r);
    expect[r] = static_cast<float>(r * 10 + me);
  }
  Dev<float> ds(send), drecv(n);
  ASSERT_TRUE(g.alltoall(ds.p, sizeof(float), drecv.p).is_ok());
  EXPECT_EQ(drecv.host(), expect);
}

}  // namespace
}  // namespace kiln::comm
