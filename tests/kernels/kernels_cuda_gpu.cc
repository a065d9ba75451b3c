// Cross-backend operator test (ggml's test-backend-ops idea): every CUDA op against the CPU op on
// the same inputs, with an error bound per op. Skips cleanly when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "kernels/ops.h"
#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

#define REQUIRE_GPU() \
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device"

// A device copy of a host vector, freed at scope exit.
template <typename E>
class Dev {
 public:
  explicit Dev(const std::vector<E>& h) : n_(h.size()) {
    p_ = static_cast<E*>(cuda::device_alloc(sizeof(E) * n_));
    cuda::copy_to_device(p_, h.data(), sizeof(E) * n_);
  }
  explicit Dev(size_t n) : Dev(std::vector<E>(n)) {}
  ~Dev() { cuda::device_free(p_); }
  Dev(const Dev&) = delete;
  E* get() { return p_; }
  std::vector<E> host() const {
    std::vector<E> h(n_);
    cuda::copy_to_host(h.data(), p_, sizeof(E) * n_);
    return h;
  }

 private:
  E* p_;
  size_t n_;
};

// GPU and CPU both compute in fp32 with different summation orders: 1e-5 relative to
// max(1, max|value|) for fp32 results; low-precision outputs may differ by one rounding step
// (one ulp: 7.8e-3 bf16, 9.8e-4 fp16 of the value).
template <typename E>
double tol() {
  if constexpr (std::is_same_v<E, float>)
    return 1e-5;
  else if constexpr (std::is_same_v<E, bf16>)
    return 8e-3;
  else
    return 1e-3;
}

template <typename E>
void check_layernorm() {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const int B = 3, T = 37, C = 200;
  auto x = to_t<E>(randn(B * T * C, 1, 2.0)), w = to_t<E>(randn(C, 2)), b = to_t<E>(randn(C, 3));
  auto dy = to_t<E>(randn(B * T * C, 4));
  std::vector<E> out(x.size()), dx(x.size());
  std::vector<float> mean(B * T), rstd(B * T), dw(C), db(C);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T,
                         C);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), B, T, C);
  Dev<E> gx(x), gw(w), gb(b), gdy(dy), gout(x.size()), gdx(x.size());
  Dev<float> gmean(B * T), grstd(B * T), gdw(C), gdb(C);
  cuda::layernorm_forward(gout.get(), gmean.get(), grstd.get(), gx.get(), gw.get(), gb.get(), B, T,
                          C);
  cuda::layernorm_backward(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(),
                           gmean.get(), grstd.get(), B, T, C);
  expect_close(to_d(gout.host()), to_d(out), tol<E>(), "out");
  expect_close(to_d(gmean.host()), to_d(mean), 1e-5, "mean");
  expect_close(to_d(grstd.host()), to_d(rstd), 1e-5, "rstd");
  expect_close(to_d(gdx.host()), to_d(dx), tol<E>(), "dinp");
  expect_close(to_d(gdw.host()), to_d(dw), 1e-5, "dweight");
  expect_close(to_d(gdb.host()), to_d(db), 1e-5, "dbias");
}

TEST(KernelsCuda, Layernorm) {
  REQUIRE_GPU();
  check_layernorm<float>();
  check_layernorm<bf16>();
  check_layernorm<fp16>();
}

template <typename E>
void check_matmul() {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const int B = 2, T = 33, C = 96, OC = 130;
  auto x = to_t<E>(randn(B * T * C, 1)), w = to_t<E>(randn(OC * C, 2, 0.1)),
       b = to_t<E>(randn(OC, 3));
  auto dy = to_t<E>(randn(B * T * OC, 4));
  std::vector<E> out(B * T * OC), dx(x.size());
  std::vector<float> dw(w.size()), db(OC);
  cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), B, T, C, OC);
  cpu::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), B, T, C, OC);
  Dev<E> gx(x), gw(w), gb(b), gdy(dy), gout(out.size()), gdx(x.size());
  Dev<float> gdw(w.size()), gdb(OC);
  cuda::matmul_forward(gout.get(), gx.get(), gw.get(), gb.get(), B, T, C, OC);
  cuda::matmul_backward(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(), B, T, C,
                        OC);
  expect_close(to_d(gout.host()), to_d(out), tol<E>(), "out");
  expect_close(to_d(gdx.host()), to_d(dx), tol<E>(), "dinp");
  expect_close(to_d(gdw.host()), to_d(dw), 1e-5, "dweight");
  expect_close(to_d(gdb.host()), to_d(db), 1e-5, "dbias");
}

TEST(KernelsCuda, Matmul) {
  REQUIRE_GPU();
  check_matmul<float>();
  check_matmul<bf16>();
  check_matmul<fp16>();
}

// out_tol / grad_tol: multiples of tol<E>() for the output and the gradients.
template <typename E>
void check_attention(int B, int T, int C, int NH, double out_tol = 1, double grad_tol = 2) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " T=" << T << " NH=" << NH);
  auto qkv = to_t<E>(randn(size_t(B) * T * 3 * C, 1)), dout = to_t<E>(randn(size_t(B) * T * C, 2));
  auto dqkv0 = to_t<E>(randn(qkv.size(), 3));
  std::vector<E> out(size_t(B) * T * C), dqkv = dqkv0;
  std::vector<float> lse(size_t(B) * NH * T);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                          NH);
  Dev<E> gqkv(qkv), gdout(dout), gout(out.size()), gdqkv(dqkv0);
  Dev<float> glse(lse.size());
  cuda::attention_forward(gout.get(), glse.get(), gqkv.get(), B, T, C, NH);
  // Backward from the CPU forward's output so both see the same O.
  Dev<E> gout_cpu(out);
  cuda::attention_backward(gdqkv.get(), gdout.get(), gqkv.get(), gout_cpu.get(), glse.get(), B, T,
                           C, NH);
  expect_close(to_d(gout.host()), to_d(out), out_tol * tol<E>(), "out");
  expect_close(to_d(glse.host()), to_d(lse), 1e-5, "lse");
  // Gradients sum O(T) terms in a different order: twice the forward bound by default.
  expect_close(to_d(gdqkv.host()), to_d(dqkv), grad_tol * tol<E>(), "dqkv");
}

