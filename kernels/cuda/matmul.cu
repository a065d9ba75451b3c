// matmul on the GPU: cuBLASLt (fp32 accumulation, no TF32; bf16/fp16 inputs on tensor cores),
// the bias added in the GEMM's epilogue. Each distinct GEMM (GemmKey: shape, types, layouts,
// alignment, epilogue) gets its descriptors and algorithm (the heuristic's first choice) once,
// cached, so a given GEMM always runs the same algorithm: results repeat bit for bit. The
// heuristic is told each pointer's real alignment (cuBLASLt assumes 256 bytes unless told; Kiln's
// tensors are 32-byte aligned, and a GPT-2 XL weight sits on a 128-byte boundary). Where cuBLASLt
// offers no algorithm (e.g. unaligned leading dimensions), or refuses one at run time, the GEMM
// falls back to cublasGemmEx, bias preloaded.
// The MLP's first GEMM can carry its GELU (CUBLASLT_EPILOGUE_GELU_AUX_BIAS, the pre-activation
// kept as the aux output for backward) and the backward GEMM into it the GELU's derivative
// (CUBLASLT_EPILOGUE_DGELU, reading that aux): matmul_gelu_forward / matmul_dgelu_backward, on
// when gemm_epilogues() is (ops.h), else a GEMM and the separate GELU kernel.
#include <cublasLt.h>

#include <cstdint>
#include <map>

#include "common/log_text.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_plan.h"

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

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<GemmKey, LtPlan> plans;  // launch_plan.h: every field that selects the algorithm
  LtState() {
    KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
    KILN_CUDA_CHECK(cudaMalloc(&workspace, kLtWorkspace));
  }
};
LtState& lt() {
  static LtState s;
  return s;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kNone: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Column-major D(m,n) = op(A) op(B) (+ beta C) with the key's epilogue, C and D the same buffer.
// The plan (descriptors + the heuristic's first algorithm) is made once per key; bias and aux are
// the first call's pointers (the heuristic looks at their alignment, which every later call with
// this key shares: both are 16-byte aligned or the key has no such epilogue).
LtPlan& plan(const GemmKey& key, const void* bias, const void* aux) {
  LtState& s = lt();
  auto it = s.plans.find(key);
  if (it != s.plans.end()) return it->second;
  const auto ta = static_cast<cublasOperation_t>(key.transa), tb = static_cast<cublasOperation_t>(key.transb);
  const auto at = static_cast<cudaDataType_t>(key.atype), bt = static_cast<cudaDataType_t>(key.btype),
             ct = static_cast<cudaDataType_t>(key.ctype);
  const int m = key.m, n = key.n, k = key.k;
  LtPlan p;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (key.epilogue != GemmEpilogue::kNone) {
    const cublasLtEpilogue_t epi = lt_epilogue(key.epilogue);
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  }
  if (bias) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof ct));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (aux) {
    const int64_t ld = key.aux_ld;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, at, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, key.lda));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, key.ldb));
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

GemmKey gemm_key(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
                 cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                 const void* C, cudaDataType_t ct, int ldc, float beta, GemmEpilogue epilogue,
                 int aux_ld) {
  GemmKey key;
  key.align_a = pointer_alignment(A);
  key.align_b = pointer_alignment(B);
  key.align_c = pointer_alignment(C);
  key.transa = int(ta);
  key.transb = int(tb);
  key.m = m;
  key.n = n;
  key.k = k;
  key.atype = int(at);
  key.lda = lda;
  key.btype = int(bt);
  key.ldb = ldb;
  key.ctype = int(ct);
  key.ldc = ldc;
  key.accumulate = beta != 0.0f;
  key.epilogue = epilogue;
  key.aux_ld = aux_ld;
  return key;
}

// cublasLtMatmul with the plan's algorithm; false when that algorithm refused these operands at
// run time (nothing ran: the plan is marked unusable and the caller falls back). Any other
// failure stops the process.
bool run_plan(LtPlan& p, const GemmKey& key, const void* A, const void* B, float beta, void* D) {
  const float alpha = 1.0f;
  const cublasStatus_t st = cublasLtMatmul(lt().handle, p.op, &alpha, A, p.a, B, p.b, &beta, D, p.c,
                                           D, p.c, &p.algo, lt().workspace, kLtWorkspace, stream());
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  KILN_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
             std::string("cublasLtMatmul: ") + cublasGetStatusName(st) + " (" +
                 cublasGetStatusString(st) + ")");
  log_warning_text(std::string("cuBLASLt refused a GEMM (") + cublasGetStatusName(st) + ", " +
                   key.describe() + "); running it without cuBLASLt");
  p.ok = false;
  return false;
}

