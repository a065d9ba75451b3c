// matmul on the GPU: cuBLASLt (fp32 accumulation, no TF32; bf16/fp16 inputs on tensor cores),
// the bias added in the GEMM's epilogue. Each distinct GEMM (shape, types, transposes, bias)
// gets its descriptors and algorithm (the heuristic's first choice) once, cached, so a given GEMM
// always runs the same algorithm: results repeat bit for bit. The heuristic is told each
// pointer's real alignment (cuBLASLt assumes 256 bytes unless told; Kiln's tensors are 32-byte
// aligned, and a GPT-2 XL weight sits on a 128-byte boundary). Where cuBLASLt offers no algorithm
// (e.g. unaligned leading dimensions), or refuses one at run time, the GEMM falls back to
// cublasGemmEx, bias preloaded.
#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>

#include "common/log_text.h"
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {

constexpr size_t kLtWorkspace = size_t(32) << 20;

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

struct LtPlan {
  bool ok = false;  // false: no cuBLASLt algorithm, use cublasGemmEx
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// One distinct GEMM: everything the algorithm choice depends on.
struct GemmKey {
  int ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc;
  bool bias, accumulate;
  uint32_t align_a = 256, align_b = 256, align_c = 256;  // the pointers' (powers of two, bytes)
  auto operator<=>(const GemmKey&) const = default;
};

// The largest power of two (up to 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
}

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<GemmKey, LtPlan> plans;
  LtState() {
    KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
    KILN_CUDA_CHECK(cudaMalloc(&workspace, kLtWorkspace));
  }
};
LtState& lt() {
  static LtState s;
  return s;
}

// Column-major D(m,n) = op(A) op(B) (+ beta C) (+ bias(m)), C and D the same buffer.
LtPlan& plan(const GemmKey& key) {
  LtState& s = lt();
  const auto ta = cublasOperation_t(key.ta), tb = cublasOperation_t(key.tb);
  const auto at = cudaDataType_t(key.at), bt = cudaDataType_t(key.bt), ct = cudaDataType_t(key.ct);
  const int m = key.m, n = key.n, k = key.k;
  auto it = s.plans.find(key);
  if (it != s.plans.end()) return it->second;
  LtPlan p;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (key.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof ct));
  }
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, at, ta == CUBLAS_OP_N ? m : k,
                                               ta == CUBLAS_OP_N ? k : m, key.lda));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, bt, tb == CUBLAS_OP_N ? k : n,
                                               tb == CUBLAS_OP_N ? n : k, key.ldb));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, m, n, key.ldc));
  cublasLtMatmulPreference_t pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &kLtWorkspace, sizeof kLtWorkspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attr, bytes] : aligns) {
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, p.op, p.a, p.b, p.c, p.c, pref,
                                                           1, &result, &found);
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.ok) p.algo = result.algo;
  return s.plans.emplace(key, p).first->second;
}

void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
          cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb, float beta,
          void* C, cudaDataType_t ct, int ldc, const void* bias = nullptr) {
  const float alpha = 1.0f;
  GemmKey key{int(ta), int(tb), m, n, k, int(at), lda, int(bt), ldb, int(ct), ldc, bias != nullptr,
              beta != 0.0f};
  key.align_a = alignment(A);
  key.align_b = alignment(B);
  key.align_c = alignment(C);
  LtPlan& p = plan(key);
  if (p.ok) {
    if (bias) {
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias));
    }
    const cublasStatus_t st =
        cublasLtMatmul(lt().handle, p.op, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, &p.algo,
                       lt().workspace, kLtWorkspace, stream());
    if (st == CUBLAS_STATUS_SUCCESS) return;
    // The chosen algorithm refused these operands (nothing ran): this GEMM uses cublasGemmEx from
    // now on. Any other failure stops the process.
    KILN_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
               std::string("cublasLtMatmul: ") + cublasGetStatusName(st) + " (" +
                   cublasGetStatusString(st) + ")");
    log_warning_text(std::string("cuBLASLt refused a ") + std::to_string(m) + "x" +
                     std::to_string(n) + "x" + std::to_string(k) + " GEMM (" +
                     cublasGetStatusName(st) + "); using cublasGemmEx for it");
    p.ok = false;
  }
  if (bias) {  // fallback: preload the bias, then accumulate (beta is 0 for biased GEMMs)
    if (ct == CUDA_R_32F) {
      broadcast_rows<<<grid_for(size_t(n) * m, 256), 256, 0, stream()>>>(static_cast<float*>(C), static_cast<const float*>(bias), size_t(n), m);
    } else if (ct == CUDA_R_16BF) {
      broadcast_rows<<<grid_for(size_t(n) * m, 256), 256, 0, stream()>>>(static_cast<bf16*>(C), static_cast<const bf16*>(bias), size_t(n), m);
    } else {
      broadcast_rows<<<grid_for(size_t(n) * m, 256), 256, 0, stream()>>>(static_cast<fp16*>(C), static_cast<const fp16*>(bias), size_t(n), m);
    }
    KILN_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  KILN_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, m, n, k, &alpha, A, at, lda, B, bt, ldb, &beta, C,
                                 ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC) {
  KILN_CUDA_TIMED(kGemm);
  const int BT = B * T_;
  if (BT == 0 || OC == 0) return;
  // Column-major: out^T (OC x BT) = W (OC x C) . inp^T (C x BT) + bias; W row-major is W^T
  // column-major.
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, weight, cuda_type<T>(), C, inp, cuda_type<T>(), C,
       0.0f, out, cuda_type<T>(), OC, bias);
}

template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC) {
  KILN_CUDA_TIMED(kGemm);
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
