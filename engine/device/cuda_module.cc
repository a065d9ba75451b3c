// The CUDA backend of the engine (engine/device/runtime.h) and the CUDA model: compiled only into
// the CUDA module libkiln_cuda.so (common/cuda_module.h) with the CUDA kernels, which the
// executable loads the first time runtime_for(Device::kCuda) is called. Plain C++: everything
// device-side goes through kiln::cuda (kernels/cuda/runtime.h). The module's entry points are the
// extern "C" functions at the end (their names differ from every engine function: a module's calls
// to a name the executable also defines go to the executable's).
#include "common/cuda_module.h"

#include <memory>
#include <string>
#include <vector>

#include "common/text.h"
#include "engine/device/kernel_runtime.h"
#include "engine/device/runtime.h"
#include "engine/model/gpt_model.h"
#include "engine/model/rng.h"
#include "kernels/cuda/runtime.h"

namespace kiln::engine {
namespace {

class CudaRuntime final : public detail::KernelRuntime<CudaBackend> {
 public:
  CudaRuntime() : info_(cuda::device_info()) {}

  std::string describe() const override {
    return "cuda: " + info_.name + " (sm_" + std::to_string(info_.major) +
           std::to_string(info_.minor) + ", " + std::to_string(info_.multiprocessors) + " SMs, " +
           bytes_in(info_.total_bytes, ByteUnit::kGiB) + "; fused kernels " +
           (cuda::fused_kernels() ? "on" : "off") + ", GEMM epilogues " +
           (cuda::gemm_epilogues() ? "on" : "off") + ", attention " +
           (cuda::attention_kernel() == cuda::AttentionKernel::kTensorCore ? "tensor-core"
                                                                           : "tiled") +
           ")";
  }
  bool host_addressable() const override { return false; }
  std::string product_name() const override { return info_.name; }

  void* allocate(size_t bytes, std::string_view what) override {
    if (bytes == 0) return nullptr;
    void* p = cuda::device_alloc(bytes, what.empty() ? "" : std::string(what).c_str());
    cuda::memset_zero(p, bytes);
    mem_.in_use += bytes;
    if (mem_.in_use > mem_.peak) mem_.peak = mem_.in_use;
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    cuda::synchronize();  // queued work may still use it
    cuda::device_free(p);
    mem_.in_use -= bytes;
  }
  void fill_zero(void* p, size_t bytes) override { cuda::memset_zero(p, bytes); }
  void fill(float* p, float value, size_t n) override { cuda::fill(p, value, n); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) cuda::copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) cuda::copy_to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) cuda::copy_device(dst, src, bytes);
  }
  void* allocate_pinned(size_t bytes) override { return cuda::pinned_alloc(bytes); }
  void deallocate_pinned(void* p, size_t) override {
    if (p) cuda::pinned_free(p);
  }
  void upload_async(void* dst, const void* src, size_t bytes, int slot) override {
    cuda::upload_async(dst, src, bytes, slot);
  }
  void wait_upload(int slot) override { cuda::wait_upload(slot); }
  void upload_done(int slot) override { cuda::upload_done(slot); }
  void synchronize() override { cuda::synchronize(); }
  std::function<void()> thread_binding() const override {
    return [dev = cuda::current_device()] {
      const std::string failed = cuda::select_device(dev);
      KILN_CHECK(failed.empty(), failed);
    };
  }
  DeviceMemory memory() const override {
    DeviceMemory m = mem_;
    m.total = info_.total_bytes;
    m.used_by_process = cuda::device_bytes_in_use();
    return m;
  }

  void set_kernel_timing(bool on) override { cuda::set_kernel_timing(on); }
  std::vector<std::pair<std::string, double>> take_kernel_times() override {
    const cuda::KernelTimes t = cuda::take_kernel_times();
    std::vector<std::pair<std::string, double>> out;
    for (int f = 0; f < cuda::kKernelFamilies; ++f) {
      out.emplace_back(cuda::kernel_family_name(static_cast<cuda::KernelFamily>(f)), t.ms[f]);
    }
    return out;
  }

 private:
  cuda::DeviceInfo info_;
  DeviceMemory mem_;
};

Result<Runtime*> open_runtime() {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) {
    return cuda_unusable(why);
  }
  static CudaRuntime runtime;
  return &runtime;
}

}  // namespace
}  // namespace kiln::engine

// ---- the module's entry points (looked up by name: engine/device/runtime.cc,
// engine/model/model.cc)

extern "C" const char* kiln_cuda_module_stamp() { return KILN_CUDA_MODULE_STAMP; }

extern "C" kiln::Status kiln_cuda_select_device(int ordinal) {
  const std::string why = kiln::cuda::unavailable_reason();
  if (!why.empty()) {
    return kiln::engine::cuda_unusable(why);
  }
  const std::string failed = kiln::cuda::select_device(ordinal);
  if (!failed.empty()) return kiln::Status::config(failed).with_key("device");
  return kiln::Status::ok();
}

extern "C" kiln::Result<kiln::engine::Runtime*> kiln_cuda_open_runtime() {
  return kiln::engine::open_runtime();
}

extern "C" std::unique_ptr<kiln::engine::Model> kiln_cuda_create_model(
    kiln::engine::ParamStore* params, int64_t micro_batch, kiln::engine::Recompute mode,
    int64_t head_chunk_rows, kiln::engine::TensorParallel* tp, int pp_slots) {
  return kiln::engine::detail::create_on<kiln::CudaBackend>(params, micro_batch, mode,
                                                            head_chunk_rows, tp, pp_slots);
}
