// kernels/cpu_isa.h: parsing KILN_CPU_ISA, the choice of path for given CPU feature sets (so the
// AVX-512 / AMX choices are tested on any machine), the process's recorded choice, and the
// `kiln` binary's handling of a bad KILN_CPU_ISA.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu_isa.h"
#include "tests/kiln_cli.h"

namespace kiln {
namespace {

using cpu::CpuFeatures;
using cpu::Isa;

CpuFeatures avx2_cpu() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}
CpuFeatures avx512_cpu() {
  CpuFeatures f = avx2_cpu();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}
CpuFeatures amx_cpu() {
  CpuFeatures f = avx512_cpu();
  f.avx512bf16 = f.amx_tile = f.amx_bf16 = true;
  return f;
}

TEST(KernelsIsa, NamesParseBack) {
  for (Isa i : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    Isa parsed = Isa::kAmx;
    ASSERT_TRUE(cpu::parse_isa(cpu::isa_name(i), &parsed)) << cpu::isa_name(i);
    EXPECT_EQ(parsed, i);
  }
  Isa out = Isa::kAvx512;
  for (const char* bad : {"", "AVX2", "avx", "avx-512", "sse4", "avx2 ", "native"}) {
    EXPECT_FALSE(cpu::parse_isa(bad, &out)) << bad;
  }
  EXPECT_EQ(out, Isa::kAvx512);  // untouched on failure
}

TEST(KernelsIsa, BaselineNeedsAvx2FmaAndF16c) {
  EXPECT_TRUE(cpu::has_baseline(avx2_cpu()));
  for (bool CpuFeatures::*drop : {&CpuFeatures::avx2, &CpuFeatures::fma, &CpuFeatures::f16c}) {
    CpuFeatures f = amx_cpu();
    f.*drop = false;
    EXPECT_FALSE(cpu::has_baseline(f));
    EXPECT_EQ(cpu::best_isa(f), Isa::kAvx2);  // nothing above a missing baseline
  }
  EXPECT_FALSE(cpu::has_baseline(CpuFeatures{}));
}

TEST(KernelsIsa, BestPathFollowsTheFeatures) {
  EXPECT_EQ(cpu::best_isa(avx2_cpu()), Isa::kAvx2);
  EXPECT_EQ(cpu::best_isa(avx512_cpu()), Isa::kAvx512);
  EXPECT_EQ(cpu::best_isa(amx_cpu()), Isa::kAmx);
  // AVX-512 needs all of F, BW, VL and DQ (Skylake-SP and later); Xeon Phi's F alone is not enough.
  for (bool CpuFeatures::*drop : {&CpuFeatures::avx512f, &CpuFeatures::avx512bw,
                                  &CpuFeatures::avx512vl, &CpuFeatures::avx512dq}) {
    CpuFeatures f = avx512_cpu();
    f.*drop = false;
    EXPECT_EQ(cpu::best_isa(f), Isa::kAvx2);
  }
  // AMX needs both the tile unit and its bf16 instructions, on top of AVX-512.
  CpuFeatures f = amx_cpu();
  f.amx_bf16 = false;
  EXPECT_EQ(cpu::best_isa(f), Isa::kAvx512);
  f = avx2_cpu();
  f.amx_tile = f.amx_bf16 = true;
  EXPECT_EQ(cpu::best_isa(f), Isa::kAvx2);
}

TEST(KernelsIsa, ChooseHonoursKilnCpuIsaUpToTheCpu) {
  EXPECT_EQ(*cpu::choose_isa(amx_cpu(), nullptr), Isa::kAmx);
  EXPECT_EQ(*cpu::choose_isa(amx_cpu(), ""), Isa::kAmx);
  EXPECT_EQ(*cpu::choose_isa(amx_cpu(), "avx512"), Isa::kAvx512);
  EXPECT_EQ(*cpu::choose_isa(amx_cpu(), "avx2"), Isa::kAvx2);
  EXPECT_EQ(*cpu::choose_isa(avx512_cpu(), "avx2"), Isa::kAvx2);
  EXPECT_EQ(*cpu::choose_isa(avx2_cpu(), "avx2"), Isa::kAvx2);
}

TEST(KernelsIsa, ChooseRejectsAPathAboveTheCpu) {
  auto r = cpu::choose_isa(avx2_cpu(), "avx512");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kConfig);
  EXPECT_NE(r.status().message().find("KILN_CPU_ISA=avx512"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("its best is avx2"), std::string::npos)
      << r.status().message();
  r = cpu::choose_isa(avx512_cpu(), "amx");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("its best is avx512"), std::string::npos)
      << r.status().message();
}

TEST(KernelsIsa, ChooseRejectsAnUnknownValue) {
  auto r = cpu::choose_isa(amx_cpu(), "avx9");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kConfig);
  EXPECT_NE(r.status().message().find("'avx9'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("avx2, avx512 or amx"), std::string::npos)
      << r.status().message();
}

// The process's own choice is what choose_isa says for this CPU and this environment.
TEST(KernelsIsa, RuntimeRecordsTheChoice) {
  const cpu::CpuRuntime& rt = cpu::cpu_runtime();
  const CpuFeatures here = cpu::detect_cpu_features();
  EXPECT_TRUE(cpu::has_baseline(here));
  auto want = cpu::choose_isa(here, std::getenv("KILN_CPU_ISA"));
  ASSERT_TRUE(want.is_ok()) << want.status().message();
  EXPECT_EQ(rt.isa, *want);
  const std::string d = cpu::describe_cpu_runtime();
  EXPECT_NE(d.find(std::string("path ") + cpu::isa_name(rt.isa)), std::string::npos) << d;
  EXPECT_NE(d.find(cpu::bf16_gemm_name(rt.bf16_gemm)), std::string::npos) << d;
  EXPECT_FALSE(rt.bf16_gemm_why.empty());
}

TEST(KernelsIsa, KilnVersionNamesThePath) {
  auto r = testing_cli::run_kiln("--version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("path " + std::string(cpu::isa_name(cpu::cpu_runtime().isa))),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("bf16 GEMM "), std::string::npos) << r.out;
  r = testing_cli::run_kiln("--version", "KILN_CPU_ISA=avx2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("path avx2 (forced by KILN_CPU_ISA"), std::string::npos) << r.out;
}

TEST(KernelsIsa, KilnRejectsABadKilnCpuIsa) {
  auto r = testing_cli::run_kiln("--version", "KILN_CPU_ISA=avx9");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.err.find("KILN_CPU_ISA='avx9'"), std::string::npos) << r.err;
  if (cpu::best_isa(cpu::detect_cpu_features()) != Isa::kAmx) {
    r = testing_cli::run_kiln("--version", "KILN_CPU_ISA=amx");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.err.find("asks for a path this CPU does not have"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace kiln
