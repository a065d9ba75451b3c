// Loader throughput, restore latency, memory and consumer wait (see tools/bench/loader, which
// builds this, generates the datasets and runs the modes below).
//
//   bench_loader make DIR MB [S]        writes a ~MB MB (uncompressed tar) two-domain dataset
//                                       (web 70%, code 30%) of .tar.zst shards + manifest.json,
//                                       at most S samples per shard (default 10000, kiln prep's)
//   bench_loader run DIR [--workers N] [--seq-len T] [--micro-batch B] [--passes P]
//       1. `zstd -d -c` over every shard (page cache warm), timed: the peer, in tar bytes/s.
//       2. the loader for one epoch's worth of tokens (workers N, packing into seq_len+1):
//          tokens/s and tar bytes/s by wall time and per CPU-second of the whole process
//          (every loader thread counted), and the ratio to zstd's rate.
//       3. time to the first batch after restoring states saved at 10%, 50% and 90% of the run
//          (open + restore + next_batch, in a fresh Loader), next to a fresh open's first batch.
//   bench_loader rss DIR [--prefetch P] [--workers N]
//       one epoch; prints the peak resident set size (VmHWM) so runs over datasets of different
//       sizes (separate processes) show memory is bounded by the settings, not the dataset.
//   bench_loader drain DIR [--workers N] [--seq-len T] [--micro-batch B] [--prefetch P] [--passes
//   P]
//       the loader alone (seed 7) for `passes` epochs' worth of tokens, timed from after open to
//       the last batch; prints one JSON line {"steps", "tokens", "wall_s", "cpu_s"}: the C++
//       side of tools/bench/loader_python, which reads the same shards through the Python module.
//   mpirun -np W bench_loader ranks DIR --global-batch G [--workers N] [--seq-len T] [--passes P]
//       each rank: micro-batch G / W, the global batches that cover the dataset's tokens `passes`
//       times; prints one JSON line {"world", "rank", "tokens" (delivered, incl. eos), "tar_bytes"
//       (decompressed), "cpu_s" (the whole process), "wall_s", "first_ms" (open to first batch),
//       "restore_ms" (a fresh loader: open + restore the state saved after 90% of the steps +
//       first batch)}; tools/bench/loader turns them into per-rank read cost and tokens/CPU-s.
//   bench_loader train-metrics RUN/metrics.jsonl
//       the loader's wait in a real `kiln train` run: sum of loader_wait_ms over sum of step_ms
//       (and without step 1, whose wait includes opening the dataset), next to tokens_per_s.
//   bench_loader wait DIR --step-ms S [--steps N]
//       a consumer that takes S ms per step (a trainer whose compute does not use the loader's
//       cores, e.g. a GPU): the loader's consumer wait as a share of step time.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/manifest.h"
#include "format/npy.h"
#include "common/random.h"
#include "format/shard_writer.h"
#include "format/shard_reader.h"
#include "loader/loader.h"
#include "tools/bench/bench_machine.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::loader;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double children_cpu_s() {
  struct rusage ru;
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

long rss_peak_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_loader: %s\n", msg.c_str());
  std::exit(1);
}

template <typename T>
T value(Result<T> r) {
  if (!r.is_ok()) die(r.status().to_string());
  return std::move(r).value();
}

void check(const Status& st) {
  if (!st.is_ok()) die(st.to_string());
}

