// bench_train_cpu: tokens/s of a full training step (forward, backward, global-norm clip, AdamW)
// of Kiln's engine on the CPU, and the process's peak memory.
//   bench_train_cpu [--precision fp32|bf16|fp16] [--recompute none|selective|full] [--threads N]
//                   [--steps N] [--warmup N] [--vocab V] [--d-model C] [--layers L] [--heads H]
//                   [--seq T] [--micro-batch B]
//                   [--arch gpt2|llama] [--kv-heads N] [--ffn N] [--doc-len N | --manifest PATH]
// Defaults: the benchmark model (vocab 8192, d_model 256, 4 layers, 4 heads, seq 256,
// micro-batch 8), fp32, no recompute, 2 threads, 3 warm-up + 10 timed steps on random tokens.
// --arch llama: the Llama blocks (engine/model/model.h; --kv-heads, --ffn; untied, no biases).
// Document masking (llama): --doc-len N packs documents of N tokens into every row (the rows of
// the PyTorch peer, tools/bench/train_cpu_torch.py, are the same); --manifest PATH takes the rows
// and their document starts from the loader over a `kiln prep` dataset (the real packing) and
// also reports "attn_pairs_kept" (the share of the causal attention's query-key pairs a document
// mask keeps) and "attn_blocks_kept" (the share of the causal 64 x 64 blocks the CPU kernel
// still computes: what the skipping saves).
// Prints the machine line (tools/bench/bench_machine.h) on stderr and one JSON line on stdout:
//   {"impl": "kiln", "precision", "recompute", "threads", "steps", "warmup",
//    "tokens_per_s", "step_ms", "step_ms_min"  (wall time: median and fastest timed step),
//    "cpu_ms"                                  (process CPU time of the median step, all threads),
//    "rss_start_mib", "peak_rss_mib", "train_mib" (peak RSS minus the RSS at start: what training
//                                                  adds to a process that has loaded its
//                                                  libraries),
//    "activation_mib_measured" (peak RSS growth over the first forward+backward, after the weights,
//                               gradients and optimizer state are resident: activations, their
//                               gradients and kernel workspaces, as the OS counts them),
//    "activation_mib_planned"  (what the engine's plan says it allocates, for comparison), ...}.
// tools/bench/train_cpu runs it next to PyTorch.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/run.h"
#include "engine/data/data_source.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "kernels/ops.h"
#include "tools/bench/bench_machine.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

// A field of /proc/self/status in MiB ("VmRSS", "VmHWM").
double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + key.size()) / 1024.0;
  }
  return 0;
}

// Resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0); false if not possible.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.close();
  return static_cast<bool>(out);
}

