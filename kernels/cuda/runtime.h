// The CUDA backend's runtime: device selection and memory, streams, uploads, kernel timing and
// the switches of its kernels. The operators themselves (kiln::cuda::*, the same names, arguments
// and semantics as kiln::cpu) are declared once for both backends by kernels/ops.h from the
// operator list kernels/operators.inc; kiln::CudaBackend is their dispatch type. Plain C++
// header (no CUDA headers needed to include it); implemented in kernels/cuda/*.cu, library
// kiln_kernels_cuda (built when a CUDA toolkit is found; KILN_HAVE_CUDA is then defined for its
// users). Matmul is cuBLASLt with fp32 accumulation; attention is tiled on CUDA cores or
// FlashAttention-2-style on tensor cores (set_attention_kernel), online softmax, O(T) memory.
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
// Out of memory stops the process naming `what` (may be ""), the size and the free memory.
void* device_alloc(size_t bytes, const char* what = "");
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
  std::string name;          // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
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

}  // namespace kiln::cuda
