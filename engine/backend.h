// The engine's device seam: one Backend object per process and device, chosen once from
// kiln::Device (config key `device`), through which the engine reaches memory (allocate, free,
// fill, copies between host and device, pinned staging buffers and asynchronous uploads), random
// initialisation, the optimizer's update and the gradient reductions. The operators of a layer
// come from the matching kernel backend type (kiln::CpuBackend / kiln::CudaBackend, chosen once in
// Model::create from backend().device()); nothing in a layer, the optimizer or the parameter
// store calls kiln::cpu:: or kiln::cuda:: directly or branches on the device.
//
//   cpu   host memory (64-byte aligned), the CPU kernels; copies are memcpy, uploads complete at
//         once. Bit-identical to the engine before the seam.
//   cuda  device memory (cudaMalloc), the CUDA kernels on one compute stream; uploads run on a
//         separate copy stream from pinned host memory, and the compute stream waits for a slot's
//         copy (an event) only when the model reads it. Only built with a CUDA toolkit.
//
// Checkpoints, metrics and the data loader stay on the host: they read and write device memory
// through copy_to_host / copy_to_device (ParamStore::read_unit / write_tensor wrap this).
// Random numbers are generated on the host by the counter-based generator (engine/rng.h) and
// uploaded, so a model starts from the same bits on every device.
// A Backend is not thread-safe: the training thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace kiln::engine {

const char* device_name(Device d);  // "cpu" | "cuda"
// "cpu" | "cuda"; anything else is a config error naming `key`.
Result<Device> parse_device(const std::string& text, const std::string& key = "device");

struct DeviceMemory {
  size_t in_use = 0;  // bytes allocated through the backend now
  size_t peak = 0;    // the most ever allocated through the backend at once
  size_t total = 0;   // the device's memory (0: host memory, not reported)
  size_t used_by_process = 0;  // cuda: total - free as the driver reports it (context, workspaces)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // One line for logs, e.g. "cpu (2 threads)" or "cuda: NVIDIA H200 (sm_90, 139.8 GiB)".
  virtual std::string describe() const = 0;
  // The accelerator's product name ("NVIDIA H200"); "" for the CPU.
  virtual std::string product_name() const = 0;
  // True when the backend's memory is host memory (the host may read it in place).
  virtual bool host_addressable() const = 0;

  // ---- memory ----
  // Zero-filled, at least 64-byte aligned; bytes 0 gives nullptr. Stops the process when out of
  // memory (the message names the size).
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual void fill_zero(void* p, size_t bytes) = 0;
  virtual void fill(float* p, float value, size_t n) = 0;
  // Synchronous copies (copy_to_host waits for the work queued before it).
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // dst and src both in this backend's memory (stream-ordered on the compute stream).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Page-locked host memory for staging uploads (plain aligned memory on the CPU).
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void deallocate_pinned(void* p, size_t bytes) = 0;
  // Starts copying `bytes` from pinned host memory to dst on the copy stream, recorded under
  // `slot` (0..kUploadSlots-1); returns at once. wait_upload(slot) makes the compute work queued
  // after it see the data; before reusing the pinned source, call upload_done(slot).
  static constexpr int kUploadSlots = 64;
  virtual void upload_async(void* dst, const void* pinned_src, size_t bytes, int slot) = 0;
  virtual void wait_upload(int slot) = 0;
  virtual void upload_done(int slot) = 0;  // blocks the host until slot's copy finished
  virtual void synchronize() = 0;          // blocks until all queued work is done
  // For a second host thread that uploads (engine/step_batches.h): made on the compute thread,
  // run first on the other thread, it makes that thread use the same device (cuda:
  // cudaSetDevice; nothing on the CPU).
  virtual std::function<void()> thread_binding() const { return {}; }
  virtual DeviceMemory memory() const = 0;

  // ---- optimizer and gradient checks (kernels/ops.h semantics) ----
  // lp_type kF32 means no low-precision copy (lp ignored); kBF16/kF16 write lp in the same pass.
  virtual void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                            const AdamWParams& hp, DType lp_type, void* lp) = 0;
  // AdamW over several tensors, each with its own weight decay (hp.weight_decay is ignored; the
  // low-precision copies, where params_lp is set, are of lp_type). The default calls
  // adamw_update per tensor (the CPU); cuda updates them all in one launch (multi-tensor,
  // docs/GPU.md "Fused kernels"). Same results as adamw_update per tensor.
  virtual void adamw_update_tensors(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                                    DType lp_type) {
    for (int i = 0; i < count; ++i) {
      AdamWParams h = hp;
      h.weight_decay = tensors[i].weight_decay;
      const AdamWTensor& t = tensors[i];
      adamw_update(t.params, t.m, t.v, t.grads, t.n, h, t.params_lp ? lp_type : DType::kF32,
                   t.params_lp);
    }
  }
  // y[i] += x[i] for n fp32 values (kernels/ops.h accumulate).
  virtual void accumulate(float* y, const float* x, size_t n) = 0;
  // dst (lp_type: kBF16 or kF16) = round(src), n values.
  virtual void cast_from_fp32(void* dst, DType lp_type, const float* src, size_t n) = 0;
  // Sum of squares over all tensors in one fused pass (fp64, fixed order), read back to the host
  // once: inf/NaN when any element is inf/NaN, so this is also the overflow check.
  virtual double sum_squares(const float* const* tensors, const size_t* sizes, int count) = 0;

  // ---- kernel timing (benchmarks, tools/bench/train_gpu) ----
  // While on, the device time of every operator is measured by kernel family (cuda: CUDA events
  // around each operator; the CPU backend measures nothing).
  virtual void set_kernel_timing(bool on) {}
  // Device milliseconds per family ("gemm", "attention", "elementwise", "cross_entropy",
  // "optimizer") since the previous call; waits for the queued work. Empty where not measured.
  virtual std::vector<std::pair<std::string, double>> take_kernel_times() { return {}; }
};

// The process-wide backend for `d`. cpu always works; cuda fails with a config-key error naming
// `device` when the build has no CUDA or no GPU is usable (the reason is in the message).
Result<Backend*> backend_for(Device d);
// Makes GPU `ordinal` this process's CUDA device (before anything is allocated on a GPU; for
// several ranks on one machine, engine/data_parallel.h). kUnimplemented naming `device` as
// backend_for when no GPU is usable; kConfig naming `device` when `ordinal` does not exist (the
// message says how many devices this process sees).
Status select_cuda_device(int ordinal);
Backend& cpu_backend();
// Whether this build has the CUDA backend compiled in.
bool cuda_compiled();

// A typed array in a backend's memory, zero-filled, freed on destruction. Move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend* backend, size_t n) { reset(backend, n); }
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      clear();
      swap(o);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { clear(); }

  void reset(Backend* backend, size_t n) {
    clear();
    backend_ = backend;
    data_ = static_cast<T*>(backend->allocate(n * sizeof(T)));
    size_ = n;
  }
  void clear() {
    if (data_) backend_->deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  void zero() {
    if (data_) backend_->fill_zero(data_, bytes());
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  Backend* backend() const { return backend_; }

 private:
  void swap(DeviceArray& o) {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln::engine
