// The CUDA backend of the engine (engine/backend.h) and the CUDA model: compiled only into the
// CUDA module libkiln_cuda.so (common/cuda_module.h) with the CUDA kernels, which the executable
// loads the first time backend_for(Device::kCuda) is called. Plain C++: everything device-side
// goes through kiln::cuda (kernels/cuda/ops.h). The module's entry points are the extern "C"
// functions at the end (their names differ from every engine function: a module's calls to a
// name the executable also defines go to the executable's).
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_module.h"
#include "engine/backend.h"
#include "engine/gpt_model.h"
#include "engine/rng.h"
#include "kernels/cuda/ops.h"

namespace kiln::engine {
namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

class CudaRuntime final : public Backend {
 public:
  CudaRuntime() : info_(cuda::device_info()) {}

  Device device() const override { return Device::kCuda; }
  std::string describe() const override {
    return "cuda: " + info_.name + " (sm_" + std::to_string(info_.major) +
           std::to_string(info_.minor) + ", " + std::to_string(info_.multiprocessors) + " SMs, " +
           gib(info_.total_bytes) + "; fused kernels " + (cuda::fused_kernels() ? "on" : "off") +
           ", GEMM epilogues " + (cuda::gemm_epilogues() ? "on" : "off") + ", attention " +
           (cuda::attention_kernel() == cuda::AttentionKernel::kTensorCore ? "tensor-core" : "tiled") +
           ")";
  }
  bool host_addressable() const override { return false; }
  std::string product_name() const override { return info_.name; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = cuda::device_alloc(bytes);
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

  void adamw_update(float* p, float* m, float* v, const float* g, size_t n, const AdamWParams& hp,
                    DType lp_type, void* lp) override {
    switch (lp_type) {
      case DType::kBF16: cuda::adamw_update(p, m, v, g, n, hp, static_cast<bf16*>(lp)); break;
      case DType::kF16: cuda::adamw_update(p, m, v, g, n, hp, static_cast<fp16*>(lp)); break;
      default: cuda::adamw_update(p, m, v, g, n, hp); break;
    }
  }
  void adamw_update_tensors(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                            DType lp_type) override {
    cuda::adamw_update_multi(tensors, count, hp, lp_type);
  }
  void accumulate(float* y, const float* x, size_t n) override { cuda::accumulate(y, x, n); }
  void cast_from_fp32(void* dst, DType lp_type, const float* src, size_t n) override {
    if (lp_type == DType::kBF16) {
      cuda::cast(static_cast<bf16*>(dst), src, n);
    } else {
      KILN_CHECK(lp_type == DType::kF16, "cast_from_fp32 to a type that is not bf16/fp16");
      cuda::cast(static_cast<fp16*>(dst), src, n);
    }
  }
  double sum_squares(const float* const* tensors, const size_t* sizes, int count) override {
    return cuda::sum_squares(tensors, sizes, count);
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

Result<Backend*> open_backend() {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) {
    return Status::unimplemented("'cuda': " + why + "; use device: cpu on this machine")
        .with_key("device");
  }
  static CudaRuntime runtime;
  return &runtime;
}

}  // namespace
}  // namespace kiln::engine

// ---- the module's entry points (looked up by name: engine/backend.cc, engine/model.cc) ----------

extern "C" const char* kiln_cuda_module_stamp() { return KILN_CUDA_MODULE_STAMP; }

extern "C" kiln::Status kiln_cuda_select_device(int ordinal) {
  const std::string why = kiln::cuda::unavailable_reason();
  if (!why.empty()) {
    return kiln::Status::unimplemented("'cuda': " + why + "; use device: cpu on this machine")
        .with_key("device");
  }
  const std::string failed = kiln::cuda::select_device(ordinal);
  if (!failed.empty()) return kiln::Status::config(failed).with_key("device");
  return kiln::Status::ok();
}

extern "C" kiln::Result<kiln::engine::Backend*> kiln_cuda_open_backend() {
  return kiln::engine::open_backend();
}

extern "C" std::unique_ptr<kiln::engine::Model> kiln_cuda_create_model(
    kiln::engine::ParamStore* params, int64_t micro_batch, kiln::engine::Recompute mode,
    int64_t head_chunk_rows, kiln::engine::TensorParallel* tp) {
  return kiln::engine::detail::create_on<kiln::CudaBackend>(params, micro_batch, mode,
                                                            head_chunk_rows, tp);
}
