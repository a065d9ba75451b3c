// Helpers for the prep tests: temporary folders, a deterministic near-duplicate corpus
// generator (English-like words and Chinese characters), running prep in-process or through the
// kiln binary, and comparing output trees.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "dataprep/dedup/normalise.h"
#include "dataprep/dedup/shingle.h"
#include "dataprep/prep_config.h"

namespace kiln::testing_prep {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() /
            ("kiln_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  fs::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80)
    s += static_cast<char>(cp);
  else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A generated document with its family (original index) and edit rate.
struct GenDoc {
  std::string text;
  bool cjk = false;
  int family = -1;    // family number: an original and its copies share it
  bool copy = false;  // a copy (else the original)
  double rate = 0.0;  // edit rate of the copy
};

// Originals (English-like or Chinese) plus copies at the given edit rates, shuffled.
class CorpusGen {
 public:
  explicit CorpusGen(uint64_t seed) : rng_(seed) {
    std::uniform_int_distribution<int> len(2, 9), letter(0, 25);
    for (int i = 0; i < 6000; ++i) {
      std::string w;
      int n = len(rng_);
      for (int k = 0; k < n; ++k) w += static_cast<char>('a' + letter(rng_));
      words_.push_back(w);
    }
  }
  // Zipf-like index in [0, n).
  size_t zipf(size_t n) {
    std::uniform_real_distribution<double> u(0, 1);
    return std::min(n - 1, static_cast<size_t>(std::pow(static_cast<double>(n), u(rng_))) - 1);
  }
  std::vector<std::string> english_tokens(int n) {
    std::vector<std::string> t;
    for (int i = 0; i < n; ++i) {
      std::string w = words_[zipf(words_.size())];
      if (i % 11 == 0) w[0] = static_cast<char>(w[0] - 32);  // some capitals
      t.push_back(w);
    }
    return t;
  }
  std::vector<std::string> cjk_tokens(int n) {
    std::vector<std::string> t;
    for (int i = 0; i < n; ++i) t.push_back(utf8(0x4E00 + static_cast<uint32_t>(zipf(3000))));
    return t;
  }
  // Replace / delete / insert each token with probability rate.
  std::vector<std::string> edit(const std::vector<std::string>& in, double rate, bool cjk) {
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<std::string> out;
    for (const auto& t : in) {
      if (u(rng_) >= rate) {
        out.push_back(t);
        continue;
      }
      int op = static_cast<int>(u(rng_) * 3);
      auto fresh = cjk ? cjk_tokens(1)[0] : english_tokens(1)[0];
      if (op == 0)
        out.push_back(fresh);
      else if (op == 2) {
        out.push_back(t);
        out.push_back(fresh);
      }
    }
    return out;
  }
  static std::string join(const std::vector<std::string>& t, bool cjk) {
    std::string s;
    for (size_t i = 0; i < t.size(); ++i) {
      if (!cjk && i) s += (i % 17 == 0) ? ". " : " ";
      s += t[i];
      if (cjk && i % 23 == 22) s += utf8(0x3002);  // 。
    }
    return s;
  }
  std::vector<GenDoc> make(int originals, double cjk_share, const std::vector<double>& rates,
                           int copies_per_original) {
    std::vector<GenDoc> docs;
    std::uniform_real_distribution<double> u(0, 1);
    std::uniform_int_distribution<int> elen(80, 300), clen(150, 600);
    for (int o = 0; o < originals; ++o) {
      bool cjk = u(rng_) < cjk_share;
      auto toks = cjk ? cjk_tokens(clen(rng_)) : english_tokens(elen(rng_));
      docs.push_back({join(toks, cjk), cjk, o, false, 0.0});
      int copies = static_cast<int>(u(rng_) * (copies_per_original + 1));
      for (int k = 0; k < copies; ++k) {
        double rate = rates[static_cast<size_t>(u(rng_) * rates.size()) % rates.size()];
        docs.push_back({join(edit(toks, rate, cjk), cjk), cjk, o, true, rate});
      }
    }
    std::shuffle(docs.begin(), docs.end(), rng_);
    return docs;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> words_;
};

// Exact Jaccard of the shingle sets prep compares (normalised, n-gram hashes).
inline std::vector<uint64_t> shingle_set(const std::string& text, int ngram, bool strip = false) {
  std::string norm;
  prep::normalise_for_dedup(text, prep::NormaliseOptions{strip}, &norm);
  std::vector<uint64_t> h;
  prep::shingle_hashes(norm, ngram, &h);
  std::sort(h.begin(), h.end());
  h.erase(std::unique(h.begin(), h.end()), h.end());
  return h;
}

inline double jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  size_t i = 0, j = 0, inter = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      ++inter;
      ++i;
      ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return static_cast<double>(inter) / static_cast<double>(a.size() + b.size() - inter);
}

// JSONL with ids "d<i>" (so removed.jsonl maps back to the generated documents).
inline void write_corpus(const std::vector<GenDoc>& docs, const std::string& dir, int files) {
  std::vector<std::string> out(files);
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string id = "d";  // (appended: GCC 12 warns falsely on "d" + std::string)
    id += std::to_string(i);
    nlohmann::json j = {{"id", id}, {"text", docs[i].text}};
    // Consecutive blocks per file keep the global order equal to the index order.
    size_t f = i * files / docs.size();
    out[f] += j.dump() + "\n";
  }
  for (int f = 0; f < files; ++f) {
    char name[32];
    std::snprintf(name, sizeof name, "part-%03d.jsonl", f);
    write_file(dir + "/" + name, out[f]);
  }
}

// removed.jsonl -> id -> {kept, similarity}.
inline std::map<std::string, std::pair<std::string, double>> read_removed(const std::string& out) {
  std::map<std::string, std::pair<std::string, double>> m;
  std::ifstream in(out + "/dedup/removed.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    m[j["id"].get<std::string>()] = {j["kept"].get<std::string>(), j["similarity"].get<double>()};
  }
  return m;
}

inline Config prep_config(const std::vector<std::string>& sets) {
  auto c = Config::load(prep::kPrepDefaultsYaml, "", sets);
  if (!c.is_ok()) throw std::runtime_error(c.status().to_string());
  return *c;
}

// Every regular file under root except the work folder, relative path -> bytes. stats.json is
// included without its "timings_s" and "cpu_s" (times differ between runs by nature).
inline std::map<std::string, std::string> output_tree(const std::string& root) {
  std::map<std::string, std::string> files;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::relative(it->path(), root).generic_string();
    if (rel.rfind(".kiln-prep", 0) == 0) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    std::string bytes = read_text(it->path().string());
    if (rel == "stats.json") {
      auto j = nlohmann::ordered_json::parse(bytes);
      j.erase("timings_s");
      j.erase("cpu_s");
      bytes = j.dump(2);
    }
    files[rel] = bytes;
  }
  return files;
}

// Runs a command line through /bin/sh; returns the exit status (or 128 + signal).
inline int run_shell(const std::string& cmd) {
  int st = std::system(cmd.c_str());
  if (st == -1) return -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

}  // namespace kiln::testing_prep
