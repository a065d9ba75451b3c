// CPU feature detection and the choice of the kernels' instruction-set path (kernels/cpu_isa.h).
//
// This file is compiled WITHOUT the AVX2 baseline flags (kernels/CMakeLists.txt): its start-up
// check must run on any x86-64 CPU and say clearly why Kiln cannot, instead of dying with SIGILL.
#include <cpuid.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cpu/internal.h"
#include "kernels/cpu_isa.h"

namespace kiln::cpu {
namespace {

uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

std::string brand_string() {
  unsigned regs[12] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000004u) return "unknown x86-64 CPU";
  for (unsigned i = 0; i < 3; ++i) {
    __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                &regs[4 * i + 3]);
  }
  char buf[49] = {};
  std::memcpy(buf, regs, 48);
  std::string s(buf);
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "unknown x86-64 CPU" : s.substr(b, e - b + 1);
}

std::string missing_baseline(const CpuFeatures& f) {
  std::string m;
  if (!f.avx2) m += " avx2";
  if (!f.fma) m += " fma";
  if (!f.f16c) m += " f16c";
  return m;
}

// Runs before other static initialisers (priority 101), so no AVX2 code runs on a CPU without it.
__attribute__((constructor(101))) void require_baseline() {
  const CpuFeatures f = detect_cpu_features();
  if (has_baseline(f)) return;
  std::fprintf(stderr,
               "kiln: this CPU (%s) lacks%s; this build of Kiln needs an x86-64 CPU with AVX2, FMA "
               "and F16C (Intel Haswell / AMD Zen or newer)\n",
               brand_string().c_str(), missing_baseline(f).c_str());
  std::exit(1);
}

std::mutex g_mu;
CpuRuntime g_rt;
std::atomic<bool> g_ready{false};

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;              // SSE + AVX state
  const bool os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;      // XTILECFG, XTILEDATA
  const bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned ebx7 = b, edx7 = d;
  __cpuid_count(7, 1, a, b, c, d);
  const unsigned eax71 = a;
  f.avx2 = avx && os_ymm && ((ebx7 >> 5) & 1);
  f.fma = avx && os_ymm && fma;
  f.f16c = avx && os_ymm && f16c;
  f.avx512f = os_zmm && ((ebx7 >> 16) & 1);
  f.avx512dq = os_zmm && ((ebx7 >> 17) & 1);
  f.avx512bw = os_zmm && ((ebx7 >> 30) & 1);
  f.avx512vl = os_zmm && ((ebx7 >> 31) & 1);
  f.avx512bf16 = f.avx512f && ((eax71 >> 5) & 1);
  f.amx_tile = os_amx && ((edx7 >> 24) & 1);
  f.amx_bf16 = os_amx && ((edx7 >> 22) & 1);
  return f;
}

bool has_baseline(const CpuFeatures& f) { return f.avx2 && f.fma && f.f16c; }

Isa best_isa(const CpuFeatures& f) {
  const bool avx512 = has_baseline(f) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (avx512 && f.amx_tile && f.amx_bf16) return Isa::kAmx;
  if (avx512) return Isa::kAvx512;
  return Isa::kAvx2;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

bool parse_isa(std::string_view s, Isa* out) {
  for (Isa i : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (s == isa_name(i)) {
      *out = i;
      return true;
    }
  }
  return false;
}

const char* bf16_gemm_name(Bf16Gemm g) { return g == Bf16Gemm::kOneDnn ? "onednn" : "kiln-avx2"; }

Result<Isa> choose_isa(const CpuFeatures& f, const char* kiln_cpu_isa) {
  const Isa best = best_isa(f);
  if (kiln_cpu_isa == nullptr || *kiln_cpu_isa == '\0') return best;
  Isa want;
  if (!parse_isa(kiln_cpu_isa, &want)) {
    return Status::config(
        std::string("KILN_CPU_ISA='") + kiln_cpu_isa +
        "' is not a CPU path; use avx2, avx512 or amx (or unset it for the best, " +
        isa_name(best) + " on this CPU)");
  }
  if (static_cast<int>(want) > static_cast<int>(best)) {
    return Status::config(std::string("KILN_CPU_ISA=") + kiln_cpu_isa +
                          " asks for a path this CPU does not have; its best is " + isa_name(best));
  }
  return want;
}

Status init_cpu_runtime() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ready.load()) return Status::ok();
  CpuRuntime rt;
  rt.features = detect_cpu_features();
  rt.cpu_name = brand_string();
  const char* env = std::getenv("KILN_CPU_ISA");
  Result<Isa> isa = choose_isa(rt.features, env);
  if (!isa.is_ok()) return isa.status();
  rt.isa = *isa;
  rt.forced = env != nullptr && *env != '\0';
  std::string why;
  rt.bf16_gemm = detail::probe_onednn_bf16(rt.isa, &why) ? Bf16Gemm::kOneDnn : Bf16Gemm::kKiln;
  rt.bf16_gemm_why = why;
  g_rt = std::move(rt);
  g_ready.store(true);
  return Status::ok();
}

const CpuRuntime& cpu_runtime() {
  if (g_ready.load(std::memory_order_acquire)) return g_rt;
  Status st = init_cpu_runtime();
  if (!st.is_ok()) {
    std::fprintf(stderr, "kiln: %s\n", st.to_string().c_str());
    std::exit(1);
  }
  return g_rt;
}

std::string describe_cpu_runtime() {
  const CpuRuntime& rt = cpu_runtime();
  std::string s = "cpu: " + rt.cpu_name + "; path " + isa_name(rt.isa);
  s += rt.forced
           ? std::string(" (forced by KILN_CPU_ISA; best ") + isa_name(best_isa(rt.features)) + ")"
           : " (best for this CPU)";
  s += std::string("; bf16 GEMM ") + bf16_gemm_name(rt.bf16_gemm);
  if (!rt.bf16_gemm_why.empty()) s += " (" + rt.bf16_gemm_why + ")";
  return s;
}

bool set_bf16_gemm(Bf16Gemm g) {
  cpu_runtime();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g == Bf16Gemm::kOneDnn) {
    std::string why;
    if (!detail::probe_onednn_bf16(g_rt.isa, &why)) return false;
  }
  g_rt.bf16_gemm = g;
  return true;
}

}  // namespace kiln::cpu
