// Kernel micro-benchmarks for the CPU operator API (kernels/ops.h).
//
// Shapes are those of a GPT layer of the given size (defaults: the train_cpu benchmark model,
// vocab 8192, d_model 256, 4 heads, seq 256, micro-batch 8). For each op it prints time per call
// and throughput; matmul is compared with a raw cblas_sgemm call of the same shape measured in
// the same run (the peer), bf16 matmul with that same fp32 sgemm. At the end it adds up one
// training step of the model from the measured kernels (forward + backward + AdamW), which is a
// lower bound of what the engine's step can cost.
//
// usage: bench_kernels [--threads N] [--B 8] [--T 256] [--C 256] [--NH 4] [--V 8192] [--L 4]
//                      [--min-seconds 0.3] [--cpu-time 0|1]
// --cpu-time 1 times with process CPU time (summed over threads) instead of wall time: useful on
// a loaded machine to compare kernels, but it hides parallel speed-up.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/ops.h"
#include "tools/bench/bench_machine.h"

namespace {

using kiln::bf16;
using Clock = std::chrono::steady_clock;

double g_min_seconds = 0.3;
bool g_cpu_time = false;  // --cpu-time 1: measure process CPU time instead of wall time

double now_seconds() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Median seconds per call over repeated runs (at least 5 runs and g_min_seconds in total).
double time_it(const std::function<void()>& fn) {
  fn();  // warm-up (scratch allocation, oneDNN primitive creation)
  std::vector<double> samples;
  auto start = Clock::now();
  while (samples.size() < 5 ||
         std::chrono::duration<double>(Clock::now() - start).count() < g_min_seconds) {
    const double t0 = now_seconds();
    fn();
    samples.push_back(now_seconds() - t0);
    if (samples.size() >= 1000) break;
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

template <typename T>
std::vector<T> random_vec(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = kiln::from_float<T>(dist(rng));
  return v;
}

struct Config {
  int threads = 2, B = 8, T = 256, C = 256, NH = 4, V = 8192, L = 4;
};

struct StepTally {
  double seconds = 0;
  void add(double s, int times = 1) { seconds += s * times; }
};

template <typename T>
void bench_dtype(const Config& cfg, StepTally& step) {
  const char* name = kiln::dtype_name(kiln::dtype_of<T>());
  const int B = cfg.B, T_ = cfg.T, C = cfg.C, NH = cfg.NH, V = cfg.V, L = cfg.L;
  const size_t BT = size_t(B) * T_;
  std::printf("\n[%s]\n", name);

  struct MM {
    const char* what;
    int in, out, rows;  // rows 0: all B*T rows; else one chunk of that many rows
  };
  // The engine runs the LM head in row chunks of ~8 MiB of logits (256 rows fp32, 512 bf16).
  const int head_rows = int(std::min<size_t>(BT, (size_t{8} << 20) / (size_t(V) * sizeof(T))));
  const MM shapes[] = {{"qkv", C, 3 * C, 0},  {"attn_proj", C, C, 0}, {"fc", C, 4 * C, 0},
                       {"fc_proj", 4 * C, C, 0}, {"lm_head", C, V, 0}, {"lm_chunk", C, V, head_rows}};
  std::printf("%-10s %12s %9s %10s %10s %12s %8s\n", "matmul", "rows x OC", "fwd ms", "fwd GF/s",
              "bwd ms", "bwd GF/s", "vs sgemm");
  for (const MM& sh : shapes) {
    const size_t rows = sh.rows ? size_t(sh.rows) : BT;
    const int mb = sh.rows ? 1 : B, mt = sh.rows ? sh.rows : T_;
    const MM& s = sh;
    auto inp = random_vec<T>(rows * s.in, 1.0f, 1), w = random_vec<T>(size_t(s.out) * s.in, 0.02f, 2);
    auto bias = random_vec<T>(s.out, 0.02f, 3), dout = random_vec<T>(rows * s.out, 1.0f, 4);
    std::vector<T> out(rows * s.out), dinp(rows * s.in);
    std::vector<float> dw(size_t(s.out) * s.in), db(s.out);
    const bool has_bias = s.out != V;
    double fwd = time_it([&] {
      kiln::cpu::matmul_forward(out.data(), inp.data(), w.data(), has_bias ? bias.data() : nullptr,
                                mb, mt, s.in, s.out);
    });
    double bwd = time_it([&] {
      kiln::cpu::matmul_backward(dinp.data(), dw.data(), has_bias ? db.data() : nullptr,
                                 dout.data(), inp.data(), w.data(), mb, mt, s.in, s.out);
    });
    // Peer: one raw fp32 sgemm of the forward shape, OpenBLAS threaded itself with the same number
    // of threads (Kiln's kernels keep OpenBLAS at 1 thread inside their own fixed chunks).
    auto fi = random_vec<float>(rows * s.in, 1.0f, 1), fw = random_vec<float>(size_t(s.out) * s.in, 0.02f, 2);
    std::vector<float> fo(rows * s.out);
    openblas_set_num_threads(cfg.threads);
    double peer = time_it([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), s.out, s.in, 1.0f, fi.data(),
                  s.in, fw.data(), s.in, 0.0f, fo.data(), s.out);
    });
    openblas_set_num_threads(1);
    const double flops = 2.0 * rows * s.in * s.out;
    std::printf("%-10s %5zux%-6d %9.3f %10.1f %10.3f %12.1f %7.2fx\n", s.what, rows, s.out,
                fwd * 1e3, flops / fwd / 1e9, bwd * 1e3, 2 * flops / bwd / 1e9, peer / fwd);
    // The step adds the LM head as the engine runs it: in chunks.
    if (sh.rows) step.add(fwd + bwd, int((size_t(cfg.B) * cfg.T + rows - 1) / rows));
    else if (std::strcmp(s.what, "lm_head") != 0) step.add(fwd + bwd, L);
  }

  // Attention.
  {
    auto qkv = random_vec<T>(BT * 3 * C, 1.0f, 5), dout = random_vec<T>(BT * C, 1.0f, 6);
    std::vector<T> out(BT * C), dqkv(BT * 3 * C);
    std::vector<float> lse(size_t(B) * NH * T_);
    double fwd = time_it([&] {
      kiln::cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T_, C, NH);
    });
    double bwd = time_it([&] {
      kiln::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                    B, T_, C, NH);
    });
    const int hs = C / NH;
    const double pairs = double(B) * NH * T_ * (T_ + 1) / 2.0;
    const double f_fwd = pairs * hs * 4.0, f_bwd = pairs * hs * 8.0 + pairs * hs * 2.0;
    std::printf("%-22s fwd %8.3f ms %7.1f GF/s   bwd %8.3f ms %7.1f GF/s (causal FLOPs)\n",
                "attention", fwd * 1e3, f_fwd / fwd / 1e9, bwd * 1e3, f_bwd / bwd / 1e9);
    step.add(fwd + bwd, L);
  }

  // Layernorm, GELU, residual (bandwidth-bound: report GB/s of tensor traffic).
  {
    const size_t n = BT * C;
    auto x = random_vec<T>(n, 1.0f, 7), w = random_vec<T>(C, 1.0f, 8), b = random_vec<T>(C, 0.1f, 9);
    auto dy = random_vec<T>(n, 1.0f, 10);
    std::vector<T> y(n), dx(n);
    std::vector<float> mean(BT), rstd(BT), dw(C), db(C);
    double fwd = time_it([&] {
      kiln::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                   B, T_, C);
    });
    double bwd = time_it([&] {
      kiln::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), B, T_, C);
    });
    const double bytes = double(n) * sizeof(T);
    std::printf("%-22s fwd %8.3f ms %7.1f GB/s   bwd %8.3f ms %7.1f GB/s\n", "layernorm",
                fwd * 1e3, 2 * bytes / fwd / 1e9, bwd * 1e3, 4 * bytes / bwd / 1e9);
    step.add(fwd + bwd, 2 * L + 1);
    double rf = time_it([&] { kiln::cpu::residual_forward(y.data(), x.data(), dy.data(), n); });
    double rb = time_it([&] { kiln::cpu::residual_backward(dx.data(), y.data(), dy.data(), n); });
    std::printf("%-22s fwd %8.3f ms %7.1f GB/s   bwd %8.3f ms %7.1f GB/s\n", "residual",
                rf * 1e3, 3 * bytes / rf / 1e9, rb * 1e3, 5 * bytes / rb / 1e9);
    step.add(rf + rb, 2 * L);
  }
  {
    const size_t n = BT * 4 * C;
    auto x = random_vec<T>(n, 1.0f, 11), dy = random_vec<T>(n, 1.0f, 12);
    std::vector<T> y(n), dx(n);
    double fwd = time_it([&] { kiln::cpu::gelu_forward(y.data(), x.data(), n); });
    double bwd = time_it([&] { kiln::cpu::gelu_backward(dx.data(), x.data(), dy.data(), n); });
    const double bytes = double(n) * sizeof(T);
    std::printf("%-22s fwd %8.3f ms %7.1f GB/s   bwd %8.3f ms %7.1f GB/s  (%.0f Melem/s fwd)\n",
                "gelu", fwd * 1e3, 2 * bytes / fwd / 1e9, bwd * 1e3, 4 * bytes / bwd / 1e9,
                n / fwd / 1e6);
    step.add(fwd + bwd, L);
  }
  // Fused cross-entropy (forward + backward, in place).
  {
    auto logits0 = random_vec<T>(BT * V, 2.0f, 13);
    std::vector<T> logits = logits0;
    std::vector<float> losses(BT);
    std::mt19937 rng(14);
    std::vector<int32_t> targets(BT);
    for (auto& t : targets) t = int32_t(rng() % V);
    double ce = time_it([&] {
      kiln::cpu::crossentropy_forward_backward(logits.data(), losses.data(), logits.data(),
                                               targets.data(), 1.0f / BT, int(BT), V, V);
    });
    std::printf("%-22s fwd+bwd %8.3f ms %7.1f GB/s  (%.0f Mlogit/s)\n", "crossentropy",
                ce * 1e3, 2.0 * BT * V * sizeof(T) / ce / 1e9, BT * V / ce / 1e6);
    step.add(ce);
  }
  // Embedding.
  {
    auto wte = random_vec<T>(size_t(V) * C, 0.02f, 15), wpe = random_vec<T>(size_t(T_) * C, 0.02f, 16);
    std::vector<int32_t> tokens(BT);
    for (size_t i = 0; i < BT; ++i) tokens[i] = int32_t((i * 7919) % V);
    std::vector<T> out(BT * C);
    std::vector<float> dwte(size_t(V) * C), dwpe(size_t(T_) * C);
    double fwd = time_it([&] {
      kiln::cpu::encoder_forward(out.data(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T_,
                                 C);
    });
    double bwd = time_it([&] {
      kiln::cpu::encoder_backward(dwte.data(), dwpe.data(), out.data(), tokens.data(), nullptr, B,
                                  T_, C);
    });
    std::printf("%-22s fwd %8.3f ms              bwd %8.3f ms\n", "encoder", fwd * 1e3, bwd * 1e3);
    step.add(fwd + bwd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();  // CPU model and the ISA paths this run takes
  Config cfg;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--threads") cfg.threads = v;
    else if (a == "--B") cfg.B = v;
    else if (a == "--T") cfg.T = v;
    else if (a == "--C") cfg.C = v;
    else if (a == "--NH") cfg.NH = v;
    else if (a == "--V") cfg.V = v;
    else if (a == "--L") cfg.L = v;
    else if (a == "--min-seconds") g_min_seconds = std::atof(argv[i + 1]);
    else if (a == "--cpu-time") g_cpu_time = v != 0;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  kiln::cpu::set_num_threads(cfg.threads);
  std::printf("kernels: threads=%d B=%d T=%d C=%d NH=%d V=%d layers=%d\n%s\n", cfg.threads,
              cfg.B, cfg.T, cfg.C, cfg.NH, cfg.V, cfg.L, kiln::cpu::describe_cpu_runtime().c_str());
  const size_t n_params = size_t(cfg.V) * cfg.C + size_t(cfg.T) * cfg.C +
                          size_t(cfg.L) * (12 * size_t(cfg.C) * cfg.C + 13 * size_t(cfg.C)) +
                          2 * size_t(cfg.C);
  double adamw = 0;
  {
    std::vector<float> p(n_params, 0.01f), m(n_params), v(n_params), g(n_params, 1e-3f);
    std::vector<bf16> plp(n_params);
    kiln::AdamWParams hp;
    adamw = time_it([&] { kiln::cpu::adamw_update(p.data(), m.data(), v.data(), g.data(), n_params, hp, plp.data()); });
    double norm = time_it([&] { (void)kiln::cpu::sum_squares(g.data(), n_params); });
    std::printf("adamw (%zu params, +bf16 copy) %8.3f ms %6.1f GB/s   grad norm %8.3f ms\n",
                n_params, adamw * 1e3, n_params * 18.0 / adamw / 1e9, norm * 1e3);
    adamw += norm;
  }
  const double tokens = double(cfg.B) * cfg.T;
  StepTally fp32, bf;
  bench_dtype<float>(cfg, fp32);
  bench_dtype<bf16>(cfg, bf);
  std::printf("\nstep from kernels alone (fwd+bwd of every op + AdamW + norm), %zu params:\n", n_params);
  std::printf("  fp32 %8.1f ms  -> %8.0f tokens/s\n", (fp32.seconds + adamw) * 1e3,
              tokens / (fp32.seconds + adamw));
  std::printf("  bf16 %8.1f ms  -> %8.0f tokens/s\n", (bf.seconds + adamw) * 1e3,
              tokens / (bf.seconds + adamw));
  return 0;
}
