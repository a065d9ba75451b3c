#include "dataprep/tokenizer/bpe.h"

#include <algorithm>
#include <limits>

namespace kiln::prep {
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
  thread_local std::vector<uint32_t> symbols;
  symbols.resize(n);
  for (size_t i = 0; i < n; ++i) symbols[i] = byte_ids_[static_cast<unsigned char>(word[i])];
  encode_symbols(symbols.data(), n, out);
}

void BpeModel::encode_symbols(const uint32_t* symbols, size_t n, std::vector<uint32_t>* out) const {
  if (n == 0) return;
  if (n == 1) {
    out->push_back(symbols[0]);
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
    ids[i] = symbols[i];
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

}  // namespace kiln::prep
