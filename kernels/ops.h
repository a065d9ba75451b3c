// Kiln's operator API: the kernels a GPT training step is made of, forward and backward.
//
// One set of names and argument orders, llm.c style, implemented per backend:
//   kiln::cpu::*   host memory, parallel on oneTBB threads, OpenBLAS for GEMM (kernels/cpu/)
//   kiln::cuda::*  device memory, same names and arguments (kernels/cuda/, when built)
//   kiln::ref::*   slow, obvious reference implementations used by tests (kernels/reference.h)
// The engine selects a backend once (e.g. `kiln::CpuBackend` below as a template argument) and
// never branches on the device inside a layer.
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

// One tensor of a multi-tensor AdamW update (Backend::adamw_update_tensors, CUDA
// adamw_update_multi): its fp32 master, moments and gradient, its low-precision copy (nullable)
// and its own weight decay; the other hyper-parameters are shared (AdamWParams).
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

// ---- runtime -----------------------------------------------------------------------------------
// Number of host threads the ops use (oneTBB arena; OpenBLAS itself runs single-threaded inside
// each task so there is one thread pool). n <= 0 means all hardware threads. Results do not depend
// on it. Not to be called while ops run on other threads.
void set_num_threads(int n);
int num_threads();
// True if matmul runs bf16 on oneDNN's native bf16 GEMM (AMX / AVX512-BF16) in this process, false
// if on Kiln's own AVX2/FMA GEMM in fp32 arithmetic (kernels/cpu_isa.h: chosen once at start-up,
// named by describe_cpu_runtime).
bool have_native_bf16_gemm();

// ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] ---------------------------------------
// out (B,T,C), tokens (B,T) in [0,V), wte (V,C), wpe (maxT>=T, C).
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const Same<T>* wte, const Same<T>* wpe, int B,
                     int T_, int C);
// dwte (V,C) += scatter of dout rows by token, dwpe (maxT,C) += sum over b. Deterministic
// (each output element's sum runs over (b,t) in order). dwte/dwpe nullable.
template <typename T>
void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                      int C);

// ---- layernorm over the last dimension, eps = 1e-5 ------------------------------------------------
// out (B,T,C); mean, rstd (B,T) nullable (written when given: needed by backward);
// weight, bias (C); bias nullable.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const Same<T>* inp, const Same<T>* weight,
                       const Same<T>* bias, int B, int T_, int C);
// dinp (B,T,C) +=, dweight, dbias (C) += (dinp, dbias nullable). mean/rstd from forward.
template <typename T>
void layernorm_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                        const Same<T>* inp, const Same<T>* weight, const float* mean,
                        const float* rstd, int B, int T_, int C);

// ---- matmul: out (B,T,OC) = inp (B,T,C) @ weight(OC,C)^T + bias(OC) --------------------------------
// fp32: cblas_sgemm in fixed row chunks, no copies. bf16/fp16: fp32 accumulation (oneDNN's bf16
// matmul where the start-up probe allows it, else Kiln's AVX2/FMA GEMM, which widens the operands
// while packing them and rounds on its output tiles). bias nullable.
template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC);
// dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias (OC) += sum_bt dout.
// dinp, dweight, dbias nullable.
template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC);

// ---- causal multi-head self-attention (FlashAttention-style) --------------------------------------
// qkv (B,T,3C): [q | k | v] along the last dim, head h in columns h*hs..(h+1)*hs of each part,
// hs = C/NH. out (B,T,C) = softmax(q k^T / sqrt(hs) + causal mask) v, heads concatenated.
// Computed in blocks with an online softmax: memory O(T), no (T,T) matrix is stored.
// lse (B,NH,T) receives the natural-log logsumexp of each score row (scaled scores), which is
// all backward needs besides the inputs and output.
template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH);
// dqkv (B,T,3C) += gradients w.r.t. q, k and v; recomputes the probabilities block by block
// from qkv and lse.
template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH);

// ---- GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ---------
template <typename T>
void gelu_forward(T* out, const Same<T>* inp, size_t N);
// dinp += gelu'(inp) * dout.
template <typename T>
void gelu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t N);

// ---- residual: out = inp1 + inp2 ------------------------------------------------------------------
template <typename T>
void residual_forward(T* out, const Same<T>* inp1, const Same<T>* inp2, size_t N);
// dinp1 += dout; dinp2 += dout. dinp1 and dinp2 must differ; neither may alias dout.
template <typename T>
void residual_backward(Same<T>* dinp1, Same<T>* dinp2, const T* dout, size_t N);

// ---- fused softmax + cross-entropy over the vocabulary ---------------------------------------------
// logits (BT, Vp) rows of stride Vp >= V; columns V..Vp-1 are padding and ignored.
// losses[i] = logsumexp(logits[i,:V]) - logits[i,targets[i]]  (fp32, natural log), or 0 when
// targets[i] < 0 (ignored / masked position).
// If dlogits is non-null it receives (OVERWRITES, the one exception to "+=") the gradient of
// sum_i dloss * losses[i]:  dlogits[i,:] = dloss * (softmax(logits[i,:]) - onehot(targets[i])),
// zero for ignored rows and padding columns. dlogits may alias logits (computed in place, row by
// row, no probability tensor kept). Targets >= V stop the process.
template <typename T>
void crossentropy_forward_backward(Same<T>* dlogits, float* losses, const T* logits,
                                   const int32_t* targets, float dloss, int BT, int V, int Vp);

