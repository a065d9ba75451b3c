// Incremental prep as a user runs it (docs/PREP.md "Incremental prep"): B prepared --against A
// removes what A+B in one run removes from B; settings that differ from the index are refused by
// name; --append survives kill -9 at every point of its commit and resumes; the appended dataset
// verifies and loads as one.
#include <gtest/gtest.h>
#include <signal.h>

#include <set>

#include "format/manifest.h"
#include "tests/dataprep/prep_test_util.h"
#include "tests/test_paths.h"

namespace kiln {
namespace {
using namespace testing_prep;

// "<prefix><i>" (appending avoids GCC 12's false -Wrestrict on "literal" + std::string).
std::string name_of(const char* prefix, size_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

// JSONL with ids "d<first + i>" in `files` files.
void write_part(const std::vector<GenDoc>& docs, size_t first, size_t last, const std::string& dir,
                int files) {
  std::vector<std::string> out(files);
  for (size_t i = first; i < last; ++i) {
    nlohmann::json j = {{"id", name_of("d", i)}, {"text", docs[i].text}};
    out[(i - first) * files / (last - first)] += j.dump() + "\n";
  }
  for (int f = 0; f < files; ++f) {
    char name[32];
    std::snprintf(name, sizeof name, "part-%03d.jsonl", f);
    write_file(dir + "/" + name, out[f]);
  }
}

struct Removed {
  std::string kept, dataset;
  double similarity = 0;
};
std::map<std::string, Removed> removed_of(const std::string& out) {
  std::map<std::string, Removed> m;
  std::ifstream in(out + "/dedup/removed.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    m[j["id"].get<std::string>()] = {j["kept"].get<std::string>(),
                                     j.value("kept_dataset", std::string()),
                                     j["similarity"].get<double>()};
  }
  return m;
}

class Incremental : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir("prep_incr");
    CorpusGen gen(11);
    docs_ = new std::vector<GenDoc>(gen.make(700, 0.3, {0.0, 0.0, 0.01, 0.02, 0.05, 0.3}, 2));
    // A: the first 75%; B: the rest (their duplicates are spread over both by the shuffle).
    n_a_ = docs_->size() * 3 / 4;
    write_part(*docs_, 0, n_a_, *tmp_ / "A", 3);
    write_part(*docs_, n_a_, docs_->size(), *tmp_ / "B", 2);
    ASSERT_EQ(run_shell(prep(*tmp_ / "A", *tmp_ / "outA")), 0) << read_text(*tmp_ / "outA.log");
  }
  static void TearDownTestSuite() {
    delete tmp_;
    delete docs_;
    tmp_ = nullptr;
  }
  static std::string kiln() { return kiln::test::kiln_binary(); }
  // Settings of the union / first run: a small tokenizer, small shards.
  static std::string prep(const std::string& inputs, const std::string& out,
                          const std::string& extra = "") {
    return kiln() + " prep --input " + inputs + " --output " + out +
           " --shard-samples 80 --vocab-size 300 --set tokenizer.train_bytes=200000 " + extra +
           " >/dev/null 2>" + out + ".log";
  }
  static std::string append(const std::string& dataset, const std::string& extra = "") {
    return kiln() + " prep --input " + *tmp_ / "B" + " --append " + dataset + " " + extra +
           " >/dev/null 2>" + dataset + ".log";
  }
  static TempDir* tmp_;
  static std::vector<GenDoc>* docs_;
  static size_t n_a_;
};
TempDir* Incremental::tmp_ = nullptr;
std::vector<GenDoc>* Incremental::docs_ = nullptr;
size_t Incremental::n_a_ = 0;

bool in_b(const std::string& id, size_t n_a) { return std::stoull(id.substr(1)) >= n_a; }

