// encoder_forward / encoder_backward (token + position embedding): values, deterministic
// scatter-add with repeated tokens, gradient check, thread-count invariance, with and without
// per-row document starts (positions restart at each document: model.doc_mask).
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

// Per-row document starts (model.doc_mask): row b's documents begin at 0 and at random
// positions; doc_start[b,t] is the start of t's document.
std::vector<int32_t> random_doc_starts(int B, int T, uint64_t seed) {
  const auto cut = randint(size_t(B) * T, 0, 4, seed);  // a new document where cut == 0
  std::vector<int32_t> ds(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    int start = 0;
    for (int t = 0; t < T; ++t) {
      if (t > 0 && cut[size_t(b) * T + t] == 0) start = t;
      ds[size_t(b) * T + t] = start;
    }
  }
  return ds;
}

void reference_gradient_check(bool masked) {
  SCOPED_TRACE(masked ? "doc_start" : "no doc_start");
  const int B = 2, T = 6, C = 3, V = 5;
  const std::vector<int32_t> starts = {0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 4, 4};
  const int32_t* ds = masked ? starts.data() : nullptr;
  auto tokens = randint(B * T, 0, V, 1);
  tokens[0] = tokens[3] = tokens[5] = 2;  // repeats
  auto wte = randn(V * C, 2), wpe = randn(T * C, 3), probe = randn(B * T * C, 4);
  auto objective = [&] {
    std::vector<double> out(B * T * C);
    ref::encoder_forward(out.data(), tokens.data(), ds, wte.data(), wpe.data(), B, T, C);
    return dot(out, probe);
  };
  std::vector<double> dwte(wte.size()), dwpe(wpe.size());
  ref::encoder_backward(dwte.data(), dwpe.data(), probe.data(), tokens.data(), ds, B, T, C);
  fd_check(wte, dwte, objective, "dwte");
  fd_check(wpe, dwpe, objective, "dwpe");
  if (masked) {  // positions restart: the last position gets no gradient
    for (int c = 0; c < C; ++c) EXPECT_EQ(dwpe[size_t(T - 1) * C + c], 0.0);
  }
}

TEST(KernelsEncoder, ReferenceGradientMatchesFiniteDifferences) {
  reference_gradient_check(false);
  reference_gradient_check(true);
}

template <typename E>
void check_against_reference(int B, int T, int C, int V, double tol_out, bool masked) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " B=" << B << " T=" << T
                                    << " C=" << C << " V=" << V << " masked=" << masked);
  const auto starts = random_doc_starts(B, T, 47);
  const int32_t* ds = masked ? starts.data() : nullptr;
  auto tokens = randint(size_t(B) * T, 0, V, 41);
  auto wte = quantize<E>(randn(size_t(V) * C, 42)), wpe = quantize<E>(randn(size_t(T + 3) * C, 43));
  auto dout = quantize<E>(randn(size_t(B) * T * C, 44));
  auto dwte0 = quantize<float>(randn(wte.size(), 45)),
       dwpe0 = quantize<float>(randn(wpe.size(), 46));
  std::vector<double> out_ref(size_t(B) * T * C), dwte_ref = dwte0, dwpe_ref = dwpe0;
  ref::encoder_forward(out_ref.data(), tokens.data(), ds, wte.data(), wpe.data(), B, T, C);
  ref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), ds, B, T, C);
  auto wte_t = to_t<E>(wte), wpe_t = to_t<E>(wpe), dout_t = to_t<E>(dout);
  std::vector<E> out(out_ref.size());
  auto dwte = to_t<float>(dwte0), dwpe = to_t<float>(dwpe0);
  cpu::encoder_forward(out.data(), tokens.data(), ds, wte_t.data(), wpe_t.data(), B, T, C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout_t.data(), tokens.data(), ds, B, T, C);
  expect_close(to_d(out), out_ref, tol_out, "out");
  // Gradients: fp32 sums of at most B*T values of O(1): 1e-5.
  expect_close(to_d(dwte), dwte_ref, 1e-5, "dwte");
  expect_close(to_d(dwpe), dwpe_ref, 1e-5, "dwpe");
}