// ---- vocabulary-parallel cross-entropy (Megatron; engine/tensor_parallel.h) ----------------------
// A rank holds the logits (BT, V) of vocabulary columns [v0, v0 + V); the caller combines the
// per-row statistics over the ranks between the passes, so the full logits never meet. The same
// arithmetic as crossentropy_forward_backward (fp32 exp and sums).
// 1. row_max[i] = max_j logits[i,j]                       (the caller takes the max over ranks)
// 2. sum_exp[i] = sum_j exp(logits[i,j] - row_max[i]); target_logit[i] = logits[i, targets[i] - v0]
//    when the target is one of this rank's columns, else 0  (the caller sums both over ranks);
//    loss_i = log(sum_exp[i]) + row_max[i] - target_logit[i]
// 3. dlogits (OVERWRITTEN; may alias logits) = dloss * (exp(logits - row_max) / sum_exp -
//    onehot(targets - v0)), zero rows where targets[i] < 0.
// crossentropy_shard_loss writes the rows' losses from the combined statistics (0 where
// targets[i] < 0).
template <typename T>
void crossentropy_shard_max(float* row_max, const T* logits, int BT, int V);
template <typename T>
void crossentropy_shard_sum(float* sum_exp, float* target_logit, const T* logits,
                            const float* row_max, const int32_t* targets, int BT, int V, int v0);
template <typename T>
void crossentropy_shard_backward(Same<T>* dlogits, const T* logits, const float* row_max,
                                 const float* sum_exp, const int32_t* targets, float dloss, int BT,
                                 int V, int v0);
void crossentropy_shard_loss(float* losses, const float* row_max, const float* sum_exp,
                             const float* target_logit, const int32_t* targets, int BT);

// ---- AdamW on fp32 master weights -----------------------------------------------------------------
// params, m, v, grads: n fp32 values. Updates params, m, v in place. params_lp (nullable) receives
// the updated parameters rounded to bf16/fp16 (the low-precision copy used by forward/backward).
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp);
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, bf16* params_lp);
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, fp16* params_lp);

// ---- casts (round to nearest even; NaN/inf/subnormals per kernels/dtype.h) ------------------------
void cast(bf16* dst, const float* src, size_t n);
void cast(fp16* dst, const float* src, size_t n);
void cast(float* dst, const bf16* src, size_t n);
void cast(float* dst, const fp16* src, size_t n);
void cast(float* dst, const float* src, size_t n);  // copy, for generic code

// ---- global gradient norm and overflow check ------------------------------------------------------
// Sum of squares over `count` tensors (tensors[i] has sizes[i] elements), accumulated in fp64 in a
// fixed order: bit-identical for any thread count. sqrt() of it is the global L2 norm. Returns
// inf/NaN if any element is inf/NaN.
double sum_squares(const float* const* tensors, const size_t* sizes, int count);
double sum_squares(const float* x, size_t n);
// True if any element is inf or NaN (the fp16 loss scaler's overflow check).
bool has_inf_or_nan(const float* const* tensors, const size_t* sizes, int count);
bool has_inf_or_nan(const float* x, size_t n);
template <typename T>
bool has_inf_or_nan_lp(const T* x, size_t n);  // T = bf16 or fp16

// ---- small helpers the engine's step needs ---------------------------------------------------------
// x *= s (n fp32 values).
void scale(float* x, float s, size_t n);
// y += x (n fp32 values), e.g. summing gradient shards.
void accumulate(float* y, const float* x, size_t n);

}  // namespace cpu

// A backend as a type, for engine code templated on the device:
//   template <class K> void block_forward(...) { K::layernorm_forward(...); K::matmul_forward(...); }
//   block_forward<kiln::CpuBackend>(...);
// The CUDA backend (kernels/cuda/ops.h) provides `kiln::CudaBackend` with the same members.
#define KILN_BACKEND_FORWARD(ns, name)                   \
  template <typename... Args>                            \
  static decltype(auto) name(Args&&... args) {           \
    return ns::name(std::forward<Args>(args)...);        \
  }
struct CpuBackend {
  static constexpr Device kDevice = Device::kCpu;
  KILN_BACKEND_FORWARD(cpu, set_num_threads)
  KILN_BACKEND_FORWARD(cpu, num_threads)
  KILN_BACKEND_FORWARD(cpu, encoder_forward)
  KILN_BACKEND_FORWARD(cpu, encoder_backward)
  KILN_BACKEND_FORWARD(cpu, layernorm_forward)
  KILN_BACKEND_FORWARD(cpu, layernorm_backward)
  KILN_BACKEND_FORWARD(cpu, matmul_forward)
  KILN_BACKEND_FORWARD(cpu, matmul_backward)
  KILN_BACKEND_FORWARD(cpu, attention_forward)
  KILN_BACKEND_FORWARD(cpu, attention_backward)
  KILN_BACKEND_FORWARD(cpu, gelu_forward)
  KILN_BACKEND_FORWARD(cpu, gelu_backward)
  KILN_BACKEND_FORWARD(cpu, residual_forward)
  KILN_BACKEND_FORWARD(cpu, residual_backward)
  KILN_BACKEND_FORWARD(cpu, crossentropy_forward_backward)
  KILN_BACKEND_FORWARD(cpu, crossentropy_shard_max)
  KILN_BACKEND_FORWARD(cpu, crossentropy_shard_sum)
  KILN_BACKEND_FORWARD(cpu, crossentropy_shard_backward)
  KILN_BACKEND_FORWARD(cpu, crossentropy_shard_loss)
  KILN_BACKEND_FORWARD(cpu, adamw_update)
  KILN_BACKEND_FORWARD(cpu, cast)
  KILN_BACKEND_FORWARD(cpu, sum_squares)
  KILN_BACKEND_FORWARD(cpu, has_inf_or_nan)
  KILN_BACKEND_FORWARD(cpu, scale)
  KILN_BACKEND_FORWARD(cpu, accumulate)
};

}  // namespace kiln