// The Llama operators (kernels/cuda/llama.cu) against the CPU: RMSNorm, RoPE, SwiGLU, and
// grouped-query attention with and without the document mask.
template <typename E>
void check_llama_ops() {
  SCOPED_TRACE(dtype_name(dtype_of<E>()));
  const int B = 2, T = 70, C = 96, NH = 6, NKV = 2, hs = 16, F = 40;
  const size_t n = size_t(B) * T * C, W = size_t(NH + 2 * NKV) * hs, nq = size_t(B) * T * W;
  std::vector<int32_t> ds(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) ds[size_t(b) * T + t] = b == 0 ? t / 23 * 23 : (t < 1 ? 0 : 1);
  Dev<int32_t> gds(ds);
  {  // RMSNorm
    auto x = to_t<E>(randn(n, 1, 2.0)), w = to_t<E>(randn(C, 2)), dy = to_t<E>(randn(n, 3));
    std::vector<E> out(n), dx(n);
    std::vector<float> rstd(B * T), dw(C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1e-5f, B, T, C);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), B, T,
                          C);
    Dev<E> gx(x), gw(w), gdy(dy), gout(n), gdx(n);
    Dev<float> grstd(B * T), gdw(C);
    cuda::rmsnorm_forward(gout.get(), grstd.get(), gx.get(), gw.get(), 1e-5f, B, T, C);
    cuda::rmsnorm_backward(gdx.get(), gdw.get(), gdy.get(), gx.get(), gw.get(), grstd.get(), B, T,
                           C);
    expect_close(to_d(gout.host()), to_d(out), tol<E>(), "rmsnorm out");
    expect_close(to_d(grstd.host()), to_d(rstd), 1e-5, "rmsnorm rstd");
    expect_close(to_d(gdx.host()), to_d(dx), tol<E>(), "rmsnorm dinp");
    expect_close(to_d(gdw.host()), to_d(dw), 1e-5, "rmsnorm dweight");
  }
  {  // RoPE, with document starts
    auto q = to_t<E>(randn(nq, 4));
    auto fwd = q, bwd = q;
    cpu::rope_forward(fwd.data(), ds.data(), 10000.0f, B, T, NH, NKV, hs);
    cpu::rope_backward(bwd.data(), ds.data(), 10000.0f, B, T, NH, NKV, hs);
    Dev<E> gf(q), gb(q);
    cuda::rope_forward(gf.get(), gds.get(), 10000.0f, B, T, NH, NKV, hs);
    cuda::rope_backward(gb.get(), gds.get(), 10000.0f, B, T, NH, NKV, hs);
    expect_close(to_d(gf.host()), to_d(fwd), tol<E>(), "rope forward");
    expect_close(to_d(gb.host()), to_d(bwd), tol<E>(), "rope backward");
  }
  {  // SwiGLU
    const size_t rows = size_t(B) * T;
    auto x = to_t<E>(randn(rows * 2 * F, 5, 2.0)), dy = to_t<E>(randn(rows * F, 6));
    std::vector<E> out(rows * F), dx(rows * 2 * F);
    cpu::swiglu_forward(out.data(), x.data(), rows, F);
    cpu::swiglu_backward(dx.data(), x.data(), dy.data(), rows, F);
    Dev<E> gx(x), gdy(dy), gout(out.size()), gdx(dx.size());
    cuda::swiglu_forward(gout.get(), gx.get(), rows, F);
    cuda::swiglu_backward(gdx.get(), gx.get(), gdy.get(), rows, F);
    expect_close(to_d(gout.host()), to_d(out), tol<E>(), "swiglu out");
    expect_close(to_d(gdx.host()), to_d(dx), tol<E>(), "swiglu dinp");
  }
  for (const int32_t* d :
       {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(ds.data())}) {
    SCOPED_TRACE(d ? "document mask" : "causal");
    const int32_t* gd = d ? gds.get() : nullptr;
    auto qkv = to_t<E>(randn(nq, 7)), dout = to_t<E>(randn(size_t(B) * T * NH * hs, 8));
    auto dqkv0 = to_t<E>(randn(nq, 9));
    std::vector<E> out(size_t(B) * T * NH * hs), dqkv = dqkv0;
    std::vector<float> lse(size_t(B) * NH * T);
    cpu::attention_gqa_forward(out.data(), lse.data(), qkv.data(), d, B, T, NH, NKV, hs);
    cpu::attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), d, B,
                                T, NH, NKV, hs);
    Dev<E> gqkv(qkv), gdout(dout), gout(out.size()), gdqkv(dqkv0), gout_cpu(out);
    Dev<float> glse(lse.size());
    cuda::attention_gqa_forward(gout.get(), glse.get(), gqkv.get(), gd, B, T, NH, NKV, hs);
    cuda::attention_gqa_backward(gdqkv.get(), gdout.get(), gqkv.get(), gout_cpu.get(), glse.get(),
                                 gd, B, T, NH, NKV, hs);
    expect_close(to_d(gout.host()), to_d(out), tol<E>(), "gqa out");
    expect_close(to_d(glse.host()), to_d(lse), 1e-5, "gqa lse");
    expect_close(to_d(gdqkv.host()), to_d(dqkv), 2 * tol<E>(), "gqa dqkv");
  }
}

