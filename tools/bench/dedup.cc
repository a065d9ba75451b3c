// bench_dedup: the dedup side of `kiln prep`.
//
//  1. Makes (once) a corpus of at least --bytes (default 1 GiB) of mixed text: English prose,
//     C code and Chinese, assembled from paragraphs of the default corpus (tools/default_corpus,
//     texts already on the machine), with injected exact copies and near copies at known edit
//     rates (DIR/truth.tsv lists them).
//  2. Signature stage (normalise + shingle + 128-permutation MinHash): Kiln's vectorised path vs
//     a straightforward single-threaded reference (utf8proc over the whole text, shingles built
//     as strings, scalar (a*x+b) mod 2^61-1 per permutation), measured in the same process on the
//     same documents; both must give identical signatures. MB/s and documents/s per core.
//  3. The whole `kiln prep` (read, validate, dedup, tag, shards; no tokenizer) as a child process
//     on a quarter and on all of the corpus with the same --memory: MB/s per core, peak RSS.
//  4. Quality on the injected pairs: recall on pairs with exact Jaccard >= 0.85, and the share of
//     removed documents with exact Jaccard >= 0.7 to the document kept in their place.
#include <sys/resource.h>
#include <sys/wait.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "dataprep/dedup/lsh.h"
#include "dataprep/dedup/minhash.h"
#include "dataprep/dedup/normalise.h"
#include "dataprep/dedup/shingle.h"
#include "tools/bench/bench_machine.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::prep;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string dir = "/tmp/kiln-bench-dedup";
  std::string kiln = "build/kiln";
  std::string source;  // default corpus folder (tools/default_corpus output)
  uint64_t bytes = uint64_t{1} << 30;
  uint64_t sig_bytes = uint64_t{96} << 20;
  uint64_t ref_bytes = uint64_t{16} << 20;
  int threads = 0;
  std::string memory = "64M";
  bool skip_prep = false;
};

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of the calling thread: single-thread rates measured with it do not depend on how busy
// the other cores of a shared machine are.
double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// ---- 1. corpus -------------------------------------------------------------------------------

struct Pools {
  std::vector<std::string> prose, code, zh;
};

void split_paragraphs(const std::string& text, std::vector<std::string>* out) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    // Long blocks: cut every ~1500 bytes at a line end.
    while (end - at > 3000) {
      size_t cut = text.rfind('\n', at + 1500);
      if (cut == std::string::npos || cut <= at) cut = at + 1500;
      out->push_back(text.substr(at, cut - at));
      at = cut + 1;
    }
    if (end > at + 40) out->push_back(text.substr(at, end - at));
    at = end + 2;
  }
}

Pools load_pools(const std::string& source) {
  Pools p;
  for (const char* part : {"licenses", "docs", "code", "zh"}) {
    for (const std::string& line : read_lines(source + "/" + part + ".jsonl")) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      std::string text = j.value("text", "");
      std::vector<std::string>* pool = std::string(part) == "code" ? &p.code
                                       : std::string(part) == "zh" ? &p.zh
                                                                   : &p.prose;
      split_paragraphs(text, pool);
    }
  }
  return p;
}

// Code points (zh) or space-separated words, edited at `rate` (replace, drop or insert).
std::string edit_text(const std::string& text, double rate, bool by_char, std::mt19937_64& rng) {
  std::vector<std::string> toks;
  if (by_char) {
    for (size_t i = 0; i < text.size();) {
      size_t len = 1;
      unsigned char c = static_cast<unsigned char>(text[i]);
      if (c >= 0xF0) len = 4;
      else if (c >= 0xE0) len = 3;
      else if (c >= 0xC0) len = 2;
      toks.push_back(text.substr(i, len));
      i += len;
    }
  } else {
    size_t at = 0;
    while (at <= text.size()) {
      size_t sp = text.find(' ', at);
      if (sp == std::string::npos) sp = text.size();
      toks.push_back(text.substr(at, sp - at));
      at = sp + 1;
    }
  }
  std::uniform_real_distribution<double> u(0, 1);
  std::string out;
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string t = toks[i];
    if (u(rng) < rate) {
      int op = static_cast<int>(u(rng) * 3);
      const std::string& other = toks[rng() % toks.size()];
      if (op == 0) t = other;
      else if (op == 1) t.clear();
      else t += by_char ? other : " " + other;
    }
    if (!by_char && i) out += ' ';
    out += t;
  }
  return out;
}

