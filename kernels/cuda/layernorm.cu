// LayerNorm on the GPU: one warp per row; parameter gradients by fixed row chunks.
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr float kLnEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // one warp per row, 256 threads

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ld(x + c);
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = ld(x + c) - m;
    v += d * d;
  }
  const float r = rsqrtf(warp_sum(v) / C + kLnEps);
  T* o = out + size_t(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float y = (ld(x + c) - m) * r * ld(weight + c) + (bias ? ld(bias + c) : 0.0f);
    st(o + c, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                               const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  const T* dy = dout + size_t(row) * C;
  const float m = mean[row], r = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = ld(dy + c) * ld(weight + c);
    a += dnorm;
    b += dnorm * (ld(x + c) - m) * r;
  }
  const float dnorm_mean = warp_sum(a) / C;
  const float dnorm_xhat_mean = warp_sum(b) / C;
  T* dx = dinp + size_t(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (ld(x + c) - m) * r;
    const float dnorm = ld(dy + c) * ld(weight + c);
    st(dx + c, ld(dx + c) + (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * r);
  }
}

// residual_forward + layernorm_forward_kernel in one pass: one warp per row writes res = a + b
// (rounded to T) and normalises the rounded values with the same per-lane order and warp sums as
// layernorm_forward_kernel. kPerLane > 0 keeps the row in registers (C <= 32 * kPerLane); 0 reads
// it back from res (any C).
template <typename T, int kPerLane>
__global__ void residual_layernorm_kernel(T* res, T* out, float* mean, float* rstd, const T* a,
                                          const T* b, const T* weight, const T* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const size_t off = size_t(row) * C;
  T* r_row = res + off;
  float vals[kPerLane > 0 ? kPerLane : 1];
  float s = 0.0f;
  if constexpr (kPerLane > 0) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < C) {
        const T r = from_float<T>(ld(a + off + c) + ld(b + off + c));
        r_row[c] = r;
        vals[i] = to_float(r);
        s += vals[i];
      }
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const T r = from_float<T>(ld(a + off + c) + ld(b + off + c));
      r_row[c] = r;
      s += to_float(r);
    }
  }
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  if constexpr (kPerLane > 0) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i < C) {
        const float d = vals[i] - m;
        v += d * d;
      }
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float d = ld(r_row + c) - m;
      v += d * d;
    }
  }
  const float rs = rsqrtf(warp_sum(v) / C + kLnEps);
  T* o = out + off;
  if constexpr (kPerLane > 0) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < C) st(o + c, (vals[i] - m) * rs * ld(weight + c) + (bias ? ld(bias + c) : 0.0f));
    }
  } else {
    for (int c = lane; c < C; c += 32)
      st(o + c, (ld(r_row + c) - m) * rs * ld(weight + c) + (bias ? ld(bias + c) : 0.0f));
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// partial[chunk][0..C) = sum dy * xhat, partial[chunk][C..2C) = sum dy, rows of the chunk in order.
template <typename T>
__global__ void layernorm_param_partials(float* partial, const T* dout, const T* inp,
                                         const float* mean, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int r0 = chunk * kColumnChunkRows, r1 = min(N, r0 + kColumnChunkRows);
  float dw = 0.0f, db = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const float dy = ld(dout + size_t(r) * C + c);
    dw += dy * (ld(inp + size_t(r) * C + c) - mean[r]) * rstd[r];
    db += dy;
  }
  partial[size_t(chunk) * 2 * C + c] = dw;
  partial[size_t(chunk) * 2 * C + C + c] = db;
}

__global__ void layernorm_param_reduce(float* dweight, float* dbias, const float* partial,
                                       int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    dw += partial[size_t(k) * 2 * C + c];
    db += partial[size_t(k) * 2 * C + C + c];
  }
  if (dweight) dweight[c] += dw;
  if (dbias) dbias[c] += db;
}
}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const Same<T>* inp, const Same<T>* weight,
                       const Same<T>* bias, int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const int N = B * T_;
  if (N == 0) return;
  layernorm_forward_kernel<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, stream()>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void residual_layernorm_forward(T* res, T* out, float* mean, float* rstd, const Same<T>* inp1,
                                const Same<T>* inp2, const Same<T>* weight, const Same<T>* bias,
                                int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const int N = B * T_;
  if (N == 0) return;
  if (!fused_kernels()) {
    residual_forward(res, inp1, inp2, size_t(N) * C);
    layernorm_forward(out, mean, rstd, res, weight, bias, B, T_, C);
    return;
  }
  const dim3 grid((N + kRowsPerBlock - 1) / kRowsPerBlock), block(32 * kRowsPerBlock);
  if (C <= 32 * 32) {
    residual_layernorm_kernel<T, 32><<<grid, block, 0, stream()>>>(res, out, mean, rstd, inp1, inp2,
                                                                   weight, bias, N, C);
  } else if (C <= 32 * 64) {
    residual_layernorm_kernel<T, 64><<<grid, block, 0, stream()>>>(res, out, mean, rstd, inp1, inp2,
                                                                   weight, bias, N, C);
  } else {
    residual_layernorm_kernel<T, 0><<<grid, block, 0, stream()>>>(res, out, mean, rstd, inp1, inp2,
                                                                  weight, bias, N, C);
  }
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void layernorm_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                        const Same<T>* inp, const Same<T>* weight, const float* mean,
                        const float* rstd, int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const int N = B * T_;
  if (N == 0) return;
  if (dinp) {
    layernorm_backward_dinp_kernel<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0,
                                     stream()>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    KILN_CUDA_LAUNCHED();
  }
  if (dweight || dbias) {
    const int chunks = (N + kColumnChunkRows - 1) / kColumnChunkRows;
    float* partial = static_cast<float*>(workspace(sizeof(float) * size_t(chunks) * 2 * C, 1));
    layernorm_param_partials<<<dim3((C + 255) / 256, chunks), 256, 0, stream()>>>(partial, dout, inp,
                                                                                 mean, rstd, N, C);
    KILN_CUDA_LAUNCHED();
    layernorm_param_reduce<<<(C + 255) / 256, 256, 0, stream()>>>(dweight, dbias, partial, chunks, C);
    KILN_CUDA_LAUNCHED();
  }
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, \
                                     int);                                                       \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,          \
                                      const float*, const float*, int, int, int);                 \
  template void residual_layernorm_forward<T>(T*, T*, float*, float*, const T*, const T*,         \
                                              const T*, const T*, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