// The property of the issue: what B --against A removes from B equals what A+B in one run
// removes from B, with the same kept document and similarity. (The one order-dependent exception,
// docs/PREP.md: with several --against datasets, a document that A2's own run removed as a copy
// of a document of A1 is not in A2's index; this test has one earlier dataset.)
TEST_F(Incremental, AgainstRemovesWhatTheUnionRemoves) {
  const std::string outB = *tmp_ / "outB", outAB = *tmp_ / "outAB";
  ASSERT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + outB +
                      " --shard-samples 80 --against " + *tmp_ / "outA" + " >/dev/null 2>" + outB +
                      ".log"),
            0)
      << read_text(outB + ".log");
  ASSERT_EQ(run_shell(prep(*tmp_ / "A" + " " + *tmp_ / "B", outAB)), 0)
      << read_text(outAB + ".log");
  auto union_removed = removed_of(outAB);
  auto against_removed = removed_of(outB);
  std::map<std::string, Removed> union_b;
  for (const auto& [id, r] : union_removed)
    if (in_b(id, n_a_)) union_b[id] = r;
  size_t kept_in_a = 0;
  for (const auto& [id, r] : union_b) {
    auto it = against_removed.find(id);
    ASSERT_NE(it, against_removed.end()) << id << " is removed by the union run only";
    EXPECT_EQ(it->second.kept, r.kept) << id;
    EXPECT_NEAR(it->second.similarity, r.similarity, 1e-9) << id;
    if (!in_b(r.kept, n_a_)) {
      ++kept_in_a;
      EXPECT_EQ(it->second.dataset, *tmp_ / "outA") << id;
    } else {
      EXPECT_EQ(it->second.dataset, "") << id;
    }
  }
  EXPECT_EQ(against_removed.size(), union_b.size());
  EXPECT_GT(kept_in_a, 20u);                  // many B documents copy A documents...
  EXPECT_GT(union_b.size(), kept_in_a + 10);  // ...and many copy other B documents
  // The new dataset uses A's tokenizer and says how much it removed against A.
  EXPECT_EQ(read_text(outB + "/tokenizer.json"), read_text(*tmp_ / "outA/tokenizer.json"));
  auto stats = nlohmann::json::parse(read_text(outB + "/stats.json"));
  EXPECT_EQ(stats["dedup"]["against_exact"].get<uint64_t>() +
                stats["dedup"]["against_near"].get<uint64_t>(),
            kept_in_a);
  EXPECT_EQ(run_shell(kiln() + " inspect " + outB + " --verify >/dev/null"), 0);

  // A and B read as one dataset (same tokenizer); with a dataset of another tokenizer, refused.
  const std::string both = *tmp_ / "outA" + "," + outB;
  auto m = read_manifest(both);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  uint64_t samples = 0;
  for (const auto& sh : m->shards) samples += sh.samples;
  auto stats_a = nlohmann::json::parse(read_text(*tmp_ / "outA/stats.json"));
  EXPECT_EQ(samples, stats_a["docs_out"].get<uint64_t>() + stats["docs_out"].get<uint64_t>());
  EXPECT_EQ(run_shell(kiln() + " stream " + both +
                      " --world 1 --rank 0 --steps 2 --seq-len 32 "
                      "--micro-batch 2 >/dev/null"),
            0);
  auto mixed = read_manifest(*tmp_ / "outA," + outAB);
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("different tokenizers"), std::string::npos);
}

