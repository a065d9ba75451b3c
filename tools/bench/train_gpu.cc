// bench_train_gpu: tokens/s, MFU, peak device memory and the device time split by kernel family
// of a full training step (zero gradients, forward + backward, global norm + clip, AdamW) of
// Kiln's engine on one GPU. tools/bench/train_gpu runs it beside PyTorch on the same model and
// batch (tools/bench/train_gpu_torch.py) and prints the table (train_gpu_report.py).
//   bench_train_gpu --config FILE [--set key=value]... [--micro-batch B] [--steps N] [--warmup N]
//                   [--device cuda|cpu] [--no-kernel-times]
// The model, precision and activation checkpointing come from the train config (with --set
// overrides); batches are random tokens (the speed does not depend on the data). Defaults: cuda,
// 3 warm-up + 10 timed steps, the config's micro-batch. --device cpu runs the same harness on the
// CPU backend (for tests of the harness on machines without a GPU: no MFU, no kernel split).
// The kernel split brackets every operator with CUDA events (a few microseconds of host time
// per operator): the timed steps run with it off, then --kernel-steps (default 3) more with it on.
// Prints one JSON line on stdout:
//   {"impl": "kiln", "model", "device", "gpu", "precision", "recompute", "micro_batch", "seq_len",
//    "vocab", "d_model", "layers", "heads", "params", "flops_per_token", "peak_flops" (null when
//    the GPU is not in engine/train/mfu.cc's table), "steps", "warmup", "step_ms" (median),
//    "step_ms_min", "tokens_per_s", "mfu" (null without a peak), "device_memory_peak_mib" (the
//    driver's used memory at its highest, sampled after each step: context and workspaces
//    included), "allocated_peak_mib" (what the engine allocated), "kernel_ms" {family: device ms
//    per step, mean over the kernel steps} (null on the CPU), "loss_first", "loss_last"}
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/config/train_config.h"
#include "engine/device/runtime.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "engine/train/mfu.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_or_null(double v, const char* fmt) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

