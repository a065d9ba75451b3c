// Fused softmax + cross-entropy on the GPU: one block per row, no probability tensor. The model
// feeds it the logits in row chunks of the storage type (engine/model/gpt_model.h head_rows: up to
// 1 GiB of logits at a time on a GPU, never fp32 logits), and the gradient
// overwrites the logits in place. Two kernels: the fused one (fused_kernels(), the default) reads
// each row twice - once for the row's max and sum of exponentials together (online softmax, the
// running sum rescaled when the max grows), once for the gradient -; the unfused one three times
// (max, sum, gradient).
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kThreads = 512;

// One row of the fused softmax + cross-entropy: both row kernels (one block per row) share the
// prologue (ce_row_begin) and the loss and gradient (ce_row_finish); they differ only in how
// they get the row's max m and sum of exp(x - m).
template <typename T>
struct CeRow {
  const T* x;  // the row's logits
  T* g;        // its gradient row (nullptr: forward only); may alias x
  int target;
  float xt;    // the target's logit, read before any thread may overwrite it (in place)
};

// false for an ignored row (target < 0): its loss is 0, its gradient row zeroed, the block is
// done. A target >= V is a caller bug: stops the process at the next CUDA call.
template <typename T>
__device__ __forceinline__ bool ce_row_begin(CeRow<T>* r, T* dlogits, float* losses,
                                             const T* logits, const int32_t* targets, int V,
                                             int Vp) {
  const int row = blockIdx.x;
  r->target = targets[row];
  r->x = logits + size_t(row) * Vp;
  r->g = dlogits ? dlogits + size_t(row) * Vp : nullptr;
  if (r->target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (r->g)
      for (int c = threadIdx.x; c < Vp; c += blockDim.x) r->g[c] = from_float<T>(0.0f);
    return false;
  }
  if (r->target >= V) __trap();
  r->xt = ld(r->x + r->target);
  return true;
}

// loss = log(s) + m - x_target; gradient dloss * (softmax - onehot(target)), padding zeroed.
template <typename T>
__device__ __forceinline__ void ce_row_finish(const CeRow<T>& r, float* losses, float m, float s,
                                              float dloss, int V, int Vp) {
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + m - r.xt;
  if (!r.g) return;
  const float k = dloss / s;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float p = expf(ld(r.x + c) - m) * k;
    st(r.g + c, c == r.target ? p - dloss : p);
  }
  for (int c = V + threadIdx.x; c < Vp; c += blockDim.x) r.g[c] = from_float<T>(0.0f);
}

// Three reads of the row: max, sum, gradient.
template <typename T>
__global__ void crossentropy_kernel(T* dlogits, float* losses, const T* logits,
                                    const int32_t* targets, float dloss, int V, int Vp) {
  __shared__ float shared[32];
  CeRow<T> r;
  if (!ce_row_begin(&r, dlogits, losses, logits, targets, V, Vp)) return;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, ld(r.x + c));
  m = block_max(m, shared);
  float s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) s += expf(ld(r.x + c) - m);
  s = block_sum(s, shared);
  ce_row_finish(r, losses, m, s, dloss, V, Vp);
}

// Online softmax statistics: (m, s) with s = sum exp(x - m) over the values seen.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MaxSum{m, 0.0f};
  return MaxSum{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
// Block-wide combine in a fixed order (warp butterflies, then warp 0 over the warps' values);
// every thread gets the result.
__device__ __forceinline__ MaxSum block_combine(MaxSum v, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  __syncthreads();
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  MaxSum r = lane < nwarps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1)
    r = combine(r, MaxSum{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
  return r;
}

// Two reads of the row: (max, sum) together, then the gradient.
template <typename T>
__global__ void crossentropy_online_kernel(T* dlogits, float* losses, const T* logits,
                                           const int32_t* targets, float dloss, int V, int Vp) {
  __shared__ float sm[32], ss[32];
  CeRow<T> r;
  if (!ce_row_begin(&r, dlogits, losses, logits, targets, V, Vp)) return;
  MaxSum a{-INFINITY, 0.0f};
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = ld(r.x + c);
    if (v > a.m) {
      a.s = a.s * expf(a.m - v) + 1.0f;  // expf(-inf) = 0 for the first value
      a.m = v;
    } else if (v != -INFINITY) {  // (-inf) - (-inf) would be NaN
      a.s += expf(v - a.m);
    }
  }
  const MaxSum t = block_combine(a, sm, ss);
  ce_row_finish(r, losses, t.m, t.s, dloss, V, Vp);
}

// Vocabulary-parallel statistics: one block per row of this rank's V columns.
template <typename T>
__global__ void shard_max_kernel(float* row_max, const T* logits, int V) {
  __shared__ float shared[32];
  const T* x = logits + size_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, ld(x + c));
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T>
__global__ void shard_sum_kernel(float* sum_exp, float* target_logit, const T* logits,
                                 const float* row_max, const int32_t* targets, int V, int v0) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  const T* x = logits + size_t(row) * V;
  const float m = row_max[row];
  float s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) s += expf(ld(x + c) - m);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    sum_exp[row] = s;
    const int t = targets[row] - v0;
    target_logit[row] = targets[row] >= 0 && t >= 0 && t < V ? ld(x + t) : 0.0f;
  }
}

