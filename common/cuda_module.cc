#include "common/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

// CMake defines both for this file (common/CMakeLists.txt); a build without CUDA has neither
// module and an empty stamp.
#ifndef KILN_CUDA_MODULE_STAMP
#define KILN_CUDA_MODULE_STAMP ""
#endif
#ifndef KILN_BUILT_CUDA_MODULE
#define KILN_BUILT_CUDA_MODULE 0
#endif
#ifndef KILN_BUILT_NCCL_MODULE
#define KILN_BUILT_NCCL_MODULE 0
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct Loaded {
  std::once_flag once;
  void* handle = nullptr;
  Status error;  // why handle is null
};

Loaded& slot(CudaModule m) {
  static Loaded modules[2];
  return modules[m == CudaModule::kCuda ? 0 : 1];
}

std::vector<fs::path> candidates(CudaModule m) {
  const std::string file = cuda_module_file(m);
  if (const char* dir = std::getenv("KILN_CUDA_MODULE_DIR"); dir && *dir) {
    return {fs::path(dir) / file};
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return {exe.parent_path() / file, exe.parent_path().parent_path() / file};
}

Status unusable(CudaModule m, const std::string& why) {
  return Status::unimplemented(std::string(cuda_module_file(m)) + ": " + why);
}

Status load(CudaModule m, void** handle) {
  if (!cuda_module_built(m)) {
    return unusable(m, m == CudaModule::kCuda
                           ? "this kiln was built without CUDA (no CUDA toolkit was found at "
                             "build time)"
                           : "this kiln was built without NCCL (CMake found no CUDA toolkit with "
                             "NCCL; KILN_NCCL=ON)");
  }
  const std::vector<fs::path> paths = candidates(m);
  std::string looked;
  for (const fs::path& p : paths) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      looked += (looked.empty() ? "" : ", ") + p.string();
      continue;
    }
    // RTLD_NOW: a missing library or symbol fails here, with the loader's message, not later.
    void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* err = dlerror();
      return unusable(m, "cannot load " + p.string() + ": " + (err ? err : "unknown error") +
                             (m == CudaModule::kCuda
                                  ? " (it needs the CUDA libraries libcublas and libcublasLt "
                                    "on the library path)"
                                  : " (it needs libnccl on the library path)"));
    }
    using StampFn = const char* (*)();
    auto stamp = reinterpret_cast<StampFn>(dlsym(h, "kiln_cuda_module_stamp"));
    if (stamp == nullptr || std::strcmp(stamp(), KILN_CUDA_MODULE_STAMP) != 0) {
      const std::string theirs = stamp ? stamp() : "none";
      dlclose(h);
      return unusable(m, p.string() + " comes from another build (its stamp '" + theirs +
                             "', this kiln's '" + KILN_CUDA_MODULE_STAMP +
                             "'): install the module built with this executable");
    }
    *handle = h;
    return Status::ok();
  }
  if (looked.empty()) looked = "nowhere: /proc/self/exe is unreadable";
  return unusable(m, "not found (looked for " + looked +
                         "; set KILN_CUDA_MODULE_DIR to the directory that holds it)");
}

}  // namespace

const char* cuda_module_file(CudaModule m) {
  return m == CudaModule::kCuda ? "libkiln_cuda.so" : "libkiln_nccl.so";
}

bool cuda_module_built(CudaModule m) {
  return m == CudaModule::kCuda ? KILN_BUILT_CUDA_MODULE != 0 : KILN_BUILT_NCCL_MODULE != 0;
}

Result<void*> cuda_module_symbol(CudaModule m, const char* symbol) {
  Loaded& s = slot(m);
  std::call_once(s.once, [&] { s.error = load(m, &s.handle); });
  if (s.handle == nullptr) return s.error;
  void* p = dlsym(s.handle, symbol);
  if (p == nullptr) {
    return unusable(m, std::string("has no symbol ") + symbol + " (a module from another build?)");
  }
  return p;
}

}  // namespace kiln