void make_corpus(const Args& a, const std::string& dir) {
  std::printf("making a %.0f MiB corpus in %s from %s ...\n", a.bytes / 1048576.0, dir.c_str(),
              a.source.c_str());
  Pools pools = load_pools(a.source);
  if (pools.prose.empty() || pools.code.empty())
    throw std::runtime_error("no source texts in " + a.source + " (run tools/default_corpus)");
  fs::create_directories(dir + "/corpus");
  std::mt19937_64 rng(12345);
  std::lognormal_distribution<double> len(std::log(3500.0), 0.8);
  std::uniform_real_distribution<double> u(0, 1);
  const double rates[] = {0.0025, 0.005, 0.01, 0.02, 0.04, 0.08};
  struct Pending {
    uint64_t due;
    std::string id, source_id, text;
    double rate;
  };
  std::vector<Pending> pending;
  std::ofstream truth(dir + "/truth.tsv");
  std::ofstream out;
  int file_no = -1;
  uint64_t file_bytes = 0, total = 0, n = 0;
  auto emit = [&](const std::string& id, const std::string& text) {
    if (!out.is_open() || file_bytes >= (uint64_t{64} << 20)) {
      if (out.is_open()) out.close();
      char name[64];
      std::snprintf(name, sizeof name, "/corpus/part-%05d.jsonl", ++file_no);
      out.open(dir + name, std::ios::binary);
      file_bytes = 0;
    }
    std::string line = nlohmann::json({{"id", id}, {"text", text}}).dump() + "\n";
    out << line;
    file_bytes += line.size();
    total += line.size();
  };
  while (total < a.bytes) {
    double r = u(rng);
    bool zh = r < 0.2, code = !zh && r < 0.5;
    const auto& pool = zh ? pools.zh : code ? pools.code : pools.prose;
    size_t target = static_cast<size_t>(std::clamp(len(rng), 400.0, 40000.0));
    std::string text;
    while (text.size() < target) {
      if (!text.empty()) text += "\n\n";
      text += pool[rng() % pool.size()];
    }
    std::string id = "g" + std::to_string(n++);
    emit(id, text);
    double c = u(rng);
    if (c < 0.04) {  // exact copy, later
      pending.push_back({n + rng() % 20000, id + "x", id, text, 0.0});
    } else if (c < 0.12) {  // near copy, later
      double rate = rates[rng() % 6];
      pending.push_back({n + rng() % 20000, id + "n", id, edit_text(text, rate, zh, rng), rate});
    }
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].due <= n) {
        emit(pending[i].id, pending[i].text);
        truth << pending[i].id << '\t' << pending[i].source_id << '\t' << pending[i].rate << '\n';
        pending[i] = std::move(pending.back());
        pending.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& p : pending) {
    emit(p.id, p.text);
    truth << p.id << '\t' << p.source_id << '\t' << p.rate << '\n';
  }
  out.close();
  truth.close();
  std::ofstream(dir + "/corpus.json") << nlohmann::json({{"bytes", a.bytes}, {"files", file_no + 1}}).dump();
}

// ---- 2. signatures ---------------------------------------------------------------------------

struct Doc {
  std::string id, text;
};

std::vector<Doc> load_docs(const std::string& dir, uint64_t bytes) {
  std::vector<Doc> docs;
  uint64_t got = 0;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir + "/corpus")) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line;
    while (got < bytes && std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      docs.push_back({j["id"], j["text"]});
      got += docs.back().text.size();
    }
    if (got >= bytes) break;
  }
  return docs;
}

