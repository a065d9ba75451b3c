#include "dataprep/bpe.h"

#include <algorithm>
#include <limits>
#include <queue>

namespace kiln {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kDead = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kEmptyKey = std::numeric_limits<uint64_t>::max();

inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

BpeModel::BpeModel(std::array<uint32_t, 256> byte_ids, std::vector<BpeMerge> merges)
    : byte_ids_(byte_ids), merges_(std::move(merges)) {
  size_t cap = 16;
  while (cap < merges_.size() * 2 + 2) cap <<= 1;
  table_keys_.assign(cap, kEmptyKey);
  table_ranks_.assign(cap, kNoRank);
  table_mask_ = cap - 1;
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    uint64_t k = key(merges_[rank].left, merges_[rank].right);
    uint64_t slot = mix(k) & table_mask_;
    while (table_keys_[slot] != kEmptyKey && table_keys_[slot] != k) slot = (slot + 1) & table_mask_;
    if (table_keys_[slot] == k) continue;  // a repeated pair: the first (lowest) rank wins
    table_keys_[slot] = k;
    table_ranks_[slot] = static_cast<uint32_t>(rank);
  }
}

std::pair<uint32_t, uint32_t> BpeModel::lookup(uint32_t a, uint32_t b) const {
  if (merges_.empty()) return {kNoRank, 0};
  uint64_t k = key(a, b);
  uint64_t slot = mix(k) & table_mask_;
  while (true) {
    uint64_t t = table_keys_[slot];
    if (t == k) {
      uint32_t rank = table_ranks_[slot];
      return {rank, merges_[rank].result};
    }
    if (t == kEmptyKey) return {kNoRank, 0};
    slot = (slot + 1) & table_mask_;
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<uint32_t>* out) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (n == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    uint32_t left;
    uint32_t right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<uint32_t> ids, next;
  thread_local std::vector<int64_t> prev;
  thread_local std::vector<Candidate> heap;
  ids.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<unsigned char>(word[i])];
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<int64_t>(i) - 1;
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    auto [rank, result] = lookup(ids[i], ids[i + 1]);
    if (rank != kNoRank) heap.push_back({rank, uint32_t(i), ids[i], ids[i + 1]});
  }
  auto cmp = std::greater<Candidate>();
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Candidate c = heap.back();
    heap.pop_back();
    if (ids[c.pos] != c.left) continue;
    uint32_t r = next[c.pos];
    if (r >= n || ids[r] != c.right) continue;
    ids[c.pos] = merges_[c.rank].result;
    ids[r] = kDead;
    next[c.pos] = next[r];
    if (next[r] < n) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0) {
      uint32_t p = static_cast<uint32_t>(prev[c.pos]);
      auto [rank, result] = lookup(ids[p], ids[c.pos]);
      if (rank != kNoRank) {
        heap.push_back({rank, p, ids[p], ids[c.pos]});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    if (next[c.pos] < n) {
      uint32_t q = next[c.pos];
      auto [rank, result] = lookup(ids[c.pos], ids[q]);
      if (rank != kNoRank) {
        heap.push_back({rank, c.pos, ids[c.pos], ids[q]});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }
  for (size_t i = 0; i < n; i = next[i]) out->push_back(ids[i]);
}

BpeTrainResult train_bpe(const std::vector<std::pair<std::string, uint64_t>>& word_counts,
                         const std::array<uint32_t, 256>& byte_ids, uint32_t first_merge_id,
                         size_t num_merges, uint64_t min_frequency) {
  BpeTrainResult result;
  auto pack = [](uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; };
  // Bytes of every token, by id (byte tokens + merged tokens).
  std::unordered_map<uint32_t, std::string> token_bytes;
  for (int b = 0; b < 256; ++b) token_bytes[byte_ids[b]] = std::string(1, char(b));

  std::vector<std::vector<uint32_t>> words;
  std::vector<int64_t> counts;
  words.reserve(word_counts.size());
  counts.reserve(word_counts.size());
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (const auto& [word, count] : word_counts) {
    if (word.size() < 2) continue;
    std::vector<uint32_t> sym(word.size());
    for (size_t i = 0; i < word.size(); ++i) sym[i] = byte_ids[static_cast<unsigned char>(word[i])];
    uint32_t w = static_cast<uint32_t>(words.size());
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t p = pack(sym[i], sym[i + 1]);
      pair_counts[p] += static_cast<int64_t>(count);
      auto& list = where[p];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
    words.push_back(std::move(sym));
    counts.push_back(static_cast<int64_t>(count));
  }

  struct Entry {
    int64_t count;
    uint64_t pair;
    bool operator<(const Entry& o) const {  // max-heap: larger count, then smaller pair
      return count != o.count ? count < o.count : pair > o.pair;
    }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [p, c] : pair_counts) heap.push({c, p});

  std::vector<uint64_t> touched;
  std::vector<uint32_t> merged;
  while (result.merges.size() < num_merges && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto it = pair_counts.find(top.pair);
    if (it == pair_counts.end() || it->second != top.count) continue;  // stale
    if (top.count < static_cast<int64_t>(std::max<uint64_t>(min_frequency, 1))) break;
    const uint32_t a = uint32_t(top.pair >> 32), b = uint32_t(top.pair);
    const uint32_t x = first_merge_id + static_cast<uint32_t>(result.merges.size());
    result.merges.push_back({a, b, x});
    std::string bytes = token_bytes[a] + token_bytes[b];
    result.tokens.push_back(bytes);
    token_bytes[x] = std::move(bytes);

    std::vector<uint32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    touched.clear();
    auto involves = [](uint64_t p, uint32_t t) { return uint32_t(p >> 32) == t || uint32_t(p) == t; };
    for (uint32_t w : affected) {
      auto& sym = words[w];
      const int64_t c = counts[w];
      bool found = false;
      for (size_t i = 0; i + 1 < sym.size(); ++i)
        if (sym[i] == a && sym[i + 1] == b) {
          found = true;
          break;
        }
      if (!found) continue;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        uint64_t p = pack(sym[i], sym[i + 1]);
        if (involves(p, a) || involves(p, b)) {
          pair_counts[p] -= c;
          touched.push_back(p);
        }
      }
      merged.clear();
      for (size_t i = 0; i < sym.size();) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          merged.push_back(x);
          i += 2;
        } else {
          merged.push_back(sym[i]);
          ++i;
        }
      }
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        uint64_t p = pack(merged[i], merged[i + 1]);
        bool has_x = involves(p, x);
        if (has_x || involves(p, a) || involves(p, b)) {
          pair_counts[p] += c;
          touched.push_back(p);
          if (has_x) {
            auto& list = where[p];
            if (list.empty() || list.back() != w) list.push_back(w);
          }
        }
      }
      sym.assign(merged.begin(), merged.end());
    }
    pair_counts.erase(top.pair);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t p : touched) {
      auto pc = pair_counts.find(p);
      if (pc == pair_counts.end()) continue;
      if (pc->second <= 0) {
        pair_counts.erase(pc);
        where.erase(p);
        continue;
      }
      heap.push({pc->second, p});
    }
  }
  return result;
}

}  // namespace kiln
