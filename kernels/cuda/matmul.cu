// matmul on the GPU: cuBLAS GEMM (fp32 accumulation, no TF32), bias preloaded into the output.
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {

template <typename T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  else return CUDA_R_16F;
}

template <typename T>
__global__ void broadcast_rows(T* out, const T* bias, size_t rows, int cols) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % cols];
}

// Row-major C(M,N) = op(A) op(B) in column-major terms (see the call sites).
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
          cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb, float beta, void* C,
          cudaDataType_t ct, int ldc) {
  const float alpha = 1.0f;
  KILN_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, m, n, k, &alpha, A, at, lda, B, bt, ldb, &beta, C,
                                 ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC) {
  const int BT = B * T_;
  if (BT == 0 || OC == 0) return;
  if (bias) {
    broadcast_rows<<<grid_for(size_t(BT) * OC, 256), 256, 0, stream()>>>(out, bias, size_t(BT), OC);
    KILN_CUDA_LAUNCHED();
  }
  // Column-major: out^T (OC x BT) = W (OC x C) . inp^T (C x BT); W row-major is W^T col-major.
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, weight, cuda_type<T>(), C, inp, cuda_type<T>(), C,
       bias ? 1.0f : 0.0f, out, cuda_type<T>(), OC);
}

template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC) {
  const int BT = B * T_;
  if (BT == 0 || OC == 0) return;
  if (dinp) {
    // dinp^T (C x BT) += W^T (C x OC) . dout^T (OC x BT)
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, weight, cuda_type<T>(), C, dout, cuda_type<T>(), OC,
         1.0f, dinp, cuda_type<T>(), C);
  }
  if (dweight) {
    // dweight^T (C x OC) += inp^T (C x BT) . dout (BT x OC), fp32 output
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, BT, inp, cuda_type<T>(), C, dout, cuda_type<T>(), OC, 1.0f,
         dweight, CUDA_R_32F, C);
  }
  if (dbias) column_sums_accumulate(dbias, dout, BT, OC);
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, int);        \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int,  \
                                   int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
