// bench_prefetch: what drawing the next step's batches during a step (engine/data/step_batches.h,
// data.prefetch_next_step) saves, against a simulated device step: per step the trainer's thread
// takes the step's micro-batches (the loader hand-over, int32 inputs/targets, the vocabulary
// check, the copy into pinned memory and the upload - on the CPU backend a memcpy), then waits
// `--compute-ms` for "the device" (a sleep: on a GPU the host thread waits in host_losses while
// the device computes, so its cores are free for the draw; on the CPU backend the compute itself
// runs on the cores - tools/bench/prefetch also runs real `kiln train` steps for that case).
//   bench_prefetch [--manifest M] [--micro-batch B] [--seq T] [--accum A] [--vocab V]
//                  [--compute-ms C] [--steps N] [--warmup W]
// Without --manifest: synthetic data. Prints the machine line on stderr and one JSON line per
// setting on stdout: {"data", "prefetch", "tokens_per_step", "compute_ms", "steps",
// "draw_ms" (median time the step's thread spent getting its batches: the draw, or the wait for
// the draw ahead), "step_ms" (median wall time of a step), "step_ms_min"}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/config/train_config.h"
#include "engine/data/data_source.h"
#include "engine/data/step_batches.h"
#include "engine/device/runtime.h"
#include "tools/bench/bench_machine.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

struct Args {
  std::string manifest;
  int64_t micro_batch = 16, seq = 1024, accum = 8, vocab = 8192;
  double compute_ms = 20;
  int steps = 40, warmup = 5;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run(const Args& a, bool prefetch) {
  TrainConfig c;
  c.model.vocab_size = a.vocab;
  c.model.seq_len = a.seq;
  c.data.micro_batch = a.micro_batch;
  c.data.grad_accum = a.accum;
  c.data.manifest = a.manifest;
  c.data.workers = 1;
  auto src = open_data_source(c.data, c.model, c.run.seed);
  if (!src.is_ok()) {
    std::fprintf(stderr, "bench_prefetch: %s\n", src.status().to_string().c_str());
    return 1;
  }
  StepBatches sb(src->get(), &host_runtime(), a.micro_batch, a.seq, a.vocab, prefetch);
  std::vector<double> draw, step;
  using clock = std::chrono::steady_clock;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    const auto t0 = clock::now();
    const StepBatches::Drawn d = sb.take(static_cast<size_t>(a.accum));
    if (!d.status.is_ok()) {
      std::fprintf(stderr, "bench_prefetch: %s\n", d.status.to_string().c_str());
      return 1;
    }
    const auto t1 = clock::now();
    if (s + 1 < a.warmup + a.steps) sb.prefetch(static_cast<size_t>(a.accum));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.compute_ms));
    // The step reads its batches' losses after "the device" (as the trainer does).
    (void)sb.staged().host_losses(static_cast<size_t>(a.accum));
    const auto t2 = clock::now();
    if (s < a.warmup) continue;
    draw.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    step.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
  }
  std::printf("{\"data\": \"%s\", \"prefetch\": %s, \"tokens_per_step\": %lld, \"compute_ms\": %.1f, "
              "\"steps\": %d, \"draw_ms\": %.3f, \"step_ms\": %.3f, \"step_ms_min\": %.3f}\n",
              a.manifest.empty() ? "synthetic" : "loader", prefetch ? "true" : "false",
              static_cast<long long>(a.micro_batch * a.seq * a.accum), a.compute_ms, a.steps,
              median(draw), median(step), *std::min_element(step.begin(), step.end()));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) {
      std::fprintf(stderr, "bench_prefetch: %s needs a value\n", k.c_str());
      return 2;
    }
    ++i;
    if (k == "--manifest") a.manifest = v;
    else if (k == "--micro-batch") a.micro_batch = std::atoll(v);
    else if (k == "--seq") a.seq = std::atoll(v);
    else if (k == "--accum") a.accum = std::atoll(v);
    else if (k == "--vocab") a.vocab = std::atoll(v);
    else if (k == "--compute-ms") a.compute_ms = std::atof(v);
    else if (k == "--steps") a.steps = std::atoi(v);
    else if (k == "--warmup") a.warmup = std::atoi(v);
    else {
      std::fprintf(stderr, "bench_prefetch: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // Off then on, then off and on again: load from other processes hits both alike.
  for (bool p : {false, true, false, true}) {
    if (int rc = run(a, p)) return rc;
  }
  return 0;
}
