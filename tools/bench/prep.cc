// Full `kiln prep` (read + dedup + tag + train the tokenizer + tokenize + shard) on a corpus of at
// least 1 GiB, with the bound measured in the same run.
//
// 1. Corpus: JSONL files under DIR/corpus (made once, reused): documents are random windows of
//    20-400 lines of text files already on the machine (/usr/include, /usr/share/doc incl. .gz,
//    /usr/share/common-licenses, /usr/share/man/zh_CN), so the mix holds code, English docs,
//    licences and Chinese, with the exact and near duplicates that overlapping windows make.
// 2. `kiln prep` as a user runs it (the real binary, a child process): wall time, CPU time, peak
//    RSS (getrusage of the child), per-stage times from stats.json; MB/s per core = input MB /
//    (stage seconds x cores). Bound in the same run: reading the corpus files (cat to nowhere).
// 3. Tagging with the default rules (1 thread) on a slice of the corpus text. Tokenizer training
//    and encoding against their peers: tools/bench/tokenizer.
//
// usage: bench_prep --kiln PATH [--dir DIR] [--bytes N] [--keep]
// KILN_BENCH_BYTES overrides the corpus size (default 1 GiB).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "format/shard.h"
#include "format/manifest.h"
#include "dataprep/tagging/domain_rules.h"
#include "dataprep/tokenizer/tokenizer_io.h"
#include "tools/bench/bench_machine.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::prep;

namespace {

extern "C" char** environ;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_prep: %s\n", msg.c_str());
  std::exit(1);
}

bool looks_like_text(const std::string& s) {
  if (s.size() < 64) return false;
  size_t n = std::min<size_t>(s.size(), 8192), bad = 0;
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    if (c < 0x09 || (c > 0x0d && c < 0x20)) ++bad;
  }
  return bad * 100 <= n;
}

struct SourceFile {
  std::vector<std::string> lines;
};

std::vector<SourceFile> load_sources(const std::vector<std::string>& roots, uint64_t max_total) {
  std::vector<std::string> paths;
  for (const auto& root : roots) {
    std::error_code ec;
    if (!fs::exists(root, ec)) continue;
    for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec) && it->file_size(ec) < (8u << 20)) paths.push_back(it->path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<SourceFile> out;
  uint64_t total = 0;
  for (const auto& p : paths) {
    auto text = read_maybe_compressed(p);
    if (!text.is_ok() || !looks_like_text(*text)) continue;
    SourceFile f;
    size_t pos = 0;
    while (pos < text->size()) {
      size_t nl = text->find('\n', pos);
      if (nl == std::string::npos) nl = text->size();
      f.lines.push_back(text->substr(pos, nl - pos + 1));
      pos = nl + 1;
    }
    total += text->size();
    out.push_back(std::move(f));
    if (total > max_total) break;
  }
  return out;
}

