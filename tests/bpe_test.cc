// BPE core against straightforward reference implementations: encoding (GPT-2's loop) and
// training (recount every pair after every merge).
#include "dataprep/bpe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace kiln {
namespace {

std::array<uint32_t, 256> identity_bytes() {
  std::array<uint32_t, 256> ids;
  for (int b = 0; b < 256; ++b) ids[b] = uint32_t(b);
  return ids;
}

// GPT-2's bpe(): merge the lowest-ranked pair everywhere, left to right, until none applies.
std::vector<uint32_t> reference_encode(const std::string& word, const std::vector<BpeMerge>& merges) {
  std::map<std::pair<uint32_t, uint32_t>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank.emplace(std::make_pair(merges[r].left, merges[r].right), r);
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
      for (size_t i = 0; i + 1 < sym[w].size(); ++i) counts[{sym[w][i], sym[w][i + 1]}] += words[w].second;
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
    auto fast = train_bpe(words, identity_bytes(), 256, 60, 2);
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
  auto r = train_bpe(words, identity_bytes(), 256, 100, 2);
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
    auto trained = train_bpe(words, identity_bytes(), 256, 80, 1);
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

}  // namespace
}  // namespace kiln