// Chains through documents the first run removed: A holds x and x' (x' a near copy of x, so A
// removes it), B holds x'' (a near copy of x' but not of x). One run over A+B removes x'' (its
// cluster is kept by x); so must --against A and --append, which find x' in A's index (removed
// documents are index entries linked to the document kept for them).
TEST(IncrementalChains, ChainsThroughRemovedDocumentsAreFollowed) {
  TempDir tmp("prep_chain");
  CorpusGen gen(23);
  std::string a0, a1, b0;
  auto line = [](const std::string& id, const std::vector<std::string>& toks) {
    return nlohmann::json{{"id", id}, {"text", CorpusGen::join(toks, false)}}.dump() + "\n";
  };
  // Replaces `k` distinct tokens (never the first ones) by fresh ones.
  std::mt19937_64 rng(3);
  auto change = [&](std::vector<std::string> t, int k) {
    std::uniform_int_distribution<size_t> pos(5, t.size() - 1);
    for (int i = 0; i < k; ++i) t[pos(rng)] = gen.english_tokens(1)[0] + "q";
    return t;
  };
  constexpr int kChains = 40;
  for (int i = 0; i < kChains; ++i) {
    auto x = gen.english_tokens(300);
    auto x1 = change(x, 4), x2 = change(x1, 4);
    a0 += line(name_of("x", i), x);
    a1 += line(name_of("y", i), x1);
    b0 += line(name_of("z", i), x2);
    a0 += line(name_of("fa", i), gen.english_tokens(200));  // unrelated documents
    b0 += line(name_of("fb", i), gen.english_tokens(200));
  }
  // Bridges: A holds p and q (10 tokens apart: two clusters) and q' (a near copy of q, removed
  // for q); B holds s (halfway between p and q: near both) and t (an exact copy of q'). One run
  // joins p's and q's clusters through s, so it removes t for p; so must --against.
  for (int i = 0; i < kChains; ++i) {
    auto p = gen.english_tokens(300), q = p, s = p;
    std::uniform_int_distribution<size_t> pos(5, p.size() - 1);
    for (int k = 0; k < 10; ++k) {
      const size_t at = pos(rng);
      q[at] = gen.english_tokens(1)[0] + "q";
      if (k < 5) s[at] = q[at];
    }
    auto q1 = change(q, 2);
    a0 += line(name_of("p", i), p);
    a0 += line(name_of("q", i), q);
    a1 += line(name_of("r", i), q1);
    b0 += line(name_of("s", i), s);
    b0 += line(name_of("t", i), q1);
  }
  write_file(tmp / "A/part-0.jsonl", a0);
  write_file(tmp / "A/part-1.jsonl", a1);
  write_file(tmp / "B/part-0.jsonl", b0);
  write_file(tmp / "AB/a0.jsonl", a0);
  write_file(tmp / "AB/a1.jsonl", a1);
  write_file(tmp / "AB/b0.jsonl", b0);
  const std::string kiln = kiln::test::kiln_binary();
  const std::string common =
      " --shard-samples 50 --vocab-size 300 --set tokenizer.train_bytes=100000";
  auto run = [&](const std::string& args, const std::string& log) {
    return run_shell(kiln + " prep " + args + " >/dev/null 2>" + log) == 0 ? std::string()
                                                                           : read_text(log);
  };
  ASSERT_EQ(run("--input " + tmp / "A" + " --output " + tmp / "outA" + common, tmp / "a.log"), "");
  ASSERT_EQ(run("--input " + tmp / "AB" + " --output " + tmp / "outAB" + common, tmp / "ab.log"),
            "");
  ASSERT_EQ(run("--input " + tmp / "B" + " --output " + tmp / "outB --against " + tmp / "outA",
                tmp / "b.log"),
            "");
  fs::copy(tmp / "outA", tmp / "appended", fs::copy_options::recursive);
  ASSERT_EQ(run("--input " + tmp / "B" + " --append " + tmp / "appended", tmp / "append.log"), "");

  // A removed the x' (A's index holds them as entries linked to their x).
  auto removed_a = removed_of(tmp / "outA");
  size_t y_removed = 0;
  for (const auto& [id, r] : removed_a)
    y_removed += id[0] == 'y' && r.kept == name_of("x", std::stoul(id.substr(1)));
  EXPECT_GT(y_removed, kChains * 3 / 4);
  // The union removes x'' for x, some of them only through x' (similarity to x below the
  // threshold): the chains this test is about.
  auto of_b = [](const std::string& id) {
    return id[0] == 'z' || id[0] == 's' || id[0] == 't' || id.rfind("fb", 0) == 0;
  };
  std::map<std::string, Removed> union_b;
  size_t chained = 0, bridged = 0;
  for (const auto& [id, r] : removed_of(tmp / "outAB")) {
    if (!of_b(id)) continue;
    union_b[id] = r;
    chained += r.kept[0] == 'x' && r.similarity < 0.8;
    bridged += id[0] == 't' && r.kept[0] == 'p';
  }
  EXPECT_GE(chained, 5u) << "the corpus has too few chains to test";
  EXPECT_GE(bridged, 5u) << "the corpus has too few bridges to test";
  for (const std::string& out : {tmp / "outB", tmp / "appended"}) {
    auto got = removed_of(out);
    std::map<std::string, Removed> got_b;
    for (const auto& [id, r] : got)
      if (of_b(id)) got_b[id] = r;
    EXPECT_EQ(got_b.size(), union_b.size()) << out;
    for (const auto& [id, r] : union_b) {
      auto it = got_b.find(id);
      ASSERT_NE(it, got_b.end()) << out << ": " << id << " is removed by the union run only";
      EXPECT_EQ(it->second.kept, r.kept) << out << ": " << id;
      EXPECT_NEAR(it->second.similarity, r.similarity, 1e-9) << out << ": " << id;
    }
  }
  EXPECT_EQ(run_shell(kiln + " inspect " + tmp / "appended" + " --verify >/dev/null"), 0);
  EXPECT_EQ(run_shell(kiln + " inspect " + tmp / "outB" + " --verify >/dev/null"), 0);
}

