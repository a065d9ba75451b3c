// Global gradient norm (fp64, fixed grid and order) and the inf/NaN check on the GPU.
#include <vector>

#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kBlocks = 256;   // fixed, independent of the GPU, so the order never changes
constexpr int kThreads = 256;

__global__ void sum_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += size_t(kBlocks) * kThreads) {
    const double v = x[i];
    acc += v * v;
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

// The fused path: all tensors in one launch (blockIdx.y = tensor, the same partial layout as one
// launch per tensor), then one block adds the partials in a fixed order on the device, so the
// host reads 8 bytes.
struct NormSegment {
  const float* x;
  size_t n;
};
__global__ void sum_squares_multi_kernel(double* partial, const NormSegment* segs) {
  const NormSegment s = segs[blockIdx.y];
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < s.n; i += size_t(kBlocks) * kThreads) {
    const double v = s.x[i];
    acc += v * v;
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[size_t(blockIdx.y) * kBlocks + blockIdx.x] = sh[0];
}
// total = sum of partial[0..n): thread t adds t, t + kThreads, ... in order, then a fixed tree.
__global__ void reduce_partials_kernel(double* total, const double* partial, size_t n) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) acc += partial[i];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = sh[0];
}

__global__ void inf_nan_kernel(const float* x, size_t n, int* flag) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if (!isfinite(x[i])) *flag = 1;  // every writer stores the same value
  }
}
}  // namespace

double sum_squares(const float* const* tensors, const size_t* sizes, int count) {
  KILN_CUDA_TIMED(kOptimizer);
  if (count <= 0) return 0.0;
  // One extra double after the partials receives the device-side total (fused path).
  double* partial = static_cast<double*>(workspace(sizeof(double) * (size_t(kBlocks) * count + 1), 2));
  if (fused_kernels() && count <= 65535) {
    std::vector<NormSegment> segs(static_cast<size_t>(count));
    for (int t = 0; t < count; ++t) segs[t] = NormSegment{tensors[t], sizes[t]};
    const auto* dsegs = static_cast<const NormSegment*>(device_table(segs.data(), segs.size() * sizeof(NormSegment), 2));
    sum_squares_multi_kernel<<<dim3(kBlocks, unsigned(count)), kThreads, 0, stream()>>>(partial, dsegs);
    KILN_CUDA_LAUNCHED();
    double* total = partial + size_t(kBlocks) * count;
    reduce_partials_kernel<<<1, kThreads, 0, stream()>>>(total, partial, size_t(kBlocks) * count);
    KILN_CUDA_LAUNCHED();
    return read_scalar(total);
  }
  for (int t = 0; t < count; ++t) {
    sum_squares_kernel<<<kBlocks, kThreads, 0, stream()>>>(partial + size_t(t) * kBlocks, tensors[t], sizes[t]);
    KILN_CUDA_LAUNCHED();
  }
  std::vector<double> host(size_t(kBlocks) * count);
  copy_to_host(host.data(), partial, host.size() * sizeof(double));
  double total = 0.0;
  for (double v : host) total += v;
  return total;
}

double sum_squares(const float* x, size_t n) {
  KILN_CUDA_TIMED(kOptimizer);
  const float* t[1] = {x};
  size_t s[1] = {n};
  return sum_squares(t, s, 1);
}

bool has_inf_or_nan(const float* const* tensors, const size_t* sizes, int count) {
  KILN_CUDA_TIMED(kOptimizer);
  int* flag = static_cast<int*>(workspace(sizeof(int), 3));
  KILN_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream()));
  for (int t = 0; t < count; ++t) {
    if (sizes[t] == 0) continue;
    inf_nan_kernel<<<grid_for(sizes[t], 256, 4096), 256, 0, stream()>>>(tensors[t], sizes[t], flag);
    KILN_CUDA_LAUNCHED();
  }
  int host = 0;
  copy_to_host(&host, flag, sizeof(int));
  return host != 0;
}

bool has_inf_or_nan(const float* x, size_t n) {
  KILN_CUDA_TIMED(kOptimizer);
  const float* t[1] = {x};
  size_t s[1] = {n};
  return has_inf_or_nan(t, s, 1);
}

}  // namespace kiln::cuda
