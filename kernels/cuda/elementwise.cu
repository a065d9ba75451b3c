// Elementwise CUDA kernels: casts, residual, GELU, scale, accumulate.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_plan.h"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kThreads = 256;

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<D>(to_float(src[i]));
}

template <typename T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    st(out + i, ld(a + i) + ld(b + i));
}

template <typename T>
__global__ void residual_backward_kernel(T* d1, T* d2, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float d = ld(dout + i);
    if (d1) st(d1 + i, ld(d1 + i) + d);
    if (d2) st(d2 + i, ld(d2 + i) + d);
  }
}

constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float x = ld(inp + i);
    const float u = kGeluK * (x + kGeluA * x * x * x);
    st(out + i, 0.5f * x * (1.0f + tanhf(u)));
  }
}

// d gelu(x) / dx for the tanh approximation.
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluA * x * x * x);
  const float t = tanhf(u);
  const float dudx = kGeluK * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dudx;
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    st(dinp + i, ld(dinp + i) + gelu_grad(ld(inp + i)) * ld(dout + i));
}

template <typename T>
__global__ void gelu_backward_inplace_kernel(T* d, const T* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    st(d + i, gelu_grad(ld(inp + i)) * ld(d + i));
}

__global__ void scale_kernel(float* x, float s, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) x[i] *= s;
}
__global__ void accumulate_kernel(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) y[i] += x[i];
}

template <typename D, typename S>
void cast_impl(D* dst, const S* src, size_t n) {
  KILN_CUDA_TIMED(kElementwise);
  if (n == 0) return;
  cast_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dst, src, n);
  KILN_CUDA_LAUNCHED();
}

}  // namespace

void cast(bf16* dst, const float* src, size_t n) { cast_impl(dst, src, n); }
void cast(fp16* dst, const float* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const bf16* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const fp16* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const float* src, size_t n) {
  if (n && dst != src) KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

template <typename T>
void residual_forward(T* out, const Same<T>* inp1, const Same<T>* inp2, size_t N) {
  KILN_CUDA_TIMED(kElementwise);
  if (N == 0) return;
  residual_forward_kernel<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(out, inp1, inp2, N);
  KILN_CUDA_LAUNCHED();
}
template <typename T>
void residual_backward(Same<T>* dinp1, Same<T>* dinp2, const T* dout, size_t N) {
  KILN_CUDA_TIMED(kElementwise);
  if (N == 0) return;
  residual_backward_kernel<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(dinp1, dinp2, dout, N);
  KILN_CUDA_LAUNCHED();
}
template <typename T>
void gelu_forward(T* out, const Same<T>* inp, size_t N) {
  KILN_CUDA_TIMED(kElementwise);
  if (N == 0) return;
  gelu_forward_kernel<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(out, inp, N);
  KILN_CUDA_LAUNCHED();
}
template <typename T>
void gelu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t N) {
  KILN_CUDA_TIMED(kElementwise);
  if (N == 0) return;
  gelu_backward_kernel<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(dinp, inp, dout, N);
  KILN_CUDA_LAUNCHED();
}

namespace detail {
template <typename T>
void gelu_backward_inplace(T* d, const T* inp, size_t n) {
  if (n == 0) return;
  gelu_backward_inplace_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(d, inp, n);
  KILN_CUDA_LAUNCHED();
}
template void gelu_backward_inplace<float>(float*, const float*, size_t);
template void gelu_backward_inplace<bf16>(bf16*, const bf16*, size_t);
template void gelu_backward_inplace<fp16>(fp16*, const fp16*, size_t);
}  // namespace detail

void scale(float* x, float s, size_t n) {
  KILN_CUDA_TIMED(kElementwise);
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, s, n);
  KILN_CUDA_LAUNCHED();
}
void accumulate(float* y, const float* x, size_t n) {
  KILN_CUDA_TIMED(kElementwise);
  if (n == 0) return;
  accumulate_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(y, x, n);
  KILN_CUDA_LAUNCHED();
}

#define KILN_INSTANTIATE(T)                                                    \
  template void residual_forward<T>(T*, const T*, const T*, size_t);          \
  template void residual_backward<T>(T*, T*, const T*, size_t);               \
  template void gelu_forward<T>(T*, const T*, size_t);                        \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
