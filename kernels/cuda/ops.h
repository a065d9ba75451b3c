// The CUDA backend of Kiln's operator API (first part): same names, arguments and semantics as
// kiln::cpu in kernels/ops.h, on device pointers. Plain C++ header (no CUDA headers needed to
// include it); implemented in kernels/cuda/*.cu, library kiln_kernels_cuda (built when a CUDA
// toolkit is found; KILN_HAVE_CUDA is then defined for its users).
//
// Implemented: casts, residual, GELU, layernorm, matmul (cuBLASLt, fp32 accumulation), causal
// attention (tiled on CUDA cores, or FlashAttention-2-style on tensor cores: see
// set_attention_kernel; online softmax, O(T) memory), embedding, fused cross-entropy, AdamW,
// sum_squares / has_inf_or_nan, scale / accumulate.
//
// Execution: every op is enqueued on the current stream (set_stream; default: the legacy default
// stream) and returns without synchronising. Pointers must be device (or managed) memory.
// Determinism: no floating-point atomics; reductions over rows use per-block partials combined in
// a fixed order, so results are bit-identical run to run on the same GPU and toolkit.
// Errors: a failing CUDA/cuBLAS call stops the process with file and line (KILN_CHECK).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "kernels/ops.h"

typedef struct CUstream_st* cudaStream_t;

namespace kiln::cuda {

// ---- runtime ----
// True if a CUDA device is usable by this process.
bool device_available();
void set_stream(cudaStream_t stream);
cudaStream_t stream();
void synchronize();  // waits for the current stream
// Device memory helpers (for tests and tools; the engine owns its allocations).
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device(void* dst, const void* src, size_t bytes);  // device to device, stream-ordered
// Makes GPU `ordinal` this thread's device (cudaSetDevice); "" or why it cannot (the CUDA
// runtime's error and how many devices this process sees).
std::string select_device(int ordinal);
int current_device();  // this thread's device (cudaGetDevice)
// Why no device is usable ("" when one is): the CUDA runtime's error or "no CUDA device".
std::string unavailable_reason();
struct DeviceInfo {
  std::string name;            // "NVIDIA H200"
  int major = 0, minor = 0;    // compute capability
  int multiprocessors = 0;
  size_t total_bytes = 0;
};
DeviceInfo device_info();
size_t device_bytes_in_use();  // total - free, as the driver reports it (all of this process)
// Stream-ordered helpers on the current stream.
void memset_zero(void* p, size_t bytes);
void fill(float* p, float value, size_t n);
// Page-locked host memory (cudaMallocHost), for asynchronous uploads.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
// Uploads on a separate non-blocking copy stream, one event per slot (0..63): upload_async
// starts the copy and records the slot's event; wait_upload makes the current stream wait for it
// (no host sync); upload_done blocks the host until it completed (before reusing the source).
// A copy starts after the compute work queued before upload_async (it never overwrites data that
// work still reads) and overlaps the compute work queued after it.
void upload_async(void* dst, const void* pinned_src, size_t bytes, int slot);
void wait_upload(int slot);
void upload_done(int slot);

// ---- kernel timing (benchmarks; off by default) ----
// While on, each operator's device work is bracketed by a pair of CUDA events on the current
// stream, labelled with the operator's family; take_kernel_times() waits for the stream and
// returns the device milliseconds per family since the previous take (and starts again). The
// events serialise nothing, but add a few microseconds of host time per operator.
enum class KernelFamily { kGemm, kAttention, kElementwise, kCrossEntropy, kOptimizer, kCount };
constexpr int kKernelFamilies = static_cast<int>(KernelFamily::kCount);
// "gemm" | "attention" | "elementwise" (layernorm, GELU, residual, embedding, casts) |
// "cross_entropy" | "optimizer" (AdamW, the gradient norm)
const char* kernel_family_name(KernelFamily f);
void set_kernel_timing(bool on);
struct KernelTimes {
  double ms[kKernelFamilies] = {};
};
KernelTimes take_kernel_times();

// ---- attention kernel choice ----
// kTiled: attention.cu's tiled kernels on CUDA cores (every dtype and head size up to 256).
// kTensorCore: attention_mma.cu's FlashAttention-2-style kernels on tensor cores (mma.sync
// bf16/fp16, fp32 accumulation), used where eligible (attention_mma_eligible, 16-byte aligned
// rows) and the tiled ones elsewhere. The default is kTiled, or kTensorCore when the environment
// has KILN_CUDA_ATTENTION=mma: the tensor-core kernels have not yet run on a GPU (docs/GPU.md);
// tools/gpu_check tests both.
enum class AttentionKernel { kTiled, kTensorCore };
void set_attention_kernel(AttentionKernel k);
AttentionKernel attention_kernel();
// bf16 / fp16, head size C / NH of 64 or 128, a device of compute capability 8.0 or newer.
bool attention_mma_eligible(DType t, int C, int NH);

// ---- fused kernels (docs/GPU.md "Fused kernels") ----
// On (the default; KILN_CUDA_FUSED=0 in the environment turns them off): the one-pass residual +
// layernorm (residual_layernorm_forward), the cross-entropy with one pass for the row statistics
// (online max and sum) instead of two, AdamW and the gradient norm as one launch over all
// tensors (multi-tensor tables), the norm reduced on the device to one 8-byte read. Off: the
// separate kernels they replace, one launch per tensor. Same results within the tolerances of
// tests/kernels_cuda_gpu.cc (most bit-identical); tools/gpu_check trains with both.
void set_fused_kernels(bool on);
bool fused_kernels();
// cuBLASLt GELU epilogues (matmul_gelu_forward, matmul_dgelu_backward): on by default,
// KILN_CUDA_GEMM_EPILOGUE=0 turns them off (a GEMM, then the separate GELU kernel). They also
// fall back to that where cuBLASLt offers no algorithm or the aux matrix is not aligned
// (launch_plan.h gelu_epilogue_fits).
void set_gemm_epilogues(bool on);
bool gemm_epilogues();

// ---- ops: see kernels/ops.h for the contracts ----
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const Same<T>* wte, const Same<T>* wpe, int B,
                     int T_, int C);
