// encoder_forward / encoder_backward (token + position embedding): values, deterministic
// scatter-add with repeated tokens, gradient check, thread-count invariance.
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(KernelsEncoder, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 4, C = 3, V = 5;
  auto tokens = randint(B * T, 0, V, 1);
  tokens[0] = tokens[3] = tokens[5] = 2;  // repeats
  auto wte = randn(V * C, 2), wpe = randn(T * C, 3), probe = randn(B * T * C, 4);
  auto objective = [&] {
    std::vector<double> out(B * T * C);
    ref::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, probe);
  };
  std::vector<double> dwte(wte.size()), dwpe(wpe.size());
  ref::encoder_backward(dwte.data(), dwpe.data(), probe.data(), tokens.data(), B, T, C);
  fd_check(wte, dwte, objective, "dwte");
  fd_check(wpe, dwpe, objective, "dwpe");
}

template <typename E>
void check_against_reference(int B, int T, int C, int V, double tol_out) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " B=" << B << " T=" << T
                                    << " C=" << C << " V=" << V);
  auto tokens = randint(size_t(B) * T, 0, V, 41);
  auto wte = quantize<E>(randn(size_t(V) * C, 42)), wpe = quantize<E>(randn(size_t(T + 3) * C, 43));
  auto dout = quantize<E>(randn(size_t(B) * T * C, 44));
  auto dwte0 = quantize<float>(randn(wte.size(), 45)),
       dwpe0 = quantize<float>(randn(wpe.size(), 46));
  std::vector<double> out_ref(size_t(B) * T * C), dwte_ref = dwte0, dwpe_ref = dwpe0;
  ref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  ref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B, T, C);
  auto wte_t = to_t<E>(wte), wpe_t = to_t<E>(wpe), dout_t = to_t<E>(dout);
  std::vector<E> out(out_ref.size());
  auto dwte = to_t<float>(dwte0), dwpe = to_t<float>(dwpe0);
  cpu::encoder_forward(out.data(), tokens.data(), wte_t.data(), wpe_t.data(), B, T, C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout_t.data(), tokens.data(), B, T, C);
  expect_close(to_d(out), out_ref, tol_out, "out");
  // Gradients: fp32 sums of at most B*T values of O(1): 1e-5.
  expect_close(to_d(dwte), dwte_ref, 1e-5, "dwte");
  expect_close(to_d(dwpe), dwpe_ref, 1e-5, "dwpe");
}

TEST(KernelsEncoder, MatchesReference) {
  // fp32 forward is one addition: exact up to 1 rounding (2^-24 relative).
  check_against_reference<float>(1, 1, 1, 1, 1e-7);
  check_against_reference<float>(2, 17, 70, 9, 1e-7);  // small vocab: many repeated tokens
  check_against_reference<float>(4, 64, 256, 1000, 1e-7);
  check_against_reference<bf16>(4, 64, 256, 1000, 5e-3);
  check_against_reference<fp16>(4, 64, 256, 1000, 6e-4);
}

TEST(KernelsEncoder, NullGradientsAreSkipped) {
  const int B = 1, T = 4, C = 8;
  std::vector<int32_t> tokens = {0, 1, 1, 0};
  auto dout = to_t<float>(randn(B * T * C, 1));
  std::vector<float> dwte(2 * C), dwpe(T * C);
  cpu::encoder_backward<float>(nullptr, dwpe.data(), dout.data(), tokens.data(), B, T, C);
  cpu::encoder_backward<float>(dwte.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(dwpe[c], dout[c]);
    EXPECT_EQ(dwte[c], dout[c] + dout[3 * C + c]);
    EXPECT_EQ(dwte[C + c], dout[C + c] + dout[2 * C + c]);
  }
}

TEST(KernelsEncoder, ThreadCountInvariant) {
  const int B = 4, T = 64, C = 200, V = 7;  // heavy token repetition
  auto tokens = randint(B * T, 0, V, 1);
  auto dout = to_t<float>(randn(B * T * C, 2));
  std::vector<float> dwte0, dwpe0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<float> dwte(V * C), dwpe(T * C);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    if (dwte0.empty()) {
      dwte0 = dwte, dwpe0 = dwpe;
      continue;
    }
    EXPECT_TRUE(bits_equal(dwte, dwte0)) << n << " threads";
    EXPECT_TRUE(bits_equal(dwpe, dwpe0)) << n << " threads";
  }
}

}  // namespace
}  // namespace kiln