// The straightforward reference: utf8proc over the whole text, units and shingles as strings,
// scalar hashing of every permutation.
void reference_signature(const std::string& text, const MinHasher& mh, int ngram,
                         std::vector<uint64_t>* sig) {
  std::string norm = normalise_for_dedup_reference(text, NormaliseOptions{});
  std::vector<UnitSpan> spans;
  shingle_units(norm, &spans);
  std::vector<std::string> shingles;
  const size_t n = static_cast<size_t>(ngram);
  if (!spans.empty() && spans.size() <= n)
    shingles.push_back(norm.substr(spans.front().begin, spans.back().end - spans.front().begin));
  for (size_t i = 0; spans.size() > n && i + n <= spans.size(); ++i)
    shingles.push_back(norm.substr(spans[i].begin, spans[i + n - 1].end - spans[i].begin));
  sig->assign(mh.num_perm(), kEmptySlot);
  for (const std::string& s : shingles) {
    uint64_t x = xxh3_64(s);
    for (int k = 0; k < mh.num_perm(); ++k)
      (*sig)[k] = std::min((*sig)[k], universal_hash61(mh.a(k), mh.b(k), x));
  }
}

struct FastTimes {
  double normalise = 0, shingle = 0, minhash = 0;
};

void fast_signature(const std::string& text, const MinHasher& mh, int ngram, std::string* norm,
                    std::vector<uint64_t>* sh, uint64_t* sig, FastTimes* t = nullptr) {
  double t0 = t ? thread_cpu() : 0;
  normalise_for_dedup(text, NormaliseOptions{}, norm);
  double t1 = t ? thread_cpu() : 0;
  shingle_hashes(*norm, ngram, sh);
  double t2 = t ? thread_cpu() : 0;
  mh.signature(sh->data(), sh->size(), sig);
  if (t) {
    double t3 = thread_cpu();
    t->normalise += t1 - t0;
    t->shingle += t2 - t1;
    t->minhash += t3 - t2;
  }
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

// ---- 3. whole prep ---------------------------------------------------------------------------

struct PrepRun {
  double wall = 0, cpu = 0;
  long maxrss_kb = 0;
  uint64_t input_bytes = 0;
  int rc = -1;
};

PrepRun run_kiln_prep(const Args& a, const std::vector<std::string>& inputs, const std::string& out,
                      bool tagging) {
  PrepRun r;
  for (const auto& f : inputs) r.input_bytes += fs::file_size(f);
  std::vector<std::string> argv = {a.kiln, "prep", "--output", out, "--overwrite", "--tokenizer",
                                   "none", "--memory", a.memory, "--threads",
                                   std::to_string(a.threads)};
  if (!tagging) {  // no domain rules: every document gets the default domain
    std::ofstream(a.dir + "/no-rules.yaml") << "rules: []\n";
    argv.push_back("--set");
    argv.push_back("domains.rules=" + a.dir + "/no-rules.yaml");
  }
  argv.push_back("--input");
  for (const auto& f : inputs) argv.push_back(f);
  auto t0 = Clock::now();
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> cargv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    std::string log = out + ".log";
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    if (!std::freopen((out + ".summary").c_str(), "w", stdout)) _exit(126);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  r.wall = secs(t0, Clock::now());
  r.cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  r.maxrss_kb = ru.ru_maxrss;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// ---- 4. quality ------------------------------------------------------------------------------

std::vector<uint64_t> shingle_set(const std::string& text) {
  std::string norm;
  normalise_for_dedup(text, NormaliseOptions{}, &norm);
  std::vector<uint64_t> h;
  shingle_hashes(norm, 5, &h);
  std::sort(h.begin(), h.end());
  h.erase(std::unique(h.begin(), h.end()), h.end());
  return h;
}

double exact_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  size_t i = 0, j = 0, inter = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) ++inter, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  }
  size_t uni = a.size() + b.size() - inter;
  return uni ? static_cast<double>(inter) / uni : 1.0;
}

