// Fused softmax + cross-entropy on the GPU: one block per row, no probability tensor.
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kThreads = 512;

template <typename T>
__global__ void crossentropy_kernel(T* dlogits, float* losses, const T* logits,
                                    const int32_t* targets, float dloss, int V, int Vp) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  const int target = targets[row];
  const T* x = logits + size_t(row) * Vp;
  T* g = dlogits ? dlogits + size_t(row) * Vp : nullptr;
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (g)
      for (int c = threadIdx.x; c < Vp; c += blockDim.x) g[c] = from_float<T>(0.0f);
    return;
  }
  if (target >= V) __trap();  // caller bug: stops the process at the next CUDA call
  const float xt = ld(x + target);  // read before any thread may overwrite it (in place)
  float m = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, ld(x + c));
  m = block_max(m, shared);
  float s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) s += expf(ld(x + c) - m);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) losses[row] = logf(s) + m - xt;
  if (g) {
    const float k = dloss / s;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float p = expf(ld(x + c) - m) * k;
      st(g + c, c == target ? p - dloss : p);
    }
    for (int c = V + threadIdx.x; c < Vp; c += blockDim.x) g[c] = from_float<T>(0.0f);
  }
}

}  // namespace

template <typename T>
void crossentropy_forward_backward(Same<T>* dlogits, float* losses, const T* logits,
                                   const int32_t* targets, float dloss, int BT, int V, int Vp) {
  KILN_CHECK(V > 0 && Vp >= V, "crossentropy: need 0 < V <= Vp");
  if (BT == 0) return;
  crossentropy_kernel<<<BT, kThreads, 0, stream()>>>(dlogits, losses, logits, targets, dloss, V, Vp);
  KILN_CUDA_LAUNCHED();
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void crossentropy_forward_backward<T>(T*, float*, const T*, const int32_t*, float, \
                                                 int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