TEST(KernelsCuda, LlamaOps) {
  REQUIRE_GPU();
  check_llama_ops<float>();
  check_llama_ops<bf16>();
  check_llama_ops<fp16>();
}

TEST(KernelsCuda, Attention) {
  REQUIRE_GPU();
  check_attention<float>(2, 1, 8, 2);
  check_attention<float>(2, 130, 128, 2);
  check_attention<float>(1, 256, 256, 4);
  check_attention<bf16>(2, 130, 128, 2);
  check_attention<fp16>(2, 130, 128, 2);
}

// The tiled kernels' edges: T around the 16-row blocks and 32-row tiles, head sizes that fill
// 1, 2, 4 or 8 slices per lane partly or fully (16, 48, 64, 96, 128, 256).
TEST(KernelsCuda, AttentionTileEdgesAndHeadSizes) {
  REQUIRE_GPU();
  for (int T : {15, 16, 17, 31, 32, 33, 47, 64, 65}) check_attention<float>(2, T, 128, 2);
  for (int hs : {16, 48, 64, 96, 128, 256}) check_attention<float>(1, 70, 2 * hs, 2);
  check_attention<bf16>(1, 70, 192, 2);  // hs 96
  check_attention<fp16>(1, 70, 2 * 256, 2);
}

// The tensor-core kernels (attention_mma.cu, FlashAttention-2 style) against the CPU: bf16 and
// fp16, head sizes 64 and 128, T around their 64-row blocks and 32/64-row tiles. Like
// FlashAttention they round P to the input type before O = P V, and P and dS before the gradient
// products (dV = P^T dO, dK = dS^T Q, dQ = dS K): each output is then a sum of terms that carry
// one more rounding each, so out gets two rounding steps (2 x tol) and the gradients four. The
// scores and the log-sum-exp stay fp32 (exact products, fp32 sums): lse as tight as the tiled
// kernels'. Results repeat bit for bit.
TEST(KernelsCuda, AttentionTensorCores) {
  REQUIRE_GPU();
  if (!cuda::attention_mma_eligible(DType::kBF16, 128, 2)) {
    GTEST_SKIP() << "tensor-core attention needs compute capability 8.0 or newer";
  }
  EXPECT_FALSE(cuda::attention_mma_eligible(DType::kF32, 128, 2));
  EXPECT_FALSE(cuda::attention_mma_eligible(DType::kBF16, 96, 2));  // head size 48
  const cuda::AttentionKernel before = cuda::attention_kernel();
  cuda::set_attention_kernel(cuda::AttentionKernel::kTensorCore);
  for (int T : {1, 15, 31, 32, 33, 63, 64, 65, 130, 200}) check_attention<bf16>(2, T, 128, 2, 2, 4);
  check_attention<bf16>(1, 130, 256, 2, 2, 4);  // head size 128
  check_attention<bf16>(2, 96, 512, 8, 2, 4);   // 8 heads of 64
  check_attention<fp16>(2, 130, 128, 2, 2, 4);
  check_attention<fp16>(1, 200, 256, 2, 2, 4);
  {  // bit-reproducible
    const int B = 2, T = 100, C = 256, NH = 2;
    auto qkv = to_t<bf16>(randn(size_t(B) * T * 3 * C, 21)),
         dout = to_t<bf16>(randn(size_t(B) * T * C, 22));
    std::vector<bf16> outs[2], grads[2];
    for (int run = 0; run < 2; ++run) {
      Dev<bf16> gqkv(qkv), gdout(dout), gout(size_t(B) * T * C), gdqkv(qkv.size());
      Dev<float> glse(size_t(B) * NH * T);
      cuda::attention_forward(gout.get(), glse.get(), gqkv.get(), B, T, C, NH);
      cuda::attention_backward(gdqkv.get(), gdout.get(), gqkv.get(), gout.get(), glse.get(), B, T,
                               C, NH);
      outs[run] = gout.host();
      grads[run] = gdqkv.host();
    }
    EXPECT_TRUE(bits_equal(outs[0], outs[1]));
    EXPECT_TRUE(bits_equal(grads[0], grads[1]));
  }
  cuda::set_attention_kernel(before);
}

