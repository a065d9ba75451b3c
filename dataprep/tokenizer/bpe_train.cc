#include "dataprep/tokenizer/bpe_train.h"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/hash.h"
#include "common/log.h"
#include "common/tsan.h"

namespace kiln::prep {
namespace {

constexpr uint64_t kEmptyKey = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

inline uint64_t pack(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

// ---- word counting -----------------------------------------------------------------------------

struct WordSlot {
  uint64_t hash = 0;
  std::string_view word;
  uint64_t count = 0;  // 0: empty slot
};

// Open addressing over XXH3 hashes of the words; the views point into the caller's texts.
class WordTable {
 public:
  void add(std::string_view word, uint64_t hash, uint64_t n) {
    if ((used_ + 1) * 2 > slots_.size()) grow();
    size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      WordSlot& s = slots_[i];
      if (s.count == 0) {
        s = {hash, word, n};
        ++used_;
        return;
      }
      if (s.hash == hash && s.word == word) {
        s.count += n;
        return;
      }
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.count) f(s);
  }
  size_t size() const { return used_; }

 private:
  void grow() {
    std::vector<WordSlot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(64, old.size() * 2), WordSlot{});
    used_ = 0;
    for (const auto& s : old)
      if (s.count) add(s.word, s.hash, s.count);
  }
  std::vector<WordSlot> slots_;
  size_t used_ = 0;
};

// Words are spread over kParts tables by the top bits of their hash, so the per-thread tables
// are merged part by part in parallel.
constexpr int kPartBits = 6;
constexpr int kParts = 1 << kPartBits;
inline int part_of(uint64_t hash) { return int(hash >> (64 - kPartBits)); }

// ---- training ----------------------------------------------------------------------------------

// Open addressing: pair key (left << 32 | right) -> dense pair index.
class PairIndex {
 public:
  PairIndex() { resize(1 << 16); }
  uint32_t find(uint64_t key) const {
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmptyKey) return kNone;
    }
  }
  // The index of `key`, inserting `value` when absent.
  uint32_t insert(uint64_t key, uint32_t value) {
    if ((size_ + 1) * 2 > keys_.size()) resize(keys_.size() * 2);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmptyKey) {
        keys_[i] = key;
        vals_[i] = value;
        ++size_;
        return value;
      }
    }
  }

 private:
  void resize(size_t cap) {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<uint32_t> vals = std::move(vals_);
    keys_.assign(cap, kEmptyKey);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmptyKey) insert(keys[i], vals[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

// The pair-count changes of one merge step over a run of words, summed per pair, with the words
// that gained a pair holding the new token (for the pair -> words lists). Keys get ordinals in
// first-seen order, so applying the deltas is deterministic.
class PairDeltas {
 public:
  void add(uint64_t key, int64_t delta) { delta_[ordinal(key)] += delta; }
  void add_new(uint64_t key, int64_t delta, uint32_t word) {
    uint32_t o = ordinal(key);
    delta_[o] += delta;
    if (adds_.empty() || adds_.back().first != o || adds_.back().second != word)
      adds_.push_back({o, word});
  }
  void clear() {
    for (uint32_t s : slot_) table_[s] = kNone;
    keys_.clear();
    delta_.clear();
    slot_.clear();
    adds_.clear();
  }
  size_t size() const { return keys_.size(); }
  uint64_t key(uint32_t o) const { return keys_[o]; }
  int64_t delta(uint32_t o) const { return delta_[o]; }
  const std::vector<std::pair<uint32_t, uint32_t>>& adds() const { return adds_; }

 private:
  uint32_t ordinal(uint64_t key) {
    if (table_.empty() || (keys_.size() + 1) * 2 > table_.size()) grow();
    const uint64_t mask = table_.size() - 1;
    for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      uint32_t o = table_[i];
      if (o == kNone) {
        table_[i] = uint32_t(keys_.size());
        keys_.push_back(key);
        delta_.push_back(0);
        slot_.push_back(uint32_t(i));
        return table_[i];
      }
      if (keys_[o] == key) return o;
    }
  }
  void grow() {
    table_.assign(std::max<size_t>(256, table_.size() * 2), kNone);
    const uint64_t mask = table_.size() - 1;
    for (uint32_t o = 0; o < keys_.size(); ++o) {
      uint64_t i = mix(keys_[o]) & mask;
      while (table_[i] != kNone) i = (i + 1) & mask;
      table_[i] = o;
      slot_[o] = uint32_t(i);
    }
  }
  std::vector<uint32_t> table_;  // slot -> ordinal
  std::vector<uint64_t> keys_;   // by ordinal
  std::vector<int64_t> delta_;
  std::vector<uint32_t> slot_;
  std::vector<std::pair<uint32_t, uint32_t>> adds_;  // (ordinal, word) of pairs holding x
};

// Replaces every non-overlapping occurrence of (a, b), left to right, in the symbols s[0, *len)
// by x, in place, and records the pair-count changes (count c per occurrence) in *d. The pair
// (a, b) itself is left out: the caller retires it. Returns whether (a, b) occurred.
bool merge_word(uint32_t* s, size_t* len, uint32_t a, uint32_t b, uint32_t x, int64_t c,
                uint32_t word, PairDeltas* d) {
  const size_t n = *len;
  const uint64_t ab = pack(a, b);
  size_t i = 0;
  while (i + 1 < n && !(s[i] == a && s[i + 1] == b)) ++i;
  if (i + 1 >= n) return false;
  size_t j = i;              // write position (j <= i)
  bool after_merge = false;  // the last symbol written is a new x
  // Writes go to positions below j <= i, so s[i - 1] still holds the old symbol whenever the
  // previous step copied one (!after_merge), and s[j - 1] is the new sequence's last symbol.
  while (i < n) {
    const uint32_t cur = s[i];
    if (i + 1 < n && cur == a && s[i + 1] == b) {
      // Old pairs: (left neighbour, a) unless that neighbour was the b of the previous
      // occurrence (then the pair (b, a) was already removed as its right pair), and (b, right).
      if (i > 0 && !after_merge && pack(s[i - 1], a) != ab) d->add(pack(s[i - 1], a), -c);
      if (i + 2 < n && pack(b, s[i + 2]) != ab) d->add(pack(b, s[i + 2]), -c);
      if (j > 0) d->add_new(pack(s[j - 1], x), c, word);
      s[j++] = x;
      i += 2;
      after_merge = true;
    } else {
      if (after_merge) d->add_new(pack(x, cur), c, word);
      s[j++] = cur;
      ++i;
      after_merge = false;
    }
  }
  *len = j;
  return true;
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
  uint32_t index;
  // Max-heap order: larger count first, then the smaller pair.
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

// Affected-word lists at least this long are processed in fixed chunks in parallel. The chunks
// do not depend on the thread count, and their deltas are applied in chunk order.
constexpr size_t kChunkWords = 1024;

}  // namespace

std::vector<WordCount> count_words(const std::vector<std::string_view>& texts,
                                   const PretokenizerSpec& spec) {
  using Tables = std::vector<WordTable>;
  tbb::enumerable_thread_specific<Tables> local([] { return Tables(kParts); });
  const tsan::ForkJoin count_fork_join;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, texts.size()), count_fork_join.task([&](const auto& range) {
    Tables& tables = local.local();
    std::vector<std::string_view> pieces;
    for (size_t i = range.begin(); i != range.end(); ++i) {
      pieces.clear();
      if (Status st = pretokenize(texts[i], spec, &pieces); !st.is_ok()) {
        // (only a regex's match limit: the text is counted as one word, and said so)
        KILN_LOG_WARN("training: text {} counted as one word: {}", i, st.message());
        pieces.assign(1, texts[i]);
      }
      for (auto p : pieces) {
        uint64_t h = xxh3_64(p);
        tables[part_of(h)].add(p, h, 1);
      }
    }
  }));
  count_fork_join.join();
  std::vector<Tables*> all;
  for (auto& t : local) all.push_back(&t);
  std::vector<std::vector<WordCount>> parts(kParts);
  const tsan::ForkJoin merge_fork_join;
  tbb::parallel_for(0, kParts, merge_fork_join.task([&](int p) {
    WordTable merged;
    for (Tables* t : all) (*t)[p].for_each([&](const WordSlot& s) { merged.add(s.word, s.hash, s.count); });
    std::vector<WordSlot> slots;
    slots.reserve(merged.size());
    merged.for_each([&](const WordSlot& s) { slots.push_back(s); });
    std::sort(slots.begin(), slots.end(), [](const WordSlot& x, const WordSlot& y) {
      return x.hash != y.hash ? x.hash < y.hash : x.word < y.word;
    });
    parts[p].reserve(slots.size());
    for (const auto& s : slots) parts[p].push_back({s.word, s.count});
  }));
  merge_fork_join.join();
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<WordCount> out;
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