TEST(KernelsEncoder, MatchesReference) {
  // fp32 forward is one addition: exact up to 1 rounding (2^-24 relative).
  for (bool masked : {false, true}) {
    check_against_reference<float>(1, 1, 1, 1, 1e-7, masked);
    check_against_reference<float>(2, 17, 70, 9, 1e-7, masked);  // small vocab: repeated tokens
    check_against_reference<float>(4, 64, 256, 1000, 1e-7, masked);
    check_against_reference<bf16>(4, 64, 256, 1000, 5e-3, masked);
    check_against_reference<fp16>(4, 64, 256, 1000, 6e-4, masked);
  }
}

// With document starts, a packed row embeds as its documents do on their own (each document its
// own row from position 0), and the position gradient is the sum of the documents' gradients.
TEST(KernelsEncoder, PackedRowIsItsDocumentsEmbeddedAlone) {
  const int T = 12, C = 20, V = 9;
  const std::vector<int> lengths = {5, 1, 6};  // documents at 0, 5, 6
  std::vector<int32_t> ds;
  for (size_t d = 0, start = 0; d < lengths.size(); start += lengths[d++])
    ds.insert(ds.end(), lengths[d], static_cast<int32_t>(start));
  auto tokens = randint(T, 0, V, 3);
  auto wte = to_t<float>(randn(V * C, 4)), wpe = to_t<float>(randn(T * C, 5));
  auto dout = to_t<float>(randn(T * C, 6));
  std::vector<float> out(T * C), dwpe(T * C);
  cpu::encoder_forward(out.data(), tokens.data(), ds.data(), wte.data(), wpe.data(), 1, T, C);
  cpu::encoder_backward<float>(nullptr, dwpe.data(), dout.data(), tokens.data(), ds.data(), 1, T,
                               C);
  std::vector<float> dwpe_docs(T * C);
  for (size_t d = 0, start = 0; d < lengths.size(); start += lengths[d++]) {
    const int n = lengths[d];
    std::vector<float> alone(size_t(n) * C);
    cpu::encoder_forward<float>(alone.data(), tokens.data() + start, nullptr, wte.data(),
                                wpe.data(), 1, n, C);
    const std::vector<float> got(out.begin() + start * C, out.begin() + (start + n) * C);
    EXPECT_TRUE(bits_equal(got, alone)) << "document " << d;
    cpu::encoder_backward<float>(nullptr, dwpe_docs.data(), dout.data() + start * C,
                                 tokens.data() + start, nullptr, 1, n, C);
  }
  EXPECT_TRUE(bits_equal(dwpe, dwpe_docs));
}

TEST(KernelsEncoder, NullGradientsAreSkipped) {
  const int B = 1, T = 4, C = 8;
  std::vector<int32_t> tokens = {0, 1, 1, 0};
  auto dout = to_t<float>(randn(B * T * C, 1));
  std::vector<float> dwte(2 * C), dwpe(T * C);
  cpu::encoder_backward<float>(nullptr, dwpe.data(), dout.data(), tokens.data(), nullptr, B, T, C);
  cpu::encoder_backward<float>(dwte.data(), nullptr, dout.data(), tokens.data(), nullptr, B, T, C);
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
  const auto starts = random_doc_starts(B, T, 3);
  for (const int32_t* ds : {static_cast<const int32_t*>(nullptr), starts.data()}) {
    std::vector<float> dwte0, dwpe0;
    for (int n : thread_counts()) {
      ThreadCount tc(n);
      std::vector<float> dwte(V * C), dwpe(T * C);
      cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), ds, B, T, C);
      if (dwte0.empty()) {
        dwte0 = dwte, dwpe0 = dwpe;
        continue;
      }
      EXPECT_TRUE(bits_equal(dwte, dwte0)) << n << " threads, masked " << (ds != nullptr);
      EXPECT_TRUE(bits_equal(dwpe, dwpe0)) << n << " threads, masked " << (ds != nullptr);
    }
  }
}

}  // namespace
}  // namespace kiln