TEST_F(Incremental, MismatchingSettingsAreRefusedByName) {
  struct Case {
    const char* flags;
    const char* key;
  } cases[] = {{"--num-perm 64", "dedup.num_perm"},
               {"--seed 7", "dedup.seed"},
               {"--ngram 3", "dedup.ngram"},
               {"--strip-punct", "dedup.strip_punct"},
               {"--bands 8 --rows 8", "dedup.bands"}};
  int n = 0;
  for (const Case& k : cases) {
    const std::string out = *tmp_ / ("refused" + std::to_string(n++));
    int rc =
        run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + out + " --against " +
                  *tmp_ / "outA" + " " + k.flags + " >/dev/null 2>" + out + ".log");
    EXPECT_EQ(rc, 2) << k.flags;
    std::string log = read_text(out + ".log");
    EXPECT_NE(log.find(k.key), std::string::npos) << k.flags << ": " << log;
    EXPECT_FALSE(fs::exists(out + "/manifest.json")) << k.flags;
  }
  // --append takes the dataset's settings by default, but refuses a different one given.
  const std::string copy = *tmp_ / "refused_append";
  fs::copy(*tmp_ / "outA", copy, fs::copy_options::recursive);
  EXPECT_EQ(run_shell(append(copy, "--num-perm 64")), 2);
  EXPECT_NE(read_text(copy + ".log").find("dedup.num_perm"), std::string::npos);
  EXPECT_EQ(run_shell(append(copy, "--tokenizer " + *tmp_ / "outA/tokenizer.json")), 2);
  EXPECT_EQ(read_text(copy + "/manifest.json"), read_text(*tmp_ / "outA/manifest.json"));
  // A dataset without an index cannot be deduplicated against.
  const std::string plain = *tmp_ / "plain";
  ASSERT_EQ(run_shell(prep(*tmp_ / "A", plain, "--no-index")), 0);
  EXPECT_FALSE(fs::exists(plain + "/dedup/index"));
  EXPECT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + *tmp_ / "noidx" +
                      " --against " + plain + " >/dev/null 2>" + *tmp_ / "noidx.log"),
            2);
  EXPECT_NE(read_text(*tmp_ / "noidx.log").find("no dedup index"), std::string::npos);
}

// Exact dedup only: the index holds hashes and ids, no signatures; copies are still found.
TEST_F(Incremental, ExactOnlyIndex) {
  const std::string a = *tmp_ / "exactA", b = *tmp_ / "exactB";
  ASSERT_EQ(run_shell(prep(*tmp_ / "A", a, "--no-near")), 0) << read_text(a + ".log");
  ASSERT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + b + " --no-near" +
                      " --against " + a + " >/dev/null 2>" + b + ".log"),
            0)
      << read_text(b + ".log");
  size_t against = 0;
  for (const auto& [id, r] : removed_of(b)) {
    EXPECT_EQ(r.similarity, 1.0) << id;
    against += !r.dataset.empty();
  }
  EXPECT_GT(against, 10u);
  EXPECT_EQ(run_shell(kiln() + " inspect " + b + " --verify >/dev/null"), 0);
  EXPECT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + *tmp_ / "exactC" +
                      " --against " + a + " >/dev/null 2>&1"),
            2);  // near dedup on here, off in the index
}

