// Tokenizer training and encoding, with the peers a user would pick, on the same text in the
// same run:
//
// 1. Text: the documents of CORPUS (files/folders as `kiln tokenizer train --input` reads them);
//    every 10th document is held out, the others (up to --train-bytes) are the training sample.
// 2. Training, same sample, vocabulary size and thread count: Kiln's Tokenizer::train (word
//    counting + merges, in process) and SentencePiece's BPE trainer (Debian python3-sentencepiece,
//    model_type=bpe; tools/bench/sentencepiece_train.py): wall and CPU time, and bytes per token
//    on the held-out text.
// 3. Encoding the held-out text, 1 thread: Kiln with GPT-2's vocabulary (tests/data/gpt2) against
//    tiktoken (the npm package: OpenAI's Rust core compiled to WebAssembly, run by node; the ids
//    must be identical) and against GPT-2's reference encoder in pure Python (the algorithm of
//    OpenAI's encoder.py, tools/bench/gpt2_reference_encode.py, on the first MB); Kiln's trained
//    tokenizer on 1 thread and on all cores.
// 4. Encoding the held-out text with tokenizer.json files, 1 thread, Kiln against Hugging Face
//    tokenizers (the npm package `tokenizers`: the Rust library built natively, run by node;
//    tools/hf_tokenizers/install; the ids must be identical): GPT-2's (ByteLevel: Kiln's
//    hand-written scanner; and the same regex as a Split pattern, run by PCRE2), Kiln's trained one
//    (kiln-v1 scanner; and its regex through PCRE2) and a Llama-3 style one (the trained merges
//    with Llama 3's regex, PCRE2). Both sides encode the held-out documents one by one.
//
// usage: bench_tokenizer --kiln-source DIR --corpus PATH [--dir WORK] [--vocab-size N]
//                        [--threads N] [--train-bytes N] [--tiktoken DIR] [--skip-slow-peers]
// --skip-slow-peers leaves out SentencePiece's training and the pure-Python encoder (minutes).
#include "dataprep/tokenizer/tokenizer.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "dataprep/tokenizer/pretokenize.h"
#include "dataprep/tokenizer/tokenizer_io.h"
#include "tools/bench/bench_machine.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::prep;

extern "C" char** environ;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_tokenizer: %s\n", msg.c_str());
  std::exit(1);
}

// Runs a child with stdout to `stdout_path`; true when it exits 0.
bool run_child(const std::vector<std::string>& args, const std::string& stdout_path) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return false;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The first line of `text` starting with `key `, split into numbers.
std::vector<double> field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + " ", 0) == 0) {
      std::istringstream nums(line.substr(key.size() + 1));
      std::vector<double> v;
      for (double d; nums >> d;) v.push_back(d);
      return v;
    }
  return {};
}

std::string read_or_empty(const std::string& path) {
  auto r = read_file(path);
  return r.is_ok() ? std::move(*r) : std::string();
}

struct Timing {
  double wall = 0, cpu = 0;
};