// Finite differences through the GPU kernels themselves (fp32): d/dx of dot(f(x), probe)
// against the GPU backward. Central differences with step 1e-2 * max(1, |x|): fp32 evaluation
// noise ~1e-7 / 1e-2 and curvature ~1e-4 bound the error, hence 2e-3 relative + 2e-3 absolute.
TEST(KernelsCuda, FiniteDifferenceGradientsOnGpu) {
  REQUIRE_GPU();
  {
    const int B = 1, T = 37, C = 64, NH = 2;  // two key tiles
    auto qkv = randn(size_t(B) * T * 3 * C, 11, 0.5), probe = randn(size_t(B) * T * C, 12);
    Dev<float> gout(size_t(B) * T * C), glse(size_t(B) * NH * T);
    auto objective = [&] {
      Dev<float> gq(to_t<float>(qkv));
      cuda::attention_forward(gout.get(), glse.get(), gq.get(), B, T, C, NH);
      return dot(to_d(gout.host()), probe);
    };
    objective();
    Dev<float> gq(to_t<float>(qkv)), gprobe(to_t<float>(probe)), gdq(qkv.size());
    cuda::attention_backward(gdq.get(), gprobe.get(), gq.get(), gout.get(), glse.get(), B, T, C,
                             NH);
    auto analytic = to_d(gdq.host());
    fd_check(qkv, analytic, objective, "attention dqkv", 64, 1e-2, 2e-3, 2e-3);
  }
  {
    const int B = 2, T = 5, C = 96;
    auto x = randn(size_t(B) * T * C, 13, 2.0), w = randn(C, 14), b = randn(C, 15);
    auto probe = randn(x.size(), 16);
    Dev<float> gw(to_t<float>(w)), gb(to_t<float>(b)), gout(x.size()), gmean(B * T), grstd(B * T);
    auto objective = [&] {
      Dev<float> gx(to_t<float>(x));
      cuda::layernorm_forward(gout.get(), gmean.get(), grstd.get(), gx.get(), gw.get(), gb.get(), B,
                              T, C);
      return dot(to_d(gout.host()), probe);
    };
    objective();
    Dev<float> gx(to_t<float>(x)), gprobe(to_t<float>(probe)), gdx(x.size()), gdw(C), gdb(C);
    cuda::layernorm_backward(gdx.get(), gdw.get(), gdb.get(), gprobe.get(), gx.get(), gw.get(),
                             gmean.get(), grstd.get(), B, T, C);
    auto analytic = to_d(gdx.host());
    fd_check(x, analytic, objective, "layernorm dinp", 64, 1e-2, 2e-3, 2e-3);
  }
}

TEST(KernelsCuda, ElementwiseAndEmbedding) {
  REQUIRE_GPU();
  const size_t n = 100003;
  auto x = to_t<float>(randn(n, 1, 2.0)), y = to_t<float>(randn(n, 2)),
       d0 = to_t<float>(randn(n, 3));
  std::vector<float> g(n), gd = d0, r(n), rd1 = d0, rd2 = d0;
  cpu::gelu_forward(g.data(), x.data(), n);
  cpu::gelu_backward(gd.data(), x.data(), y.data(), n);
  cpu::residual_forward(r.data(), x.data(), y.data(), n);
  cpu::residual_backward(rd1.data(), rd2.data(), y.data(), n);
  Dev<float> gx(x), gy(y), gg(n), ggd(d0), gr(n), grd1(d0), grd2(d0);
  cuda::gelu_forward(gg.get(), gx.get(), n);
  cuda::gelu_backward(ggd.get(), gx.get(), gy.get(), n);
  cuda::residual_forward(gr.get(), gx.get(), gy.get(), n);
  cuda::residual_backward(grd1.get(), grd2.get(), gy.get(), n);
  // GPU tanhf vs the CPU's vectorised tanh: both within ~1e-7 absolute of the true value.
  expect_close(to_d(gg.host()), to_d(g), 2e-6, "gelu");
  expect_close(to_d(ggd.host()), to_d(gd), 2e-6, "gelu backward");
  EXPECT_TRUE(bits_equal(gr.host(), r));
  EXPECT_TRUE(bits_equal(grd1.host(), rd1));
  EXPECT_TRUE(bits_equal(grd2.host(), rd2));

  const int B = 2, T = 16, C = 40, V = 11;
  auto tokens = randint(B * T, 0, V, 5);
  auto wte = to_t<float>(randn(V * C, 6)), wpe = to_t<float>(randn(T * C, 7));
  auto dout = to_t<float>(randn(B * T * C, 8));
  // Without and with document starts (model.doc_mask: positions restart at 0, 5, 9 and 0, 12).
  std::vector<int32_t> starts(B * T);
  for (int t = 0; t < T; ++t) {
    starts[t] = t < 5 ? 0 : t < 9 ? 5 : 9;
    starts[T + t] = t < 12 ? 0 : 12;
  }
  Dev<int32_t> gtok(tokens), gstarts(starts);
  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "doc_start" : "no doc_start");
    const int32_t* ds = masked ? starts.data() : nullptr;
    const int32_t* gds = masked ? gstarts.get() : nullptr;
    std::vector<float> out(B * T * C), dwte(V * C), dwpe(T * C);
    cpu::encoder_forward(out.data(), tokens.data(), ds, wte.data(), wpe.data(), B, T, C);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), ds, B, T, C);
    Dev<float> gwte(wte), gwpe(wpe), gdout(dout), gout(out.size()), gdwte(dwte.size()),
        gdwpe(dwpe.size());
    cuda::encoder_forward(gout.get(), gtok.get(), gds, gwte.get(), gwpe.get(), B, T, C);
    cuda::encoder_backward(gdwte.get(), gdwpe.get(), gdout.get(), gtok.get(), gds, B, T, C);
    EXPECT_TRUE(bits_equal(gout.host(), out));
    EXPECT_TRUE(bits_equal(gdwte.host(), dwte));  // same order of additions as the CPU
    EXPECT_TRUE(bits_equal(gdwpe.host(), dwpe));  // same order (rows in turn) as the CPU
    // The vocabulary-parallel forward (two windows, rank 0 adding wpe) sums to the same rows.
    Dev<float> p0(out.size()), p1(out.size());
    cuda::tp_embedding_forward(p0.get(), gtok.get(), gds, gwte.get(), gwpe.get(), B, T, C, 0, 4);
    cuda::tp_embedding_forward<float>(p1.get(), gtok.get(), gds, gwte.get() + 4 * C, nullptr, B, T,
                                      C, 4, V - 4);
    auto a = p0.host(), b = p1.host();
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    EXPECT_TRUE(bits_equal(a, out));
  }
}

