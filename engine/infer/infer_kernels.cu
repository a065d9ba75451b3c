// The CUDA versions of engine/infer/infer_kernels.h: attention of query rows against the KV
// cache and RoPE at positions after the prompt, fp32, in their plainest form (one thread block per
// (query row, head); one thread per rotated pair), the CPU loops' arithmetic (gpt_infer.cc). On
// the CUDA backend's current stream (kiln::cuda::stream()); compiled only into libkiln_cuda.so.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "common/status.h"
#include "engine/infer/infer_kernels.h"
#include "kernels/cuda/runtime.h"

namespace kiln::engine::infer {
namespace {

constexpr int kThreads = 128;

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  KILN_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

// Max (kMax) or sum of v over the block (blockDim.x == kThreads, a power of two), a fixed tree.
template <bool kMax>
__device__ float block_reduce(float v, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float a = sh[threadIdx.x], b = sh[threadIdx.x + s];
      sh[threadIdx.x] = kMax ? fmaxf(a, b) : a + b;
    }
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

// grid (n, NH): query row p0 + blockIdx.x, head blockIdx.y.
__global__ void cached_attention_kernel(float* out, const float* rows, float* scores, int p0, int n,
                                        int NH, int NKV, int hs) {
  __shared__ float sh[kThreads];
  const int i = blockIdx.x, h = blockIdx.y;
  const int last = p0 + i;
  const size_t W = size_t(NH + 2 * NKV) * hs;
  const size_t g = size_t(h / (NH / NKV)) * hs;
  const float* q = rows + size_t(last) * W + size_t(h) * hs;
  const float* K = rows + size_t(NH) * hs + g;
  const float* V = rows + size_t(NH + NKV) * hs + g;
  float* s = scores + (size_t(i) * NH + h) * size_t(p0 + n);
  const float scale = 1.0f / sqrtf(float(hs));
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) {
    const float* kj = K + size_t(j) * W;
    float d = 0.0f;
    for (int e = 0; e < hs; ++e) d += q[e] * scale * kj[e];
    s[j] = d;
    mx = fmaxf(mx, d);
  }
  mx = block_reduce<true>(mx, sh);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) {
    const float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, sh);  // its barriers also publish s[] to the block
  const float inv = 1.0f / sum;
  float* o = out + (size_t(i) * NH + h) * hs;
  for (int e = threadIdx.x; e < hs; e += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= last; ++j) acc += s[j] * V[size_t(j) * W + e];
    o[e] = acc * inv;
  }
}

// One thread per (row, rotated head, pair i < hs/2); fp64 angle and cos/sin, rounded to fp32.
__global__ void rope_rows_kernel(float* qkv, int n, int p0, double th, int NH, int NKV, int hs) {
  const int half = hs / 2;
  const size_t total = size_t(n) * (NH + NKV) * half;
  const size_t W = size_t(NH + 2 * NKV) * hs;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const size_t rh = idx / half;
    const int h = int(rh % (NH + NKV));
    const size_t r = rh / (NH + NKV);
    const double a = double(p0 + int(r)) * pow(th, -2.0 * i / hs);
    const float c = float(cos(a)), sn = float(sin(a));
    float* x = qkv + r * W + size_t(h) * hs;
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * sn;
    x[i + half] = x2 * c + x1 * sn;
  }
}

}  // namespace

void cached_attention_cuda(float* out, const float* rows, float* scores, int p0, int n, int NH,
                           int NKV, int hs) {
  KILN_CHECK(n > 0 && NKV > 0 && NH % NKV == 0, "cached_attention: bad shape");
  cached_attention_kernel<<<dim3(unsigned(n), unsigned(NH)), kThreads, 0, kiln::cuda::stream()>>>(
      out, rows, scores, p0, n, NH, NKV, hs);
  check_launch("cached_attention_kernel");
}

void rope_rows_cuda(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs) {
  KILN_CHECK(hs > 0 && hs % 2 == 0, "rope_rows: the head size must be even");
  const size_t total = size_t(n) * (NH + NKV) * (hs / 2);
  size_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 65535u * 16) blocks = 65535u * 16;
  if (blocks < 1) blocks = 1;
  // The operator takes theta as a float.
  const double th = double(float(theta));
  rope_rows_kernel<<<unsigned(blocks), kThreads, 0, kiln::cuda::stream()>>>(qkv, n, p0, th, NH, NKV,
                                                                            hs);
  check_launch("rope_rows_kernel");
}

}  // namespace kiln::engine::infer
