// The engine's device runtime: one Runtime object per process and device, chosen once from
// kiln::Device (config key `device`), through which the engine reaches memory (allocate, free,
// fill, copies between host and device, pinned staging buffers and asynchronous uploads), the
// optimizer's update and the gradient reductions. It is the engine's one seam to the device;
// the kernels it dispatches to are a kernel backend (kernels/ops.h: kiln::CpuBackend /
// kiln::CudaBackend), and the layers of the model call their backend type directly, chosen once
// in Model::create from runtime().device(). Outside engine/model/ and engine/device/, nothing in
// the engine calls kiln::cpu:: or kiln::cuda:: or branches on the device.
//
//   cpu   host memory (64-byte aligned), the CPU kernels; copies are memcpy, uploads complete at
//         once.
//   cuda  device memory (cudaMalloc), the CUDA kernels on one compute stream; uploads run on a
//         separate copy stream from pinned host memory, and the compute stream waits for a slot's
//         copy (an event) only when the model reads it. Only built with a CUDA toolkit; lives in
//         the module libkiln_cuda.so (engine/device/cuda_module.cc).
//
// Checkpoints, metrics and the data loader stay on the host: they read and write device memory
// through copy_to_host / copy_to_device (ParamStore::read_unit / write_tensor wrap this).
// Random numbers are generated on the host by the counter-based generator (engine/model/rng.h)
// and uploaded, so a model starts from the same bits on every device.
// A Runtime is not thread-safe: the training thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/config/run.h"  // device_name, parse_device
#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace kiln::engine {

struct DeviceMemory {
  size_t in_use = 0;           // bytes allocated through the backend now
  size_t peak = 0;             // the most ever allocated through the backend at once
  size_t total = 0;            // the device's memory (0: host memory, not reported)
  size_t used_by_process = 0;  // cuda: total - free as the driver reports it (context, workspaces)
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Device device() const = 0;
  // One line for logs, e.g. "cpu (2 threads)" or "cuda: NVIDIA H200 (sm_90, 139.8 GiB)".
  virtual std::string describe() const = 0;
  // The accelerator's product name ("NVIDIA H200"); "" for the CPU.
  virtual std::string product_name() const = 0;
  // True when the backend's memory is host memory (the host may read it in place).
  virtual bool host_addressable() const = 0;

  // ---- memory ----
  // Zero-filled, at least 64-byte aligned; bytes 0 gives nullptr. Stops the process when out of
  // memory: the message names `what` (e.g. "blocks.3.master"; "" for an unnamed buffer), the
  // size and the memory left (mpirun then stops the other ranks).
  virtual void* allocate(size_t bytes, std::string_view what) = 0;
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
  // For a second host thread that uploads (engine/data/step_batches.h): made on the compute thread,
  // run first on the other thread, it makes that thread use the same device (cuda:
  // cudaSetDevice; nothing on the CPU).
  virtual std::function<void()> thread_binding() const { return {}; }
  virtual DeviceMemory memory() const = 0;

  // ---- optimizer and gradient checks (kernels/ops.h semantics; engine/device/kernel_runtime.h
  // implements them once for every kernel backend) ----
  // AdamW over several tensors, each with its own weight decay (hp.weight_decay is ignored; the
  // low-precision copies, where params_lp is set, are of lp_type: kBF16 / kF16).
  virtual void adamw_update_multi(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                                  DType lp_type) = 0;
  // y[i] += x[i] for n fp32 values.
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

// The process-wide runtime for `d`. cpu always works; cuda fails with a config-key error naming
// `device` when the build has no CUDA or no GPU is usable (the reason is in the message).
Result<Runtime*> runtime_for(Device d);
// Makes GPU `ordinal` this process's CUDA device (before anything is allocated on a GPU; for
// several ranks on one machine, engine/parallel/parallelism.h). kUnimplemented naming `device` as
// runtime_for when no GPU is usable; kConfig naming `device` when `ordinal` does not exist (the
// message says how many devices this process sees).
Status select_cuda_device(int ordinal);
Runtime& host_runtime();
// The error for `device: cuda` where it cannot run: kUnimplemented naming the key `device`,
// "'cuda': <why>; use device: cpu" (why: the module's or the CUDA runtime's reason).
Status cuda_unusable(const std::string& why);
// Whether this build has the CUDA backend compiled in.
bool cuda_compiled();

// A typed array in a runtime's memory, zero-filled, freed on destruction. Move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Runtime* runtime, size_t n, std::string_view what = "") { reset(runtime, n, what); }
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

  // n elements in runtime's memory; `what` names them in an out-of-memory message.
  void reset(Runtime* runtime, size_t n, std::string_view what = "") {
    clear();
    runtime_ = runtime;
    data_ = static_cast<T*>(runtime->allocate(n * sizeof(T), what));
    size_ = n;
  }
  void clear() {
    if (data_) runtime_->deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  void zero() {
    if (data_) runtime_->fill_zero(data_, bytes());
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  Runtime* runtime() const { return runtime_; }

 private:
  void swap(DeviceArray& o) {
    std::swap(runtime_, o.runtime_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  Runtime* runtime_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln::engine