// ---- make ----------------------------------------------------------------------------------
// Documents of Zipf-distributed pseudo-words (text compresses ~3x with zstd -3, like prose);
// one token per word (vocabulary 8192, eos 0), lengths log-uniform in [300, 12000] bytes.
int make(const std::string& dir, double megabytes, uint64_t samples_per_shard) {
  constexpr int kWords = 8191;
  std::vector<std::string> words(kWords);
  SplitMix64 rng(12345);
  for (int i = 0; i < kWords; ++i) {
    const int len = 2 + static_cast<int>(rng.next() % 9);
    for (int c = 0; c < len; ++c) words[i].push_back(static_cast<char>('a' + rng.next() % 26));
  }
  // Zipf(1) sampling table.
  std::vector<double> cdf(kWords);
  double acc = 0;
  for (int i = 0; i < kWords; ++i) cdf[i] = (acc += 1.0 / (i + 1));
  for (double& c : cdf) c /= acc;
  auto word = [&]() {
    const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    return static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  };
  fs::remove_all(dir);
  Manifest m;
  m.tokenizer.vocab_size = 8192;
  m.tokenizer.eos_id = 0;
  const double t0 = now_s();
  const struct {
    const char* name;
    double share;
  } domains[] = {{"web", 0.7}, {"code", 0.3}};
  for (const auto& d : domains) {
    RollingShardWriter::Options o;
    o.dir = dir + "/shards/" + d.name;
    o.prefix = d.name;
    o.compression = ShardCompression::kZstd;
    o.max_samples = samples_per_shard;  // kiln prep's default: 10000

    o.max_tar_bytes = 256ull << 20;
    fs::create_directories(o.dir);
    RollingShardWriter w(o);
    const uint64_t budget = static_cast<uint64_t>(megabytes * 1e6 * d.share);
    uint64_t bytes = 0;
    std::vector<uint16_t> tokens;
    for (uint64_t i = 0; bytes < budget; ++i) {
      const double len = std::exp(std::log(300.0) + (std::log(12000.0) - std::log(300.0)) *
                                                         (static_cast<double>(rng.next() >> 11) * 0x1.0p-53));
      std::string text;
      tokens.clear();
      while (text.size() < len) {
        const int k = word();
        text += words[k];
        text.push_back(rng.next() % 12 == 0 ? '\n' : ' ');
        tokens.push_back(static_cast<uint16_t>(k + 1));
      }
      ShardSample sample;
      sample.key = std::string(d.name) + "_" + std::to_string(i);
      sample.members.push_back({"txt", text});
      sample.members.push_back({"json", "{\"id\":\"" + sample.key + "\",\"domain\":\"" + d.name +
                                            "\",\"tokens\":" + std::to_string(tokens.size()) + "}"});
      sample.members.push_back({"tokens.npy", npy_encode(tokens)});
      for (const auto& mem : sample.members) bytes += 512 + (mem.data.size() + 511) / 512 * 512;
      check(w.add(sample, tokens.size()));
    }
    for (const ShardInfo& info : value(w.finish())) m.add_shard(info, d.name, dir);
  }
  check(write_manifest(dir + "/manifest.json", m));
  uint64_t disk = 0, tokens = 0;
  for (const auto& sh : m.shards) {
    disk += sh.bytes;
    tokens += sh.tokens;
  }
  std::printf(
      "made %s: %zu shards (at most %llu samples each), %.1f MB on disk, %.1f M tokens, in %.1f "
      "s\n",
      dir.c_str(), m.shards.size(), static_cast<unsigned long long>(samples_per_shard), disk / 1e6,
      tokens / 1e6, now_s() - t0);
  return 0;
}

// ---- run -----------------------------------------------------------------------------------
struct Args {
  int workers = 1;
  int64_t seq_len = 2048;
  int64_t micro_batch = 8;
  int prefetch = 4;
  double step_ms = 0;
  int64_t steps = 0;
  double passes = 1.0;
  int64_t global_batch = 0;
};

Args parse(int argc, char** argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + k);
      return argv[++i];
    };
    if (k == "--workers") a.workers = std::atoi(next().c_str());
    else if (k == "--seq-len") a.seq_len = std::atoll(next().c_str());
    else if (k == "--micro-batch") a.micro_batch = std::atoll(next().c_str());
    else if (k == "--prefetch") a.prefetch = std::atoi(next().c_str());
    else if (k == "--step-ms") a.step_ms = std::atof(next().c_str());
    else if (k == "--steps") a.steps = std::atoll(next().c_str());
    else if (k == "--passes") a.passes = std::atof(next().c_str());
    else if (k == "--global-batch")
      a.global_batch = std::atoll(next().c_str());
    else die("unknown flag " + k);
  }
  return a;
}

loader::LoaderOptions loader_options(const Args& a) {
  loader::LoaderOptions o;
  o.seq_len = a.seq_len;
  o.micro_batch = a.micro_batch;
  o.workers = a.workers;
  o.prefetch_depth = a.prefetch;
  o.seed = 7;
  return o;
}

// Steps that cover the dataset's tokens (plus one eos per document) `passes` times.
int64_t epoch_steps(const Manifest& m, const Args& a) {
  uint64_t tokens = 0;
  for (const auto& sh : m.shards) tokens += sh.tokens + sh.samples;
  return static_cast<int64_t>(a.passes * tokens / (a.seq_len + 1) / a.micro_batch);
}