// --append takes the dataset's shard and split settings (recorded in its index) unless given,
// and says which it took; a value given wins and is reported beside the dataset's.
TEST_F(Incremental, AppendAdoptsTheDatasetsLayout) {
  auto meta = nlohmann::json::parse(read_text(*tmp_ / "outA/dedup/index/index.json"));
  EXPECT_EQ(meta["format"], "kiln-dedup-index/2");
  EXPECT_EQ(meta["settings"]["layout"]["shards.max_samples"].get<uint64_t>(), 80u);
  const std::string before = read_text(*tmp_ / "outA/manifest.json");
  auto appended_max = [&](const std::string& ds) {
    auto m = read_manifest(ds);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    uint64_t most = 0, samples = 0;
    auto a = read_manifest(*tmp_ / "outA");
    std::set<std::string> old;
    for (const auto& sh : a->shards) old.insert(fs::path(sh.path).filename().string());
    for (const auto& sh : m->shards) {
      if (old.count(fs::path(sh.path).filename().string())) continue;
      most = std::max(most, sh.samples);
      samples += sh.samples;
    }
    EXPECT_GT(samples, 100u);  // enough appended documents for shards to roll over
    return most;
  };
  const std::string adopt = *tmp_ / "adopt_layout";
  fs::copy(*tmp_ / "outA", adopt, fs::copy_options::recursive);
  ASSERT_EQ(run_shell(append(adopt)), 0) << read_text(adopt + ".log");
  EXPECT_NE(read_text(adopt + ".log").find("shards.max_samples=80"), std::string::npos)
      << read_text(adopt + ".log");
  EXPECT_EQ(appended_max(adopt), 80u);
  const std::string given = *tmp_ / "given_layout";
  fs::copy(*tmp_ / "outA", given, fs::copy_options::recursive);
  ASSERT_EQ(run_shell(append(given, "--shard-samples 30")), 0) << read_text(given + ".log");
  EXPECT_NE(read_text(given + ".log").find("shards.max_samples=30 as given; the dataset has 80"),
            std::string::npos)
      << read_text(given + ".log");
  EXPECT_EQ(appended_max(given), 30u);
  EXPECT_EQ(read_text(*tmp_ / "outA/manifest.json"), before);
}

// --against a dataset whose append was killed after its commit point finishes that append first
// (its journal decides it), then deduplicates against the whole appended dataset; a journal that
// cannot be finished is refused with a message, the dataset left as it is.
TEST_F(Incremental, AgainstFinishesAPendingAppendOrRefuses) {
  const std::string pend = *tmp_ / "pending";
  fs::copy(*tmp_ / "outA", pend, fs::copy_options::recursive);
  const std::string before = read_text(pend + "/manifest.json");
  ASSERT_EQ(run_shell("KILN_PREP_CRASH_AT=append-journal " + append(pend)), 128 + SIGKILL);
  ASSERT_TRUE(fs::exists(pend + "/.kiln-append/commit.json"));
  ASSERT_EQ(read_text(pend + "/manifest.json"), before);
  const std::string out = *tmp_ / "against_pending";
  ASSERT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + out + " --against " +
                      pend + " >/dev/null 2>" + out + ".log"),
            0)
      << read_text(out + ".log");
  EXPECT_NE(read_text(out + ".log").find("finished an interrupted append"), std::string::npos);
  EXPECT_FALSE(fs::exists(pend + "/.kiln-append"));
  EXPECT_NE(read_text(pend + "/manifest.json"), before);
  EXPECT_EQ(run_shell(kiln() + " inspect " + pend + " --verify >/dev/null"), 0);
  // B is in the appended dataset now: every document of B is a copy of one there.
  auto stats = nlohmann::json::parse(read_text(out + "/stats.json"));
  EXPECT_EQ(stats["docs_out"].get<uint64_t>(), 0u);
  EXPECT_GT(stats["dedup"]["against_exact"].get<uint64_t>(), 100u);

  // A journal that cannot be replayed (it names files that are gone): refused, nothing changed.
  const std::string bad = *tmp_ / "bad_journal";
  fs::copy(*tmp_ / "outA", bad, fs::copy_options::recursive);
  write_file(bad + "/.kiln-append/commit.json",
             R"({"moves": [["/nonexistent/kiln/a", "/nonexistent/kiln/b"]]})");
  const std::string out2 = *tmp_ / "against_bad";
  EXPECT_EQ(run_shell(kiln() + " prep --input " + *tmp_ / "B" + " --output " + out2 +
                      " --against " + bad + " >/dev/null 2>" + out2 + ".log"),
            2);
  EXPECT_NE(read_text(out2 + ".log").find("has an unfinished append"), std::string::npos)
      << read_text(out2 + ".log");
  EXPECT_TRUE(fs::exists(bad + "/.kiln-append/commit.json"));
  EXPECT_EQ(read_text(bad + "/manifest.json"), before);
  EXPECT_FALSE(fs::exists(out2 + "/manifest.json"));
}