template <typename T>
void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                      int C);

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const Same<T>* inp, const Same<T>* weight,
                       const Same<T>* bias, int B, int T_, int C);
template <typename T>
void layernorm_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                        const Same<T>* inp, const Same<T>* weight, const float* mean,
                        const float* rstd, int B, int T_, int C);

template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC);
template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC);

// The MLP's first linear layer with its GELU: pre = inp W^T + bias (kept for backward), out =
// gelu(pre) - matmul_forward then gelu_forward, as one cuBLASLt GEMM with the GELU_AUX_BIAS
// epilogue when gemm_epilogues() (GELU of the fp32 accumulator, so `out` may differ from
// gelu(rounded pre) by one rounding). bias required for the epilogue.
template <typename T>
void matmul_gelu_forward(T* out, T* pre, const Same<T>* inp, const Same<T>* weight,
                         const Same<T>* bias, int B, int T_, int C, int OC);
// The backward of the layer after that GELU (inp = gelu(pre), C inputs, OC outputs): dpre =
// (dout W) * gelu'(pre), overwritten (not accumulated); dweight, dbias accumulate as in
// matmul_backward. One GEMM with the DGELU epilogue when gemm_epilogues(); else the GEMM, then
// gelu'(pre) applied in place (the arithmetic of matmul_backward into a zeroed buffer followed by
// gelu_backward into another).
template <typename T>
void matmul_dgelu_backward(Same<T>* dpre, float* dweight, float* dbias, const T* dout,
                           const Same<T>* inp, const Same<T>* weight, const Same<T>* pre, int B,
                           int T_, int C, int OC);

template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH);
template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH);

// res = inp1 + inp2 (rounded to T), then out = layernorm(res): residual_forward followed by
// layernorm_forward (same arithmetic, same bits for res), fused into one pass over the rows when
// fused_kernels() is on.
template <typename T>
void residual_layernorm_forward(T* res, T* out, float* mean, float* rstd, const Same<T>* inp1,
                                const Same<T>* inp2, const Same<T>* weight, const Same<T>* bias,
                                int B, int T_, int C);

