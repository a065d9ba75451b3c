// CUDA runtime state: the current stream, the cuBLAS handle, grow-only workspaces.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_plan.h"

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

void* device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e == cudaErrorMemoryAllocation) {  // the memory preflight's estimate was short of this
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_b, &total_b);
    KILN_CHECK(false, "out of GPU memory allocating " + std::to_string(bytes) + " bytes" +
                          (what && *what ? std::string(" for ") + what : std::string()) + ": " +
                          std::to_string(free_b) + " of " + std::to_string(total_b) +
                          " bytes free (kiln train's memory preflight, docs/TRAINING.md, "
                          "estimated less; try parallel.zero_stage=3 or activation_checkpointing)");
  }
  KILN_CUDA_CHECK(e);
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

void copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
}

std::string select_device(int ordinal) {
  const cudaError_t err = cudaSetDevice(ordinal);
  if (err == cudaSuccess) return std::string();
  (void)cudaGetLastError();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  return "CUDA set device " + std::to_string(ordinal) + ": " + cudaGetErrorString(err) +
         " (this process sees " + std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + ")";
}

int current_device() {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("the CUDA runtime found no usable GPU (") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err) + ")";
  }
  return n > 0 ? std::string() : std::string("the CUDA runtime reports no CUDA device");
}

DeviceInfo device_info() {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_bytes = prop.totalGlobalMem;
  return info;
}

size_t device_bytes_in_use() {
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

void memset_zero(void* p, size_t bytes) {
  KILN_CUDA_TIMED(kElementwise);
  if (bytes) KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream));
}

namespace {
__global__ void fill_kernel(float* p, float v, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

constexpr int kSlots = 64;
struct CopyEngine {
  cudaStream_t stream = nullptr;
  cudaEvent_t events[kSlots] = {};
  cudaEvent_t compute_mark = nullptr;  // the compute work queued before an upload
  CopyEngine() {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark, cudaEventDisableTiming));
    for (auto& e : events) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
};
CopyEngine& copy_engine() {
  static CopyEngine engine;
  return engine;
}
cudaEvent_t slot_event(int slot) {
  KILN_CHECK(slot >= 0 && slot < kSlots, "upload slot out of range");
  return copy_engine().events[slot];
}
}  // namespace

void fill(float* p, float value, size_t n) {
  KILN_CUDA_TIMED(kElementwise);
  if (n == 0) return;
  fill_kernel<<<detail::grid_for(n, 256, 4096), 256, 0, g_stream>>>(p, value, n);
  KILN_CUDA_LAUNCHED();
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return p;
}
void pinned_free(void* p) { KILN_CUDA_CHECK(cudaFreeHost(p)); }

void upload_async(void* dst, const void* src, size_t bytes, int slot) {
  CopyEngine& ce = copy_engine();
  cudaEvent_t ev = slot_event(slot);
  // Never overwrite data the compute work queued so far may still read.
  KILN_CUDA_CHECK(cudaEventRecord(ce.compute_mark, g_stream));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(ce.stream, ce.compute_mark, 0));
  if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ce.stream));
  KILN_CUDA_CHECK(cudaEventRecord(ev, ce.stream));
}
void wait_upload(int slot) { KILN_CUDA_CHECK(cudaStreamWaitEvent(g_stream, slot_event(slot), 0)); }
void upload_done(int slot) { KILN_CUDA_CHECK(cudaEventSynchronize(slot_event(slot))); }

// ---- fused-kernel switches ----
namespace {
// The switch's value from `env` (unset: `fallback`); a value that is neither on nor off stops the
// process naming the variable (it is read once, on the first operator that asks).
bool switch_from_env(const char* env, bool fallback) {
  const char* text = std::getenv(env);
  switch (parse_switch(text)) {
    case SwitchValue::kDefault: return fallback;
    case SwitchValue::kOn: return true;
    case SwitchValue::kOff: return false;
    case SwitchValue::kBad: break;
  }
  KILN_CHECK(false, std::string("environment variable ") + env + "='" + text +
                        "': expected 1/on/true/yes or 0/off/false/no");
  return fallback;
}
bool& fused_flag() {
  static bool on = switch_from_env("KILN_CUDA_FUSED", true);
  return on;
}
bool& epilogue_flag() {
  static bool on = switch_from_env("KILN_CUDA_GEMM_EPILOGUE", true);
  return on;
}
}  // namespace

