// Kiln's quality filters against datatrove itself: the unmodified datatrove filter code
// (v0.10.0, a649de79) run by ../shared/peers/datatrove with default parameters, decision by
// decision, on a corpus made here (tests/dataprep/filter_corpus.py: man pages, READMEs, code,
// prose and web-like pages drawn on both sides of every threshold; no CJK text, where Kiln's
// rules differ on purpose). Each of gopher_quality, gopher_repetition, c4 (decision and the
// text it leaves) and fineweb must agree on >= 99% of the documents, and so must the four as a
// chain through `kiln prep`.
//
// The peer needs the datatrove and spaCy sources unpacked as its README says (/tmp/peers, or
// KILN_DATATROVE_SRC / SPACY_SRC) and python3-xxhash; without them the tests are skipped.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>

#include "dataprep/filter/filter.h"
#include "tests/dataprep/prep_test_util.h"
#include "tests/test_paths.h"

namespace kiln {
namespace {

using namespace testing_prep;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The peer's folder, or "" when it cannot run here.
std::string find_peer(std::string* why) {
  const std::string src = test::source_dir();
  std::string peer;
  for (const std::string& p :
       {env_or("KILN_DATATROVE_PEER", ""), src + "/../shared/peers/datatrove",
        src + "/../../shared/peers/datatrove", std::string("/work/shared/peers/datatrove")})
    if (!p.empty() && fs::exists(p + "/run_datatrove_filters.py")) {
      peer = p;
      break;
    }
  if (peer.empty()) {
    *why = "../shared/peers/datatrove not found (set KILN_DATATROVE_PEER)";
    return "";
  }
  const std::string spacy = env_or("SPACY_SRC", "/tmp/peers/spacy");
  const std::string dt = env_or("KILN_DATATROVE_SRC", "/tmp/peers/datatrove");
  if (!fs::exists(spacy + "/spacy/lang/en/tokenizer_exceptions.py") ||
      !fs::exists(dt + "/src/datatrove/pipeline/filters/gopher_quality_filter.py")) {
    *why = "datatrove / spaCy sources not unpacked (" + peer + "/README.md says how)";
    return "";
  }
  if (run_shell("/usr/bin/python3 -c 'import xxhash, numpy, regex' 2>/dev/null") != 0) {
    *why = "python3-xxhash / python3-numpy / python3-regex missing (tools/setup)";
    return "";
  }
  return peer;
}

struct PeerDecision {
  bool keep = false;
  std::string reason, xxh64;
};

std::map<std::string, PeerDecision> read_peer(const std::string& path) {
  std::map<std::string, PeerDecision> m;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    PeerDecision d;
    d.keep = j["keep"].is_boolean() && j["keep"].get<bool>();
    if (j["reason"].is_string()) d.reason = j["reason"].get<std::string>();
    if (j.contains("text_xxh64") && j["text_xxh64"].is_string())
      d.xxh64 = j["text_xxh64"].get<std::string>();
    m[j["id"].get<std::string>()] = d;
  }
  return m;
}

std::string xxh64_hex(const std::string& s) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH64(s.data(), s.size(), 0)));
  return buf;
}

struct Doc {
  std::string id, text, source;
};