// One cuBLASLt call with an epilogue that needs an aux matrix (the GELU ones); false (nothing
// enqueued) where cuBLASLt has no algorithm for it, so the caller runs the unfused kernels.
bool gemm_aux(GemmEpilogue epilogue, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
              void* D, cudaDataType_t ct, int ldc, const void* bias, const void* aux, int aux_ld) {
  if (!gelu_epilogue_fits(aux_ld, aux) || (bias && reinterpret_cast<uintptr_t>(bias) % 16 != 0)) return false;
  const float beta = 0.0f;
  const GemmKey key =
      gemm_key(ta, tb, m, n, k, A, at, lda, B, bt, ldb, D, ct, ldc, beta, epilogue, aux_ld);
  LtPlan& p = plan(key, bias, aux);
  if (!p.ok) return false;
  if (bias) KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
  return run_plan(p, key, A, B, beta, D);
}

void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
          cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb, float beta,
          void* C, cudaDataType_t ct, int ldc, const void* bias = nullptr) {
  const float alpha = 1.0f;
  const GemmKey key = gemm_key(ta, tb, m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc, beta,
                               bias ? GemmEpilogue::kBias : GemmEpilogue::kNone, 0);
  LtPlan& p = plan(key, bias, nullptr);
  if (p.ok) {
    if (bias) {
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias));
    }
    if (run_plan(p, key, A, B, beta, C)) return;
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

template <typename T>
void matmul_gelu_forward(T* out, T* pre, const Same<T>* inp, const Same<T>* weight,
                         const Same<T>* bias, int B, int T_, int C, int OC) {
  KILN_CUDA_TIMED(kGemm);
  const int BT = B * T_;
  if (BT == 0 || OC == 0) return;
  // out^T = gelu(W . inp^T + bias), pre^T = W . inp^T + bias (column-major OC x BT, ld OC).
  if (gemm_epilogues() && bias &&
      gemm_aux(GemmEpilogue::kGeluAuxBias, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, weight, cuda_type<T>(), C,
               inp, cuda_type<T>(), C, out, cuda_type<T>(), OC, bias, pre, OC)) {
    return;
  }
  matmul_forward(pre, inp, weight, bias, B, T_, C, OC);
  gelu_forward(out, pre, size_t(BT) * OC);
}

template <typename T>
void matmul_dgelu_backward(Same<T>* dpre, float* dweight, float* dbias, const T* dout,
                           const Same<T>* inp, const Same<T>* weight, const Same<T>* pre, int B,
                           int T_, int C, int OC) {
  KILN_CUDA_TIMED(kGemm);
  const int BT = B * T_;
  if (BT == 0 || OC == 0) return;
  // dpre^T (C x BT) = (W^T . dout^T) * gelu'(pre^T): the DGELU epilogue reads pre as its aux.
  const bool fused =
      gemm_epilogues() &&
      gemm_aux(GemmEpilogue::kDGelu, CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, weight, cuda_type<T>(), C,
               dout, cuda_type<T>(), OC, dpre, cuda_type<T>(), C, nullptr, pre, C);
  if (!fused) {
    // The unfused arithmetic: d(gelu out) rounded to T, then times gelu'(pre), rounded again.
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, weight, cuda_type<T>(), C, dout, cuda_type<T>(), OC,
         0.0f, dpre, cuda_type<T>(), C);
    gelu_backward_inplace(dpre, pre, size_t(BT) * C);
  }
  matmul_backward(static_cast<T*>(nullptr), dweight, dbias, dout, inp, weight, B, T_, C, OC);
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void matmul_gelu_forward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int); \
  template void matmul_dgelu_backward<T>(T*, float*, float*, const T*, const T*, const T*,       \
                                         const T*, int, int, int, int);                          \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, int);        \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int,  \
                                   int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