void set_fused_kernels(bool on) { fused_flag() = on; }
bool fused_kernels() { return fused_flag(); }
void set_gemm_epilogues(bool on) { epilogue_flag() = on; }
bool gemm_epilogues() { return epilogue_flag(); }

// ---- kernel timing ----
namespace {
struct Timing {
  bool on = false;
  int depth = 0;  // operators nest (matmul_backward's bias sums): only the outermost is timed
  struct Mark {
    cudaEvent_t start = nullptr, stop = nullptr;
    KernelFamily family = KernelFamily::kGemm;
  };
  std::vector<Mark> marks;  // events are reused from one take to the next
  size_t used = 0;
};
Timing& timing() {
  static Timing t;
  return t;
}
}  // namespace

const char* kernel_family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::kGemm: return "gemm";
    case KernelFamily::kAttention: return "attention";
    case KernelFamily::kElementwise: return "elementwise";
    case KernelFamily::kCrossEntropy: return "cross_entropy";
    case KernelFamily::kOptimizer: return "optimizer";
    case KernelFamily::kCount: break;
  }
  return "?";
}

void set_kernel_timing(bool on) {
  Timing& t = timing();
  KILN_CHECK(t.depth == 0, "set_kernel_timing inside an operator");
  t.on = on;
}

KernelTimes take_kernel_times() {
  Timing& t = timing();
  KernelTimes out;
  if (t.used > 0) KILN_CUDA_CHECK(cudaEventSynchronize(t.marks[t.used - 1].stop));
  for (size_t i = 0; i < t.used; ++i) {
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, t.marks[i].start, t.marks[i].stop));
    out.ms[static_cast<int>(t.marks[i].family)] += ms;
  }
  t.used = 0;
  return out;
}

namespace detail {

bool kernel_timing_on() { return timing().on; }

void kernel_timing_begin(KernelFamily f) {
  Timing& t = timing();
  if (t.depth++ > 0) return;
  if (t.used == t.marks.size()) {
    Timing::Mark m;
    KILN_CUDA_CHECK(cudaEventCreate(&m.start));
    KILN_CUDA_CHECK(cudaEventCreate(&m.stop));
    t.marks.push_back(m);
  }
  t.marks[t.used].family = f;
  KILN_CUDA_CHECK(cudaEventRecord(t.marks[t.used].start, g_stream));
}

void kernel_timing_end() {
  Timing& t = timing();
  if (--t.depth > 0) return;
  KILN_CUDA_CHECK(cudaEventRecord(t.marks[t.used].stop, g_stream));
  ++t.used;
}

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

const void* device_table(const void* host, size_t bytes, int slot) {
  struct Table {
    std::vector<unsigned char> copy;  // what the device buffer holds
    void* p = nullptr;
    size_t cap = 0;
  };
  static Table tables[4];
  KILN_CHECK(slot >= 0 && slot < 4, "cuda device table slot out of range");
  Table& t = tables[slot];
  if (bytes == 0) return nullptr;
  if (t.copy.size() == bytes && std::memcmp(t.copy.data(), host, bytes) == 0) return t.p;
  if (t.cap < bytes) {
    if (t.p) KILN_CUDA_CHECK(cudaFree(t.p));  // synchronises: nothing queued still reads it
    t.cap = bytes < 4096 ? 4096 : bytes;
    KILN_CUDA_CHECK(cudaMalloc(&t.p, t.cap));
  }
  t.copy.assign(static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + bytes);
  // Stream-ordered after the kernels that read the previous table; the source is t.copy, which
  // stays unchanged until the next upload, so a staged (pageable) copy is safe.
  KILN_CUDA_CHECK(cudaMemcpyAsync(t.p, t.copy.data(), bytes, cudaMemcpyHostToDevice, g_stream));
  return t.p;
}

double read_scalar(const double* device_value) {
  static double* pinned = [] {
    double* p = nullptr;
    KILN_CUDA_CHECK(cudaMallocHost(&p, sizeof(double)));
    return p;
  }();
  KILN_CUDA_CHECK(cudaMemcpyAsync(pinned, device_value, sizeof(double), cudaMemcpyDeviceToHost, g_stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  return *pinned;
}

}  // namespace detail
}  // namespace kiln::cuda
