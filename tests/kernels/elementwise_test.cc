// gelu_forward / gelu_backward and residual_forward / residual_backward.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(KernelsGelu, ReferenceGradientMatchesFiniteDifferences) {
  auto x = randn(200, 1, 3.0), probe = randn(200, 2);
  auto objective = [&] {
    std::vector<double> y(x.size());
    ref::gelu_forward(y.data(), x.data(), x.size());
    return dot(y, probe);
  };
  std::vector<double> dx(x.size());
  ref::gelu_backward(dx.data(), x.data(), probe.data(), x.size());
  fd_check(x, dx, objective, "dinp", 200);
}

TEST(KernelsGelu, ReferenceValues) {
  // GPT-2's tanh approximation at a few points (computed independently with high precision).
  EXPECT_NEAR(ref::gelu(0.0), 0.0, 1e-15);
  EXPECT_NEAR(ref::gelu(1.0), 0.8411919906082768, 1e-12);
  EXPECT_NEAR(ref::gelu(-1.0), -0.15880800939172324, 1e-12);
  EXPECT_NEAR(ref::gelu(3.0), 2.996362607918227, 1e-12);
}

template <typename E>
void check_gelu(size_t n, double tol) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " n=" << n);
  // Inputs across the interesting range, plus large magnitudes where tanh saturates.
  auto x = randn(n, 51, 3.0);
  if (n > 4) x[0] = 20.0, x[1] = -20.0, x[2] = 0.0, x[3] = -1e-6;
  x = quantize<E>(x);
  auto dy = quantize<E>(randn(n, 52)), dx0 = quantize<E>(randn(n, 53));
  std::vector<double> y_ref(n), dx_ref = dx0;
  ref::gelu_forward(y_ref.data(), x.data(), n);
  ref::gelu_backward(dx_ref.data(), x.data(), dy.data(), n);
  auto x_t = to_t<E>(x), dy_t = to_t<E>(dy), dx_t = to_t<E>(dx0);
  std::vector<E> y_t(n);
  cpu::gelu_forward(y_t.data(), x_t.data(), n);
  cpu::gelu_backward(dx_t.data(), x_t.data(), dy_t.data(), n);
  expect_close(to_d(y_t), y_ref, tol, "out");
  expect_close(to_d(dx_t), dx_ref, tol, "dinp");
}

// fp32: the vectorised tanh has ~1e-7 absolute error; 2e-6 relative to max(1, max|expected|).
// bf16/fp16: one rounding of the output: 5e-3 / 6e-4.
TEST(KernelsGelu, MatchesReference) {
  for (size_t n : {size_t(1), size_t(37), size_t(100000)}) {
    check_gelu<float>(n, 2e-6);
    check_gelu<bf16>(n, 5e-3);
    check_gelu<fp16>(n, 6e-4);
  }
}

TEST(KernelsGelu, Fp32GradientMatchesFiniteDifferences) {
  auto x = quantize<float>(randn(64, 3, 2.0)), probe = randn(64, 4);
  auto objective = [&] {
    auto xf = to_t<float>(x);
    std::vector<float> y(x.size());
    cpu::gelu_forward(y.data(), xf.data(), x.size());
    return dot(to_d(y), probe);
  };
  auto xf = to_t<float>(x), pr = to_t<float>(probe);
  std::vector<float> dx(x.size());
  cpu::gelu_backward(dx.data(), xf.data(), pr.data(), x.size());
  fd_check(x, to_d(dx), objective, "dinp", 64, 1e-2, 1e-2, 2e-3);
}

TEST(KernelsResidual, ForwardAndBackward) {
  const size_t n = 70001;
  auto a = randn(n, 1), b = randn(n, 2), d = randn(n, 3), g1 = randn(n, 4), g2 = randn(n, 5);
  std::vector<double> out_ref(n), g1_ref = quantize<float>(g1), g2_ref = quantize<float>(g2);
  auto af = to_t<float>(a), bf = to_t<float>(b), df = to_t<float>(d);
  ref::residual_forward(out_ref.data(), to_d(af).data(), to_d(bf).data(), n);
  ref::residual_backward(g1_ref.data(), g2_ref.data(), to_d(df).data(), n);
  std::vector<float> out(n), g1f = to_t<float>(g1), g2f = to_t<float>(g2);
  cpu::residual_forward(out.data(), af.data(), bf.data(), n);
  cpu::residual_backward(g1f.data(), g2f.data(), df.data(), n);
  // One fp32 rounding each.
  expect_close(to_d(out), out_ref, 1e-6, "out");
  expect_close(to_d(g1f), g1_ref, 1e-6, "dinp1");
  expect_close(to_d(g2f), g2_ref, 1e-6, "dinp2");
  // bf16: out = round(a + b) exactly as from_float would.
  auto ab = to_t<bf16>(a), bb = to_t<bf16>(b);
  std::vector<bf16> outb(n);
  cpu::residual_forward(outb.data(), ab.data(), bb.data(), n);
  for (size_t i = 0; i < n; i += 997) {
    EXPECT_EQ(outb[i].bits, float_to_bf16(bf16_to_float(ab[i]) + bf16_to_float(bb[i])).bits);
  }
  std::vector<bf16> gb(n, bf16{0});
  cpu::residual_backward<bf16>(gb.data(), nullptr, ab.data(), n);
  EXPECT_TRUE(bits_equal(gb, ab));
}

TEST(KernelsElementwise, ThreadCountInvariant) {
  const size_t n = 300001;
  auto x = to_t<float>(randn(n, 1, 2.0)), dy = to_t<float>(randn(n, 2));
  std::vector<float> y0, dx0;
  for (int t : thread_counts()) {
    ThreadCount tc(t);
    std::vector<float> y(n), dx(n);
    cpu::gelu_forward(y.data(), x.data(), n);
    cpu::gelu_backward(dx.data(), x.data(), dy.data(), n);
    if (y0.empty()) {
      y0 = y, dx0 = dx;
      continue;
    }
    EXPECT_TRUE(bits_equal(y, y0));
    EXPECT_TRUE(bits_equal(dx, dx0));
  }
}

}  // namespace
}  // namespace kiln