// Best of `reps` (by CPU time) of f().
template <class F>
Timing best_of(int reps, F&& f) {
  Timing best{1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    double t0 = now_s(), c0 = cpu_s();
    f();
    Timing t{now_s() - t0, cpu_s() - c0};
    if (t.cpu < best.cpu) best = t;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string source = ".", corpus, dir = "/tmp/kiln-bench-tokenizer", tiktoken;
  size_t vocab_size = 8192;
  int threads = int(std::thread::hardware_concurrency());
  uint64_t train_bytes = 64ull << 20;
  bool skip_slow = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--kiln-source") source = next();
    else if (a == "--corpus") corpus = next();
    else if (a == "--dir") dir = next();
    else if (a == "--vocab-size") vocab_size = std::stoull(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--train-bytes") train_bytes = std::stoull(next());
    else if (a == "--tiktoken") tiktoken = next();
    else if (a == "--skip-slow-peers")
      skip_slow = true;
    else die("unknown argument " + a);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows while the peers run
  if (corpus.empty()) die("--corpus PATH is required");
  fs::create_directories(dir);

  auto all = read_training_texts({corpus});
  if (!all.is_ok()) die(all.status().to_string());
  std::vector<std::string_view> train, heldout;
  uint64_t train_size = 0, heldout_size = 0;
  for (size_t i = 0; i < all->texts.size(); ++i) {
    std::string_view t = all->texts[i];
    if (i % 10 == 9) {
      heldout.push_back(t);
      heldout_size += t.size();
    } else if (train_size + t.size() <= train_bytes) {
      train.push_back(t);
      train_size += t.size();
    }
  }
  // The same texts as files for the peers: the training sample, and the held-out text.
  std::string train_txt = dir + "/train.txt", heldout_txt = dir + "/heldout.txt";
  std::string joined;
  for (auto t : train) {
    joined += t;
    if (!t.empty() && t.back() != '\n') joined += '\n';
  }
  if (!write_file_atomic(train_txt, joined).is_ok()) die("cannot write " + train_txt);
  std::string heldout_text;
  for (auto t : heldout) {
    heldout_text += t;
    if (!t.empty() && t.back() != '\n') heldout_text += '\n';
  }
  if (!write_file_atomic(heldout_txt, heldout_text).is_ok()) die("cannot write " + heldout_txt);

  std::printf("%s\ntokenizer code path: portable C++ (no ISA-specific kernels)\n",
              bench::machine_line().c_str());
  std::printf("text: %s: %zu documents; training sample %zu documents, %.1f MB; held out every "
              "10th document, %.1f MB\n",
              corpus.c_str(), all->texts.size(), train.size(), train_size / 1e6, heldout_size / 1e6);

  // ---- training ----
  std::printf("\nBPE training, vocabulary %zu, %d thread(s), same sample\n", vocab_size, threads);
  std::printf("%-44s %9s %9s %12s\n", "", "wall s", "cpu s", "held-out B/tok");
  Tokenizer trained;
  Timing kiln_train;
  {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    TokenizerTrainOptions opts;
    opts.vocab_size = vocab_size;
    double t0 = now_s(), c0 = cpu_s();
    auto tok = Tokenizer::train(train, opts);
    kiln_train = {now_s() - t0, cpu_s() - c0};
    if (!tok.is_ok()) die(tok.status().to_string());
    trained = std::move(*tok);
  }
  uint64_t kiln_tokens = 0;
  for (auto t : heldout) kiln_tokens += trained.encode(t).size();
  std::printf("%-44s %9.2f %9.2f %12.3f\n", "kiln (byte-level BPE, kiln-v1 pre-tokenizer)",
              kiln_train.wall, kiln_train.cpu, double(heldout_size) / double(kiln_tokens));

  const std::string sp_out = dir + "/sentencepiece.out";
  if (skip_slow) std::printf("peer: SentencePiece skipped (--skip-slow-peers)\n");
  bool sp_ok =
      !skip_slow && run_child({"/usr/bin/python3", source + "/tools/bench/sentencepiece_train.py",
                               train_txt, heldout_txt, std::to_string(vocab_size),
                               std::to_string(threads), dir + "/sentencepiece"},
                              sp_out);
  auto sp_log = read_or_empty(sp_out);
  auto sp_time = field(sp_log, "train_seconds"), sp_held = field(sp_log, "heldout");
  if (sp_ok && sp_time.size() == 2 && sp_held.size() == 2) {
    std::printf("%-44s %9.2f %9.2f %12.3f\n", "peer: SentencePiece (model_type=bpe, C++)",
                sp_time[0], sp_time[1], sp_held[0] / sp_held[1]);
    std::printf("  SentencePiece takes %.1fx Kiln's wall time and %.1fx its CPU time\n",
                sp_time[0] / kiln_train.wall, sp_time[1] / kiln_train.cpu);
  } else if (!skip_slow) {
    std::printf("peer: SentencePiece unavailable (needs Debian's python3-sentencepiece; tools/setup "
                "installs it)\n%s",
                sp_log.c_str());
  }

  // ---- encoding ----
  const std::string gpt2_dir = source + "/tests/data/gpt2";
  auto gpt2 = Tokenizer::load_gpt2(gpt2_dir + "/vocab.json", gpt2_dir + "/merges.txt");
  if (!gpt2.is_ok()) die(gpt2.status().to_string());
  const double mb = heldout_text.size() / 1e6;
  std::printf("\nencoding the held-out text, %.1f MB, best of 3\n", mb);
  std::printf("%-44s %9s %9s %12s\n", "", "MB/s wall", "MB/cpu-s", "bytes/tok");
  std::vector<uint32_t> gpt2_ids;
  double kiln_gpt2_rate = 0;
  {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    Timing t = best_of(3, [&] { gpt2_ids = gpt2->encode(heldout_text); });
    kiln_gpt2_rate = mb / t.cpu;
    std::printf("%-44s %9.1f %9.1f %12.3f\n", "kiln, GPT-2 vocabulary, 1 thread", mb / t.wall,
                mb / t.cpu, double(heldout_text.size()) / gpt2_ids.size());
  }
  for (int n : {1, threads}) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, n);
    uint64_t tokens = 0;
    Timing t = best_of(3, [&] {
      tokens = 0;
      for (auto& ids : trained.encode_batch(heldout)) tokens += ids.size();
    });
    std::printf("%-44s %9.1f %9.1f %12.3f\n",
                ("kiln, trained vocabulary, " + std::to_string(n) + " thread(s)").c_str(),
                mb / t.wall, mb / t.cpu, double(heldout_size) / tokens);
    if (threads == 1) break;
  }

  // Peer: tiktoken under node.
  if (tiktoken.empty()) {
    for (std::string c : {std::string(std::getenv("KILN_TIKTOKEN_DIR") ? std::getenv("KILN_TIKTOKEN_DIR") : ""),
                          source + "/node_modules/tiktoken"})
      if (!c.empty() && fs::exists(c + "/package.json")) {
        tiktoken = c;
        break;
      }
  }
  const std::string node = "/usr/bin/node";
  if (!tiktoken.empty() && fs::exists(node)) {
    const std::string out = dir + "/tiktoken.out", ids_path = dir + "/tiktoken.ids";
    bool ok = run_child({node, source + "/tools/bench/tiktoken_encode.js", tiktoken, heldout_txt, ids_path}, out);
    auto log = read_or_empty(out);
    auto t = field(log, "encode_seconds");
    if (ok && t.size() == 2) {
      auto ids = parse_token_ids(read_or_empty(ids_path));
      bool same = ids.is_ok() && *ids == gpt2_ids;
      std::printf("%-44s %9.1f %9.1f %12.3f\n", "peer: tiktoken (Rust as WASM, node), 1 thread",
                  mb / t[0], mb / t[1], ids.is_ok() ? double(heldout_text.size()) / ids->size() : 0.0);
      std::printf("  ids %s Kiln's (GPT-2 vocabulary); Kiln does %.2fx tiktoken's MB per cpu-second\n",
                  same ? "identical to" : "DIFFER from", kiln_gpt2_rate / (mb / t[1]));
    } else {
      std::printf("peer: tiktoken failed:\n%s", log.c_str());
    }
  } else {
    std::printf("peer: tiktoken unavailable: `npm install --no-save --prefix %s tiktoken` puts it in "
                "%s/node_modules (or pass --tiktoken DIR / set KILN_TIKTOKEN_DIR); needs node\n",
                source.c_str(), source.c_str());
  }

  // tokenizer.json files, Kiln against Hugging Face tokenizers on the same text and file.
  {
    const char* llama3 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    auto with_split = [](const std::string& json_text, const std::string& pattern) {
      nlohmann::json j = nlohmann::json::parse(json_text);
      j["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"},
                               {"pattern", {{"Regex", pattern}}},
                               {"behavior", "Isolated"},
                               {"invert", false}},
                              {{"type", "ByteLevel"},
                               {"add_prefix_space", false},
                               {"trim_offsets", true},
                               {"use_regex", false}}}}};
      return j.dump();
    };
    struct Case {
      std::string name, file, json;
    };
    std::vector<Case> cases = {
        {"GPT-2, ByteLevel (hand-written scanner)", "gpt2", gpt2->to_json()},
        {"GPT-2, same regex as Split (PCRE2 JIT)", "gpt2_regex",
         with_split(gpt2->to_json(), "(?:" + gpt2_pattern() + ")")},
        {"trained, kiln-v1 (hand-written scanner)", "kiln_v1", trained.to_json()},
        {"trained, kiln-v1 regex as Split (PCRE2 JIT)", "kiln_v1_regex",
         with_split(trained.to_json(), "(?:" + kiln_v1_pattern(0) + ")")},
        {"trained merges, Llama 3 regex (PCRE2 JIT)", "llama3",
         with_split(trained.to_json(), llama3)},
    };
    const std::string hf = source + "/tools/hf_tokenizers";
    const std::string heldout_jsonl = dir + "/heldout.jsonl";
    std::string jsonl;
    for (auto d : heldout)
      jsonl += nlohmann::json{{"text", std::string(d)}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace) +
               "\n";
    if (!write_file_atomic(heldout_jsonl, jsonl).is_ok()) die("cannot write " + heldout_jsonl);
    const bool have_hf = fs::exists(hf + "/node_modules/tokenizers") && fs::exists(node);
    std::printf(
        "\ntokenizer.json files, the held-out documents (%.1f MB), 1 thread, best of 3; peer: "
        "Hugging Face tokenizers (Rust, native, node; encodeBatch, documents)\n",
        mb);
    std::printf("%-44s %9s %9s %12s %9s %s\n", "", "MB/s wall", "MB/cpu-s", "HF MB/cpu-s",
                "kiln/HF", "ids");
    for (const auto& c : cases) {
      const std::string path = dir + "/" + c.file + ".tokenizer.json";
      if (!write_file_atomic(path, c.json).is_ok()) die("cannot write " + path);
      auto tok = Tokenizer::load(path);
      if (!tok.is_ok()) die(tok.status().to_string());
      // Per document, as a user encodes (and as Hugging Face is fast: one 4 MB string is not).
      std::vector<uint32_t> ids;
      Timing t;
      {
        tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
        t = best_of(3, [&] {
          ids.clear();
          for (auto d : heldout) (void)tok->encode(d, &ids);
        });
      }
      std::string peer = "unavailable", same = "-";
      double hf_rate = 0;
      if (have_hf) {
        const std::string out = dir + "/hf_" + c.file + ".out",
                          ids_path = dir + "/hf_" + c.file + ".ids";
        bool ok = run_child({node, hf + "/encode.js", "bench", path, heldout_jsonl, ids_path}, out);
        auto ht = field(read_or_empty(out), "encode_seconds");
        if (ok && ht.size() == 2) {
          hf_rate = mb / ht[1];
          auto hids = parse_token_ids(read_or_empty(ids_path));
          same = hids.is_ok() && *hids == ids ? "identical" : "DIFFER";
        }
      }
      char hf_col[32] = "n/a", ratio[32] = "n/a";
      if (hf_rate > 0) {
        std::snprintf(hf_col, sizeof hf_col, "%.1f", hf_rate);
        std::snprintf(ratio, sizeof ratio, "%.2fx", (mb / t.cpu) / hf_rate);
      }
      std::printf("%-44s %9.1f %9.1f %12s %9s %s\n", c.name.c_str(), mb / t.wall, mb / t.cpu,
                  hf_col, ratio, same.c_str());
    }
    if (!have_hf)
      std::printf(
          "  Hugging Face tokenizers unavailable: tools/hf_tokenizers/install (npm) puts it in "
          "%s/node_modules\n",
          hf.c_str());
  }

  // Peer: GPT-2's reference encoder in pure Python, on the first ~1 MB of the same text.
  std::string peer_text;
  for (auto t : heldout) {
    if (peer_text.size() > 1000000) break;
    peer_text += t;
    if (!t.empty() && t.back() != '\n') peer_text += '\n';
  }
  const std::string peer_in = dir + "/peer.txt", peer_ids = dir + "/peer.ids", peer_out = dir + "/peer.out";
  if (!write_file_atomic(peer_in, peer_text).is_ok()) die("cannot write " + peer_in);
  bool ok =
      !skip_slow && run_child({"/usr/bin/python3", source + "/tools/bench/gpt2_reference_encode.py",
                               gpt2_dir, peer_in, peer_ids},
                              peer_out);
  auto t = field(read_or_empty(peer_out), "encode_seconds");
  if (ok && t.size() == 2) {
    auto ids = parse_token_ids(read_or_empty(peer_ids));
    bool same = ids.is_ok() && *ids == gpt2->encode(peer_text);
    const double pmb = peer_text.size() / 1e6;
    std::printf("%-44s %9.2f %9.2f\n", "peer: GPT-2 reference encoder, pure Python", pmb / t[0], pmb / t[1]);
    std::printf("  on the first %.1f MB: ids %s Kiln's; Kiln does %.0fx its MB per cpu-second\n", pmb,
                same ? "identical to" : "DIFFER from", kiln_gpt2_rate / (pmb / t[1]));
  } else if (skip_slow) {
    std::printf("peer: GPT-2 reference encoder skipped (--skip-slow-peers)\n");
  } else {
    std::printf("peer: GPT-2 reference encoder unavailable (needs /usr/bin/python3 with python3-regex; "
                "tools/setup installs it)\n");
  }
  return 0;
}
