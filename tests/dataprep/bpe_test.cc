// BPE core against straightforward reference implementations: encoding (GPT-2's loop) and
// training (recount every pair after every merge).
#include "dataprep/tokenizer/bpe.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <map>
#include <random>

#include "dataprep/tokenizer/bpe_train.h"

namespace kiln::prep {
namespace {

std::array<uint32_t, 256> identity_bytes() {
  std::array<uint32_t, 256> ids;
  for (int b = 0; b < 256; ++b) ids[b] = uint32_t(b);
  return ids;
}

// GPT-2's bpe(): merge the lowest-ranked pair everywhere, left to right, until none applies.
std::vector<uint32_t> reference_encode(const std::string& word,
                                       const std::vector<BpeMerge>& merges) {
  std::map<std::pair<uint32_t, uint32_t>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r)
    rank.emplace(std::make_pair(merges[r].left, merges[r].right), r);
  std::vector<uint32_t> sym;
  for (unsigned char c : word) sym.push_back(c);
  while (sym.size() > 1) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end()) best = std::min(best, it->second);
    }
    if (best == SIZE_MAX) break;
    std::vector<uint32_t> next;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == merges[best].left && sym[i + 1] == merges[best].right) {
        next.push_back(merges[best].result);
        i += 2;
      } else {
        next.push_back(sym[i++]);
      }
    }
    sym = std::move(next);
  }
  return sym;
}

// Training by brute force: recount all pairs each step.
std::vector<BpeMerge> reference_train(const std::vector<std::pair<std::string, uint64_t>>& words,
                                      size_t num_merges, uint64_t min_frequency) {
  std::vector<std::vector<uint32_t>> sym;
  for (const auto& [w, c] : words) {
    std::vector<uint32_t> s;
    for (unsigned char ch : w) s.push_back(ch);
    sym.push_back(s);
  }
  std::vector<BpeMerge> merges;
  for (uint32_t next_id = 256; merges.size() < num_merges; ++next_id) {
    std::map<std::pair<uint32_t, uint32_t>, uint64_t> counts;
    for (size_t w = 0; w < sym.size(); ++w)
      for (size_t i = 0; i + 1 < sym[w].size(); ++i)
        counts[{sym[w][i], sym[w][i + 1]}] += words[w].second;
    std::pair<uint32_t, uint32_t> best;
    uint64_t best_count = 0;
    for (const auto& [p, c] : counts)
      if (c > best_count) best_count = c, best = p;  // map order: smallest pair wins ties
    if (best_count < std::max<uint64_t>(min_frequency, 1)) break;
    merges.push_back({best.first, best.second, next_id});
    for (auto& s : sym) {
      std::vector<uint32_t> out;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == best.first && s[i + 1] == best.second) {
          out.push_back(next_id);
          i += 2;
        } else {
          out.push_back(s[i++]);
        }
      }
      s = out;
    }
  }
  return merges;
}

std::vector<WordCount> as_counts(const std::vector<std::pair<std::string, uint64_t>>& words) {
  std::vector<WordCount> out;
  for (const auto& [w, c] : words) out.push_back({w, c});
  return out;
}

std::vector<std::pair<std::string, uint64_t>> random_words(std::mt19937& rng, size_t n,
                                                           const std::string& alphabet) {
  std::map<std::string, uint64_t> m;
  for (size_t i = 0; i < n; ++i) {
    std::string w;
    size_t len = 1 + rng() % 12;
    for (size_t k = 0; k < len; ++k) w += alphabet[rng() % alphabet.size()];
    m[w] += 1 + rng() % 5;
  }
  return {m.begin(), m.end()};
}

TEST(Bpe, TrainingMatchesBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    auto words = random_words(rng, 200, trial % 2 ? "aab" : "abcdeaaa ");
    auto fast = train_bpe(as_counts(words), identity_bytes(), 256, 60, 2);
    auto slow = reference_train(words, 60, 2);
    ASSERT_EQ(fast.merges.size(), slow.size()) << "trial " << trial;
    for (size_t r = 0; r < slow.size(); ++r) {
      EXPECT_EQ(fast.merges[r].left, slow[r].left) << "trial " << trial << " rank " << r;
      EXPECT_EQ(fast.merges[r].right, slow[r].right) << "trial " << trial << " rank " << r;
      EXPECT_EQ(fast.merges[r].result, slow[r].result);
    }
  }
}

TEST(Bpe, TrainedTokensAreConcatenations) {
  std::vector<std::pair<std::string, uint64_t>> words = {{"hello", 10}, {"help", 5}, {"aaaa", 3}};
  auto r = train_bpe(as_counts(words), identity_bytes(), 256, 100, 2);
  ASSERT_FALSE(r.merges.empty());
  EXPECT_EQ(r.tokens[0], "el");  // "el" and "he" both occur 15 times; (e,l) < (h,e)
  std::map<uint32_t, std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, char(b));
  for (size_t i = 0; i < r.merges.size(); ++i) {
    bytes[r.merges[i].result] = bytes[r.merges[i].left] + bytes[r.merges[i].right];
    EXPECT_EQ(bytes[r.merges[i].result], r.tokens[i]);
  }
}

TEST(Bpe, EncodeMatchesGpt2Loop) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 10; ++trial) {
    auto words = random_words(rng, 300, trial % 2 ? "ab" : "abcab c");
    auto trained = train_bpe(as_counts(words), identity_bytes(), 256, 80, 1);
    BpeModel model(identity_bytes(), trained.merges);
    for (int i = 0; i < 300; ++i) {
      std::string w;
      size_t len = 1 + rng() % 40;
      for (size_t k = 0; k < len; ++k) w += "abc "[rng() % 4];
      std::vector<uint32_t> got;
      model.encode_word(w, &got);
      ASSERT_EQ(got, reference_encode(w, trained.merges)) << "word '" << w << "'";
    }
  }
}