void make_corpus(const std::string& dir, uint64_t bytes, const std::vector<std::string>& roots) {
  std::printf("making a %.0f MB corpus in %s from text on this machine...\n", bytes / 1e6, dir.c_str());
  std::fflush(stdout);
  auto sources = load_sources(roots, 2ull << 30);
  if (sources.empty()) die("no source text found");
  uint64_t source_bytes = 0;
  for (auto& s : sources)
    for (auto& l : s.lines) source_bytes += l.size();
  std::printf("  %zu source files, %.0f MB\n", sources.size(), source_bytes / 1e6);
  fs::create_directories(dir);
  // Each pass cuts every source file into consecutive windows of random length (20-400 lines),
  // visiting the files in a fresh random order; later passes cut at other places, so documents
  // overlap their earlier-pass neighbours only partly. Files too short to cut differently are
  // used in the first pass only (else every pass would add an exact duplicate).
  std::mt19937_64 rng(12345);
  std::vector<std::string> docs_text;
  uint64_t pool = 0;
  for (int pass = 0; pool < bytes; ++pass) {
    std::vector<size_t> order(sources.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    uint64_t before = pool;
    for (size_t f : order) {
      const auto& lines = sources[f].lines;
      if (pass > 0 && lines.size() < 60) continue;
      size_t pos = pass > 0 ? rng() % 40 : 0;
      while (pos < lines.size() && pool < bytes) {
        size_t len = std::min<size_t>(lines.size() - pos, 20 + rng() % 380);
        std::string text;
        for (size_t i = pos; i < pos + len; ++i) text += lines[i];
        pos += len;
        if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
        pool += text.size();
        docs_text.push_back(std::move(text));
      }
      if (pool >= bytes) break;
    }
    if (pool == before) break;
  }
  std::shuffle(docs_text.begin(), docs_text.end(), rng);
  const int kFiles = 8;
  uint64_t written = 0, docs = 0;
  for (int f = 0; f < kFiles; ++f) {
    std::string path = dir + "/part-" + std::to_string(f) + ".jsonl";
    std::string buf;
    for (size_t i = docs_text.size() * f / kFiles; i < docs_text.size() * (f + 1) / kFiles; ++i) {
      nlohmann::json j = {{"id", "d" + std::to_string(docs)}, {"text", docs_text[i]}};
      std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      buf += line;
      written += line.size();
      ++docs;
    }
    if (!write_file_atomic(path, buf).is_ok()) die("cannot write " + path);
  }
  std::printf("  %llu documents, %.0f MB of JSONL\n", (unsigned long long)docs, written / 1e6);
}

struct ChildRun {
  int status = -1;
  double wall_s = 0, cpu_s = 0;
  long maxrss_kb = 0;
};

ChildRun run_child(const std::vector<std::string>& args, const std::string& stdout_path = "") {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!stdout_path.empty())
    posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ChildRun r;
  double t0 = now_s();
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) die("cannot run " + args[0]);
  struct rusage ru {};
  wait4(pid, &r.status, 0, &ru);
  r.wall_s = now_s() - t0;
  r.cpu_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  r.maxrss_kb = ru.ru_maxrss;
  posix_spawn_file_actions_destroy(&fa);
  return r;
}

double cpu_s() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