int usage(const std::string& msg) {
  std::fprintf(stderr,
               "bench_train_gpu: %s\nusage: bench_train_gpu --config FILE [--set key=value]... "
               "[--micro-batch B] [--steps N] [--warmup N] [--kernel-steps N] "
               "[--device cuda|cpu] [--no-kernel-times]\n",
               msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_file, device_name_arg = "cuda";
  std::vector<std::string> sets;
  int64_t micro_batch = 0;
  int steps = 10, warmup = 3, kernel_steps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--no-kernel-times") {
      kernel_steps = 0;
      continue;
    }
    if (i + 1 >= argc) return usage("option " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--config") config_file = v;
    else if (k == "--set") sets.push_back(v);
    else if (k == "--micro-batch") micro_batch = std::atoll(v.c_str());
    else if (k == "--steps") steps = std::atoi(v.c_str());
    else if (k == "--warmup") warmup = std::atoi(v.c_str());
    else if (k == "--kernel-steps") kernel_steps = std::atoi(v.c_str());
    else if (k == "--device") device_name_arg = v;
    else return usage("unknown option " + k);
  }
  if (config_file.empty()) return usage("--config is required");
  if (steps < 1 || warmup < 0 || kernel_steps < 0) return usage("--steps must be >= 1");
  sets.push_back("device=" + device_name_arg);
  auto cfg = load_train_config(config_file, sets);
  if (!cfg.is_ok()) return std::fprintf(stderr, "bench_train_gpu: %s\n", cfg.status().to_string().c_str()), 2;
  auto tc = parse_train_config(*cfg);
  if (!tc.is_ok()) return std::fprintf(stderr, "bench_train_gpu: %s\n", tc.status().to_string().c_str()), 2;
  auto rt = runtime_for(tc->device);
  if (!rt.is_ok())
    return std::fprintf(stderr, "bench_train_gpu: %s\n", rt.status().to_string().c_str()), 2;
  Runtime* runtime = *rt;
  const ModelConfig& m = tc->model;
  const int64_t B = micro_batch > 0 ? micro_batch : tc->data.micro_batch;
  const int64_t T = m.seq_len;
  std::fprintf(stderr, "bench_train_gpu: %s on %s, %s, micro-batch %lld x %lld\n",
               config_file.c_str(), runtime->describe().c_str(), precision_name(tc->precision),
               static_cast<long long>(B), static_cast<long long>(T));

  ParamStore params(m, tc->precision, false, runtime);
  params.init(tc->run.seed);
  OptimizerConfig oc = tc->optimizer;
  AdamW opt(oc);
  auto model = Model::create(&params, B, tc->activation_checkpointing);
  const size_t n = static_cast<size_t>(B * T);
  std::vector<int32_t> in(n), tg(n), ds(n);
  std::vector<float> losses(n);
  DeviceArray<int32_t> d_in(runtime, n), d_tg(runtime, n), d_ds(runtime, n);
  // model.doc_mask (llama configs): random tokens packed as documents of kBenchDocLen tokens.
  constexpr int64_t kBenchDocLen = 512;
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(i) % T;
    ds[i] = static_cast<int32_t>(t / kBenchDocLen * kBenchDocLen);
  }
  runtime->copy_to_device(d_ds.data(), ds.data(), n * sizeof(int32_t));
  DeviceArray<float> d_loss(runtime, n);
  const double loss_scale = tc->precision == Precision::kFp16 ? 1024.0 : 1.0;
  std::vector<double> ms;
  std::map<std::string, double> kernel_ms;
  double loss_first = NAN, loss_last = NAN;
  size_t device_peak = 0;
  const int total = warmup + steps + (tc->device == Device::kCuda ? kernel_steps : 0);
  for (int s = 0; s < total; ++s) {
    const bool timed_kernels = s >= warmup + steps;
    for (size_t i = 0; i < n; ++i) {
      in[i] = static_cast<int32_t>(random_bits(s, 1, i) % m.vocab_size);
      tg[i] = static_cast<int32_t>(random_bits(s, 2, i) % m.vocab_size);
    }
    // Uploads before the clock: the trainer overlaps them with the previous step.
    runtime->copy_to_device(d_in.data(), in.data(), n * sizeof(int32_t));
    runtime->copy_to_device(d_tg.data(), tg.data(), n * sizeof(int32_t));
    runtime->synchronize();
    if (timed_kernels && s == warmup + steps) runtime->set_kernel_timing(true);
    const auto t0 = std::chrono::steady_clock::now();
    params.zero_grads();
    model->forward_backward(d_in.data(), d_tg.data(), static_cast<float>(loss_scale / n),
                            d_loss.data(), d_ds.data());
    const StepStats st = opt.step(params, oc.lr, loss_scale);
    runtime->synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.finite) std::fprintf(stderr, "bench_train_gpu: non-finite gradients at step %d\n", s);
    runtime->copy_to_host(losses.data(), d_loss.data(), n * sizeof(float));
    double l = 0;
    for (float x : losses) l += x;
    l /= static_cast<double>(n);
    if (s == 0) loss_first = l;
    loss_last = l;
    device_peak = std::max(device_peak, runtime->memory().used_by_process);
    if (s >= warmup && !timed_kernels) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (timed_kernels) {
      for (const auto& [family, t] : runtime->take_kernel_times())
        kernel_ms[family] += t / kernel_steps;
    }
  }
  runtime->set_kernel_timing(false);

  const double step_ms = median(ms);
  const double tokens_per_s = static_cast<double>(n) / (step_ms / 1e3);
  const double flops = model_flops_per_token(m, params.num_params());
  const auto peak = dense_bf16_peak_flops(runtime->product_name());
  const double peak_flops = peak ? *peak : NAN;
  const double mfu = peak ? tokens_per_s * flops / *peak : NAN;
  std::string kernels = "null";
  if (!kernel_ms.empty()) {
    kernels = "{";
    for (const auto& [family, t] : kernel_ms) {
      kernels += (kernels.size() > 1 ? ", \"" : "\"") + family + "\": " + json_or_null(t, "%.3f");
    }
    kernels += "}";
  }
  const DeviceMemory mem = runtime->memory();
  std::printf(
      "{\"impl\": \"kiln\", \"model\": \"%s\", \"arch\": \"%s\", \"doc_mask\": %s, "
      "\"device\": \"%s\", \"gpu\": \"%s\", "
      "\"precision\": \"%s\", \"recompute\": \"%s\", \"micro_batch\": %lld, \"seq_len\": %lld, "
      "\"vocab\": %lld, \"d_model\": %lld, \"layers\": %lld, \"heads\": %lld, "
      "\"kv_heads\": %lld, \"ffn\": %lld, \"doc_len\": %lld, "
      "\"params\": %zu, \"flops_per_token\": %.6g, \"peak_flops\": %s, \"steps\": %d, "
      "\"warmup\": %d, \"step_ms\": %.3f, \"step_ms_min\": %.3f, \"tokens_per_s\": %.1f, "
      "\"mfu\": %s, \"device_memory_peak_mib\": %s, \"allocated_peak_mib\": %.1f, "
      "\"kernel_ms\": %s, \"loss_first\": %.4f, \"loss_last\": %.4f}\n",
      config_file.c_str(), arch_name(m.arch), m.doc_mask ? "true" : "false",
      device_name(tc->device), runtime->product_name().c_str(), precision_name(tc->precision),
      recompute_name(tc->activation_checkpointing), static_cast<long long>(B),
      static_cast<long long>(T), static_cast<long long>(m.vocab_size),
      static_cast<long long>(m.d_model), static_cast<long long>(m.n_layers),
      static_cast<long long>(m.n_heads), static_cast<long long>(m.kv_heads()),
      static_cast<long long>(m.ffn()), static_cast<long long>(m.doc_mask ? kBenchDocLen : 0),
      params.num_params(), flops, json_or_null(peak_flops, "%.6g").c_str(), steps, warmup, step_ms,
      *std::min_element(ms.begin(), ms.end()), tokens_per_s, json_or_null(mfu, "%.4f").c_str(),
      tc->device == Device::kCuda ? json_or_null(device_peak / 1048576.0, "%.1f").c_str() : "null",
      mem.peak / 1048576.0, kernels.c_str(), loss_first, loss_last);
  return 0;
}