TEST(Bpe, RepeatedCharacterRuns) {
  // "aaa..." with merges aa, aaaa: GPT-2 merges left to right without overlap.
  std::vector<BpeMerge> merges = {{'a', 'a', 256}, {256, 256, 257}};
  BpeModel model(identity_bytes(), merges);
  for (size_t n = 1; n < 20; ++n) {
    std::string w(n, 'a');
    std::vector<uint32_t> got;
    model.encode_word(w, &got);
    EXPECT_EQ(got, reference_encode(w, merges)) << n;
  }
}

// Larger corpora: the first merges touch more than kChunkWords * 3 words, so they take the
// parallel, chunked path; counts up to 1000 and long runs of one letter (overlapping pairs).
std::vector<std::pair<std::string, uint64_t>> big_random_words(std::mt19937& rng, size_t n,
                                                               const std::string& alphabet) {
  std::map<std::string, uint64_t> m;
  while (m.size() < n) {
    std::string w;
    size_t len = 2 + rng() % (rng() % 8 == 0 ? 30 : 8);
    for (size_t k = 0; k < len; ++k) w += alphabet[rng() % alphabet.size()];
    m[w] += 1 + rng() % 1000;
  }
  return {m.begin(), m.end()};
}

void expect_same_merges(const std::vector<BpeMerge>& got, const std::vector<BpeMerge>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].left, want[r].left) << what << " rank " << r;
    ASSERT_EQ(got[r].right, want[r].right) << what << " rank " << r;
    ASSERT_EQ(got[r].result, want[r].result) << what << " rank " << r;
  }
}

TEST(Bpe, LargeCorporaMatchBruteForceInParallelChunks) {
  std::mt19937 rng(17);
  const char* alphabets[] = {"ab", "aaab", "abcdefgh  aa"};
  for (int trial = 0; trial < 3; ++trial) {
    auto words = big_random_words(rng, 6000, alphabets[trial]);
    auto slow = reference_train(words, 40, 2);
    ASSERT_EQ(slow.size(), 40u);
    expect_same_merges(train_bpe(as_counts(words), identity_bytes(), 256, 40, 2).merges, slow,
                       "trial " + std::to_string(trial));
  }
}

TEST(Bpe, TrainingIgnoresThreadCountWordOrderAndSplitCounts) {
  std::mt19937 rng(19);
  auto words = big_random_words(rng, 20000, "abcdeabc aab");
  std::vector<BpeMerge> base;
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    base = train_bpe(as_counts(words), identity_bytes(), 256, 300, 2).merges;
  }
  ASSERT_EQ(base.size(), 300u);
  for (int threads : {2, 3, 8}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    expect_same_merges(train_bpe(as_counts(words), identity_bytes(), 256, 300, 2).merges, base,
                       std::to_string(threads) + " threads");
  }
  // The same multiset of words in another order, with some counts split over two entries.
  auto counts = as_counts(words);
  std::vector<WordCount> split;
  for (const auto& wc : counts) {
    if (wc.count > 1 && wc.word.size() % 3 == 0) {
      split.push_back({wc.word, wc.count / 2});
      split.push_back({wc.word, wc.count - wc.count / 2});
    } else {
      split.push_back(wc);
    }
  }
  std::shuffle(split.begin(), split.end(), rng);
  expect_same_merges(train_bpe(split, identity_bytes(), 256, 300, 2).merges, base,
                     "shuffled and split");
}

TEST(Bpe, MinFrequencyStopsTraining) {
  std::vector<std::pair<std::string, uint64_t>> words = {{"abab", 3}, {"cd", 2}, {"ef", 1}};
  // (a,b) 6, (b,a) 3, (c,d) 2, (e,f) 1: with min_frequency 2, "ef" never merges.
  auto r = train_bpe(as_counts(words), identity_bytes(), 256, 100, 2);
  auto slow = reference_train(words, 100, 2);
  expect_same_merges(r.merges, slow, "min_frequency 2");
  for (const auto& t : r.tokens) EXPECT_NE(t, "ef");
  EXPECT_EQ(train_bpe(as_counts(words), identity_bytes(), 256, 100, 1).tokens.back(), "ef");
}

TEST(Bpe, CountWordsEqualsSequentialCountAndIgnoresThreads) {
  std::mt19937 rng(23);
  std::vector<std::string> texts;
  const char* parts[] = {"the ", "cat ",   "Hello",    ", ",     "world", "\n",
                         "  ",   "123456", "深度学习", "don't ", "x",     "\xff"};
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    for (int k = 0, n = 1 + rng() % 30; k < n; ++k) t += parts[rng() % std::size(parts)];
    texts.push_back(t);
  }
  std::vector<std::string_view> views(texts.begin(), texts.end());
  PretokenizerSpec spec;
  std::map<std::string, uint64_t> want;
  std::vector<std::string_view> pieces;
  for (auto v : views) {
    pieces.clear();
    ASSERT_TRUE(pretokenize(v, spec, &pieces).is_ok());
    for (auto p : pieces) ++want[std::string(p)];
  }
  std::vector<WordCount> one;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    one = count_words(views, spec);
  }
  std::map<std::string, uint64_t> got;
  for (const auto& wc : one) {
    EXPECT_TRUE(got.emplace(std::string(wc.word), wc.count).second) << "repeated " << wc.word;
  }
  EXPECT_EQ(got, want);
  auto many = count_words(views, spec);
  ASSERT_EQ(many.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(many[i].word, one[i].word);
    EXPECT_EQ(many[i].count, one[i].count);
  }
}

}  // namespace
}  // namespace kiln::prep
