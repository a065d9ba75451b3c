// Kiln's operator API: the kernels a GPT training step is made of, forward and backward.
//
// One set of names and argument orders, llm.c style, implemented per backend:
//   kiln::cpu::*   host memory, parallel on oneTBB threads, OpenBLAS for GEMM (kernels/cpu/)
//   kiln::cuda::*  device memory, same names and arguments (kernels/cuda/, when built; its
//                  runtime - streams, device memory, switches - is kernels/cuda/runtime.h)
//   kiln::ref::*   slow, obvious reference implementations used by tests (kernels/reference.h)
// Every operator is declared once, in the operator list kernels/operators.inc, which this header
// expands into both namespaces and into the two backend types kiln::CpuBackend and
// kiln::CudaBackend (below). The engine selects a backend type once (a template argument) and
// never branches on the device inside a layer; what a backend does better than the plain
// sequence of operators is a named trait of its type (kFusedGemmGelu, ...), never probed.
//
// Conventions (all ops):
//  * Pointers are raw, caller-owned, and must not alias unless an op says so. Shapes are row-major
//    and contiguous: B batch, T time (sequence), C channels, OC output channels, NH heads,
//    V vocabulary. "N" is an element count.
//  * T (the template parameter) is the activation/parameter storage type: float, bf16 or fp16
//    (kernels/dtype.h). Low-precision inputs are widened to fp32, all arithmetic and every
//    reduction is done in fp32 (statistics that need it in fp64), and results are rounded
//    (nearest-even) on store. Parameter gradients (dweight, dbias, dwte, dwpe) are always fp32.
//  * Backward ops ACCUMULATE (+=) into every gradient they write, parameter and activation
//    gradients alike (as llm.c): zero gradient buffers before the first micro-batch / backward.
//    A gradient pointer documented as "nullable" may be nullptr to skip that gradient.
//  * Determinism: every op returns bit-identical results for any thread count and any call
//    (work is split into fixed chunks that do not depend on the number of threads; reductions
//    combine partial results in a fixed order; no atomics).
//  * Thread safety: ops may be called concurrently on disjoint outputs. They use the process-wide
//    thread setting (set_num_threads) and small grow-only per-thread scratch buffers that are
//    allocated on first use and reused (no allocation in steady state).
//  * Shapes are trusted (KILN_CHECK on the cheap invariants, e.g. C % NH == 0). Token ids must
//    be in [0, V): the embedding ops stop the process on a negative id (they are not given V),
//    cross-entropy on a target >= V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/dtype.h"

namespace kiln {

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

// Hyper-parameters of one AdamW step (Loshchilov & Hutter: decoupled weight decay).
//   g = grad * grad_scale                      (grad_scale folds 1/loss_scale and clipping)
//   m = beta1 m + (1-beta1) g ;  v = beta2 v + (1-beta2) g^2
//   p = p (1 - lr weight_decay) - lr / (1-beta1^step) * m / (sqrt(v) / sqrt(1-beta2^step) + eps)
// evaluated in the same order as torch.optim.AdamW (bias corrections in fp64).
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // applied as lr * weight_decay * p (0 for biases and norm gains)
  float grad_scale = 1.0f;
  int64_t step = 1;           // 1-based step count, for bias correction
};

// One tensor of a multi-tensor AdamW update (adamw_update_multi): its fp32 master, moments and
// gradient, its low-precision copy (nullable) and its own weight decay; the other hyper-parameters
// are shared (AdamWParams).
struct AdamWTensor {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grads = nullptr;
  void* params_lp = nullptr;  // bf16/fp16 bits, or nullptr
  size_t n = 0;
  float weight_decay = 0.0f;
};

// Identity alias: keeps a parameter out of template argument deduction so nullptr may be passed.
template <typename T>
using Same = std::type_identity_t<T>;