// The vocabulary-parallel embedding's gradient (kernels/ops.h: encoder.cu's token-sorted
// kernel with a vocabulary window): each window's rows are the bits of the whole gradient's rows
// (the same additions in the same order), tokens outside the window leave nothing.
TEST(KernelsCuda, TpEmbeddingGradientWindowsAreTheWholeGradientsRows) {
  REQUIRE_GPU();
  const int B = 3, T = 16, C = 40, V = 12;
  auto tokens = randint(B * T, 0, V, 15);
  auto dout = to_t<float>(randn(B * T * C, 16));
  std::vector<float> dwte(V * C), dwpe(T * C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, B, T, C);
  Dev<int32_t> gtok(tokens);
  Dev<float> gdout(dout);
  for (auto [v0, Vl] : {std::pair{0, 5}, std::pair{5, 7}, std::pair{0, 12}}) {
    Dev<float> g(size_t(Vl) * C);
    cuda::tp_embedding_backward_wte(g.get(), gdout.get(), gtok.get(), B, T, C, v0, Vl);
    const std::vector<float> want(dwte.begin() + v0 * C, dwte.begin() + (v0 + Vl) * C);
    EXPECT_TRUE(bits_equal(g.host(), want)) << "window [" << v0 << ", " << v0 + Vl << ")";
  }
}

// The vocabulary-parallel cross-entropy kernels (engine/parallel/tensor_parallel.h) against the
// CPU's: row statistics, losses and the in-place gradient of one rank's columns.
TEST(KernelsCuda, ShardedCrossEntropyMatchesTheCpu) {
  REQUIRE_GPU();
  const int BT = 11, V = 500, v0 = 500;  // rank 1 of 2 over a 1000-word vocabulary
  auto logits = to_t<float>(randn(BT * V, 5, 3.0));
  auto targets = randint(BT, 0, 2 * V, 6);
  targets[3] = -1;
  std::vector<float> mx(BT), se(BT), xt(BT), loss(BT), d = logits;
  cpu::crossentropy_shard_max(mx.data(), logits.data(), BT, V);
  cpu::crossentropy_shard_sum(se.data(), xt.data(), logits.data(), mx.data(), targets.data(), BT, V,
                              v0);
  cpu::crossentropy_shard_loss(loss.data(), mx.data(), se.data(), xt.data(), targets.data(), BT);
  cpu::crossentropy_shard_backward(d.data(), d.data(), mx.data(), se.data(), targets.data(), 0.5f,
                                   BT, V, v0);
  Dev<float> glog(logits), gmx(BT), gse(BT), gxt(BT), gloss(BT);
  Dev<int32_t> gt(targets);
  cuda::crossentropy_shard_max(gmx.get(), glog.get(), BT, V);
  cuda::crossentropy_shard_sum(gse.get(), gxt.get(), glog.get(), gmx.get(), gt.get(), BT, V, v0);
  cuda::crossentropy_shard_loss(gloss.get(), gmx.get(), gse.get(), gxt.get(), gt.get(), BT);
  cuda::crossentropy_shard_backward(glog.get(), glog.get(), gmx.get(), gse.get(), gt.get(), 0.5f,
                                    BT, V, v0);
  expect_close(to_d(gmx.host()), to_d(mx), 0.0, "row max");
  expect_close(to_d(gse.host()), to_d(se), 1e-5, "sum of exponentials");
  expect_close(to_d(gxt.host()), to_d(xt), 0.0, "target logit");
  expect_close(to_d(gloss.host()), to_d(loss), 1e-5, "losses");
  expect_close(to_d(glog.host()), to_d(d), 1e-6, "dlogits (in place)");
}

TEST(KernelsCuda, CrossEntropyAdamWCastsNorms) {
  REQUIRE_GPU();
  const int BT = 9, V = 1000, Vp = 1024;
  auto logits = to_t<float>(randn(BT * Vp, 1, 3.0));
  auto targets = randint(BT, 0, V, 2);
  targets[4] = -1;
  std::vector<float> losses(BT), dl(logits.size());
  cpu::crossentropy_forward_backward(dl.data(), losses.data(), logits.data(), targets.data(), 0.25f,
                                     BT, V, Vp);
  Dev<float> glog(logits), glosses(BT);
  Dev<int32_t> gt(targets);
  cuda::crossentropy_forward_backward(glog.get(), glosses.get(), glog.get(), gt.get(), 0.25f, BT, V,
                                      Vp);
  expect_close(to_d(glosses.host()), to_d(losses), 1e-5, "losses");
  expect_close(to_d(glog.host()), to_d(dl), 1e-6, "dlogits (in place)");

  const size_t n = 70001;
  auto p = to_t<float>(randn(n, 3)), g = to_t<float>(randn(n, 4));
  std::vector<float> m(n), v(n), pc = p;
  std::vector<bf16> plp(n);
  AdamWParams hp;
  hp.weight_decay = 0.1f;
  hp.step = 5;
  cpu::adamw_update(pc.data(), m.data(), v.data(), g.data(), n, hp, plp.data());
  Dev<float> gp(p), gm(n), gv(n), gg(g);
  Dev<bf16> gplp(n);
  cuda::adamw_update(gp.get(), gm.get(), gv.get(), gg.get(), n, hp, gplp.get());
  // Same operations in the same order; the GPU's sqrt/div are correctly rounded too.
  expect_close(to_d(gp.host()), to_d(pc), 1e-6, "params");
  expect_close(to_d(gplp.host()), to_d(plp), 8e-3, "bf16 copy");

  // Casts: exhaustive up-casts, and ties for the down-casts, bit for bit with the CPU.
  std::vector<bf16> hb(65536);
  std::vector<fp16> hf(65536);
  for (uint32_t i = 0; i < 65536; ++i) hb[i].bits = hf[i].bits = uint16_t(i);
  std::vector<float> fb(65536), ff(65536);
  cpu::cast(fb.data(), hb.data(), 65536);
  cpu::cast(ff.data(), hf.data(), 65536);
  Dev<bf16> ghb(hb);
  Dev<fp16> ghf(hf);
  Dev<float> gfb(65536), gff(65536);
  cuda::cast(gfb.get(), ghb.get(), 65536);
  cuda::cast(gff.get(), ghf.get(), 65536);
  EXPECT_TRUE(bits_equal(gfb.host(), fb));
  EXPECT_TRUE(bits_equal(gff.host(), ff));
  auto rnd = to_t<float>(randn(200000, 9, 1000.0));
  std::vector<bf16> db(rnd.size());
  std::vector<fp16> dh(rnd.size());
  cpu::cast(db.data(), rnd.data(), rnd.size());
  cpu::cast(dh.data(), rnd.data(), rnd.size());
  Dev<float> grnd(rnd);
  Dev<bf16> gdb(rnd.size());
  Dev<fp16> gdh(rnd.size());
  cuda::cast(gdb.get(), grnd.get(), rnd.size());
  cuda::cast(gdh.get(), grnd.get(), rnd.size());
  EXPECT_TRUE(bits_equal(gdb.host(), db));
  EXPECT_TRUE(bits_equal(gdh.host(), dh));

  const double ss_cpu = cpu::sum_squares(g.data(), n);
  const double ss_gpu = cuda::sum_squares(gg.get(), n);
  EXPECT_NEAR(ss_gpu, ss_cpu, 1e-12 * ss_cpu);
  EXPECT_EQ(cuda::sum_squares(gg.get(), n), ss_gpu);  // deterministic
  EXPECT_FALSE(cuda::has_inf_or_nan(gg.get(), n));
  std::vector<float> bad(1000, 1.0f);
  bad[999] = NAN;
  Dev<float> gbad(bad);
  EXPECT_TRUE(cuda::has_inf_or_nan(gbad.get(), bad.size()));
}