template <typename T>
void gelu_forward(T* out, const Same<T>* inp, size_t N);
template <typename T>
void gelu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t N);

template <typename T>
void residual_forward(T* out, const Same<T>* inp1, const Same<T>* inp2, size_t N);
template <typename T>
void residual_backward(Same<T>* dinp1, Same<T>* dinp2, const T* dout, size_t N);

template <typename T>
void crossentropy_forward_backward(Same<T>* dlogits, float* losses, const T* logits,
                                   const int32_t* targets, float dloss, int BT, int V, int Vp);
// Vocabulary-parallel cross-entropy (kernels/ops.h has the contract); device pointers.
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

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp);
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, bf16* params_lp);
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, fp16* params_lp);

// AdamW over `count` tensors (kernels/ops.h AdamWTensor; hp.weight_decay is ignored, each
// tensor has its own), the low-precision copies of type lp_type (kF32: none): one launch over a
// multi-tensor chunk table (launch_plan.h) when fused_kernels() is on, else adamw_update per
// tensor. Bit-identical either way.
void adamw_update_multi(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                        DType lp_type);

void cast(bf16* dst, const float* src, size_t n);
void cast(fp16* dst, const float* src, size_t n);
void cast(float* dst, const bf16* src, size_t n);
void cast(float* dst, const fp16* src, size_t n);
void cast(float* dst, const float* src, size_t n);

// Host-side results (the call synchronises the stream to return them).
double sum_squares(const float* const* tensors, const size_t* sizes, int count);
double sum_squares(const float* x, size_t n);
bool has_inf_or_nan(const float* const* tensors, const size_t* sizes, int count);
bool has_inf_or_nan(const float* x, size_t n);

void scale(float* x, float s, size_t n);
void accumulate(float* y, const float* x, size_t n);

}  // namespace kiln::cuda

namespace kiln {
// The CUDA backend as a type (see kiln::CpuBackend in kernels/ops.h).
struct CudaBackend {
  static constexpr Device kDevice = Device::kCuda;
  KILN_BACKEND_FORWARD(cuda, encoder_forward)
  KILN_BACKEND_FORWARD(cuda, encoder_backward)
  KILN_BACKEND_FORWARD(cuda, layernorm_forward)
  KILN_BACKEND_FORWARD(cuda, layernorm_backward)
  KILN_BACKEND_FORWARD(cuda, matmul_forward)
  KILN_BACKEND_FORWARD(cuda, matmul_backward)
  KILN_BACKEND_FORWARD(cuda, matmul_gelu_forward)
  KILN_BACKEND_FORWARD(cuda, matmul_dgelu_backward)
  KILN_BACKEND_FORWARD(cuda, attention_forward)
  KILN_BACKEND_FORWARD(cuda, attention_backward)
  KILN_BACKEND_FORWARD(cuda, gelu_forward)
  KILN_BACKEND_FORWARD(cuda, gelu_backward)
  KILN_BACKEND_FORWARD(cuda, residual_forward)
  KILN_BACKEND_FORWARD(cuda, residual_backward)
  KILN_BACKEND_FORWARD(cuda, residual_layernorm_forward)
  KILN_BACKEND_FORWARD(cuda, crossentropy_forward_backward)
  KILN_BACKEND_FORWARD(cuda, crossentropy_shard_max)
  KILN_BACKEND_FORWARD(cuda, crossentropy_shard_sum)
  KILN_BACKEND_FORWARD(cuda, crossentropy_shard_backward)
  KILN_BACKEND_FORWARD(cuda, crossentropy_shard_loss)
  KILN_BACKEND_FORWARD(cuda, adamw_update)
  KILN_BACKEND_FORWARD(cuda, cast)
  KILN_BACKEND_FORWARD(cuda, sum_squares)
  KILN_BACKEND_FORWARD(cuda, has_inf_or_nan)
  KILN_BACKEND_FORWARD(cuda, scale)
  KILN_BACKEND_FORWARD(cuda, accumulate)
};
}  // namespace kiln
