// bench_train_cpu: tokens/s of a full training step (forward, backward, global-norm clip, AdamW)
// of Kiln's engine on the CPU, and the process's peak memory.
//   bench_train_cpu [--precision fp32|bf16|fp16] [--recompute none|selective|full] [--threads N]
//                   [--steps N] [--warmup N] [--vocab V] [--d-model C] [--layers L] [--heads H]
//                   [--seq T] [--micro-batch B]
// Defaults: the benchmark model (vocab 8192, d_model 256, 4 layers, 4 heads, seq 256,
// micro-batch 8), fp32, no recompute, 2 threads, 3 warm-up + 10 timed steps on random tokens.
// Prints one JSON line: {"impl": "kiln", "precision", "recompute", "tokens_per_s", "step_ms",
// "step_ms_min" (median and fastest step), "peak_rss_mib", "activation_mib", ...}. tools/bench/train_cpu runs it next to
// PyTorch.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/params.h"
#include "engine/rng.h"
#include "kernels/ops.h"

using namespace kiln;
using namespace kiln::engine;

int main(int argc, char** argv) {
  std::string precision = "fp32", recompute = "none";
  int threads = 2, steps = 10, warmup = 3;
  ModelConfig m;
  m.vocab_size = 8192;
  m.d_model = 256;
  m.n_layers = 4;
  m.n_heads = 4;
  m.seq_len = 256;
  int64_t B = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--precision") precision = v;
    else if (k == "--recompute") recompute = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--steps") steps = std::atoi(v.c_str());
    else if (k == "--warmup") warmup = std::atoi(v.c_str());
    else if (k == "--vocab") m.vocab_size = std::atoll(v.c_str());
    else if (k == "--d-model") m.d_model = std::atoll(v.c_str());
    else if (k == "--layers") m.n_layers = std::atoll(v.c_str());
    else if (k == "--heads") m.n_heads = std::atoll(v.c_str());
    else if (k == "--seq") m.seq_len = std::atoll(v.c_str());
    else if (k == "--micro-batch") B = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  Precision p = precision == "bf16" ? Precision::kBf16
                : precision == "fp16" ? Precision::kFp16 : Precision::kFp32;
  Recompute r = recompute == "selective" ? Recompute::kSelective
                : recompute == "full" ? Recompute::kFull : Recompute::kNone;
  cpu::set_num_threads(threads);

  ParamStore params(m, p);
  params.init(1);
  auto model = Model::create(&params, B, r);
  OptimizerConfig oc;
  oc.lr = 3e-4;
  oc.clip_grad = 1.0f;
  AdamW opt(oc);
  const int64_t T = m.seq_len;
  std::vector<int32_t> in(B * T), tg(B * T);
  std::vector<float> losses(B * T);
  const double scale = p == Precision::kFp16 ? 1024.0 : 1.0;
  std::vector<double> ms;
  double loss0 = 0, loss_last = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    for (int64_t i = 0; i < B * T; ++i) {
      in[i] = static_cast<int32_t>(random_bits(s, 1, i) % m.vocab_size);
      tg[i] = static_cast<int32_t>(random_bits(s, 2, i) % m.vocab_size);
    }
    auto t0 = std::chrono::steady_clock::now();
    params.zero_grads();
    model->forward_backward(in.data(), tg.data(), static_cast<float>(scale / (B * T)), losses.data());
    StepStats st = opt.step(params, oc.lr, scale);
    auto t1 = std::chrono::steady_clock::now();
    if (!st.finite) std::fprintf(stderr, "warning: non-finite gradients at step %d\n", s);
    double l = 0;
    for (float x : losses) l += x;
    l /= static_cast<double>(B * T);
    if (s == 0) loss0 = l;
    loss_last = l;
    if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  // The median step: robust to other processes taking the cores for a moment.
  std::sort(ms.begin(), ms.end());
  const double mean = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  const double best = ms.front();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  ActivationMemory a = model->activation_memory();
  std::printf(
      "{\"impl\": \"kiln\", \"precision\": \"%s\", \"recompute\": \"%s\", \"threads\": %d, "
      "\"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"step_ms_min\": %.2f, \"peak_rss_mib\": %.1f, "
      "\"activation_mib\": %.1f, \"model_state_mib\": %.1f, \"params\": %zu, \"loss_first\": %.4f, "
      "\"loss_last\": %.4f, \"native_bf16_gemm\": %s}\n",
      precision.c_str(), recompute.c_str(), threads, static_cast<double>(B * T) / (mean / 1e3), mean,
      best, ru.ru_maxrss / 1024.0, (a.kept_bytes + a.recompute_bytes) / 1048576.0,
      params.state_bytes() / 1048576.0, params.num_params(), loss0, loss_last,
      cpu::have_native_bf16_gemm() ? "true" : "false");
  return 0;
}