int run(const std::string& dir, const Args& a) {
  const Manifest m = value(read_manifest(dir));
  std::string files;
  uint64_t disk = 0;
  for (const auto& sh : m.shards) {
    files += " '" + m.shard_path(sh) + "'";
    disk += sh.bytes;
  }
  // Warm the page cache so both sides read from memory.
  if (std::system(("cat" + files + " > /dev/null").c_str()) != 0) die("cat failed");

  // 1. The peer: zstd -d over the same shards (one process, one thread).
  const double c0 = children_cpu_s(), z0 = now_s();
  if (std::system(("zstd -q -d -c" + files + " > /dev/null").c_str()) != 0) die("zstd -d failed");
  const double zstd_wall = now_s() - z0, zstd_cpu = children_cpu_s() - c0;

  // 2. The loader over one epoch's worth of tokens.
  const int64_t steps = epoch_steps(m, a);
  auto loader = value(loader::Loader::open(m, loader_options(a)));
  std::vector<std::pair<double, loader::LoaderState>> saved;  // (fraction, state)
  const double t0 = now_s(), cpu0 = cpu_s();
  double wait_ms = 0;
  for (int64_t i = 0; i < steps; ++i) {
    Batch b = value(loader->next_batch());
    wait_ms += b.wait_ms;
    for (double f : {0.1, 0.5, 0.9}) {
      if (i == static_cast<int64_t>(f * steps)) saved.push_back({f, loader->state()});
    }
  }
  const double wall = now_s() - t0, cpu = cpu_s() - cpu0;
  const loader::LoaderStats st = loader->stats();
  loader.reset();
  // zstd decompressed every shard once: its tar bytes are the dataset's tar bytes. The loader
  // consumed st.tokens tokens; in tar bytes that is st.tokens * (dataset tar bytes / tokens).
  const double dataset_tar = [&] {
    // Total uncompressed tar bytes of the dataset, from a read of every shard's tar size.
    double total = 0;
    for (const auto& sh : m.shards) {
      auto r = value(ShardReader::open(m.shard_path(sh)));
      ShardSample smp;
      while (value(r->next(&smp))) {
      }
      total += static_cast<double>(r->tar_bytes());
    }
    return total;
  }();
  uint64_t manifest_tokens = 0;
  for (const auto& sh : m.shards) manifest_tokens += sh.tokens + sh.samples;
  // Rates per CPU-second use what the CPUs did: every shard the workers read (including the
  // read-ahead past the last consumed batch). Wall rates use the tokens the consumer received.
  const double tokens_per_tar = manifest_tokens / dataset_tar;
  const double read_tar = static_cast<double>(st.tar_bytes);
  const double zstd_rate = dataset_tar / zstd_wall;
  const double zstd_rate_cpu = dataset_tar / std::max(zstd_cpu, 1e-9);
  const double tar_cpu = read_tar / cpu, tok_cpu = read_tar * tokens_per_tar / cpu;
  const double tok_wall = st.tokens / wall, tar_wall = st.tokens / tokens_per_tar / wall;
  std::printf("dataset: %zu shards, %.1f MB tar (%.1f MB .tar.zst), %.1f M tokens incl. eos\n",
              m.shards.size(), dataset_tar / 1e6, disk / 1e6, manifest_tokens / 1e6);
  std::printf("zstd -d (peer): %.1f MB/s tar by wall time, %.1f MB/s per CPU-second\n",
              zstd_rate / 1e6, zstd_rate_cpu / 1e6);
  std::printf(
      "loader (workers=%d, seq_len=%lld, micro_batch=%lld, %lld steps in %.2f s, %.2f cores busy):\n"
      "  per CPU-second: %.1f MB/s tar, %.2f M tokens/s packed  -> %.0f%% of zstd -d's %.1f MB/s\n"
      "  by wall time:   %.1f MB/s tar, %.2f M tokens/s delivered -> %.0f%% of zstd -d's %.1f MB/s\n"
      "  consumer wait %.0f ms (%.0f%% of the run: this consumer does nothing but ask)\n",
      a.workers, static_cast<long long>(a.seq_len), static_cast<long long>(a.micro_batch),
      static_cast<long long>(steps), wall, cpu / wall, tar_cpu / 1e6, tok_cpu / 1e6,
      100.0 * tar_cpu / zstd_rate_cpu, zstd_rate_cpu / 1e6, tar_wall / 1e6, tok_wall / 1e6,
      100.0 * tar_wall / zstd_rate, zstd_rate / 1e6, wait_ms, 100.0 * wait_ms / (wall * 1e3));

  // 3. Time to the first batch after a restore, by depth.
  {
    const double f0 = now_s();
    auto fresh = value(loader::Loader::open(m, loader_options(a)));
    value(fresh->next_batch());
    std::printf("first batch from a fresh open: %.0f ms\n", (now_s() - f0) * 1e3);
  }
  for (const auto& [fraction, state] : saved) {
    const double r0 = now_s();
    auto l = value(loader::Loader::open(m, loader_options(a)));
    check(l->restore(state));
    value(l->next_batch());
    const double ms = (now_s() - r0) * 1e3;
    std::printf("first batch after restoring at %2.0f%% of the epoch (step %lld): %.0f ms\n",
                fraction * 100, static_cast<long long>(state.step), ms);
  }
  return 0;
}

