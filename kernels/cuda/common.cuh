// Internal to kernels/cuda/: helpers of the CUDA kernels: error checks, the current stream and
// cuBLAS handle, a grow-only device workspace, launch sizes, and deterministic block reductions.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "common/status.h"
#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

#define KILN_CUDA_CHECK(expr)                                                       \
  do {                                                                              \
    cudaError_t kiln_err_ = (expr);                                                 \
    KILN_CHECK(kiln_err_ == cudaSuccess,                                            \
               std::string(#expr) + ": " + cudaGetErrorString(kiln_err_));          \
  } while (0)

#define KILN_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                        \
    cublasStatus_t kiln_st_ = (expr);                                                         \
    KILN_CHECK(kiln_st_ == CUBLAS_STATUS_SUCCESS, std::string(#expr) + ": " +                 \
                                                      cublasGetStatusName(kiln_st_) + " (" +  \
                                                      cublasGetStatusString(kiln_st_) + ")"); \
  } while (0)

// Checks the last kernel launch.
#define KILN_CUDA_LAUNCHED() KILN_CUDA_CHECK(cudaGetLastError())

namespace kiln::cuda::detail {

cublasHandle_t cublas();
// A device copy of `bytes` of host data (a launch table), cached per slot 0..3: uploaded on the
// current stream only when the content differs from the slot's previous upload, so a table that
// stays the same from step to step (multi-tensor AdamW's) costs no copy after the first.
const void* device_table(const void* host, size_t bytes, int slot);
// One fp64 value read back through a pinned buffer (waits for the current stream).
double read_scalar(const double* device_value);
// A device buffer of at least `bytes`, owned by the runtime, reused across calls (slot 0..3).
// Growing it synchronises the device (cudaFree). Not for concurrent use from several host threads.
void* workspace(size_t bytes, int slot);

inline unsigned grid_for(size_t n, int threads, unsigned max_blocks = 65535u * 16) {
  size_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}

template <typename T>
__device__ __forceinline__ float ld(const T* p) {
  return to_float(*p);
}
template <typename T>
__device__ __forceinline__ void st(T* p, float v) {
  *p = from_float<T>(v);
}

// Sum over a warp in a fixed butterfly order (same result on every run).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// Fixed order: warp butterflies, then warp 0 over the per-warp values.
__device__ __forceinline__ float block_sum(float v, float* shared32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared32[lane] : 0.0f;
  r = warp_sum(r);
  return r;
}
__device__ __forceinline__ float block_max(float v, float* shared32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared32[lane] : -INFINITY;
  r = warp_max(r);
  return r;
}

// Kernel timing (ops.h set_kernel_timing): KILN_CUDA_TIMED(kGemm) at the top of an operator
// brackets everything it enqueues; an operator called from another is counted in the outer one.
bool kernel_timing_on();
void kernel_timing_begin(KernelFamily f);
void kernel_timing_end();
class TimedOp {
 public:
  explicit TimedOp(KernelFamily f) : on_(kernel_timing_on()) {
    if (on_) kernel_timing_begin(f);
  }
  ~TimedOp() {
    if (on_) kernel_timing_end();
  }
  TimedOp(const TimedOp&) = delete;
  TimedOp& operator=(const TimedOp&) = delete;

 private:
  bool on_;
};
#define KILN_CUDA_TIMED(family) \
  ::kiln::cuda::detail::TimedOp kiln_timed_op_(::kiln::cuda::KernelFamily::family)

// The tensor-core attention (attention_mma.cu), called by attention.cu: whether it runs for these
// arguments (chosen, eligible, aligned; always false for fp32), forward, and backward given
// D = rowsum(dout o out) (B, NH, T).
template <typename T>
bool use_attention_mma(const T* qkv, const T* dout, int C, int NH);
template <typename T>
void attention_forward_mma(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH);
template <typename T>
void attention_backward_mma(T* dqkv, const T* dout, const T* qkv, const float* lse,
                            const float* D, int B, int T_, int C, int NH);

// d[i] = gelu'(inp[i]) * d[i] in place (matmul_dgelu_backward without the epilogue; the same
// arithmetic as gelu_backward into a zeroed buffer).
template <typename T>
void gelu_backward_inplace(T* d, const T* inp, size_t n);

// out[c] += sum over rows of f(row, c), deterministic: rows are cut into fixed chunks of
// kColumnChunkRows, each (chunk, column) sums in row order into a partial, partials are then
// added in chunk order. Used for bias / layernorm parameter gradients.
constexpr int kColumnChunkRows = 256;

}  // namespace kiln::cuda::detail

namespace kiln::cuda::detail {

// partial[chunk * cols + c] = sum over rows r in chunk (in order) of x[r * cols + c]
template <typename T>
__global__ void column_partial_sums(float* partial, const T* x, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= cols) return;
  const int r0 = chunk * kColumnChunkRows;
  const int r1 = min(rows, r0 + kColumnChunkRows);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) acc += ld(x + size_t(r) * cols + c);
  partial[size_t(chunk) * cols + c] = acc;
}

// out[c] += sum over chunks (in order) of partial[chunk * cols + c]
static __global__ void column_reduce_partials(float* out, const float* partial, int chunks, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += partial[size_t(k) * cols + c];
  out[c] += acc;
}

// out[c] += sum over rows of x[r][c], deterministic (see kColumnChunkRows).
template <typename T>
void column_sums_accumulate(float* out, const T* x, int rows, int cols) {
  if (rows == 0 || cols == 0) return;
  const int chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  float* partial = static_cast<float*>(workspace(sizeof(float) * size_t(chunks) * cols, 1));
  dim3 grid((cols + 255) / 256, chunks);
  column_partial_sums<<<grid, 256, 0, stream()>>>(partial, x, rows, cols);
  KILN_CUDA_LAUNCHED();
  column_reduce_partials<<<(cols + 255) / 256, 256, 0, stream()>>>(out, partial, chunks, cols);
  KILN_CUDA_LAUNCHED();
}

}  // namespace kiln::cuda::detail
