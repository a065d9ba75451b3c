// Tensor-parallel kernels on the GPU (engine/tensor_parallel.h): the vocabulary-parallel
// embedding, where a rank holds the embedding rows [v0, v0 + V_local) and a token outside them
// contributes zero. Declarations only (no CUDA headers): the engine's templates name them, and
// only the CUDA module (K = kiln::CudaBackend) instantiates those calls.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kiln::cuda {

// out (B*T rows x C, fp32) = (v0 <= token < v0 + V_local ? wte_local[token - v0] : 0)
//                            + (wpe ? wpe[row % T] : 0):
// this rank's part of the embedding sum (the tensor-parallel all-reduce adds the others').
template <typename T>
void tp_embedding_forward(float* out, const int32_t* tokens, const T* wte_local, const T* wpe,
                          int B, int T_, int C, int v0, int V_local);

// dwte_local[token - v0] += dout[row] for the rows whose token this rank owns, each token's rows
// in increasing row order (deterministic, no atomics, the CPU's order): kernels/cuda/encoder.cu's
// token-sorted gradient (a stable radix sort of (token, row), one block per token) with the
// window [v0, v0 + V_local). Defined in encoder.cu.
template <typename T>
void tp_embedding_backward_wte(float* dwte_local, const T* dout, const int32_t* tokens, int B,
                               int T_, int C, int v0, int V_local);

}  // namespace kiln::cuda