int rss(const std::string& dir, const Args& a) {
  const Manifest m = value(read_manifest(dir));
  const int64_t steps = epoch_steps(m, a);
  auto loader = value(loader::Loader::open(m, loader_options(a)));
  const double t0 = now_s();
  for (int64_t i = 0; i < steps; ++i) value(loader->next_batch());
  uint64_t tar = 0;
  for (const auto& sh : m.shards) tar += sh.bytes;
  std::printf("rss: dataset %.1f MB .tar.zst, %zu shards, prefetch %d, workers %d: peak RSS %.1f MiB "
              "(%lld steps in %.1f s)\n",
              tar / 1e6, m.shards.size(), a.prefetch, a.workers, rss_peak_kib() / 1024.0,
              static_cast<long long>(steps), now_s() - t0);
  return 0;
}

int wait(const std::string& dir, const Args& a) {
  const Manifest m = value(read_manifest(dir));
  if (a.step_ms <= 0 || a.steps <= 0) die("wait needs --step-ms and --steps");
  auto loader = value(loader::Loader::open(m, loader_options(a)));
  value(loader->next_batch());  // the first batch's wait is start-up, reported separately below
  double wait_ms = 0, max_wait = 0;
  const double t0 = now_s();
  for (int64_t i = 0; i < a.steps; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.step_ms));
    Batch b = value(loader->next_batch());
    wait_ms += b.wait_ms;
    max_wait = std::max(max_wait, b.wait_ms);
  }
  const double wall = (now_s() - t0) * 1e3;
  const double demand = a.micro_batch * (a.seq_len + 1) / (a.step_ms / 1e3);
  std::printf(
      "wait: consumer step %.1f ms (demand %.2f M tokens/s), %lld steps: loader wait %.1f ms total "
      "= %.3f%% of step time (max %.2f ms in one step)\n",
      a.step_ms, demand / 1e6, static_cast<long long>(a.steps), wait_ms, 100.0 * wait_ms / wall,
      max_wait);
  return 0;
}

int drain(const std::string& dir, const Args& a) {
  const Manifest m = value(read_manifest(dir));
  const int64_t steps = epoch_steps(m, a);
  auto loader = value(Loader::open(m, loader_options(a)));
  const double t0 = now_s(), cpu0 = cpu_s();
  uint64_t tokens = 0;
  for (int64_t i = 0; i < steps; ++i) tokens += value(loader->next_batch()).tokens.size();
  const double wall = now_s() - t0, cpu = cpu_s() - cpu0;
  std::printf("{\"steps\": %lld, \"tokens\": %llu, \"wall_s\": %.6f, \"cpu_s\": %.6f}\n",
              static_cast<long long>(steps), static_cast<unsigned long long>(tokens), wall, cpu);
  return 0;
}

