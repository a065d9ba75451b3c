// Shared by the benchmark programs in tools/bench: one line that says what machine a run measured
// and which CPU code paths it took, so that every recorded number carries them.
//   machine: 2 cores, 23.5 GiB; cpu: AMD EPYC 7B13; path avx2 (best avx2); bf16 GEMM kiln-avx2
//   (...); cpu flags: avx2 fma f16c (no avx512f ...); OpenBLAS Zen; forced: none; load average ...
// The path and the bf16 GEMM are the kernels' own start-up choice (kernels/cpu_isa.h).
#pragma once

#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

namespace kiln::bench {

// The CPU's name (CPUID brand string, as the kernels report it).
inline std::string cpu_model() { return cpu::cpu_runtime().cpu_name; }

// The instruction-set extensions that decide Kiln's CPU paths, as the kernel reports them:
// "avx2 fma f16c (no avx512f avx512_bf16 amx_bf16)".
inline std::string cpu_isa_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string flags;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':'));  // ": fpu vme ..."
      flags[0] = ' ';
      flags.append(" ");
      break;
    }
  }
  std::string have, lack;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile",
                        "amx_bf16"}) {
    std::string& dst = flags.find(std::string(" ").append(f).append(" ")) != std::string::npos ? have : lack;
    if (!dst.empty()) dst.append(" ");
    dst.append(f);
  }
  std::string out = have.empty() ? "none" : have;
  if (!lack.empty()) out.append(" (no ").append(lack).append(")");
  return out;
}

// The whole line (without a trailing newline).
inline std::string machine_line() {
  std::ostringstream o;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(pages) * page / (1 << 30));
  o << "machine: " << sysconf(_SC_NPROCESSORS_ONLN) << " cores, " << mem << "; "
    << cpu::describe_cpu_runtime() << "; cpu flags: " << cpu_isa_flags() << "; OpenBLAS "
    << openblas_get_corename();
  std::string forced;
  for (const char* env : {"KILN_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE"}) {
    if (const char* v = std::getenv(env)) {
      if (!forced.empty()) forced.append(" ");
      forced.append(env).append("=").append(v);
    }
  }
  o << "; forced: " << (forced.empty() ? "none" : forced);
  std::ifstream la("/proc/loadavg");
  std::string l1, l5, l15;
  if (la >> l1 >> l5 >> l15) o << "; load average " << l1 << " " << l5 << " " << l15;
  return o.str();
}

inline void print_machine(std::FILE* out = stdout) {
  std::fprintf(out, "%s\n", machine_line().c_str());
  std::fflush(out);
}

}  // namespace kiln::bench