// ---- fused kernels (docs/GPU.md "Fused kernels"): each against the CPU and against the unfused
// GPU path it replaces (KILN_CUDA_FUSED=0) ----

// Sets the fused-kernel switch for a scope, then restores it.
class FusedScope {
 public:
  explicit FusedScope(bool on) : was_(cuda::fused_kernels()) { cuda::set_fused_kernels(on); }
  ~FusedScope() { cuda::set_fused_kernels(was_); }

 private:
  bool was_;
};

template <typename E>
void check_residual_layernorm(int C) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " C=" << C);
  const int B = 2, T = 19;
  const size_t n = size_t(B) * T * C;
  auto a = to_t<E>(randn(n, 1, 2.0)), b = to_t<E>(randn(n, 2)), w = to_t<E>(randn(C, 3)),
       bias = to_t<E>(randn(C, 4));
  std::vector<E> res(n), out(n);
  std::vector<float> mean(B * T), rstd(B * T);
  cpu::residual_forward(res.data(), a.data(), b.data(), n);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), B,
                         T, C);
  Dev<E> ga(a), gb(b), gw(w), gbias(bias);
  std::vector<E> res_path[2], out_path[2];
  for (int fused = 0; fused < 2; ++fused) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    FusedScope scope(fused == 1);
    Dev<E> gres(n), gout(n);
    Dev<float> gmean(B * T), grstd(B * T);
    cuda::residual_layernorm_forward(gres.get(), gout.get(), gmean.get(), grstd.get(), ga.get(),
                                     gb.get(), gw.get(), gbias.get(), B, T, C);
    res_path[fused] = gres.host();
    out_path[fused] = gout.host();
    EXPECT_TRUE(bits_equal(res_path[fused], res));  // one addition, one rounding: exact
    expect_close(to_d(out_path[fused]), to_d(out), tol<E>(), "out");
    expect_close(to_d(gmean.host()), to_d(mean), 1e-5, "mean");
    expect_close(to_d(grstd.host()), to_d(rstd), 1e-5, "rstd");
  }
  // The fused kernel sums in the unfused one's order: at most one rounding apart (the compiler may
  // contract differently), usually identical.
  expect_close(to_d(out_path[1]), to_d(out_path[0]), tol<E>(), "fused vs unfused out");
}

TEST(KernelsCuda, ResidualLayernormFused) {
  REQUIRE_GPU();
  // 200 / 768: the row in registers (32 per lane); 1600: 64 per lane; 2100: read back.
  for (int C : {200, 768, 1600, 2100}) {
    check_residual_layernorm<float>(C);
    check_residual_layernorm<bf16>(C);
    check_residual_layernorm<fp16>(C);
  }
}

