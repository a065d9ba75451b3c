// Dedup quality against brute force: a generated English + Chinese corpus with copies injected at
// known edit rates; exact Jaccard of every pair of documents computed directly on the shingle
// sets. At threshold 0.8: recall >= 0.97 on pairs with J >= 0.85, and >= 0.97 of the removed
// documents have J >= 0.7 with the document kept in their place.
#include <gtest/gtest.h>

#include "comm/comm.h"
#include "dataprep/prep.h"
#include "tests/dataprep/prep_test_util.h"

namespace kiln::prep {
namespace {
using namespace testing_prep;

TEST(PrepQuality, RecallAndPrecisionAgainstBruteForceJaccard) {
  TempDir tmp("prep_quality");
  CorpusGen gen(2024);
  const std::vector<double> rates = {0.0, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.3};
  auto docs = gen.make(700, 0.35, rates, 3);
  write_corpus(docs, tmp / "in", 4);
  auto group = comm::make_local_group();
  auto r = run_prep(
      prep_config({"input.paths=[\"" + tmp / "in" + "\"]", "output=\"" + tmp / "out" + "\"",
                   "tokenizer.path=none", "dedup.threshold=0.8"}),
      *group);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto removed = read_removed(tmp / "out");

  const int n = static_cast<int>(docs.size());
  std::vector<std::vector<uint64_t>> sets(n);
  for (int i = 0; i < n; ++i) sets[i] = shingle_set(docs[i].text, 5);
  auto index = [](const std::string& id) { return std::stoi(id.substr(1)); };
  // Where each document ended: itself when kept, else its kept representative.
  std::vector<int> home(n);
  for (int i = 0; i < n; ++i) home[i] = i;
  for (const auto& [id, kept] : removed) home[index(id)] = index(kept.first);

  // Recall over every pair (brute force, all n^2/2 pairs).
  uint64_t high = 0, found = 0, cjk_high = 0;
  std::map<int, std::pair<uint64_t, uint64_t>> by_bucket;  // J*20 -> (pairs, together)
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      double jac = jaccard(sets[i], sets[j]);
      if (jac >= 0.5) {
        auto& b = by_bucket[static_cast<int>(jac * 20)];
        ++b.first;
        b.second += home[i] == home[j];
      }
      if (jac < 0.85) continue;
      ++high;
      cjk_high += docs[i].cjk;
      found += home[i] == home[j];
    }
  ASSERT_GT(high, 300u);
  ASSERT_GT(cjk_high, 50u);
  double recall = static_cast<double>(found) / high;
  // Precision: removed documents really resemble what was kept instead.
  uint64_t close = 0;
  for (const auto& [id, kept] : removed)
    close += jaccard(sets[index(id)], sets[index(kept.first)]) >= 0.7;
  double precision = removed.empty() ? 0 : static_cast<double>(close) / removed.size();
  std::printf("pairs with J>=0.85: %llu (CJK %llu), recall %.4f; removed %zu, precision %.4f\n",
              (unsigned long long)high, (unsigned long long)cjk_high, recall, removed.size(),
              precision);
  for (const auto& [b, v] : by_bucket)
    std::printf("  J in [%.2f, %.2f): %llu pairs, %llu in one cluster\n", b / 20.0, (b + 1) / 20.0,
                (unsigned long long)v.first, (unsigned long long)v.second);
  EXPECT_GE(recall, 0.97);
  EXPECT_GE(precision, 0.97);
  EXPECT_GT(r->near_dups, 100u);
  EXPECT_GT(r->exact_dups, 20u);
}

}  // namespace
}  // namespace kiln::prep
