// Checks tools/sanitizers/tsan.supp and common/tsan.h against the installed libraries
// (tools/sanitizers/check_tsan_supp builds this with -fsanitize=thread): the file parses, each
// called_from_lib pattern matches a library TSan accepts, the hand-offs inside oneTBB, OpenBLAS
// and oneDNN that TSan cannot see are silenced (with oneTBB's fork and join annotated the way
// Kiln's code does it), and the results stay right.
//
// Controls (argv[1]), each of which TSan must report with the file:
//   thread-race     two std::threads increment one int (the file does not hide Kiln's own threads);
//   tbb-race        two oneTBB tasks of one annotated parallel_for do the same (the file does not
//                   hide races between tasks: no longer a blind spot);
//   tbb-unannotated a parallel_for without common/tsan.h's annotations whose results are read
//                   after the call: a false report, which shows the annotations are what makes
//                   oneTBB's join visible (if it is ever not reported, libtbb is instrumented).
#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <thread>
#include <vector>

#include "common/tsan.h"

namespace {
volatile int g_racy = 0;
void bump(int n) {
  for (int k = 0; k < 100000; ++k) g_racy = g_racy + n;
}
}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "thread-race") == 0) {
    std::thread a(bump, 1), b(bump, 2);
    a.join();
    b.join();
    return 0;
  }
  if (std::strcmp(mode, "tbb-race") == 0) {
    const kiln::tsan::ForkJoin fork_join;
    tbb::parallel_for(0, 64, fork_join.task([](int i) { bump(i); }), tbb::simple_partitioner());
    fork_join.join();
    return 0;
  }
  std::vector<float> v(1 << 16);
  if (std::strcmp(mode, "tbb-unannotated") == 0) {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, v.size(), 1024), [&](const auto& r) {
      for (size_t i = r.begin(); i < r.end(); ++i) v[i] = float(i);
    });
  } else {
    const kiln::tsan::ForkJoin fork_join;
    tbb::parallel_for(tbb::blocked_range<size_t>(0, v.size(), 1024),
                      fork_join.task([&](const auto& r) {
                        for (size_t i = r.begin(); i < r.end(); ++i) v[i] = float(i);
                      }));
    fork_join.join();
  }
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