template <typename E>
void check_crossentropy_paths(int BT, int V, int Vp) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype_of<E>()) << " V=" << V << " Vp=" << Vp);
  auto logits = to_t<E>(randn(size_t(BT) * Vp, 11, 3.0));
  // A row with -inf logits (masked words) and a large spread: the online rescaling must cope.
  for (int c = 0; c < V; c += 3) logits[size_t(1) * Vp + c] = from_float<E>(-INFINITY);
  logits[size_t(2) * Vp + 7] = from_float<E>(60.0f);
  auto targets = randint(BT, 0, V, 12);
  targets[0] = -1;
  targets[1] = 1;  // not a -inf column
  std::vector<float> losses(BT);
  std::vector<E> dl = logits;
  cpu::crossentropy_forward_backward(dl.data(), losses.data(), dl.data(), targets.data(), 0.25f, BT,
                                     V, Vp);
  Dev<int32_t> gt(targets);
  std::vector<float> loss_path[2];
  for (int fused = 0; fused < 2; ++fused) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    FusedScope scope(fused == 1);
    Dev<E> glog(logits);
    Dev<float> glosses(BT), gfwd(BT);
    cuda::crossentropy_forward_backward<E>(nullptr, gfwd.get(), glog.get(), gt.get(), 0.25f, BT, V,
                                           Vp);
    cuda::crossentropy_forward_backward(glog.get(), glosses.get(), glog.get(), gt.get(), 0.25f, BT,
                                        V, Vp);
    loss_path[fused] = glosses.host();
    EXPECT_TRUE(bits_equal(gfwd.host(), loss_path[fused]));  // forward-only gives the same losses
    expect_close(to_d(loss_path[fused]), to_d(losses), 1e-5, "losses");
    // dlogits: fp32 within 1e-6 of the probabilities' scale (dloss); bf16/fp16 one rounding.
    expect_close(to_d(glog.host()), to_d(dl), std::is_same_v<E, float> ? 1e-6 : tol<E>(),
                 "dlogits (in place)");
  }
  expect_close(to_d(loss_path[1]), to_d(loss_path[0]), 1e-5, "fused vs unfused losses");
}

TEST(KernelsCuda, CrossEntropyFusedAndUnfused) {
  REQUIRE_GPU();
  check_crossentropy_paths<float>(9, 1000, 1024);
  check_crossentropy_paths<bf16>(9, 1000, 1024);
  check_crossentropy_paths<fp16>(5, 50257, 50257);  // GPT-2's vocabulary, unpadded
  check_crossentropy_paths<bf16>(5, 50257, 50304);
}

// Multi-tensor AdamW: one launch over tensors across chunk boundaries, bit-identical to
// adamw_update per tensor (the unfused path) and close to the CPU.
TEST(KernelsCuda, AdamWMultiTensor) {
  REQUIRE_GPU();
  AdamWParams hp;
  hp.lr = 2e-3f;
  hp.step = 9;
  hp.grad_scale = 0.7f;
  for (int classes : {2, 10}) {  // 10 distinct weight decays: more than the fused kernel's 8
    SCOPED_TRACE(::testing::Message() << classes << " weight decays");
    std::vector<size_t> sizes{1, 65536, 65537, 0, 200003, 31};
    if (classes == 10) sizes.insert(sizes.end(), {7, 8, 9, 10});
    std::vector<std::vector<float>> p, g, m, v;
    for (size_t t = 0; t < sizes.size(); ++t) {
      p.push_back(to_t<float>(randn(sizes[t], 20 + t)));
      g.push_back(to_t<float>(randn(sizes[t], 40 + t)));
      m.push_back(to_t<float>(randn(sizes[t], 60 + t, 0.1)));
      v.push_back(to_t<float>(randn(sizes[t], 80 + t, 0.1, 1.0)));
    }
    auto wd = [&](size_t t) { return classes == 2 ? (t % 2 ? 0.0f : 0.1f) : 0.01f * float(t); };
    std::vector<float> got[2][4];
    std::vector<bf16> got_lp[2];
    for (int fused = 0; fused < 2; ++fused) {
      FusedScope scope(fused == 1);
      std::vector<std::unique_ptr<Dev<float>>> dp, dg, dm, dv;
      std::vector<std::unique_ptr<Dev<bf16>>> dlp;
      std::vector<AdamWTensor> batch;
      for (size_t t = 0; t < sizes.size(); ++t) {
        dp.push_back(std::make_unique<Dev<float>>(p[t]));
        dg.push_back(std::make_unique<Dev<float>>(g[t]));
        dm.push_back(std::make_unique<Dev<float>>(m[t]));
        dv.push_back(std::make_unique<Dev<float>>(v[t]));
        dlp.push_back(std::make_unique<Dev<bf16>>(sizes[t]));
        batch.push_back(AdamWTensor{dp[t]->get(), dm[t]->get(), dv[t]->get(), dg[t]->get(),
                                    t == 5 ? nullptr : dlp[t]->get(), sizes[t], wd(t)});
      }
      cuda::adamw_update_multi(batch.data(), int(batch.size()), hp, DType::kBF16);
      for (size_t t = 0; t < sizes.size(); ++t) {
        auto hp_ = dp[t]->host(), hm = dm[t]->host(), hv = dv[t]->host();
        auto hlp = dlp[t]->host();
        got[fused][0].insert(got[fused][0].end(), hp_.begin(), hp_.end());
        got[fused][1].insert(got[fused][1].end(), hm.begin(), hm.end());
        got[fused][2].insert(got[fused][2].end(), hv.begin(), hv.end());
        got_lp[fused].insert(got_lp[fused].end(), hlp.begin(), hlp.end());
      }
    }
    for (int f = 0; f < 3; ++f) EXPECT_TRUE(bits_equal(got[1][f], got[0][f])) << "field " << f;
    EXPECT_TRUE(bits_equal(got_lp[1], got_lp[0]));
    // Against the CPU.
    std::vector<float> want;
    for (size_t t = 0; t < sizes.size(); ++t) {
      AdamWParams h = hp;
      h.weight_decay = wd(t);
      std::vector<float> pc = p[t], mc = m[t], vc = v[t];
      cpu::adamw_update(pc.data(), mc.data(), vc.data(), g[t].data(), sizes[t], h);
      want.insert(want.end(), pc.begin(), pc.end());
    }
    expect_close(to_d(got[1][0]), to_d(want), 1e-6, "params vs CPU");
  }
}

