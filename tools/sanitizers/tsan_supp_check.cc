// Checks tools/sanitizers/tsan.supp against the installed libraries (tools/sanitizers/
// check_tsan_supp builds this with -fsanitize=thread): the file parses, each called_from_lib
// pattern matches a library TSan accepts, and the handoffs inside oneTBB, OpenBLAS and oneDNN that
// TSan cannot see are silenced, while the results stay right.
//
// Two controls with a deliberate race (argv[1]): "thread-race" (two std::threads increment one
// int: TSan must still report it with the file, so the file does not hide Kiln's own threads, the
// loader's prefetch workers) and "tbb-race" (two oneTBB tasks do the same: with the file it is NOT
// reported - the blind spot docs/HARDENING.md describes: races between oneTBB tasks are invisible
// while libtbb is uninstrumented and its frames suppressed).
#include <cblas.h>
#include <tbb/parallel_for.h>

#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <thread>
#include <vector>

namespace {
volatile int g_racy = 0;
void bump(int n) {
  for (int k = 0; k < 100000; ++k) g_racy = g_racy + n;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "thread-race") == 0) {
    std::thread a(bump, 1), b(bump, 2);
    a.join();
    b.join();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "tbb-race") == 0) {
    tbb::parallel_for(0, 64, [](int i) { bump(i); }, tbb::simple_partitioner());
    return 0;
  }
  std::vector<float> v(1 << 16);
  tbb::parallel_for(size_t(0), v.size(), [&](size_t i) { v[i] = float(i); });
  double sum = 0;
  for (float x : v) sum += x;
  const int n = 256;
  std::vector<float> a(n * n, 1.f), b(n * n, 2.f), c(n * n), d(n * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
              0.f, c.data(), n);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  dnnl::memory::desc md({n, n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  dnnl::memory ma(md, eng, a.data()), mb(md, eng, b.data()), md_out(md, eng, d.data());
  dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng))
      .execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, md_out}});
  st.wait();
  const bool ok = sum == double(v.size()) * double(v.size() - 1) / 2 && c[0] == 2.f * n && d[0] == 2.f * n;
  std::printf("tsan_supp_check: %s\n", ok ? "results right" : "WRONG RESULTS");
  return ok ? 0 : 1;
}
