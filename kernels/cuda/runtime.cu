// CUDA runtime state: the current stream, the cuBLAS handle, grow-only workspaces.
#include <mutex>

#include "kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {
cudaStream_t g_stream = nullptr;
}  // namespace

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

void set_stream(cudaStream_t s) { g_stream = s; }
cudaStream_t stream() { return g_stream; }
void synchronize() { KILN_CUDA_CHECK(cudaStreamSynchronize(g_stream)); }

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  return p;
}
void device_free(void* p) { KILN_CUDA_CHECK(cudaFree(p)); }
void copy_to_device(void* dst, const void* src, size_t bytes) {
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
  synchronize();
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream));
  synchronize();
}

namespace detail {

cublasHandle_t cublas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    KILN_CUBLAS_CHECK(cublasCreate(&h));
    // Deterministic: no atomics in cuBLAS reductions.
    KILN_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
    return h;
  }();
  KILN_CUBLAS_CHECK(cublasSetStream(handle, g_stream));
  return handle;
}

void* workspace(size_t bytes, int slot) {
  struct Buf {
    void* p = nullptr;
    size_t size = 0;
  };
  static Buf bufs[4];
  KILN_CHECK(slot >= 0 && slot < 4, "cuda workspace slot out of range");
  Buf& b = bufs[slot];
  if (b.size < bytes) {
    if (b.p) KILN_CUDA_CHECK(cudaFree(b.p));
    size_t cap = bytes < 4096 ? 4096 : bytes;
    KILN_CUDA_CHECK(cudaMalloc(&b.p, cap));
    b.size = cap;
  }
  return b.p;
}

}  // namespace detail
}  // namespace kiln::cuda
