// Token + position embedding on the GPU. The token-embedding gradient is deterministic and
// bit-identical with the CPU's: the positions are stably sorted by token (CUB's radix sort), then
// one block per distinct token adds its positions' rows in increasing position order — the CPU's
// order for every element — with no atomics. The same code serves the vocabulary-parallel
// embedding's gradient (kernels/ops.h tp_embedding_backward_wte): a window [v0, v0 + V)
// of the vocabulary, the runs of tokens outside it skipped.
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace kiln::cuda {

using namespace detail;

namespace {
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const int32_t* doc_start,
                                       const T* wte, const T* wpe, int BT, int T_, int C) {
  const size_t n = size_t(BT) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / C;
    const int c = int(i % C);
    const int t = int(r % T_) - (doc_start ? doc_start[r] : 0);
    st(out + i, ld(wte + size_t(tokens[r]) * C + c) + (wpe ? ld(wpe + size_t(t) * C + c) : 0.0f));
  }
}

__global__ void iota_kernel(int32_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = i;
}

// Block i: if sorted position i starts a run of one token inside the window [v0, v0 + V), adds
// the run's rows of dout (in increasing position order) to that token's row (token - v0) of
// dwte; other blocks return at once.
template <typename T>
__global__ void encoder_backward_wte_kernel(float* dwte, const T* dout,
                                            const int32_t* sorted_tokens,
                                            const int32_t* sorted_rows, int BT, int C, int v0,
                                            int V) {
  const int i = blockIdx.x;
  const int32_t token = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == token) return;
  if (token < v0 || token - v0 >= V) return;  // another rank's row (vocabulary-parallel)
  int end = i + 1;
  while (end < BT && sorted_tokens[end] == token) ++end;
  float* g = dwte + size_t(token - v0) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = g[c];
    for (int j = i; j < end; ++j) acc += ld(dout + size_t(sorted_rows[j]) * C + c);
    g[c] = acc;
  }
}

// dwte (the rows of the tokens [v0, v0 + V)) on the current stream: sort (token, position) pairs
// by token, stably, in workspace slot 0.
template <typename T>
void encoder_backward_wte(float* dwte, const T* dout, const int32_t* tokens, int BT, int C,
                          int v0 = 0, int V = INT_MAX) {
  size_t sort_bytes = 0;  // CUB's scratch for BT pairs (a size query: nothing runs)
  int32_t* none = nullptr;
  KILN_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, none, none, none, BT));
  const size_t ints =
      (size_t(BT) * 3 + 63) / 64 * 64;  // keys out, rows in, rows out (256-B aligned)
  char* ws = static_cast<char*>(workspace(ints * sizeof(int32_t) + sort_bytes, 0));
  int32_t* sorted_tokens = reinterpret_cast<int32_t*>(ws);
  int32_t* rows = sorted_tokens + BT;
  int32_t* sorted_rows = rows + BT;
  iota_kernel<<<grid_for(size_t(BT), 256), 256, 0, stream()>>>(rows, BT);
  KILN_CUDA_LAUNCHED();
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + ints * sizeof(int32_t), sort_bytes, tokens,
                                                  sorted_tokens, rows, sorted_rows, BT, 0,
                                                  int(sizeof(int32_t) * 8), stream()));
  encoder_backward_wte_kernel<<<BT, 128, 0, stream()>>>(dwte, dout, sorted_tokens, sorted_rows, BT,
                                                        C, v0, V);
  KILN_CUDA_LAUNCHED();
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

// With document starts (model.doc_mask): thread (p, c) adds the rows whose position
// t - doc_start[b,t] is p, in increasing row order (the CPU's order, so fp32 is bit-identical).
template <typename T>
__global__ void encoder_backward_wpe_doc_kernel(float* dwpe, const T* dout,
                                                const int32_t* doc_start, int B, int T_, int C) {
  const size_t n = size_t(T_) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const int p = int(i / C);
    const int c = int(i % C);
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b)
      for (int t = p; t < T_; ++t) {
        const size_t r = size_t(b) * T_ + t;
        if (t - doc_start[r] == p) acc += ld(dout + r * C + c);
      }
    dwpe[i] = acc;
  }
}
}  // namespace

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const int32_t* doc_start, const Same<T>* wte,
                     const Same<T>* wpe, int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const size_t n = size_t(B) * T_ * C;
  if (n == 0) return;
  encoder_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(out, tokens, doc_start, wte, wpe,
                                                                 B * T_, T_, C);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens,
                      const int32_t* doc_start, int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  if (size_t(B) * T_ * C == 0) return;
  if (dwte) encoder_backward_wte(dwte, dout, tokens, B * T_, C);
  if (dwpe && doc_start) {
    encoder_backward_wpe_doc_kernel<<<grid_for(size_t(T_) * C, 256), 256, 0, stream()>>>(
        dwpe, dout, doc_start, B, T_, C);
    KILN_CUDA_LAUNCHED();
  } else if (dwpe) {
    encoder_backward_wpe_kernel<<<grid_for(size_t(T_) * C, 256), 256, 0, stream()>>>(dwpe, dout, B, T_, C);
    KILN_CUDA_LAUNCHED();
  }
}

template <typename T>
void tp_embedding_backward_wte(float* dwte_local, const T* dout, const int32_t* tokens, int B,
                               int T_, int C, int v0, int V_local) {
  KILN_CUDA_TIMED(kElementwise);
  if (size_t(B) * T_ * C == 0) return;
  encoder_backward_wte(dwte_local, dout, tokens, B * T_, C, v0, V_local);
}

#define KILN_INSTANTIATE(T)                                                                        \
  template void encoder_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int,    \
                                   int, int);                                                      \
  template void encoder_backward<T>(float*, float*, const T*, const int32_t*, const int32_t*, int, \
                                    int, int);                                                     \
  template void tp_embedding_backward_wte<T>(float*, const T*, const int32_t*, int, int, int, int, \
                                             int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