namespace cpu {

// ---- the CPU runtime (not operators) -----------------------------------------------------------
// Number of host threads the ops use (oneTBB arena; OpenBLAS itself runs single-threaded inside
// each task so there is one thread pool). n <= 0 means all hardware threads. Results do not depend
// on it. Not to be called while ops run on other threads.
void set_num_threads(int n);
int num_threads();
// True if matmul runs bf16 on oneDNN's native bf16 GEMM (AMX / AVX512-BF16) in this process, false
// if on Kiln's own AVX2/FMA GEMM in fp32 arithmetic (kernels/cpu_isa.h: chosen once at start-up,
// named by describe_cpu_runtime).
bool have_native_bf16_gemm();

}  // namespace cpu

// ---- the operators, declared once per backend namespace -----------------------------------------
#define KILN_OP(ret, name, params) ret name params;
#define KILN_OP_T(ret, name, params) \
  template <typename T>              \
  ret name params;
#define KILN_OP_OVERLOAD(ret, name, params) ret name params;
namespace cpu {
#include "kernels/operators.inc"
}  // namespace cpu
namespace cuda {
#include "kernels/operators.inc"
}  // namespace cuda
#undef KILN_OP
#undef KILN_OP_T
#undef KILN_OP_OVERLOAD

// ---- the backend types --------------------------------------------------------------------------
// For engine code templated on the device:
//   template <class K> void block_forward(...) { K::layernorm_forward(...); K::matmul_forward(...);
//   } block_forward<kiln::CpuBackend>(...);
// Each has every operator of the list (forwarding to its namespace) and its traits:
//   kDevice                   where its pointers live
//   kFusedGemmGelu            matmul_gelu_forward / matmul_dgelu_backward are one GEMM each (GELU
//                             epilogues): a caller uses them instead of the separate operators,
//                             and needs no buffer for the GELU's gradient
//   kFusedResidualLayernorm   residual_layernorm_forward is one pass over the rows
//   kMultiTensorAdamW         adamw_update_multi is one launch over all tensors
// A trait that is false means the operator exists but is the plain sequence of the others (same
// results), so a caller may use either; the engine picks by the trait.
#define KILN_OP_FORWARD(ns, name)                 \
  template <typename... Args>                     \
  static decltype(auto) name(Args&&... args) {    \
    return ns::name(std::forward<Args>(args)...); \
  }
#define KILN_OP(ret, name, params) KILN_OP_FORWARD(KILN_OP_NAMESPACE, name)
#define KILN_OP_T(ret, name, params) KILN_OP_FORWARD(KILN_OP_NAMESPACE, name)
#define KILN_OP_OVERLOAD(ret, name, params)

struct CpuBackend {
  static constexpr Device kDevice = Device::kCpu;
  static constexpr bool kFusedGemmGelu = false;
  static constexpr bool kFusedResidualLayernorm = false;
  static constexpr bool kMultiTensorAdamW = false;
#define KILN_OP_NAMESPACE cpu
#include "kernels/operators.inc"
#undef KILN_OP_NAMESPACE
};

struct CudaBackend {
  static constexpr Device kDevice = Device::kCuda;
  static constexpr bool kFusedGemmGelu = true;  // cuBLASLt epilogues
  static constexpr bool kFusedResidualLayernorm = true;
  static constexpr bool kMultiTensorAdamW = true;
#define KILN_OP_NAMESPACE cuda
#include "kernels/operators.inc"
#undef KILN_OP_NAMESPACE
};

#undef KILN_OP
#undef KILN_OP_T
#undef KILN_OP_OVERLOAD
#undef KILN_OP_FORWARD

namespace detail {
// adamw_update_multi as adamw_update per tensor, on backend K (the CPU's form, and CUDA's when
// its fused kernels are off).
template <class K>
void adamw_update_each(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                       DType lp_type) {
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    AdamWParams h = hp;
    h.weight_decay = t.weight_decay;
    switch (t.params_lp ? lp_type : DType::kF32) {
      case DType::kBF16:
        K::adamw_update(t.params, t.m, t.v, t.grads, t.n, h, static_cast<bf16*>(t.params_lp));
        break;
      case DType::kF16:
        K::adamw_update(t.params, t.m, t.v, t.grads, t.n, h, static_cast<fp16*>(t.params_lp));
        break;
      default:
        K::adamw_update(t.params, t.m, t.v, t.grads, t.n, h);
        break;
    }
  }
}
}  // namespace detail

}  // namespace kiln