// ---- ranks ---------------------------------------------------------------------------------
// One data-parallel rank of an `mpirun -np W` job (OMPI_COMM_WORLD_RANK / _SIZE or PMI_RANK /
// PMI_SIZE; 0 of 1 without mpirun). Only the loader's own options are used (dp_rank, dp_world,
// micro_batch = G / W), so this file builds against the loader before the global-batch work too
// (tools/bench/loader --before), where the same options mean "W physical partitions".
int ranks(const std::string& dir, const Args& a) {
  auto env_int = [](const char* name, const char* other, int fallback) {
    const char* v = std::getenv(name);
    if (!v) v = std::getenv(other);
    return v ? std::atoi(v) : fallback;
  };
  const int rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0);
  const int world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1);
  if (a.global_batch <= 0 || a.global_batch % world != 0) {
    die("ranks needs --global-batch G, a multiple of the world size " + std::to_string(world));
  }
  const Manifest m = value(read_manifest(dir));
  Args ra = a;
  ra.micro_batch = a.global_batch / world;
  loader::LoaderOptions o = loader_options(ra);
  o.dp_rank = rank;
  o.dp_world = world;
  Args ga = a;  // steps of G rows that cover the dataset's tokens `passes` times
  ga.micro_batch = a.global_batch;
  const int64_t steps = epoch_steps(m, ga);
  const int64_t deep_at = steps * 9 / 10;
  const double t0 = now_s(), cpu0 = cpu_s();
  auto loader = value(Loader::open(m, o));
  double first_ms = 0;
  loader::LoaderState deep;
  for (int64_t i = 0; i < steps; ++i) {
    value(loader->next_batch());
    if (i == 0) first_ms = (now_s() - t0) * 1e3;
    if (i + 1 == deep_at) deep = loader->state();
  }
  const double wall = now_s() - t0, cpu = cpu_s() - cpu0;
  const loader::LoaderStats st = loader->stats();
  loader.reset();
  // A deep resume: a fresh loader restores the state saved after 90% of the steps.
  const double r0 = now_s();
  auto restored = value(Loader::open(m, o));
  check(restored->restore(deep));
  value(restored->next_batch());
  const double restore_ms = (now_s() - r0) * 1e3;
  std::printf(
      "{\"world\": %d, \"rank\": %d, \"global_batch\": %lld, \"micro_batch\": %lld, \"steps\": "
      "%lld, "
      "\"tokens\": %llu, \"tar_bytes\": %llu, \"shards_read\": %llu, \"wall_s\": %.6f, "
      "\"cpu_s\": %.6f, \"first_ms\": %.3f, \"restore_step\": %lld, \"restore_ms\": %.3f}\n",
      world, rank, static_cast<long long>(a.global_batch), static_cast<long long>(ra.micro_batch),
      static_cast<long long>(steps), static_cast<unsigned long long>(st.tokens),
      static_cast<unsigned long long>(st.tar_bytes),
      static_cast<unsigned long long>(st.shards_read), wall, cpu, first_ms,
      static_cast<long long>(deep.step), restore_ms);
  return 0;
}

int train_metrics(const std::string& path) {
  std::ifstream f(path);
  if (!f) die("cannot read " + path);
  std::string line;
  double wait = 0, step = 0, wait1 = 0, step1 = 0, tps = 0;
  int64_t n = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    const double w = j.value("loader_wait_ms", 0.0), s = j.value("step_ms", 0.0);
    if (j.value("step", 0) <= 1) {
      wait1 += w;
      step1 += s;
    } else {
      wait += w;
      step += s;
      tps += j.value("tokens_per_s", 0.0);
    }
    ++n;
  }
  if (n < 2) die("too few steps in " + path);
  std::printf(
      "kiln train (%lld steps): trainer demand %.0f tokens/s; loader wait %.4f ms over %.0f ms of "
      "steps = %.5f%% (step 1, which opens the dataset: %.1f ms of %.0f ms)\n",
      static_cast<long long>(n), tps / (n - 1), wait, step, 100.0 * wait / step, wait1, step1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();  // CPU model and the ISA paths this run takes
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "make" && (argc == 4 || argc == 5)) {
    return make(argv[2], std::atof(argv[3]),
                argc == 5 ? std::strtoull(argv[4], nullptr, 10) : 10000);
  }
  if (mode == "ranks" && argc >= 3) return ranks(argv[2], parse(argc, argv, 3));
  if (mode == "run" && argc >= 3) return run(argv[2], parse(argc, argv, 3));
  if (mode == "rss" && argc >= 3) return rss(argv[2], parse(argc, argv, 3));
  if (mode == "drain" && argc >= 3) return drain(argv[2], parse(argc, argv, 3));
  if (mode == "train-metrics" && argc == 3) return train_metrics(argv[2]);
  if (mode == "wait" && argc >= 3) return wait(argv[2], parse(argc, argv, 3));
  std::fprintf(stderr,
               "usage: bench_loader make DIR MB | run DIR [flags] | rss DIR [flags] | drain DIR [flags] | "
               "wait DIR --step-ms S --steps N [flags]\n");
  return 2;
}
