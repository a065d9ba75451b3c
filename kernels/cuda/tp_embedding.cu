// The vocabulary-parallel embedding's forward on the GPU (kernels/ops.h). Its wte
// gradient is kernels/cuda/encoder.cu's token-sorted one with a vocabulary window. Not yet run on
// a GPU.
#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace kiln::cuda {

using namespace detail;

namespace {

template <typename T>
__global__ void tp_embedding_forward_kernel(float* out, const int32_t* tokens,
                                            const int32_t* doc_start, const T* wte, const T* wpe,
                                            int BT, int T_, int C, int v0, int Vl) {
  const size_t n = size_t(BT) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / C;
    const int c = int(i % C);
    const int local = tokens[r] - v0;
    float v = (local >= 0 && local < Vl) ? ld(wte + size_t(local) * C + c) : 0.0f;
    if (wpe) v += ld(wpe + (r % T_ - (doc_start ? doc_start[r] : 0)) * C + c);
    out[i] = v;
  }
}

}  // namespace

template <typename T>
void tp_embedding_forward(float* out, const int32_t* tokens, const int32_t* doc_start,
                          const T* wte_local, const T* wpe, int B, int T_, int C, int v0,
                          int V_local) {
  KILN_CUDA_TIMED(kElementwise);
  const size_t n = size_t(B) * T_ * C;
  if (n == 0) return;
  tp_embedding_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(
      out, tokens, doc_start, wte_local, wpe, B * T_, T_, C, v0, V_local);
  KILN_CUDA_LAUNCHED();
}

#define KILN_INSTANTIATE(T)                                                               \
  template void tp_embedding_forward<T>(float*, const int32_t*, const int32_t*, const T*, \
                                        const T*, int, int, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
