// The CUDA modules (common/cuda_module.h): a CPU process never maps the CUDA libraries, NCCL or
// the modules; `device: cuda` loads libkiln_cuda.so (and through it cuBLAS) and reports why it
// cannot train where there is no GPU; a broken or missing module is an error naming the file.
// Checked on the `kiln` binary (ldd, and the dynamic loader's own log: LD_DEBUG=files lists every
// object a process maps, dlopen-ed ones included) and in this process (/proc/self/maps).
#include "common/cuda_module.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/nccl.h"
#include "engine/device/runtime.h"
#include "tests/kiln_cli.h"
#include "tests/test_paths.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

using testing_cli::CliRun;
using testing_cli::run_kiln;

// The libraries only a GPU run may map.
const std::vector<std::string> kCudaLibraries = {"libcublas",    "libcudart",    "libnccl",
                                                 "libkiln_cuda", "libkiln_nccl", "libcuda.so"};

// The first of kCudaLibraries named in text, or "".
std::string first_cuda_library(const std::string& text) {
  for (const std::string& lib : kCudaLibraries) {
    if (text.find(lib) != std::string::npos) return lib;
  }
  return "";
}

// The dynamic loader's own lines in LD_DEBUG=files output ("<pid>:<tab>file=<library> ..."): what
// was loaded, as opposed to an error message that names a module file.
std::string loader_lines(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(":\tfile=") != std::string::npos) out += line + "\n";
  }
  return out;
}

std::string self_maps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tiny_train(const std::string& dir, const std::string& more = "") {
  return "train --config " + std::string(test::source_dir()) + "/configs/train/tiny.yaml" +
         " --set run.steps=2 --set run.threads=2 --set checkpoint.every_steps=0" +
         " --set checkpoint.at_end=false --set run.dir=" + dir + " " + more;
}

class CudaModules : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("kiln_cuda_module_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

// The executable itself needs none of them (ldd: every library it and its libraries need).
TEST_F(CudaModules, KilnBinaryNeedsNoCudaLibrary) {
  const std::string cmd = "ldd " + std::string(test::kiln_binary()) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  ASSERT_NE(out.find("libstdc++"), std::string::npos) << out;  // ldd did list the libraries
  EXPECT_EQ(first_cuda_library(out), "") << out;
}

// A CPU training run maps none of them at any time (dlopen-ed ones included).
TEST_F(CudaModules, CpuTrainingMapsNoCudaLibrary) {
  CliRun r = run_kiln(tiny_train((root_ / "run").string()), "LD_DEBUG=files");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(r.output.size() > 4000 ? r.output.size() - 4000 : 0);
  // The loader's log is there (so an absent name means it was not loaded), and it is complete.
  ASSERT_NE(r.err.find("file=libtbb.so"), std::string::npos) << r.err.substr(0, 2000);
  EXPECT_EQ(first_cuda_library(r.err), "");
}

// device=cuda loads the CUDA module (and cuBLAS through it): where no GPU is usable it exits 2
// with the runtime's reason, not a loading error; a build without CUDA says so.
TEST_F(CudaModules, CudaDeviceLoadsTheModule) {
  CliRun r = run_kiln(tiny_train((root_ / "gpu").string(), "--set device=cuda"), "LD_DEBUG=files");
  if (!cuda_module_built(CudaModule::kCuda)) {
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("built without CUDA"), std::string::npos) << r.err;
    // (The refusal names the module file, libkiln_cuda.so; the loader's log must not.)
    ASSERT_NE(loader_lines(r.err).find("file=libtbb.so"), std::string::npos)
        << r.err.substr(0, 2000);
    EXPECT_EQ(first_cuda_library(loader_lines(r.err)), "") << loader_lines(r.err);
    return;
  }
  EXPECT_NE(r.err.find("libkiln_cuda.so"), std::string::npos);
  EXPECT_NE(r.err.find("libcublasLt.so"), std::string::npos);
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is usable here: device=cuda trained";
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("key 'device'"), std::string::npos) << r.err.substr(r.err.size() - 800);
  EXPECT_TRUE(r.err.find("no usable GPU") != std::string::npos ||
              r.err.find("no CUDA device") != std::string::npos)
      << r.err.substr(r.err.size() - 800);
}

// A module that is missing or is not a loadable library: exit 2 naming `device`, the file and
// the loader's reason.
TEST_F(CudaModules, MissingOrBrokenModuleIsAConfigError) {
  if (!cuda_module_built(CudaModule::kCuda)) GTEST_SKIP() << "this build has no CUDA module";
  const fs::path empty = root_ / "empty", broken = root_ / "broken";
  fs::create_directories(empty);
  fs::create_directories(broken);
  CliRun missing = run_kiln(tiny_train((root_ / "a").string(), "--set device=cuda"),
                            "KILN_CUDA_MODULE_DIR=" + empty.string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.err.find("key 'device'"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("libkiln_cuda.so: not found (looked for " +
                             (empty / "libkiln_cuda.so").string()),
            std::string::npos)
      << missing.err;
  std::ofstream(broken / "libkiln_cuda.so") << "not a shared library\n";
  CliRun bad = run_kiln(tiny_train((root_ / "b").string(), "--set device=cuda"),
                        "KILN_CUDA_MODULE_DIR=" + broken.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.err.find("cannot load " + (broken / "libkiln_cuda.so").string()), std::string::npos)
      << bad.err;
  // The CPU still trains with the broken module in the way: nothing loads it.
  CliRun cpu =
      run_kiln(tiny_train((root_ / "c").string()), "KILN_CUDA_MODULE_DIR=" + broken.string());
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
}

// In a test process: the CPU backend maps nothing of CUDA; asking for NCCL loads the NCCL module
// (and libnccl) where it was built - so /proc/self/maps does show loaded modules.
TEST_F(CudaModules, ThisProcessMapsCudaOnlyWhenAsked) {
  ASSERT_TRUE(engine::runtime_for(Device::kCpu).is_ok());
  const std::string before = self_maps();
  ASSERT_NE(before.find("libstdc++"), std::string::npos);
  EXPECT_EQ(first_cuda_library(before), "");
  if (!cuda_module_built(CudaModule::kNccl)) {
    EXPECT_FALSE(comm::nccl_available());
    GTEST_SKIP() << "this build has no NCCL module";
  }
  ASSERT_TRUE(comm::nccl_available())
      << cuda_module_symbol(CudaModule::kNccl, "kiln_nccl_make_group").status().to_string();
  const std::string after = self_maps();
  EXPECT_NE(after.find("libkiln_nccl.so"), std::string::npos);
  EXPECT_NE(after.find("libnccl"), std::string::npos);
  EXPECT_EQ(after.find("libcublas"), std::string::npos);  // NCCL alone does not bring cuBLAS
}

}  // namespace
}  // namespace kiln
