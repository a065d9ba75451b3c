// Checks tools/sanitizers/tsan.supp against the installed libraries (tools/sanitizers/
// check_tsan_supp builds this with -fsanitize=thread): the file parses, each called_from_lib
// pattern matches a library TSan accepts, and the handoffs inside oneTBB, OpenBLAS and oneDNN that
// TSan cannot see are silenced, while the results stay right.
#include <cblas.h>
#include <tbb/parallel_for.h>

#include <cstdio>
#include <dnnl.hpp>
#include <vector>

int main() {
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