double cpu_ms_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

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
  int64_t doc_len = 0;
  std::string manifest;
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
    else if (k == "--arch")
      m.arch = v == "llama" ? Arch::kLlama : Arch::kGpt2;
    else if (k == "--kv-heads")
      m.n_kv_heads = std::atoll(v.c_str());
    else if (k == "--ffn")
      m.ffn_hidden = std::atoll(v.c_str());
    else if (k == "--doc-len")
      doc_len = std::atoll(v.c_str());
    else if (k == "--manifest")
      manifest = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (m.llama()) {
    m.tie_embeddings = false;
    m.bias = false;
    m.doc_mask = doc_len > 0 || !manifest.empty();
  }
  Precision p = precision == "bf16" ? Precision::kBf16
                : precision == "fp16" ? Precision::kFp16 : Precision::kFp32;
  Recompute r = recompute == "selective" ? Recompute::kSelective
                : recompute == "full" ? Recompute::kFull : Recompute::kNone;
  const double rss_start = status_mib("VmRSS");
  cpu::set_num_threads(threads);
  bench::print_machine(stderr);

  ParamStore params(m, p);
  params.init(1);  // weights, gradients and moments: resident from here on
  params.zero_grads();
  OptimizerConfig oc;
  oc.lr = 3e-4;
  oc.clip_grad = 1.0f;
  AdamW opt(oc);
  // Activation memory, measured: from here to the end of the first forward+backward, everything
  // that becomes resident is the model's activation buffers, activation gradients and workspaces.
  double peak_before = status_mib("VmHWM");
  const bool can_reset = reset_peak_rss();
  const double rss_before_model = status_mib("VmRSS");
  double activation_measured = -1;
  auto model = Model::create(&params, B, r);
  const int64_t T = m.seq_len;
  std::vector<int32_t> in(B * T), tg(B * T), ds(B * T, 0);
  // Real packing: the loader's rows and document starts (random tokens otherwise).
  std::unique_ptr<DataSource> data;
  double pairs_kept = 0, pairs_all = 0, blocks_kept = 0, blocks_all = 0;
  if (!manifest.empty()) {
    DataConfig dc;
    dc.manifest = manifest;
    dc.micro_batch = B;
    auto opened = open_data_source(dc, m, RunConfig{}.seed);
    if (!opened.is_ok()) {
      std::fprintf(stderr, "%s\n", opened.status().to_string().c_str());
      return 2;
    }
    data = std::move(*opened);
  }
  std::vector<float> losses(B * T);
  const double scale = p == Precision::kFp16 ? 1024.0 : 1.0;
  std::vector<double> ms, cpu_ms;
  double loss0 = 0, loss_last = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (data) {
      MicroBatch mb;
      Status st = data->next(&mb);
      if (!st.is_ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
      in = mb.inputs, tg = mb.targets, ds = mb.doc_start;
      // What the mask keeps of causal attention: query-key pairs, and 64 x 64 blocks (the CPU
      // kernel's: key blocks before the query block's first document are skipped).
      for (int64_t r = 0; r < B; ++r) {
        const int32_t* d = ds.data() + r * T;
        for (int64_t t = 0; t < T; ++t) {
          pairs_kept += static_cast<double>(t - d[t] + 1);
          pairs_all += static_cast<double>(t + 1);
        }
        for (int64_t i0 = 0; i0 < T; i0 += 64) {
          const int64_t last = std::min<int64_t>(T, i0 + 64) - 1;
          blocks_all += static_cast<double>(last / 64 + 1);
          blocks_kept += static_cast<double>(last / 64 + 1 - d[i0] / 64);
        }
      }
    } else {
      for (int64_t i = 0; i < B * T; ++i) {
        in[i] = static_cast<int32_t>(random_bits(s, 1, i) % m.vocab_size);
        tg[i] = static_cast<int32_t>(random_bits(s, 2, i) % m.vocab_size);
        ds[i] = doc_len > 0 ? static_cast<int32_t>((i % T) / doc_len * doc_len) : 0;
      }
    }
    const double c0 = cpu_ms_now();
    auto t0 = std::chrono::steady_clock::now();
    params.zero_grads();
    model->forward_backward(in.data(), tg.data(), static_cast<float>(scale / (B * T)),
                            losses.data(), ds.data());
    if (s == 0 && can_reset) activation_measured = status_mib("VmHWM") - rss_before_model;
    StepStats st = opt.step(params, oc.lr, scale);
    auto t1 = std::chrono::steady_clock::now();
    const double c1 = cpu_ms_now();
    if (!st.finite) std::fprintf(stderr, "warning: non-finite gradients at step %d\n", s);
    double l = 0;
    for (float x : losses) l += x;
    l /= static_cast<double>(B * T);
    if (s == 0) loss0 = l;
    loss_last = l;
    if (s >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpu_ms.push_back(c1 - c0);
    }
  }
  // The median step: robust to other processes taking the cores for a moment.
  const double step_ms = median(ms);
  const double best = *std::min_element(ms.begin(), ms.end());
  const double peak = std::max(peak_before, status_mib("VmHWM"));
  ActivationMemory a = model->activation_memory();
  std::printf(
      "{\"impl\": \"kiln\", \"precision\": \"%s\", \"recompute\": \"%s\", \"threads\": %d, "
      "\"steps\": %d, \"warmup\": %d, \"tokens_per_s\": %.1f, \"step_ms\": %.2f, "
      "\"step_ms_min\": %.2f, \"cpu_ms\": %.2f, \"rss_start_mib\": %.1f, \"peak_rss_mib\": %.1f, "
      "\"train_mib\": %.1f, \"activation_mib_measured\": %.1f, \"activation_mib_planned\": %.1f, "
      "\"model_state_mib\": %.1f, \"params\": %zu, \"loss_first\": %.4f, \"loss_last\": %.4f, "
      "\"native_bf16_gemm\": %s, \"cpu\": \"%s\", \"isa\": \"%s\", \"bf16_gemm\": \"%s\", "
      "\"cpu_flags\": \"%s\", \"arch\": \"%s\", \"doc_mask\": %s, \"doc_len\": %lld, "
      "\"real_packing\": %s, \"attn_pairs_kept\": %.4f, \"attn_blocks_kept\": %.4f}\n",
      precision.c_str(), recompute.c_str(), threads, steps, warmup,
      static_cast<double>(B * T) / (step_ms / 1e3), step_ms, best, median(cpu_ms), rss_start, peak,
      peak - rss_start, activation_measured, a.total() / 1048576.0,
      params.state_bytes() / 1048576.0, params.num_params(), loss0, loss_last,
      cpu::have_native_bf16_gemm() ? "true" : "false", bench::cpu_model().c_str(),
      cpu::isa_name(cpu::cpu_runtime().isa), cpu::bf16_gemm_name(cpu::cpu_runtime().bf16_gemm),
      bench::cpu_isa_flags().c_str(), arch_name(m.arch), m.doc_mask ? "true" : "false",
      static_cast<long long>(doc_len), data ? "true" : "false",
      pairs_all > 0 ? pairs_kept / pairs_all : 1.0,
      blocks_all > 0 ? blocks_kept / blocks_all : 1.0);
  return 0;
}
