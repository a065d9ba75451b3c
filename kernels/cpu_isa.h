// Instruction-set paths of the CPU kernels, chosen once per process at start-up.
//
// The default build runs on any x86-64 CPU with AVX2, FMA and F16C (the baseline; a CPU without
// them gets a clear message and exit status 1 before any kernel code runs). Faster paths are
// picked at run time from what the CPU has:
//   avx2    Kiln's AVX2/FMA kernels; bf16/fp16 GEMM in fp32 arithmetic (no native bf16 on AVX2)
//   avx512  + AVX-512 attention micro-kernel; oneDNN may use AVX-512 / AVX512-BF16
//   amx     + oneDNN may use AMX tiles for the bf16 GEMM
// KILN_CPU_ISA=avx2|avx512|amx forces a path; a path the CPU does not have, or any other value,
// is an error (exit 1 with a message naming the value and the CPU's best path) - never a silent
// clamp. oneDNN's own maximum ISA is set to match before it initialises. (OpenBLAS picks its own
// kernels at load time; OPENBLAS_CORETYPE=Haswell pins them, as tools/test does for forced runs.)
//
// The bf16 GEMM is oneDNN when Kiln is built with it AND oneDNN can create a non-reference bf16
// matmul on the chosen path (probed once; a failure is reported, not thrown), otherwise Kiln's
// own AVX2/FMA GEMM (kernels/cpu/gemm_lp.cc, "kiln-avx2": widens the operands while packing). `kiln --version` and `kiln train`'s log print describe_cpu_runtime().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kiln::cpu {

enum class Isa : uint8_t { kAvx2 = 0, kAvx512 = 1, kAmx = 2 };
enum class Bf16Gemm : uint8_t { kOneDnn = 0, kKiln = 1 };

// What the CPU (and OS) support, as far as the paths care.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
};

CpuFeatures detect_cpu_features();
// AVX2 + FMA + F16C: what the default build needs.
bool has_baseline(const CpuFeatures& f);
// The highest path the features allow (kAvx2 also when the baseline is missing: check that first).
Isa best_isa(const CpuFeatures& f);
const char* isa_name(Isa isa);  // "avx2", "avx512", "amx"
bool parse_isa(std::string_view s, Isa* out);
const char* bf16_gemm_name(Bf16Gemm g);  // "onednn", "kiln-avx2"

// The path for a CPU with features `f` given KILN_CPU_ISA's value (nullptr or "" = best).
// Errors (StatusCode::kConfig): an unknown value, or a path above the CPU's best.
Result<Isa> choose_isa(const CpuFeatures& f, const char* kiln_cpu_isa);

// The process's choices (made on first use, thread-safe).
struct CpuRuntime {
  std::string cpu_name;  // CPUID brand string
  CpuFeatures features;
  Isa isa = Isa::kAvx2;
  bool forced = false;  // KILN_CPU_ISA was set
  Bf16Gemm bf16_gemm = Bf16Gemm::kKiln;
  std::string bf16_gemm_why;  // why that GEMM (e.g. oneDNN's error message)
};
// Checks KILN_CPU_ISA and makes the choices; an error names the bad value (call it first in main).
Status init_cpu_runtime();
// The choices; if init_cpu_runtime() has not succeeded, makes them now and on an error prints it
// and exits with status 1.
const CpuRuntime& cpu_runtime();
// One line for logs and --version, e.g.
// "cpu: AMD EPYC 7B13; path avx2 (best avx2); bf16 GEMM kiln-avx2 (oneDNN: ...)".
std::string describe_cpu_runtime();

// Tests and benchmarks: switch the bf16 GEMM of this process (not while ops run). False (and no
// change) if that GEMM is not available here.
bool set_bf16_gemm(Bf16Gemm g);

}  // namespace kiln::cpu