TEST(KernelsCuda, SumSquaresFused) {
  REQUIRE_GPU();
  const std::vector<size_t> sizes{5, 100003, 0, 65536 * 3 + 1};
  std::vector<std::vector<float>> h;
  std::vector<std::unique_ptr<Dev<float>>> d;
  std::vector<const float*> ptrs, hptrs;
  for (size_t t = 0; t < sizes.size(); ++t) {
    h.push_back(to_t<float>(randn(sizes[t], 90 + t)));
    d.push_back(std::make_unique<Dev<float>>(h[t]));
    ptrs.push_back(d[t]->get());
    hptrs.push_back(h[t].data());
  }
  const double cpu_ss = cpu::sum_squares(hptrs.data(), sizes.data(), int(sizes.size()));
  double ss[2];
  for (int fused = 0; fused < 2; ++fused) {
    FusedScope scope(fused == 1);
    ss[fused] = cuda::sum_squares(ptrs.data(), sizes.data(), int(sizes.size()));
    EXPECT_NEAR(ss[fused], cpu_ss, 1e-12 * cpu_ss);
    EXPECT_EQ(cuda::sum_squares(ptrs.data(), sizes.data(), int(sizes.size())),
              ss[fused]);  // deterministic
  }
  EXPECT_NEAR(ss[1], ss[0], 1e-13 * ss[0]);
  // An inf anywhere makes the sum inf (the overflow check).
  FusedScope scope(true);
  std::vector<float> bad(1000, 1.0f);
  bad[500] = INFINITY;
  Dev<float> gbad(bad);
  ptrs.push_back(gbad.get());
  std::vector<size_t> sizes2 = sizes;
  sizes2.push_back(bad.size());
  EXPECT_FALSE(std::isfinite(cuda::sum_squares(ptrs.data(), sizes2.data(), int(sizes2.size()))));
}

// The MLP's GEMM + GELU operators (cuBLASLt GELU_AUX_BIAS / DGELU epilogues) against the CPU's
// separate operators, with the epilogues on and off. With them on, GELU and its derivative are
// applied to the fp32 accumulator before rounding, so low-precision results may be one more
// rounding away; fp32 is held to 2e-5 of the scale, which also tells the tanh-approximated GELU
// (the CPU's) from the erf one (they differ by up to 4.7e-4).
class EpilogueScope {
 public:
  explicit EpilogueScope(bool on) : was_(cuda::gemm_epilogues()) { cuda::set_gemm_epilogues(on); }
  ~EpilogueScope() { cuda::set_gemm_epilogues(was_); }

 private:
  bool was_;
};

template <typename E>
void check_matmul_gelu(bool epilogue) {
  SCOPED_TRACE(::testing::Message()
               << dtype_name(dtype_of<E>()) << (epilogue ? " epilogue" : " separate"));
  EpilogueScope scope(epilogue);
  const int B = 2, T = 33, C = 96, OC = 256;  // OC: the aux leading dimension, a multiple of 8
  const double t = std::is_same_v<E, float> ? 2e-5 : 2 * tol<E>();
  auto x = to_t<E>(randn(B * T * C, 1)), w = to_t<E>(randn(OC * C, 2, 0.2)),
       b = to_t<E>(randn(OC, 3));
  std::vector<E> pre(B * T * OC), out(pre.size());
  cpu::matmul_forward(pre.data(), x.data(), w.data(), b.data(), B, T, C, OC);
  cpu::gelu_forward(out.data(), pre.data(), pre.size());
  Dev<E> gx(x), gw(w), gb(b), gpre(pre.size()), gout(pre.size());
  cuda::matmul_gelu_forward(gout.get(), gpre.get(), gx.get(), gw.get(), gb.get(), B, T, C, OC);
  expect_close(to_d(gpre.host()), to_d(pre), tol<E>(), "pre-activation (aux)");
  expect_close(to_d(gout.host()), to_d(out), t, "gelu out");

  // Backward of the next layer (OC -> C2) through the GELU: dpre = (dout W2) * gelu'(pre). The
  // CPU reference reads the GPU's pre-activation and GELU output, so only the backward differs.
  const int C2 = 72;
  const auto hpre = gpre.host(), hout = gout.host();
  auto w2 = to_t<E>(randn(C2 * OC, 4, 0.1)), dout = to_t<E>(randn(B * T * C2, 5));
  std::vector<E> dgelu(pre.size()), dpre(pre.size());
  std::vector<float> dw2(w2.size()), db2(C2);
  cpu::matmul_backward(dgelu.data(), dw2.data(), db2.data(), dout.data(), hout.data(), w2.data(), B,
                       T, OC, C2);
  cpu::gelu_backward(dpre.data(), hpre.data(), dgelu.data(), pre.size());
  Dev<E> gw2(w2), gdout(dout),
      gdpre(to_t<E>(randn(pre.size(), 6)));  // overwritten, not accumulated
  Dev<float> gdw2(w2.size()), gdb2(C2);
  cuda::matmul_dgelu_backward(gdpre.get(), gdw2.get(), gdb2.get(), gdout.get(), gout.get(),
                              gw2.get(), gpre.get(), B, T, OC, C2);
  expect_close(to_d(gdpre.host()), to_d(dpre), t, "dpre");
  expect_close(to_d(gdw2.host()), to_d(dw2), 1e-5, "dweight");
  expect_close(to_d(gdb2.host()), to_d(db2), 1e-5, "dbias");
}

TEST(KernelsCuda, MatmulGeluEpilogues) {
  REQUIRE_GPU();
  for (bool epilogue : {true, false}) {
    check_matmul_gelu<float>(epilogue);
    check_matmul_gelu<bf16>(epilogue);
    check_matmul_gelu<fp16>(epilogue);
  }
}

}  // namespace
}  // namespace kiln