class DatatroveAgreement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = new std::string;
    peer_ = new std::string(find_peer(skip_));
    if (peer_->empty()) return;
    tmp_ = new TempDir("filters_dt");
    const std::string src = test::source_dir();
    const std::string corpus = *tmp_ / "in/corpus.jsonl";
    fs::create_directories(*tmp_ / "in");
    if (run_shell("/usr/bin/python3 " + src + "/tests/dataprep/filter_corpus.py " + corpus +
                  " --seed 11 --docs 2400") != 0) {
      *skip_ = "filter_corpus.py failed";
      return;
    }
    if (run_shell("cd " + *peer_ + " && /usr/bin/python3 run_datatrove_filters.py " + corpus +
                  " --out " + (*tmp_ / "dt") + " > " + (*tmp_ / "dt.log") + " 2>&1") != 0) {
      *skip_ = "";  // (the peer is there but failed: a failure, not a skip)
      failed_ = true;
      return;
    }
    docs_ = new std::vector<Doc>;
    std::istringstream in(read_text(corpus));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      docs_->push_back({j["id"].get<std::string>(), j["text"].get<std::string>(),
                        j["source"].get<std::string>()});
    }
  }
  static void TearDownTestSuite() {
    delete docs_;
    delete tmp_;
    delete peer_;
    delete skip_;
    docs_ = nullptr;
    tmp_ = nullptr;
  }
  void SetUp() override {
    if (failed_) FAIL() << "datatrove peer failed: " << read_text(*tmp_ / "dt.log");
    if (peer_->empty() || !docs_) GTEST_SKIP() << *skip_;
  }

  // Agreement of Kiln's `name` filter at its defaults with datatrove's `peer_file`.
  void compare(const std::string& name, const std::string& peer_file, bool text) {
    auto peer = read_peer(*tmp_ / ("dt/" + peer_file + ".jsonl"));
    ASSERT_EQ(peer.size(), docs_->size());
    YAML::Node cfg = YAML::Load("[{name: " + name + "}]");
    auto chain = prep::filter::FilterChain::from_yaml(cfg);
    ASSERT_TRUE(chain.is_ok()) << chain.status().to_string();
    size_t same = 0, kept = 0, dropped = 0, same_text = 0, both_keep = 0, shown = 0;
    std::map<std::string, std::map<std::string, int>> reasons;  // datatrove reason -> kiln rule
    for (const Doc& d : *docs_) {
      std::string t = d.text;
      auto o = (*chain)->run(&t, "");
      const PeerDecision& p = peer.at(d.id);
      (o.keep ? kept : dropped)++;
      if (o.keep == p.keep) ++same;
      if (!o.keep && !p.keep) ++reasons[p.reason][o.drop.rule];
      if (o.keep && p.keep && text) {
        ++both_keep;
        if (xxh64_hex(t) == p.xxh64) {
          ++same_text;
        } else if (shown++ < 3) {
          ADD_FAILURE() << name << " " << d.id << ": the kept texts differ";
        }
      }
      if (o.keep != p.keep && shown++ < 5)
        std::printf("%s %s (%s): kiln %s, datatrove %s\n", name.c_str(), d.id.c_str(),
                    d.source.c_str(), o.keep ? "keeps" : (*chain)->describe(o).c_str(),
                    p.keep ? "keeps" : p.reason.c_str());
    }
    const double agree = static_cast<double>(same) / docs_->size();
    std::printf("%s: %zu of %zu documents decided as datatrove decides (%.4f); kiln keeps %zu\n",
                name.c_str(), same, docs_->size(), agree, kept);
    for (const auto& [r, m] : reasons) {
      std::printf("  datatrove %s ->", r.c_str());
      for (const auto& [k, n] : m) std::printf(" %s %d", k.c_str(), n);
      std::printf("\n");
    }
    EXPECT_GE(agree, 0.99) << name;
    // Both sides of the filter's thresholds are in the corpus.
    EXPECT_GE(kept, docs_->size() / 20) << name;
    EXPECT_GE(dropped, docs_->size() / 20) << name;
    if (text) {
      EXPECT_GT(both_keep, docs_->size() / 20);
      EXPECT_EQ(same_text, both_keep) << name << ": the text c4 leaves";
    }
  }

  static std::string* peer_;
  static std::string* skip_;
  static TempDir* tmp_;
  static std::vector<Doc>* docs_;
  static bool failed_;
};
std::string* DatatroveAgreement::peer_ = nullptr;
std::string* DatatroveAgreement::skip_ = nullptr;
TempDir* DatatroveAgreement::tmp_ = nullptr;
std::vector<Doc>* DatatroveAgreement::docs_ = nullptr;
bool DatatroveAgreement::failed_ = false;

// Each filter at its defaults, then the four as a chain through `kiln prep --dry-run-filters`, c4
// last (so every filter sees the text datatrove's filters saw): a document is kept when all four
// of datatrove's keep it. (One test: ctest runs each test in its own process, and the corpus and
// datatrove's run are made once per process.)
TEST_F(DatatroveAgreement, EachFilterAndTheChain) {
  compare("gopher_quality", "gopher_quality", false);
  compare("gopher_repetition", "gopher_repetition", false);
  compare("c4", "c4_quality", true);
  compare("fineweb", "fineweb_quality", false);
  const std::string cfg = *tmp_ / "chain.yaml";
  write_file(cfg,
             "filters:\n  - {name: gopher_repetition}\n  - {name: gopher_quality}\n"
             "  - {name: fineweb}\n  - {name: c4}\n");
  const std::string out = *tmp_ / "out";
  const std::string cmd = std::string(test::kiln_binary()) + " prep --input " + (*tmp_ / "in") +
                          " --config " + cfg +
                          " --tokenizer none --threads 2 --dry-run-filters --output " + out +
                          " > " + (*tmp_ / "prep.log") + " 2>&1";
  ASSERT_EQ(run_shell(cmd), 0) << read_text(*tmp_ / "prep.log");
  std::set<std::string> dropped;
  for (const auto& f : fs::directory_iterator(out + "/rejects")) {
    std::istringstream in(read_text(f.path().string()));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      ASSERT_EQ(j.value("reason", ""), "filtered") << line;  // (no other rejects here)
      dropped.insert(j["id"].get<std::string>());
    }
  }
  std::map<std::string, bool> keep;
  for (const Doc& d : *docs_) keep[d.id] = true;
  for (const char* f : {"gopher_repetition", "gopher_quality", "fineweb_quality", "c4_quality"})
    for (const auto& [id, p] : read_peer(*tmp_ / (std::string("dt/") + f + ".jsonl")))
      keep[id] = keep[id] && p.keep;
  size_t same = 0, kept = 0;
  for (const Doc& d : *docs_) {
    const bool k = !dropped.count(d.id);
    kept += k;
    same += k == keep[d.id];
  }
  const double agree = static_cast<double>(same) / docs_->size();
  std::printf("chain: %zu of %zu documents decided as datatrove decides (%.4f); kiln keeps %zu\n",
              same, docs_->size(), agree, kept);
  EXPECT_GE(agree, 0.99);
  EXPECT_GE(kept, docs_->size() / 20);
}

}  // namespace
}  // namespace kiln