// --append: the result removes what the union removes, verifies, loads as one dataset, and
// a kill -9 at any point leaves the dataset as it was or fully appended.
TEST_F(Incremental, AppendIsAtomicUnderKill) {
  const std::string ref = *tmp_ / "append_ref";
  fs::copy(*tmp_ / "outA", ref, fs::copy_options::recursive);
  ASSERT_EQ(run_shell(append(ref)), 0) << read_text(ref + ".log");
  EXPECT_EQ(run_shell(kiln() + " inspect " + ref + " --verify >/dev/null"), 0);
  EXPECT_FALSE(fs::exists(ref + "/.kiln-append"));
  const std::string before = read_text(*tmp_ / "outA/manifest.json");
  const std::string after = read_text(ref + "/manifest.json");
  ASSERT_NE(before, after);
  // Stats add up over both parts; the same command again does nothing.
  auto stats = nlohmann::json::parse(read_text(ref + "/stats.json"));
  EXPECT_EQ(stats["docs_in"].get<uint64_t>(), docs_->size());
  EXPECT_EQ(stats["appends"].get<uint64_t>(), 1u);
  ASSERT_EQ(run_shell(append(ref)), 0);
  EXPECT_EQ(read_text(ref + "/manifest.json"), after);
  // The loader reads the appended dataset as one (kiln stream over every document).
  EXPECT_EQ(run_shell(kiln() + " stream " + ref +
                      " --world 1 --rank 0 --steps 3 --seq-len 64 "
                      "--micro-batch 2 >/dev/null"),
            0);

  const char* points[] = {"stage-dedup",   "write-doc:5",   "append-staged",  "append-journal",
                          "append-move:1", "append-move:4", "append-finished"};
  int n = 0;
  for (const char* point : points) {
    const std::string out = *tmp_ / ("append_kill" + std::to_string(n++));
    fs::copy(*tmp_ / "outA", out, fs::copy_options::recursive);
    int rc = run_shell("KILN_PREP_CRASH_AT=" + std::string(point) + " " + append(out));
    ASSERT_EQ(rc, 128 + SIGKILL) << point << ": the crash point was not reached";
    // Right after the kill: the dataset is the old one or the appended one, and it verifies.
    ASSERT_EQ(run_shell(kiln() + " inspect " + out + " --verify >/dev/null 2>&1"), 0) << point;
    const std::string now = read_text(out + "/manifest.json");
    EXPECT_TRUE(now == before || now == after) << point;
    // The same command again completes it, identical to the uninterrupted append.
    ASSERT_EQ(run_shell(append(out)), 0) << point << ": " << read_text(out + ".log");
    EXPECT_EQ(read_text(out + "/manifest.json"), after) << point;
    EXPECT_EQ(read_text(out + "/dedup/removed.jsonl"), read_text(ref + "/dedup/removed.jsonl"))
        << point;
    auto tree = output_tree(out), want = output_tree(ref);
    for (const auto& [path, bytes] : want) {
      if (path.rfind("dedup/index/index.json", 0) == 0) continue;  // holds the stage's path
      auto it = tree.find(path);
      ASSERT_NE(it, tree.end()) << point << ": missing " << path;
      EXPECT_TRUE(it->second == bytes) << point << ": " << path << " differs";
    }
    EXPECT_EQ(tree.size(), want.size()) << point;
    EXPECT_FALSE(fs::exists(out + "/.kiln-append")) << point;
  }
}

}  // namespace
}  // namespace kiln