template <typename T>
__global__ void shard_backward_kernel(T* dlogits, const T* logits, const float* row_max,
                                      const float* sum_exp, const int32_t* targets, float dloss,
                                      int V, int v0) {
  const int row = blockIdx.x;
  const T* x = logits + size_t(row) * V;
  T* g = dlogits + size_t(row) * V;
  if (targets[row] < 0) {
    for (int c = threadIdx.x; c < V; c += blockDim.x) g[c] = from_float<T>(0.0f);
    return;
  }
  const float m = row_max[row], k = dloss / sum_exp[row];
  const int t = targets[row] - v0;
  // Each element is read before the same thread overwrites it (dlogits may alias logits).
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float p = expf(ld(x + c) - m) * k;
    st(g + c, c == t ? p - dloss : p);
  }
}

__global__ void shard_loss_kernel(float* losses, const float* row_max, const float* sum_exp,
                                  const float* target_logit, const int32_t* targets, int BT) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < BT) losses[r] = targets[r] < 0 ? 0.0f : logf(sum_exp[r]) + row_max[r] - target_logit[r];
}

}  // namespace

template <typename T>
void crossentropy_shard_max(float* row_max, const T* logits, int BT, int V) {
  KILN_CUDA_TIMED(kCrossEntropy);
  if (BT == 0) return;
  shard_max_kernel<<<BT, kThreads, 0, stream()>>>(row_max, logits, V);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void crossentropy_shard_sum(float* sum_exp, float* target_logit, const T* logits,
                            const float* row_max, const int32_t* targets, int BT, int V, int v0) {
  KILN_CUDA_TIMED(kCrossEntropy);
  if (BT == 0) return;
  shard_sum_kernel<<<BT, kThreads, 0, stream()>>>(sum_exp, target_logit, logits, row_max, targets,
                                                  V, v0);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void crossentropy_shard_backward(Same<T>* dlogits, const T* logits, const float* row_max,
                                 const float* sum_exp, const int32_t* targets, float dloss, int BT,
                                 int V, int v0) {
  KILN_CUDA_TIMED(kCrossEntropy);
  if (BT == 0) return;
  shard_backward_kernel<<<BT, kThreads, 0, stream()>>>(dlogits, logits, row_max, sum_exp, targets,
                                                       dloss, V, v0);
  KILN_CUDA_LAUNCHED();
}

void crossentropy_shard_loss(float* losses, const float* row_max, const float* sum_exp,
                             const float* target_logit, const int32_t* targets, int BT) {
  KILN_CUDA_TIMED(kCrossEntropy);
  if (BT == 0) return;
  shard_loss_kernel<<<grid_for(size_t(BT), 256), 256, 0, stream()>>>(losses, row_max, sum_exp,
                                                                    target_logit, targets, BT);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void crossentropy_forward_backward(Same<T>* dlogits, float* losses, const T* logits,
                                   const int32_t* targets, float dloss, int BT, int V, int Vp) {
  KILN_CUDA_TIMED(kCrossEntropy);
  KILN_CHECK(V > 0 && Vp >= V, "crossentropy: need 0 < V <= Vp");
  if (BT == 0) return;
  if (fused_kernels()) {
    crossentropy_online_kernel<<<BT, kThreads, 0, stream()>>>(dlogits, losses, logits, targets,
                                                              dloss, V, Vp);
  } else {
    crossentropy_kernel<<<BT, kThreads, 0, stream()>>>(dlogits, losses, logits, targets, dloss, V, Vp);
  }
  KILN_CUDA_LAUNCHED();
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void crossentropy_forward_backward<T>(T*, float*, const T*, const int32_t*, float, \
                                                 int, int, int);                              \
  template void crossentropy_shard_max<T>(float*, const T*, int, int);                        \
  template void crossentropy_shard_sum<T>(float*, float*, const T*, const float*,             \
                                          const int32_t*, int, int, int);                     \
  template void crossentropy_shard_backward<T>(T*, const T*, const float*, const float*,      \
                                               const int32_t*, float, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