BpeTrainResult train_bpe(std::span<const WordCount> words, const std::array<uint32_t, 256>& byte_ids,
                         uint32_t first_merge_id, size_t num_merges, uint64_t min_frequency) {
  BpeTrainResult result;
  // Bytes of every token by id (byte tokens, then merged tokens as they are made).
  std::vector<std::string> token_bytes(first_merge_id);
  for (int b = 0; b < 256; ++b) {
    if (byte_ids[b] >= token_bytes.size()) token_bytes.resize(byte_ids[b] + 1);
    token_bytes[byte_ids[b]] = std::string(1, char(b));
  }

  // Words of two or more bytes as symbol sequences, flat.
  std::vector<uint32_t> syms;
  struct Word {
    size_t begin;  // in syms
    size_t len;    // symbols now
    int64_t count;
  };
  std::vector<Word> word_list;  // together: one cache line per touched word
  size_t total_bytes = 0;
  for (const auto& w : words)
    if (w.word.size() >= 2 && w.count > 0) total_bytes += w.word.size();
  syms.reserve(total_bytes);
  for (const auto& w : words) {
    if (w.word.size() < 2 || w.count == 0) continue;
    word_list.push_back({syms.size(), w.word.size(), int64_t(w.count)});
    for (unsigned char ch : w.word) syms.push_back(byte_ids[ch]);
  }
  const size_t num_words = word_list.size();

  // Pair counts and, per pair, the words holding it (ascending, possibly stale: a word may
  // have lost the pair since).
  PairIndex index;
  std::vector<uint64_t> pair_key;
  std::vector<int64_t> pair_count;
  std::vector<std::vector<uint32_t>> pair_words;
  auto pair_of = [&](uint64_t key) {
    uint32_t p = index.insert(key, uint32_t(pair_key.size()));
    if (p == pair_key.size()) {
      pair_key.push_back(key);
      pair_count.push_back(0);
      pair_words.emplace_back();
    }
    return p;
  };
  for (size_t w = 0; w < num_words; ++w) {
    const uint32_t* s = syms.data() + word_list[w].begin;
    for (size_t i = 0; i + 1 < word_list[w].len; ++i) {
      uint32_t p = pair_of(pack(s[i], s[i + 1]));
      pair_count[p] += word_list[w].count;
      auto& list = pair_words[p];
      if (list.empty() || list.back() != w) list.push_back(uint32_t(w));
    }
  }

  // A lazy max-heap: one entry per live pair, whose count is at least the pair's current count
  // (counts of existing pairs only fall; new pairs are pushed once, after the step that makes
  // them). A popped entry whose count is stale goes back with the current count.
  std::vector<HeapEntry> heap;
  heap.reserve(pair_key.size());
  for (uint32_t p = 0; p < pair_key.size(); ++p) heap.push_back({pair_count[p], pair_key[p], p});
  std::make_heap(heap.begin(), heap.end());
  auto pop = [&] {
    std::pop_heap(heap.begin(), heap.end());
    HeapEntry e = heap.back();
    heap.pop_back();
    return e;
  };
  auto push = [&](const HeapEntry& e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end());
  };

  const int64_t min_count = int64_t(std::max<uint64_t>(min_frequency, 1));
  std::vector<PairDeltas> deltas(1);
  std::vector<uint32_t> global;   // ordinal -> pair index, per chunk
  std::vector<uint32_t> created;  // pairs made by this step
  while (result.merges.size() < num_merges && !heap.empty()) {
    HeapEntry top = pop();
    const int64_t current = pair_count[top.index];
    if (current != top.count) {
      if (current > 0) push({current, top.key, top.index});
      continue;
    }
    if (current < min_count) break;
    const uint32_t a = uint32_t(top.key >> 32), b = uint32_t(top.key);
    const uint32_t x = first_merge_id + uint32_t(result.merges.size());
    result.merges.push_back({a, b, x});
    std::string bytes = token_bytes[a] + token_bytes[b];
    result.tokens.push_back(bytes);
    if (x >= token_bytes.size()) token_bytes.resize(size_t(x) + 1);
    token_bytes[x] = std::move(bytes);

    // Retire the pair; merge it in every word that may hold it.
    std::vector<uint32_t> affected = std::move(pair_words[top.index]);
    pair_words[top.index] = {};
    pair_count[top.index] = 0;
    const size_t chunks = (affected.size() + kChunkWords - 1) / kChunkWords;
    if (deltas.size() < chunks) deltas.resize(chunks);
    auto run_chunk = [&](size_t k) {
      PairDeltas& d = deltas[k];
      d.clear();
      const size_t end = std::min(affected.size(), (k + 1) * kChunkWords);
      for (size_t i = k * kChunkWords; i < end; ++i) {
        if (i + 8 < end) __builtin_prefetch(&word_list[affected[i + 8]]);
        if (i + 4 < end) __builtin_prefetch(syms.data() + word_list[affected[i + 4]].begin);
        const uint32_t w = affected[i];
        Word& word = word_list[w];
        merge_word(syms.data() + word.begin, &word.len, a, b, x, word.count, w, &d);
      }
    };
    if (chunks > 2) {
      const tsan::ForkJoin fork_join;
      tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1), fork_join.task([&](const auto& r) {
        for (size_t k = r.begin(); k != r.end(); ++k) run_chunk(k);
      }));
      fork_join.join();
    } else {
      for (size_t k = 0; k < chunks; ++k) run_chunk(k);
    }
    created.clear();
    for (size_t k = 0; k < chunks; ++k) {
      const PairDeltas& d = deltas[k];
      global.resize(d.size());
      for (uint32_t o = 0; o < d.size(); ++o) {
        const uint64_t key = d.key(o);
        const size_t before = pair_key.size();
        const uint32_t p = pair_of(key);
        if (pair_key.size() != before) created.push_back(p);
        global[o] = p;
        pair_count[p] += d.delta(o);
        if (pair_count[p] <= 0) pair_words[p] = {};  // gone for good
      }
      for (const auto& [o, w] : d.adds()) {
        auto& list = pair_words[global[o]];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    }
    for (uint32_t p : created)
      if (pair_count[p] > 0) push({pair_count[p], pair_key[p], p});
  }
  return result;
}

}  // namespace kiln::prep
