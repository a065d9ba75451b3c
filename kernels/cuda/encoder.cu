// Token + position embedding on the GPU; the backward scatter-add is deterministic (each thread
// owns one channel and walks the positions in order; no atomics).
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int BT, int T_, int C) {
  const size_t n = size_t(BT) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / C;
    const int c = int(i % C);
    const int t = int(r % T_);
    st(out + i, ld(wte + size_t(tokens[r]) * C + c) + ld(wpe + size_t(t) * C + c));
  }
}

template <typename T>
__global__ void encoder_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens,
                                            int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = 0; r < BT; ++r) dwte[size_t(tokens[r]) * C + c] += ld(dout + size_t(r) * C + c);
}

template <typename T>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const T* dout, int B, int T_, int C) {
  const size_t n = size_t(T_) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += ld(dout + size_t(b) * n + i);
    dwpe[i] += acc;
  }
}
}  // namespace

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const Same<T>* wte, const Same<T>* wpe, int B,
                     int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const size_t n = size_t(B) * T_ * C;
  if (n == 0) return;
  encoder_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(out, tokens, wte, wpe, B * T_, T_, C);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                      int C) {
  KILN_CUDA_TIMED(kElementwise);
  if (size_t(B) * T_ * C == 0) return;
  if (dwte) {
    encoder_backward_wte_kernel<<<(C + 127) / 128, 128, 0, stream()>>>(dwte, dout, tokens, B * T_, C);
    KILN_CUDA_LAUNCHED();
  }
  if (dwpe) {
    encoder_backward_wpe_kernel<<<grid_for(size_t(T_) * C, 256), 256, 0, stream()>>>(dwpe, dout, B, T_, C);
    KILN_CUDA_LAUNCHED();
  }
}

#define KILN_INSTANTIATE(T)                                                                     \
  template void encoder_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int);     \
  template void encoder_backward<T>(float*, float*, const T*, const int32_t*, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
