#include "engine/device/runtime.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cuda_module.h"
#include "engine/device/kernel_runtime.h"

namespace kiln::engine {

namespace {

class CpuRuntime final : public detail::KernelRuntime<CpuBackend> {
 public:
  std::string describe() const override {
    return "cpu (" + std::to_string(cpu::num_threads()) + " threads)";
  }
  bool host_addressable() const override { return true; }
  std::string product_name() const override { return ""; }

  void* allocate(size_t bytes, std::string_view what) override {
    if (bytes == 0) return nullptr;
    const size_t padded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, padded);
    KILN_CHECK(p != nullptr, "out of host memory allocating " + std::to_string(bytes) + " bytes" +
                                 (what.empty() ? std::string() : " for " + std::string(what)) +
                                 " (" + std::to_string(mem_.in_use) +
                                 " bytes already held through the runtime)");
    std::memset(p, 0, padded);
    mem_.in_use += bytes;
    if (mem_.in_use > mem_.peak) mem_.peak = mem_.in_use;
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    std::free(p);
    mem_.in_use -= bytes;
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void fill(float* p, float value, size_t n) override {
    for (size_t i = 0; i < n; ++i) p[i] = value;
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  void* allocate_pinned(size_t bytes) override { return allocate(bytes, "pinned staging"); }
  void deallocate_pinned(void* p, size_t bytes) override { deallocate(p, bytes); }
  void upload_async(void* dst, const void* src, size_t bytes, int) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void wait_upload(int) override {}
  void upload_done(int) override {}
  void synchronize() override {}
  DeviceMemory memory() const override { return mem_; }

 private:
  DeviceMemory mem_;
};

}  // namespace

Runtime& host_runtime() {
  static CpuRuntime runtime;
  return runtime;
}

Status cuda_unusable(const std::string& why) {
  return Status::unimplemented("'cuda': " + why + "; use device: cpu").with_key("device");
}

bool cuda_compiled() { return cuda_module_built(CudaModule::kCuda); }

Status select_cuda_device(int ordinal) {
  auto select = cuda_module_symbol(CudaModule::kCuda, "kiln_cuda_select_device");
  if (!select.is_ok()) {
    return cuda_unusable(select.status().message());
  }
  using SelectFn = Status (*)(int);
  return reinterpret_cast<SelectFn>(*select)(ordinal);
}

// The CUDA backend lives in libkiln_cuda.so (engine/device/cuda_module.cc), loaded on first use.
Result<Runtime*> runtime_for(Device d) {
  if (d == Device::kCpu) return &host_runtime();
  auto open = cuda_module_symbol(CudaModule::kCuda, "kiln_cuda_open_runtime");
  if (!open.is_ok()) {
    return cuda_unusable(open.status().message());
  }
  using OpenFn = Result<Runtime*> (*)();
  return reinterpret_cast<OpenFn>(*open)();
}

}  // namespace kiln::engine
