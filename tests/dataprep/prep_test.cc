// End-to-end tests of the prep pipeline in one process (dataprep/prep.h).
#include "dataprep/prep.h"

#include <gtest/gtest.h>

#include "comm/comm.h"
#include "dataprep/stages/sample_metadata.h"
#include "format/manifest.h"
#include "format/shard_reader.h"
#include "tests/compress_util.h"
#include "tests/dataprep/prep_test_util.h"

namespace kiln::prep {
namespace {
using namespace testing_prep;

using testing_compress::gzip;
using testing_compress::zstd;

Result<PrepResult> prep(const std::string& in, const std::string& out,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"input.paths=[\"" + in + "\"]", "output=\"" + out + "\"",
                                   "tokenizer.path=none"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  auto group = comm::make_local_group();
  return run_prep(prep_config(sets), *group);
}

std::string line(const std::string& text, const std::string& extra = "") {
  return "{\"text\": " + nlohmann::json(text).dump() + extra + "}\n";
}

// The hand-written sample metadata is byte-identical to nlohmann's dump of the same object.
TEST(Prep, SampleMetadataMatchesJsonDump) {
  std::mt19937 rng(3);
  const std::vector<std::string> pool = {"a",    "\"",       "\\",           "/",
                                         "\n",   "\t",       "\x01",         "\x1f",
                                         "\x7f", "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80",
                                         " ",    "\xff",     "\b",           "\f",
                                         "\r"};
  auto random_string = [&] {
    std::string s;
    for (int i = static_cast<int>(rng() % 8); i > 0; --i) s += pool[rng() % pool.size()];
    return s;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    Document d;
    d.id = random_string();
    d.domain = "web";
    d.domain_by = iter % 2 ? "default" : "rule:" + random_string();
    d.source = random_string();
    d.url = iter % 3 ? "" : random_string();
    d.tokens.resize(rng() % 5);
    if (iter % 7 == 0) d.carried["meta"] = {{"k", random_string()}};
    if (iter % 11 == 0) d.carried["zz"] = 5;
    nlohmann::json j = d.carried;
    j["id"] = d.id;
    j["domain"] = d.domain;
    j["domain_by"] = d.domain_by;
    j["source"] = d.source;
    if (!d.url.empty()) j["url"] = d.url;
    j["tokens"] = d.tokens.size();
    ASSERT_EQ(detail::sample_metadata(d),
              j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
}

TEST(Prep, EveryBadInputHasItsReasonAndNothingIsLost) {
  TempDir tmp("prep_bad");
  std::string in = tmp / "in";
  std::string good = "A perfectly ordinary document with enough words to be kept around here.";
  std::string lines = line(good);
  lines += "{this is not json\n";                               // 2 invalid_json
  lines += "{\"title\": \"no text\"}\n";                        // 3 missing_text
  lines += "{\"text\": 17}\n";                                  // 4 text_not_string
  lines += "{\"text\": \"   \"}\n";                             // 5 empty_text
  lines += "{\"text\": \"broken \xff utf8 here\"}\n";           // 6 invalid_utf8
  lines += "{\"text\": \"" + std::string(5000, 'x') + "\"}\n";  // 7 too_long
  lines += "[1, 2, 3]\n";                                       // 8 not_object
  lines += "{\"text\": \"fine\", \"meta\": 5}\n";               // 9 bad_field
  lines += "\n   \n";                                           // blank: skipped
  lines += line("Another ordinary document, different from the first one entirely.");
  write_file(in + "/a.jsonl", lines);
  std::string gz_data, zst_data;
  for (int i = 0; i < 200; ++i) {
    gz_data += line("gzip document number " + std::to_string(i) + " with some filler words");
    zst_data += line("zstd document number " + std::to_string(i) + " with other filler words");
  }
  std::string gz = gzip(gz_data), zs = zstd(zst_data);
  write_file(in + "/b.jsonl.gz", gz.substr(0, gz.size() * 2 / 3));   // truncated
  write_file(in + "/c.jsonl.zst", zs.substr(0, zs.size() * 2 / 3));  // truncated
  std::string bad = gz;
  for (size_t i = 30; i < 80; ++i) bad[i] ^= 0x33;
  write_file(in + "/d.jsonl.gz", bad);  // corrupt

  for (std::string policy : {"reject", "repair"}) {
    std::string out = tmp / ("out-" + policy);
    auto r =
        prep(in, out,
             {"input.max_line_bytes=1000", "input.max_reject_fraction=1", "input.utf8=" + policy});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto stats = nlohmann::json::parse(read_text(out + "/stats.json"));
    const auto& by = stats["rejected_by_reason"];
    EXPECT_EQ(by["invalid_json"], 1);
    EXPECT_EQ(by["missing_text"], 1);
    EXPECT_EQ(by["text_not_string"], 1);
    EXPECT_EQ(by["empty_text"], 1);
    EXPECT_EQ(by["invalid_utf8"], policy == "reject" ? 1 : 0);
    EXPECT_EQ(stats["repaired_utf8"], policy == "reject" ? 0 : 1);
    EXPECT_EQ(by["too_long"], 1);
    EXPECT_EQ(by["not_object"], 1);
    EXPECT_EQ(by["bad_field"], 1);
    EXPECT_EQ(by["truncated_file"], 2);
    EXPECT_EQ(by["corrupt_file"], 1);
    uint64_t in_docs = stats["docs_in"], out_docs = stats["docs_out"];
    uint64_t ex = stats["exact_dups"], near = stats["near_dups"], rej = stats["rejected"];
    EXPECT_EQ(in_docs, out_docs + ex + near + rej);
    EXPECT_EQ(r->docs_in, in_docs);
    // Each reject is listed with its file and line.
    std::map<std::string, std::pair<std::string, uint64_t>> where;
    std::ifstream rj(out + "/rejects/rejects-00000.jsonl");
    std::string l;
    uint64_t listed = 0;
    while (std::getline(rj, l)) {
      auto j = nlohmann::json::parse(l);
      where[j["reason"]] = {j["file"], j["line"]};
      ++listed;
    }
    EXPECT_EQ(listed, rej);
    EXPECT_EQ(where["invalid_json"], std::make_pair(in + "/a.jsonl", uint64_t{2}));
    EXPECT_EQ(where["missing_text"].second, 3u);
    EXPECT_EQ(where["text_not_string"].second, 4u);
    EXPECT_EQ(where["empty_text"].second, 5u);
    if (policy == "reject") EXPECT_EQ(where["invalid_utf8"].second, 6u);
    EXPECT_EQ(where["too_long"].second, 7u);
    EXPECT_EQ(where["not_object"].second, 8u);
    EXPECT_EQ(where["bad_field"].second, 9u);
    EXPECT_EQ(where["corrupt_file"].first, in + "/d.jsonl.gz");
    // The documents before the truncation point were kept.
    EXPECT_GT(out_docs, 100u);
    auto m = read_manifest(out);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    uint64_t samples = 0;
    for (const auto& s : m->shards) {
      auto all = ShardReader::read_all(m->shard_path(s));
      ASSERT_TRUE(all.is_ok()) << all.status().to_string();
      samples += all->size();
      for (const auto& smp : *all) {
        ASSERT_NE(smp.find("txt"), nullptr);
        ASSERT_NE(smp.find("json"), nullptr);
        auto meta = nlohmann::json::parse(smp.find("json")->data);
        EXPECT_TRUE(meta.contains("id"));
        EXPECT_EQ(meta["domain"], s.domain);
        EXPECT_EQ(smp.key.size(), 12u);
      }
    }
    EXPECT_EQ(samples, out_docs);
  }
}

TEST(Prep, TooManyRejectsExit3NamingTheWorstFile) {
  TempDir tmp("prep_frac");
  std::string in = tmp / "in";
  std::string good, bad;
  for (int i = 0; i < 50; ++i) good += line("good document " + std::to_string(i) + " alpha beta");
  for (int i = 0; i < 10; ++i) bad += "garbage line " + std::to_string(i) + "\n";
  write_file(in + "/good.jsonl", good);
  write_file(in + "/bad.jsonl", bad);
  auto r = prep(in, tmp / "out");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 3);
  EXPECT_NE(r.status().message().find("bad.jsonl: 10 of 10 rejected (mostly invalid_json)"),
            std::string::npos)
      << r.status().message();
  // Raising the limit continues from the recorded scan.
  auto r2 = prep(in, tmp / "out", {"input.max_reject_fraction=0.5"});
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_TRUE(r2->resumed);
  EXPECT_EQ(r2->rejected, 10u);
  EXPECT_EQ(r2->docs_out, 50u);
}

TEST(Prep, ExactAndNearDuplicatesAreRemovedAndListed) {
  TempDir tmp("prep_dups");
  CorpusGen gen(11);
  auto docs = gen.make(40, 0.3, {0.0, 0.01}, 2);
  write_corpus(docs, tmp / "in", 3);
  auto r = prep(tmp / "in", tmp / "out");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto removed = read_removed(tmp / "out");
  EXPECT_EQ(removed.size(), r->exact_dups + r->near_dups);
  EXPECT_GT(r->exact_dups, 0u);
  EXPECT_GT(r->near_dups, 0u);
  // The kept document of each cluster is the earliest: a kept id has a smaller index.
  for (const auto& [id, kept] : removed) {
    EXPECT_LT(std::stoi(kept.first.substr(1)), std::stoi(id.substr(1)));
    EXPECT_EQ(removed.count(kept.first), 0u) << "kept document was itself removed";
    int a = std::stoi(id.substr(1)), b = std::stoi(kept.first.substr(1));
    EXPECT_EQ(docs[a].family, docs[b].family)
        << id << " joined an unrelated document " << kept.first;
    if (docs[a].text == docs[b].text) EXPECT_EQ(kept.second, 1.0);
  }
  // Every original and copy is either kept or removed, never both or neither.
  auto stats = nlohmann::json::parse(read_text(tmp / "out/stats.json"));
  EXPECT_EQ(stats["docs_out"].get<uint64_t>() + removed.size(), docs.size());
  EXPECT_EQ(stats["dedup"]["bands"], 16);
  EXPECT_EQ(stats["dedup"]["rows"], 8);
  EXPECT_GT(stats["dedup"]["cluster_sizes"].size(), 0u);
}

TEST(Prep, SameOutputFor1To4ThreadsAndUnderSpilling) {
  TempDir tmp("prep_threads");
  CorpusGen gen(12);
  auto docs = gen.make(300, 0.3, {0.0, 0.005, 0.01, 0.02, 0.05}, 2);
  write_corpus(docs, tmp / "in", 5);
  std::map<std::string, std::string> first;
  for (int threads : {1, 2, 4}) {
    std::string out = tmp / ("out" + std::to_string(threads));
    auto r = prep(tmp / "in", out, {"threads=" + std::to_string(threads), "shards.max_samples=50"});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto tree = output_tree(out);
    if (first.empty()) {
      first = tree;
      EXPECT_GT(tree.size(), 4u);
    } else {
      EXPECT_EQ(tree, first) << "threads=" << threads;
    }
  }
  // A 64 KiB budget spills sorted runs to disk (several runs, merged); the result is the same.
  std::string out = tmp / "out-spill";
  auto r = prep(tmp / "in", out, {"memory=64K", "shards.max_samples=50"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto stats = nlohmann::json::parse(read_text(out + "/stats.json"));
  EXPECT_GT(stats["dedup"]["spilled_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(output_tree(out).at("manifest.json"), first.at("manifest.json"));
  EXPECT_EQ(output_tree(out).at("dedup/removed.jsonl"), first.at("dedup/removed.jsonl"));
}

TEST(Prep, TextFoldersGlobsAndCompressedInputs) {
  TempDir tmp("prep_inputs");
  write_file(tmp / "docs/readme.txt", "A text file document about installing the package.");
  write_file(tmp / "docs/sub/notes.md", "Notes: a second text document in a sub folder.");
  write_file(tmp / "docs/.hidden", "hidden files are skipped");
  write_file(tmp / "docs/data.jsonl.gz", gzip(line("from a gzip jsonl", ",\"id\":\"g1\"")));
  write_file(tmp / "docs/data2.jsonl.zst", zstd(line("from a zstd jsonl")));
  write_file(tmp / "more/x.jsonl", line("from a glob", ",\"source\":\"glob\""));
  std::vector<std::string> sets = {
      "input.paths=[\"" + tmp / "docs" + "\", \"" + tmp / "mo*" + "\"]",
      "output=\"" + tmp / "out" + "\"", "tokenizer.path=none"};
  auto group = comm::make_local_group();
  auto r = run_prep(prep_config(sets), *group);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->docs_in, 5u);
  EXPECT_EQ(r->docs_out, 5u);
  std::set<std::string> ids;
  auto m = read_manifest(tmp / "out");
  ASSERT_TRUE(m.is_ok());
  for (const auto& s : m->shards) {
    auto all = ShardReader::read_all(m->shard_path(s));
    ASSERT_TRUE(all.is_ok());
    for (const auto& smp : *all)
      ids.insert(nlohmann::json::parse(smp.find("json")->data)["id"].get<std::string>());
  }
  EXPECT_EQ(ids, (std::set<std::string>{"readme.txt", "sub/notes.md", "g1", "data2:1", "x:1"}));
}

TEST(Prep, OutputInsideTheInputFolderIsNotRead) {
  TempDir tmp("prep_nested");
  write_file(tmp / "data/a.jsonl", line("one document about nesting folders"));
  for (int run = 0; run < 2; ++run) {
    auto r = prep(tmp / "data", tmp / "data/out", {run ? "dedup.ngram=4" : "dedup.ngram=5"});
    if (run == 1) {
      ASSERT_FALSE(r.is_ok());  // a different setting: refused, not resumed from wrong inputs
      continue;
    }
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->docs_in, 1u);
  }
  auto again = prep(tmp / "data", tmp / "data/out", {"dedup.ngram=5"});
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_TRUE(again->already_complete);
}

TEST(Prep, RefusesForeignOutputAndOverwrites) {
  TempDir tmp("prep_over");
  write_file(tmp / "in/a.jsonl", line("some text for the dataset here"));
  ASSERT_TRUE(prep(tmp / "in", tmp / "out").is_ok());
  auto again = prep(tmp / "in", tmp / "out");
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->already_complete);
  auto other = prep(tmp / "in", tmp / "out", {"dedup.ngram=3"});
  ASSERT_FALSE(other.is_ok());
  EXPECT_EQ(other.status().exit_code(), 2);
  std::vector<std::string> sets = {"input.paths=[\"" + tmp / "in" + "\"]",
                                   "output=\"" + tmp / "out" + "\"", "tokenizer.path=none",
                                   "dedup.ngram=3"};
  auto group = comm::make_local_group();
  PrepRunOptions ro;
  ro.overwrite = true;
  auto over = run_prep(prep_config(sets), *group, ro);
  ASSERT_TRUE(over.is_ok()) << over.status().to_string();
  EXPECT_FALSE(over->already_complete);
}

}  // namespace
}  // namespace kiln::prep