struct Speed {
  double wall_mbps = 0;  // MB per wall second
  double cpu_mbps = 0;   // MB per CPU second of this process: the per-core rate, robust to load
};

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();  // CPU model and the ISA paths this run takes
  std::string kiln, dir = "/tmp/kiln-bench-prep";
  uint64_t bytes = 1ull << 30;
  if (const char* e = std::getenv("KILN_BENCH_BYTES")) bytes = std::stoull(e);
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--kiln") kiln = next();
    else if (a == "--dir") dir = next();
    else if (a == "--bytes") bytes = std::stoull(next());
    else if (a == "--keep") keep = true;
    else die("unknown argument " + a);
  }
  if (kiln.empty()) die("--kiln PATH is required");
  const int cores = int(std::thread::hardware_concurrency());
  const std::string corpus = dir + "/corpus-" + std::to_string(bytes);
  const std::string out = dir + "/out";
  if (!fs::exists(corpus + "/part-7.jsonl"))
    make_corpus(corpus, bytes, {"/usr/include", "/usr/share/doc", "/usr/share/common-licenses",
                                "/usr/share/man/zh_CN"});
  uint64_t corpus_bytes = 0;
  std::vector<std::string> parts;
  for (auto& e : fs::directory_iterator(corpus)) {
    corpus_bytes += e.file_size();
    parts.push_back(e.path().string());
  }
  std::sort(parts.begin(), parts.end());
  const double mb = corpus_bytes / 1e6;

  // Bound: reading the corpus files.
  std::vector<std::string> cat = {"/bin/cat"};
  cat.insert(cat.end(), parts.begin(), parts.end());
  ChildRun read = run_child(cat, "/dev/null");

  fs::remove_all(out);
  ChildRun prep = run_child({kiln, "prep", "--input", corpus, "--output", out}, dir + "/prep.log");
  if (!WIFEXITED(prep.status) || WEXITSTATUS(prep.status) != 0)
    die("kiln prep failed; see " + dir + "/prep.log");
  auto stats_text = read_file(out + "/stats.json");
  if (!stats_text.is_ok()) die(stats_text.status().to_string());
  auto stats = nlohmann::json::parse(*stats_text);

  std::printf("\nprep: %.1f MB JSONL in (%llu docs) -> %llu docs out (%llu exact, %llu near dups, "
              "%llu rejected), %.1f M tokens, %d cores\n",
              mb, (unsigned long long)stats["docs_in"].get<uint64_t>(),
              (unsigned long long)stats["docs_out"].get<uint64_t>(),
              (unsigned long long)stats["exact_dups"].get<uint64_t>(),
              (unsigned long long)stats["near_dups"].get<uint64_t>(),
              (unsigned long long)stats["rejected"].get<uint64_t>(),
              stats["tokens_out"].get<uint64_t>() / 1e6, cores);
  std::string domains;
  for (auto& [name, d] : stats["domains"].items())
    domains += " " + name + "=" + std::to_string(d["docs"].get<uint64_t>());
  std::printf("domains:%s\n", domains.c_str());
  std::printf("%-34s %9s %12s\n", "stage", "seconds", "MB/s/core");
  for (auto& [stage, s] : stats["timings_s"].items()) {
    double sec = s.get<double>();
    std::printf("%-34s %9.2f %12.2f\n", stage.c_str(), sec, sec > 0 ? mb / sec / cores : 0.0);
  }
  std::printf("%-34s %9.2f %12.2f   cpu %.1f s = %.1f MB per cpu-second, peak RSS %.0f MiB\n",
              "kiln prep (process, wall)", prep.wall_s, mb / prep.wall_s / cores, prep.cpu_s,
              mb / prep.cpu_s, prep.maxrss_kb / 1024.0);
  std::printf("%-34s %9.2f %12.2f   (bound: reading the corpus; prep takes %.1fx)\n",
              "cat corpus > /dev/null", read.wall_s, mb / read.wall_s / cores,
              prep.wall_s / read.wall_s);

  // ---- tagging ----
  auto slice = read_training_texts(parts, 256ull << 20);
  if (!slice.is_ok()) die(slice.status().to_string());
  std::vector<std::string_view> texts(slice->texts.begin(), slice->texts.end());
  std::printf("\n%.1f MB of corpus text (%zu documents), best of 2\n", slice->bytes / 1e6, texts.size());
  std::printf("%-40s %10s %12s\n", "", "MB/s wall", "MB/cpu-s");

  // Tagging with the default rules (the per-document work of the annotate step besides encode).
  {
    auto rules = DomainRules::load("");
    if (!rules.is_ok()) die(rules.status().to_string());
    std::vector<Document> docs(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      docs[i].text = std::string(texts[i]);
      docs[i].file = "corpus.jsonl";
      docs[i].line = i + 1;
    }
    Speed best;
    size_t matched = 0;
    for (int rep = 0; rep < 2; ++rep) {
      double t0 = now_s(), c0 = cpu_s();
      matched = 0;
      for (const auto& d : docs) matched += rules->match(d).has_value();
      best.wall_mbps = std::max(best.wall_mbps, slice->bytes / 1e6 / (now_s() - t0));
      best.cpu_mbps = std::max(best.cpu_mbps, slice->bytes / 1e6 / (cpu_s() - c0));
    }
    std::printf("%-40s %10.1f %12.1f   (%zu of %zu documents matched a rule)\n",
                "tagging, default rules, 1 thread", best.wall_mbps, best.cpu_mbps, matched,
                docs.size());
  }

  if (!keep) fs::remove_all(out);
  return 0;
}