void quality(const std::string& dir, const std::string& out) {
  // Injected pairs and removed documents.
  std::vector<std::tuple<std::string, std::string, double>> truth;
  for (const auto& line : read_lines(dir + "/truth.tsv")) {
    auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    truth.emplace_back(line.substr(0, t1), line.substr(t1 + 1, t2 - t1 - 1), std::stod(line.substr(t2 + 1)));
  }
  std::unordered_map<std::string, std::pair<std::string, double>> removed;
  for (const auto& line : read_lines(out + "/dedup/removed.jsonl")) {
    auto j = nlohmann::json::parse(line);
    removed[j["id"]] = {j["kept"], j["similarity"]};
  }
  std::unordered_set<std::string> need;
  for (const auto& [c, s, r] : truth) need.insert(c), need.insert(s);
  for (const auto& [id, k] : removed) need.insert(id), need.insert(k.first);
  std::unordered_map<std::string, std::vector<uint64_t>> sets;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir + "/corpus")) files.push_back(e.path().string());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line;
    while (std::getline(in, line)) {
      size_t a = line.find("\"id\":\"") + 6;
      std::string id = line.substr(a, line.find('"', a) - a);
      if (!need.count(id)) continue;
      sets[id] = shingle_set(nlohmann::json::parse(line)["text"].get<std::string>());
    }
  }
  auto home = [&](const std::string& id) {
    auto it = removed.find(id);
    return it == removed.end() ? id : it->second.first;
  };
  uint64_t high = 0, found = 0;
  std::map<double, std::pair<uint64_t, uint64_t>> by_rate;
  for (const auto& [c, s, r] : truth) {
    double j = exact_jaccard(sets[c], sets[s]);
    if (j < 0.85) continue;
    ++high;
    bool same = home(c) == home(s);
    found += same;
    by_rate[r].first++;
    by_rate[r].second += same;
  }
  uint64_t close = 0;
  for (const auto& [id, k] : removed) close += exact_jaccard(sets[id], sets[k.first]) >= 0.7;
  std::printf("quality: injected pairs with exact Jaccard >= 0.85: %llu, found %llu -> recall %.4f\n",
              (unsigned long long)high, (unsigned long long)found, high ? double(found) / high : 0.0);
  for (const auto& [r, v] : by_rate)
    std::printf("  edit rate %.4f: %llu pairs, recall %.4f\n", r, (unsigned long long)v.first,
                double(v.second) / v.first);
  std::printf("quality: removed %zu documents, %llu with exact Jaccard >= 0.7 to the kept one -> "
              "precision %.4f\n",
              removed.size(), (unsigned long long)close,
              removed.empty() ? 0.0 : double(close) / removed.size());
}

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();  // CPU model and the ISA paths this run takes
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value for " + k);
      return argv[++i];
    };
    if (k == "--dir") a.dir = next();
    else if (k == "--kiln") a.kiln = next();
    else if (k == "--source") a.source = next();
    else if (k == "--bytes") a.bytes = std::stoull(next());
    else if (k == "--sig-bytes") a.sig_bytes = std::stoull(next());
    else if (k == "--ref-bytes") a.ref_bytes = std::stoull(next());
    else if (k == "--threads") a.threads = std::stoi(next());
    else if (k == "--memory") a.memory = next();
    else if (k == "--skip-prep") a.skip_prep = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_dedup [--dir DIR] [--kiln PATH] [--source CORPUS_DIR] [--bytes N] "
                   "[--sig-bytes N] [--ref-bytes N] [--threads N] [--memory SIZE] [--skip-prep]\n");
      return 2;
    }
  }
  if (a.threads <= 0) a.threads = static_cast<int>(std::thread::hardware_concurrency());
  if (a.source.empty()) a.source = a.dir + "/source";
  const int cores = a.threads;

  // 1. corpus
  bool have = false;
  if (fs::exists(a.dir + "/corpus.json")) {
    auto j = nlohmann::json::parse(std::ifstream(a.dir + "/corpus.json"), nullptr, false);
    have = j.is_object() && j.value("bytes", uint64_t{0}) == a.bytes;
  }
  if (!have) {
    fs::remove_all(a.dir + "/corpus");
    make_corpus(a, a.dir);
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(a.dir + "/corpus")) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  uint64_t corpus_bytes = 0;
  for (const auto& f : files) corpus_bytes += fs::file_size(f);
  std::printf("corpus: %zu files, %.1f MiB (JSONL), threads %d\n", files.size(),
              corpus_bytes / 1048576.0, cores);

  // 2. signatures
  MinHasher mh(128, 1);
  const int ngram = 5;
  std::vector<Doc> docs = load_docs(a.dir, a.sig_bytes);
  size_t nref = 0;
  uint64_t ref_bytes = 0, sample_bytes = 0;
  for (const auto& d : docs) sample_bytes += d.text.size();
  while (nref < docs.size() && ref_bytes < a.ref_bytes) ref_bytes += docs[nref++].text.size();
  std::vector<uint64_t> ref_sigs(nref * 128), fast_sigs(docs.size() * 128);
  {
    // Single-thread rates use the thread's CPU time (a shared machine's load does not skew them;
    // wall-clock rates are printed too).
    std::vector<uint64_t> sig;
    double c0 = thread_cpu();
    auto t0 = Clock::now();
    for (size_t i = 0; i < nref; ++i) {
      reference_signature(docs[i].text, mh, ngram, &sig);
      std::copy(sig.begin(), sig.end(), ref_sigs.begin() + i * 128);
    }
    double w = secs(t0, Clock::now()), c = thread_cpu() - c0;
    std::printf("signatures, reference (scalar, 1 thread): %.1f MiB, %zu docs: %.1f MB/s, %.0f "
                "docs/s per core (CPU time; wall %.1f MB/s)\n",
                ref_bytes / 1048576.0, nref, ref_bytes / 1e6 / c, nref / c, ref_bytes / 1e6 / w);
    std::string norm;
    std::vector<uint64_t> sh;
    FastTimes ft;
    c0 = thread_cpu();
    t0 = Clock::now();
    for (size_t i = 0; i < nref; ++i)
      fast_signature(docs[i].text, mh, ngram, &norm, &sh, fast_sigs.data() + i * 128, &ft);
    double w1 = secs(t0, Clock::now()), c1 = thread_cpu() - c0;
    bool same = std::equal(ref_sigs.begin(), ref_sigs.end(), fast_sigs.begin());
    std::printf("signatures, kiln (%s, 1 thread), same docs: %.1f MB/s, %.0f docs/s per core (CPU "
                "time; wall %.1f MB/s) -> %.2fx the reference; signatures identical: %s\n",
                mh.kernel(), ref_bytes / 1e6 / c1, nref / c1, ref_bytes / 1e6 / w1, c / c1,
                same ? "yes" : "NO");
    double parts = ft.normalise + ft.shingle + ft.minhash;
    std::printf("  kiln 1-thread split: normalise %.0f%%, shingle+xxh3 %.0f%%, minhash %.0f%%\n",
                100 * ft.normalise / parts, 100 * ft.shingle / parts, 100 * ft.minhash / parts);
    // The MinHash kernels alone on Kiln's shingles (what vectorising buys).
    setenv("KILN_MINHASH_KERNEL", "scalar", 1);
    MinHasher scalar(128, 1);
    unsetenv("KILN_MINHASH_KERNEL");
    double tmin_scalar = 0, tmin_fast = 0;
    std::vector<uint64_t> tmp(128);
    for (size_t i = 0; i < nref; ++i) {
      normalise_for_dedup(docs[i].text, NormaliseOptions{}, &norm);
      shingle_hashes(norm, ngram, &sh);
      double s0 = thread_cpu();
      scalar.signature(sh.data(), sh.size(), tmp.data());
      double s1 = thread_cpu();
      mh.signature(sh.data(), sh.size(), tmp.data());
      tmin_scalar += s1 - s0;
      tmin_fast += thread_cpu() - s1;
    }
    std::printf("  minhash kernel alone: scalar %.1f MB/s, %s %.1f MB/s (%.2fx)\n",
                ref_bytes / 1e6 / tmin_scalar, mh.kernel(), ref_bytes / 1e6 / tmin_fast,
                tmin_scalar / tmin_fast);
    if (!same) return 1;
  }
  {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, cores);
    double c0 = cpu_seconds();
    auto t0 = Clock::now();
    tbb::parallel_for(tbb::blocked_range<size_t>(0, docs.size(), 64), [&](const auto& r) {
      std::string norm;
      std::vector<uint64_t> sh;
      for (size_t i = r.begin(); i < r.end(); ++i)
        fast_signature(docs[i].text, mh, ngram, &norm, &sh, fast_sigs.data() + i * 128);
    });
    double t = secs(t0, Clock::now()), c = cpu_seconds() - c0;
    std::printf("signatures, kiln (%d threads): %.1f MiB, %zu docs: %.1f MB/s = %.1f MB/s per core "
                "(%.1f MB per CPU-second), %.0f docs/s per core\n",
                cores, sample_bytes / 1048576.0, docs.size(), sample_bytes / 1e6 / t,
                sample_bytes / 1e6 / t / cores, sample_bytes / 1e6 / c, docs.size() / t / cores);
  }
  docs.clear();
  docs.shrink_to_fit();

  // 3. whole prep
  if (!a.skip_prep) {
    std::vector<std::string> quarter(files.begin(), files.begin() + std::max<size_t>(1, files.size() / 4));
    struct Case {
      const std::vector<std::string>* inputs;
      bool tagging;
      const char* name;
    };
    // "read, dedup, shards" (the domain rules off) on a quarter and on all of the corpus with the
    // same --memory (peak memory must stay flat), then the default prep with domain tagging.
    const Case cases[] = {{&quarter, false, "out-quarter"},
                          {&files, false, "out-full"},
                          {&files, true, "out-full-tagged"}};
    for (const Case& k : cases) {
      std::string out = a.dir + "/" + k.name;
      PrepRun r = run_kiln_prep(a, *k.inputs, out, k.tagging);
      if (r.rc != 0) {
        std::printf("kiln prep failed (exit %d); see %s.log\n", r.rc, out.c_str());
        return 1;
      }
      auto stats = nlohmann::json::parse(std::ifstream(out + "/stats.json"));
      std::printf("kiln prep%s on %.1f MiB (%zu files, --memory %s, %d threads): %.1fs wall, "
                  "%.1f MB/s = %.1f MB/s per core; %.1f MB per CPU-second (%.1fs cpu), %.0f docs "
                  "per CPU-second; peak RSS %.0f MiB; docs in %llu, out %llu, exact %llu, near "
                  "%llu; stage wall times %s\n",
                  k.tagging ? " (with domain tagging)" : "", r.input_bytes / 1048576.0,
                  k.inputs->size(), a.memory.c_str(), cores, r.wall, r.input_bytes / 1e6 / r.wall,
                  r.input_bytes / 1e6 / r.wall / cores, r.input_bytes / 1e6 / r.cpu, r.cpu,
                  stats["docs_in"].get<double>() / r.cpu, r.maxrss_kb / 1024.0,
                  (unsigned long long)stats["docs_in"], (unsigned long long)stats["docs_out"],
                  (unsigned long long)stats["exact_dups"], (unsigned long long)stats["near_dups"],
                  stats["timings_s"].dump().c_str());
      std::fflush(stdout);
      if (std::string(k.name) == "out-full") quality(a.dir, out);
    }
  }
  return 0;
}
