// The published heuristic filters: Gopher quality and repetition (Rae et al. 2021, as datatrove
// implements them), C4's line rules (Raffel et al. 2020, datatrove's C4QualityFilter), FineWeb's
// quality rules (Penedo et al. 2024), and plain length bounds. The rule definitions and their CJK
// handling are in docs/PREP.md; tests/dataprep/filter_reference.py is the same in Python.
//
// Everything is measured on code points (Python's len), with per-thread scratch buffers so a
// document costs no allocation once they have grown. The repetition filter's top n-grams are
// counted exactly: words get dense ids (equal words compared byte for byte), an n-gram is the
// pair (id of its first n - 1 words, id of its last word), and only positions where the
// (n - 1)-grams at i and i + 1 both repeat can start a repeated n-gram. Its duplicated n-grams
// (datatrove joins the words without a separator, so word boundaries do not count) are keyed by
// a 64-bit hash of their bytes, looked up only where the first 16 bytes of the concatenated
// words repeat at another word start: a hash collision (about k^2 / 2^64 for k such n-grams in
// a document) is the only way a result can differ from comparing strings.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dataprep/filter/params.h"
#include "dataprep/filter/spacy_en.h"
#include "dataprep/filter/text.h"

namespace kiln::prep::filter {
namespace {

// XXH3-64 compiled into this file (the same function as kiln::xxh3_64, without the call into
// the shared library: most keys here are a few dozen bytes).
inline uint64_t xxh3(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

// Open-addressing set / counter over 64-bit keys, reused per thread. A slot is in use when its
// stamp is the table's current generation, so reset() clears nothing (a new generation frees
// every slot at once); a slot holds its key, stamp and count together (one cache line per probe).
class KeyTable {
 public:
  void reset(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    if (slots_.size() < cap) slots_.resize(cap, Slot{0, 0, 0});
    if (++gen_ == 0) {  // (wrapped: every stamp is stale again)
      for (Slot& s : slots_) s.gen = 0;
      gen_ = 1;
    }
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
  }
  // Inserts; returns true when the key was already present.
  bool insert(uint64_t key) {
    Slot& s = slots_[slot(key)];
    if (s.gen == gen_) return true;
    s = {key, gen_, 0};
    return false;
  }
  // Counts; returns the slot.
  size_t count(uint64_t key) {
    const size_t i = slot(key);
    Slot& s = slots_[i];
    if (s.gen != gen_) s = {key, gen_, 0};
    ++s.count;
    return i;
  }
  // Starts loading the slot a later insert or count of this key will probe.
  void prefetch(uint64_t key) const { __builtin_prefetch(slots_.data() + home(key)); }
  uint32_t count_at(size_t i) const { return slots_[i].count; }

 private:
  struct Slot {
    uint64_t key;
    uint32_t gen, count;
  };
  // Fibonacci hashing: the top bits of the product depend on every bit of the key.
  size_t home(uint64_t key) const {
    return static_cast<size_t>(((key ^ (key >> 32)) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t slot(uint64_t key) const {
    size_t i = home(key);
    while (slots_[i].gen == gen_ && slots_[i].key != key) i = (i + 1) & mask_;
    return i;
  }
  std::vector<Slot> slots_;
  uint32_t gen_ = 0;
  size_t mask_ = 0;
  int shift_ = 60;
};

struct Scratch {
  std::vector<Span> lines, parts;
  KeyTable table;
  std::string out, lower;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

Span whole(const CodePoints& t) { return {0, static_cast<uint32_t>(t.size())}; }

bool drop(FilterDrop* d, const char* rule, double value, const char* op, double threshold) {
  d->rule = rule;
  d->value = value;
  d->op = op;
  d->threshold = threshold;
  d->note.clear();
  return false;
}

bool is_symbol_word(const CodePoints& t, Span w) {
  for (uint32_t i = w.begin; i < w.end; ++i)
    if (!is_symbol_char(t[i])) return false;
  return true;
}
bool is_cjk_word(const CodePoints& t, Span w) { return w.size() == 1 && is_cjk(t[w.begin]); }

// (duplicate elements, their code points) of a list of spans: datatrove's find_duplicates. The
// spans are compared by their UTF-8 bytes (equal code points are equal bytes), keyed by a 64-bit
// hash with the length.
std::pair<uint64_t, uint64_t> find_duplicates(std::string_view text, const DocumentView& v,
                                              const std::vector<Span>& parts, KeyTable* table) {
  table->reset(parts.size());
  uint64_t dup = 0, chars = 0;
  for (const Span& p : parts) {
    const uint32_t b = v.byte_at[p.begin], e = v.byte_at[p.end];
    uint64_t key =
        xxh3(text.data() + b, e - b, 0x6c696e6573ull) ^ (static_cast<uint64_t>(p.size()) << 40);
    if (table->insert(key)) {
      ++dup;
      chars += p.size();
    }
  }
  return {dup, chars};
}

// ---- n-grams of gopher_repetition --------------------------------------------------------------

constexpr uint32_t kNone = UINT32_MAX;
constexpr size_t kAhead = 12;  // table slots prefetched this many positions ahead

// Dense ids (0, 1, 2, ... in order of first appearance) for 64-bit keys; same(id) confirms that
// a key found in the table is the item being interned (words compare their bytes; n-gram keys
// are exact, so they need no confirmation). Reused per thread; generation stamps as KeyTable.
class IdTable {
 public:
  void reset(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    if (slots_.size() < cap) slots_.resize(cap, Slot{0, 0, 0});
    if (++gen_ == 0) {
      for (Slot& s : slots_) s.gen = 0;
      gen_ = 1;
    }
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
    size_ = 0;
  }
  template <typename Same>
  uint32_t intern(uint64_t key, Same same) {
    size_t i = home(key);
    for (;;) {
      Slot& s = slots_[i];
      if (s.gen != gen_) {
        s = {key, size_, gen_};
        return size_++;
      }
      if (s.key == key && same(s.id)) return s.id;
      i = (i + 1) & mask_;
    }
  }
  void prefetch(uint64_t key) const { __builtin_prefetch(slots_.data() + home(key)); }
  uint32_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    uint32_t id, gen;
  };
  size_t home(uint64_t key) const {
    return static_cast<size_t>(((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<Slot> slots_;
  uint32_t gen_ = 0;
  size_t mask_ = 0;
  int shift_ = 60;
  uint32_t size_ = 0;
};

struct Ngrams {
  IdTable ids;
  KeyTable table;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> word_id;     // per position: the id of its word
  std::vector<uint32_t> gram, next;  // per position: the id of the m-gram there, or kNone
  std::vector<uint32_t> count, next_count, first;  // per id of the current level
  std::vector<uint32_t> word_at, word_size;        // per word id: its bytes in the text
  std::vector<uint64_t> word_head;                 // per word id: its first 16 bytes
  std::vector<uint64_t> head;                      // per position: its word's first 16 bytes
  std::vector<uint32_t> best_count, best_first;    // per n-gram length m: the most common one
  std::vector<uint32_t> cp_off;    // code point offset of word i in the words' concatenation
  std::vector<uint32_t> byte_off;  // byte offset of word i in `cat`
  std::vector<char> cat;           // the words' UTF-8 bytes, concatenated (and slack)
  std::vector<uint32_t> live;      // the starts where a duplicated n-gram may start (ascending)
  std::vector<uint32_t> slot;      // per start: its 16-byte key's slot in `table`
  std::vector<std::pair<size_t, double>> rules;
  std::vector<uint64_t> longest;  // per top n-gram rule: longest_gram, once computed
};
Ngrams& ngrams() {
  thread_local Ngrams g;
  return g;
}

static_assert(std::endian::native == std::endian::little, "load_head masks little-endian words");

// The first min(size, 16) bytes of text[at, at + size), zero-padded, as two words.
inline void load_head(std::string_view text, uint32_t at, uint32_t size, uint64_t* h) {
  if (text.size() - at >= 16) {
    std::memcpy(h, text.data() + at, 16);
  } else {
    h[0] = h[1] = 0;
    std::memcpy(h, text.data() + at, std::min<size_t>(text.size() - at, 16));
  }
  // (little-endian: byte k of a word is bits 8k..8k+7)
  if (size < 16) {
    if (size < 8) {
      h[0] &= size == 0 ? 0 : ~uint64_t{0} >> (64 - 8 * size);
      h[1] = 0;
    } else {
      h[1] &= size == 8 ? 0 : ~uint64_t{0} >> (64 - 8 * (size - 8));
    }
  }
}

// The longest m-gram in code points, joined with spaces (an upper bound of any m-gram's length).
uint64_t longest_gram(const Ngrams& g, size_t n, size_t m) {
  uint32_t longest = 0;
  for (size_t i = 0; i + m <= n; ++i) longest = std::max(longest, g.cp_off[i + m] - g.cp_off[i]);
  return longest + (m - 1);
}

// Counter(m-grams).most_common(1) for m = 1..max_m (<= the number of words), into
// g->best_count[m] and g->best_first[m] (its first position): the highest count, and of those
// the n-gram seen first (Counter keeps insertion order). Exact: ids, not hashes, identify
// n-grams. `rules` are the top n-gram rules (m, fraction) and len the text's length: a level
// none of the rules from it on can reach is not counted (best_count 0 there): an m-gram occurs
// at most as often as the most common (m-1)-gram, and is at most the longest m-gram long.
void count_top_grams(std::string_view text, const DocumentView& v, size_t max_m,
                     const std::vector<std::pair<size_t, double>>& rules, double len, Ngrams* g) {
  const auto& words = v.words;
  const size_t n = words.size();
  g->best_count.assign(max_m + 1, 1);
  g->best_first.assign(max_m + 1, 0);
  // Level 1: the words, keyed by their first 16 bytes (and a hash of the rest) and compared
  // by them.
  g->keys.resize(n);
  g->head.resize(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = v.byte_at[words[i].begin], e = v.byte_at[words[i].end];
    uint64_t* h = &g->head[2 * i];
    load_head(text, b, e - b, h);
    uint64_t k = (h[0] ^ 0x9E3779B97F4A7C15ull) * 0xC2B2AE3D27D4EB4Full;
    k ^= ((h[1] << 31 | h[1] >> 33) ^ (k >> 29) ^ (uint64_t{e - b} << 56)) * 0x165667B19E3779F9ull;
    if (e - b > 16) k ^= xxh3(text.data() + b + 16, e - b - 16, 0x776f7264ull);
    g->keys[i] = k;
  }
  g->ids.reset(n);
  g->word_id.resize(n);
  g->count.assign(n, 0);
  g->first.resize(n);
  g->word_at.resize(n);
  g->word_size.resize(n);
  g->word_head.resize(2 * n);
  uint32_t best_count = 1, best_first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) g->ids.prefetch(g->keys[i + kAhead]);
    const uint32_t b = v.byte_at[words[i].begin], size = v.byte_at[words[i].end] - b;
    const uint64_t* h = &g->head[2 * i];
    const uint32_t before = g->ids.size();
    const uint32_t id = g->ids.intern(g->keys[i], [&](uint32_t id) {
      return g->word_size[id] == size && g->word_head[2 * id] == h[0] &&
             g->word_head[2 * id + 1] == h[1] &&
             (size <= 16 ||
              std::memcmp(text.data() + g->word_at[id] + 16, text.data() + b + 16, size - 16) == 0);
    });
    if (id == before) {
      g->word_at[id] = b;
      g->word_size[id] = size;
      g->word_head[2 * id] = h[0];
      g->word_head[2 * id + 1] = h[1];
      g->first[id] = static_cast<uint32_t>(i);
    }
    g->word_id[i] = id;
    const uint32_t c = ++g->count[id];
    if (c > best_count || (c == best_count && g->first[id] < best_first)) {
      best_count = c;
      best_first = g->first[id];
    }
  }
  g->best_count[1] = best_count;
  g->best_first[1] = best_first;
  g->gram.assign(g->word_id.begin(), g->word_id.end());
  // Level m from level m - 1: the m-gram at i is (the (m-1)-gram at i, the word at i + m - 1),
  // and it can repeat only if the (m-1)-grams at i and at i + 1 both repeat.
  g->longest.assign(rules.size(), UINT64_MAX);  // (longest_gram per rule, once)
  for (size_t m = 2; m <= max_m && best_count > 1; ++m) {
    bool reachable = false;
    for (size_t r = 0; r < rules.size() && !reachable; ++r) {
      const auto& [rm, frac] = rules[r];
      if (rm < m || rm > n) continue;
      if (g->longest[r] == UINT64_MAX) g->longest[r] = longest_gram(*g, n, rm);
      reachable = static_cast<double>(g->longest[r]) * best_count / len > frac;
    }
    if (!reachable) {
      std::fill(g->best_count.begin() + m, g->best_count.end(), 0);
      break;
    }
    const size_t grams = n - m + 1;
    auto repeats = [&](uint32_t id) { return id != kNone && g->count[id] > 1; };
    size_t live = 0;
    for (size_t i = 0; i < grams; ++i) {
      const bool on = repeats(g->gram[i]) && repeats(g->gram[i + 1]);
      g->keys[i] = on ? (uint64_t{g->gram[i]} << 32 | g->word_id[i + m - 1]) : ~uint64_t{0};
      live += on;
    }
    g->ids.reset(live);
    g->next.resize(grams);
    g->next_count.assign(live, 0);
    best_count = 1;
    best_first = 0;
    for (size_t i = 0; i < grams; ++i) {
      if (i + kAhead < grams && g->keys[i + kAhead] != ~uint64_t{0})
        g->ids.prefetch(g->keys[i + kAhead]);
      if (g->keys[i] == ~uint64_t{0}) {
        g->next[i] = kNone;
        continue;
      }
      const uint32_t before = g->ids.size();
      const uint32_t id = g->ids.intern(g->keys[i], [](uint32_t) { return true; });
      if (id == before) g->first[id] = static_cast<uint32_t>(i);
      g->next[i] = id;
      const uint32_t c = ++g->next_count[id];
      if (c > best_count || (c == best_count && g->first[id] < best_first)) {
        best_count = c;
        best_first = g->first[id];
      }
    }
    g->best_count[m] = best_count;
    g->best_first[m] = best_first;
    g->gram.swap(g->next);
    g->count.swap(g->next_count);
  }
  // (once no m-gram repeats, no longer one does: every count is 1 and the first n-gram is top)
}

// The words' bytes concatenated, and g->live[i] for the starts i of min_m-grams: false only
// where no n-gram (n >= min_m) starting at i can equal one starting at another word. Equal
// n-grams are equal byte strings of the same length, so if that length is at least 16 the two
// starts share their first 16 bytes: a start whose 16 bytes no other start has cannot repeat (a
// start whose min_m-gram is shorter than 16 bytes always stays in play). Exact; a collision of
// the 16-byte key only keeps a start in play.
void mark_repeatable_starts(std::string_view text, const DocumentView& v, size_t min_m, Ngrams* g) {
  constexpr uint32_t K = 16;
  const auto& words = v.words;
  const size_t n = words.size();
  // (a short word is copied as 16 bytes, the next word overwriting the excess: one move)
  if (g->cat.size() < text.size() + 16) g->cat.resize(text.size() + 16);
  char* out = g->cat.data();
  uint32_t total = 0;
  g->byte_off.resize(n + 1);
  g->byte_off[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = v.byte_at[words[i].begin], size = v.byte_at[words[i].end] - b;
    if (size <= 16 && text.size() - b >= 16)
      std::memcpy(out + total, text.data() + b, 16);
    else
      std::memcpy(out + total, text.data() + b, size);
    total += size;
    g->byte_off[i + 1] = total;
  }
  const size_t starts = n - min_m + 1;
  g->keys.resize(starts);
  size_t keyed = 0;
  for (size_t i = 0; i < starts; ++i) {
    const uint32_t at = g->byte_off[i];
    if (total - at < K) {
      g->keys[i] = 0;
      continue;
    }
    uint64_t a, b;
    std::memcpy(&a, g->cat.data() + at, 8);
    std::memcpy(&b, g->cat.data() + at + 8, 8);
    uint64_t k = (a ^ 0x9E3779B97F4A7C15ull) * 0xC2B2AE3D27D4EB4Full;
    k ^= ((b << 31 | b >> 33) ^ (k >> 29)) * 0x165667B19E3779F9ull;
    g->keys[i] = k | 1;  // (0: no key)
    ++keyed;
  }
  g->table.reset(keyed);
  g->slot.resize(starts);
  for (size_t i = 0; i < starts; ++i) {
    if (i + kAhead < starts && g->keys[i + kAhead]) g->table.prefetch(g->keys[i + kAhead]);
    if (g->keys[i]) g->slot[i] = static_cast<uint32_t>(g->table.count(g->keys[i]));
  }
  g->live.clear();
  // (a start without a key has fewer than K bytes after it: its n-grams are all shorter)
  for (size_t i = 0; i < starts; ++i)
    if (g->byte_off[i + min_m] - g->byte_off[i] < K || g->table.count_at(g->slot[i]) > 1)
      g->live.push_back(static_cast<uint32_t>(i));
}

// datatrove's duplicated n-gram count for n-grams of m words: scanning the starts in order, an
// n-gram seen before adds its length (code points) and the scan jumps past it.
// Returns 0 without the scan when the n-grams that may repeat cover no more than frac * len
// code points (the repeated n-grams it counts do not overlap, so they cannot exceed that).
uint64_t duplicated_chars(size_t m, size_t grams, double frac, double len, Ngrams* g) {
  // (only the live starts, g->live, can add: the others are neither counted nor inserted)
  const std::vector<uint32_t>& live = g->live;
  uint64_t cover = 0;
  uint32_t covered_to = 0;
  size_t count = 0;  // the live starts below `grams`
  for (; count < live.size() && live[count] < grams; ++count) {
    const uint32_t i = live[count];
    const uint32_t b = std::max(g->cp_off[i], covered_to), e = g->cp_off[i + m];
    if (e > b) cover += e - b;
    covered_to = std::max(covered_to, e);
  }
  if (!(cover / len > frac)) return 0;
  g->keys.resize(count);
  for (size_t k = 0; k < count; ++k) {
    const uint32_t b = g->byte_off[live[k]], e = g->byte_off[live[k] + m];
    g->keys[k] = xxh3(g->cat.data() + b, e - b, 0x6e6772616d73ull);
  }
  g->table.reset(count);
  uint64_t repeated = 0;
  uint32_t next = 0;  // a repeated n-gram makes the scan jump past it
  for (size_t k = 0; k < count; ++k) {
    if (k + kAhead < count) g->table.prefetch(g->keys[k + kAhead]);
    const uint32_t i = live[k];
    if (i < next) continue;
    if (g->table.insert(g->keys[k])) {
      repeated += g->cp_off[i + m] - g->cp_off[i];
      next = static_cast<uint32_t>(i + m);
    }
  }
  return repeated;
}

// "top_7_gram" for ("top_%zu_gram", 7): a static name for n = 1..64 (the parameters' range).
const char* rule_name(const char* pattern, size_t n) {
  struct Names {
    std::vector<std::string> top, dup;
    Names() {
      char buf[64];
      for (size_t k = 0; k <= 64; ++k) {
        std::snprintf(buf, sizeof buf, "top_%zu_gram", k);
        top.push_back(buf);
        std::snprintf(buf, sizeof buf, "duplicated_%zu_n_grams", k);
        dup.push_back(buf);
      }
    }
  };
  static const Names names;
  const auto& v = std::strcmp(pattern, "top_%zu_gram") == 0 ? names.top : names.dup;
  return v[std::min<size_t>(n, 64)].c_str();
}

// ---- gopher_quality ----------------------------------------------------------------------------

class GopherQuality final : public Filter {
 public:
  std::optional<int64_t> min_doc_words = 50, max_doc_words = 100000;
  std::optional<double> min_avg_word_length = 3, max_avg_word_length = 10;
  std::optional<double> max_symbol_word_ratio = 0.1, max_bullet_lines_ratio = 0.9,
                        max_ellipsis_lines_ratio = 0.3, max_non_alpha_words_ratio = 0.8;
  std::optional<int64_t> min_stop_words = 2;
  std::vector<std::u32string> stop_words;

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool*,
             FilterAnnotations*) const override {
    Scratch& s = scratch();
    const DocumentView& v = document_view_words(*text);
    const auto& t = v.cp;
    const auto& words = v.words;
    const uint64_t n_words = words.size();
    uint64_t non_symbol = 0, len_sum = 0, len_words = 0, alpha_words = 0, cjk_words = 0;
    for (const Span& w : words) {
      bool alpha = false, symbol = true;
      // (once a letter and a non-punctuation character are seen, the rest cannot change either)
      for (uint32_t i = w.begin; i < w.end && !(alpha && !symbol); ++i) {
        alpha |= is_alpha(t[i]);
        symbol &= is_symbol_char(t[i]);
      }
      alpha_words += alpha;
      if (symbol) continue;
      ++non_symbol;
      if (is_cjk_word(t, w)) {
        ++cjk_words;
        continue;
      }
      len_sum += w.size();
      ++len_words;
    }
    if (min_doc_words && static_cast<int64_t>(non_symbol) < *min_doc_words)
      return drop(d, "doc_words", non_symbol, "<", *min_doc_words);
    if (max_doc_words && static_cast<int64_t>(non_symbol) > *max_doc_words)
      return drop(d, "doc_words", non_symbol, ">", *max_doc_words);
    // CJK characters (one word each) are left out of the mean word length.
    if (len_words > 0) {
      const double avg = static_cast<double>(len_sum) / len_words;
      if (min_avg_word_length && avg < *min_avg_word_length)
        return drop(d, "avg_word_length", avg, "<", *min_avg_word_length);
      if (max_avg_word_length && avg > *max_avg_word_length)
        return drop(d, "avg_word_length", avg, ">", *max_avg_word_length);
    }
    if (n_words == 0) return true;
    const Span all = whole(t);
    if (max_symbol_word_ratio) {
      double r = static_cast<double>(count_bytes(*text, "#")) / n_words;
      if (r > *max_symbol_word_ratio)
        return drop(d, "hash_word_ratio", r, ">", *max_symbol_word_ratio);
      r = static_cast<double>(count_bytes(*text, "...") + count_bytes(*text, "\u2026")) / n_words;
      if (r > *max_symbol_word_ratio)
        return drop(d, "ellipsis_word_ratio", r, ">", *max_symbol_word_ratio);
    }
    // (an ASCII text's lines are found on its bytes: the same spans, as a byte is a code point)
    if (take_ascii_path(*text))
      split_lines_of(reinterpret_cast<const unsigned char*>(text->data()), all, &s.lines);
    else
      split_lines(t, all, &s.lines);
    if (!s.lines.empty()) {
      if (max_bullet_lines_ratio) {
        uint64_t n = 0;
        for (const Span& l : s.lines) {
          Span x = l;
          while (x.begin < x.end && is_space(t[x.begin])) ++x.begin;
          n += x.begin < x.end && (t[x.begin] == U'\u2022' || t[x.begin] == U'-');
        }
        double r = static_cast<double>(n) / s.lines.size();
        if (r > *max_bullet_lines_ratio)
          return drop(d, "bullet_lines_ratio", r, ">", *max_bullet_lines_ratio);
      }
      if (max_ellipsis_lines_ratio) {
        uint64_t n = 0;
        for (const Span& l : s.lines) {
          Span x = l;
          while (x.end > x.begin && is_space(t[x.end - 1])) --x.end;
          n += ends_with(t, x, U"...") || ends_with(t, x, U"\u2026");
        }
        double r = static_cast<double>(n) / s.lines.size();
        if (r > *max_ellipsis_lines_ratio)
          return drop(d, "ellipsis_lines_ratio", r, ">", *max_ellipsis_lines_ratio);
      }
    }
    if (max_non_alpha_words_ratio) {
      double r = static_cast<double>(alpha_words) / n_words;
      if (r < *max_non_alpha_words_ratio)
        return drop(d, "alpha_words_ratio", r, "<", *max_non_alpha_words_ratio);
    }
    // English stop words say nothing about a text that is mostly CJK: skipped there.
    if (min_stop_words && *min_stop_words > 0 && cjk_words * 2 <= n_words) {
      uint64_t found_mask = 0;
      int64_t found = 0;
      for (const Span& w : words) {
        for (size_t k = 0; k < stop_words.size() && k < 64; ++k) {
          if (!(found_mask >> k & 1) && span_equals(t, w, stop_words[k])) {
            found_mask |= uint64_t{1} << k;
            ++found;
          }
        }
        if (found >= *min_stop_words) break;
      }
      if (found < *min_stop_words) return drop(d, "stop_words", found, "<", *min_stop_words);
    }
    return true;
  }
};

// ---- gopher_repetition -------------------------------------------------------------------------

class GopherRepetition final : public Filter {
 public:
  std::optional<double> dup_line_frac = 0.3, dup_para_frac = 0.3, dup_line_char_frac = 0.2,
                        dup_para_char_frac = 0.2;
  std::vector<std::pair<int64_t, double>> top_n_grams = {{2, 0.2}, {3, 0.18}, {4, 0.16}};
  std::vector<std::pair<int64_t, double>> dup_n_grams = {{5, 0.15}, {6, 0.14}, {7, 0.13},
                                                         {8, 0.12}, {9, 0.11}, {10, 0.10}};

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool*,
             FilterAnnotations*) const override {
    Scratch& s = scratch();
    const DocumentView& v = document_view(*text);
    const auto& t = v.cp;
    const double len = static_cast<double>(t.size());
    if (t.empty()) return true;
    // Paragraphs: re.split(r"\n{2,}", text.strip()); lines: re.split(r"\n+", text).
    // (an ASCII text is split on its bytes: the same spans)
    const bool ascii = take_ascii_path(*text);
    if (ascii)
      split_on_runs_ascii(*text, strip(t, whole(t)), '\n', 2, &s.parts);
    else
      split_on_runs(t, strip(t, whole(t)), U'\n', 2, &s.parts);
    auto [para_dups, para_chars] = find_duplicates(*text, v, s.parts, &s.table);
    if (dup_para_frac && static_cast<double>(para_dups) / s.parts.size() > *dup_para_frac)
      return drop(d, "dup_para_frac", static_cast<double>(para_dups) / s.parts.size(), ">",
                  *dup_para_frac);
    if (dup_para_char_frac && para_chars / len > *dup_para_char_frac)
      return drop(d, "dup_para_char_frac", para_chars / len, ">", *dup_para_char_frac);
    if (ascii)
      split_on_runs_ascii(*text, whole(t), '\n', 1, &s.parts);
    else
      split_on_runs(t, whole(t), U'\n', 1, &s.parts);
    auto [line_dups, line_chars] = find_duplicates(*text, v, s.parts, &s.table);
    if (dup_line_frac && static_cast<double>(line_dups) / s.parts.size() > *dup_line_frac)
      return drop(d, "dup_line_frac", static_cast<double>(line_dups) / s.parts.size(), ">",
                  *dup_line_frac);
    if (dup_line_char_frac && line_chars / len > *dup_line_char_frac)
      return drop(d, "dup_line_char_frac", line_chars / len, ">", *dup_line_char_frac);
    if (top_n_grams.empty() && dup_n_grams.empty()) return true;

    const DocumentView& vw = document_view_words(*text);
    const auto& words = vw.words;
    const size_t n = words.size();
    Ngrams& g = ngrams();
    // Code point offsets of the words in their concatenation (an n-gram's length).
    g.cp_off.resize(n + 1);
    g.cp_off[0] = 0;
    for (size_t i = 0; i < n; ++i) g.cp_off[i + 1] = g.cp_off[i] + words[i].size();
    // A CJK character is about half a word: in a text whose words are mostly CJK characters the
    // n-gram rules take n-grams of 2n characters (else every common 5-character phrase of
    // Japanese would count as a repeated 5-word passage).
    size_t cjk = 0;
    for (const Span& w : words) cjk += is_cjk_word(t, w);
    const size_t scale = cjk * 2 > n ? 2 : 1;
    // Top n-grams (" ".join of the words: words hold no spaces, so the word sequence decides).
    size_t max_top = 0;
    g.rules.clear();
    for (const auto& [n64, frac] : top_n_grams) {
      max_top = std::max(max_top, static_cast<size_t>(n64) * scale);
      g.rules.emplace_back(static_cast<size_t>(n64) * scale, frac);
    }
    if (max_top > 0 && n > 0) count_top_grams(*text, vw, std::min(max_top, n), g.rules, len, &g);
    for (const auto& [n64, frac] : top_n_grams) {
      const size_t m = static_cast<size_t>(n64) * scale, m64 = static_cast<size_t>(n64);
      if (n < m) continue;
      const uint32_t best_count = g.best_count[m], best_first = g.best_first[m];
      if (best_count == 0) continue;  // (cannot reach frac: not counted)
      const uint64_t gram_len = g.cp_off[best_first + m] - g.cp_off[best_first] + (m - 1);
      const double r = static_cast<double>(gram_len) * best_count / len;
      if (r > frac) {
        return drop(d, rule_name("top_%zu_gram", m64), r, ">", frac);
      }
    }
    // Duplicated n-grams ("".join of the words, as datatrove compares them: ["ab", "c"] and
    // ["a", "bc"] are the same 2-gram there), on the words' UTF-8 bytes concatenated (equal
    // code points are equal bytes).
    size_t min_m = SIZE_MAX;
    for (const auto& [n64, frac] : dup_n_grams)
      min_m = std::min(min_m, static_cast<size_t>(n64) * scale);
    if (!dup_n_grams.empty() && n >= min_m) mark_repeatable_starts(*text, vw, min_m, &g);
    for (const auto& [n64, frac] : dup_n_grams) {
      const size_t m = static_cast<size_t>(n64) * scale, m64 = static_cast<size_t>(n64);
      const uint64_t repeated = n >= m ? duplicated_chars(m, n - m + 1, frac, len, &g) : 0;
      const double r = repeated / len;
      if (r > frac) {
        return drop(d, rule_name("duplicated_%zu_n_grams", m64), r, ">", frac);
      }
    }
    return true;
  }
};

// ---- c4 ----------------------------------------------------------------------------------------

// The sentences of a line as datatrove counts them (len(split_into_sentences(line))): spaCy's
// Sentencizer over spaCy's tokens of the line, at least 1. (t: code points, or the bytes of an
// ASCII text.)
template <typename Ch>
uint64_t count_sentences(const Ch* t, Span line) {
  thread_local std::string utf8;
  thread_local std::vector<spacy::Token> tokens;
  thread_local std::vector<uint32_t> starts;
  std::string_view text;
  if constexpr (sizeof(Ch) == 1) {
    text = std::string_view(reinterpret_cast<const char*>(t + line.begin), line.size());
  } else {
    utf8.clear();
    for (uint32_t i = line.begin; i < line.end; ++i) append_utf8(t[i], &utf8);
    text = utf8;
  }
  spacy::tokenize(text, &tokens);
  spacy::sentence_starts(text, tokens, &starts);
  return std::max<uint64_t>(1, starts.size());
}

// The line lower-cased for the c4 phrase checks (`phrase in line.lower()`): the phrases are
// ASCII letters and spaces, and str.lower() turns no other character into one of those except
// U+212A KELVIN SIGN (into k; U+0130 lowers to "i" + U+0307, which breaks the phrase anyway), so
// every other non-ASCII character becomes a byte no phrase holds.
inline char lower_char(char32_t c) {
  return c < 128 ? static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c)
                 : (c == 0x212A ? 'k' : '\x80');
}
template <typename Ch>
void lower_for_match(std::span<const Ch> t, std::string* out) {
  out->resize(t.size());
  for (size_t i = 0; i < t.size(); ++i) (*out)[i] = lower_char(t[i]);
}

// Whether low holds phrase (a phrase of the c4 rules): found by memchr of its rarest character
// in English text ('{', j, k, v, f, p; anchor_of) and compared around each hit.
constexpr size_t anchor_of(std::string_view phrase) {
  for (char a : {'{', 'j', 'k', 'v', 'f', 'p'})
    if (phrase.find(a) != std::string_view::npos) return phrase.find(a);
  return 0;
}
inline bool contains(std::string_view low, std::string_view phrase) {
  const size_t anchor = anchor_of(phrase);
  const char a = phrase[anchor];
  for (size_t from = anchor; from < low.size();) {
    const void* p = std::memchr(low.data() + from, a, low.size() - from);
    if (!p) return false;
    const size_t at = static_cast<const char*>(p) - low.data();
    if (at - anchor + phrase.size() <= low.size() &&
        std::memcmp(low.data() + at - anchor, phrase.data(), phrase.size()) == 0)
      return true;
    from = at + 1;
  }
  return false;
}

template <typename Ch>
bool span_ends_with(const Ch* t, Span s, std::u32string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t k = 0; k < suffix.size(); ++k)
    if (char32_t{t[s.end - suffix.size() + k]} != suffix[k]) return false;
  return true;
}
template <typename Ch>
bool span_starts_with(const Ch* t, Span s, std::u32string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t k = 0; k < prefix.size(); ++k)
    if (char32_t{t[s.begin + k]} != prefix[k]) return false;
  return true;
}

class C4 final : public Filter {
 public:
  bool split_paragraph = true, remove_citations = true, filter_no_terminal_punct = true,
       filter_lorem_ipsum = true, filter_javascript = true, filter_curly_bracket = true,
       filter_policy = true;
  int64_t min_num_sentences = 5, min_words_per_line = 3, max_word_length = 1000;
  bool rewrites() const override { return true; }

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool* edited,
             FilterAnnotations*) const override {
    // An ASCII text is its own code points: c4 runs on its bytes, without decoding it (the
    // same code as on code points; tests/dataprep/filter_text_test.cc compares the two).
    if (take_ascii_path(*text))
      return run(reinterpret_cast<const unsigned char*>(text->data()),
                 static_cast<uint32_t>(text->size()), nullptr, text, d, edited);
    const DocumentView& v = document_view(*text);
    return run(v.cp.data(), static_cast<uint32_t>(v.cp.size()), v.byte_at.data(), text, d, edited);
  }

  // c4 over t[0, size): code points with their byte offsets byte_at (and the end's), or the
  // bytes of an ASCII text (byte_at null: byte offsets are code point offsets).
  template <typename Ch>
  bool run(const Ch* t, uint32_t size, const uint32_t* byte_at, std::string* text, FilterDrop* d,
           bool* edited) const {
    static constexpr std::string_view kPolicy[] = {"terms of use",   "privacy policy",
                                                   "cookie policy",  "uses cookies",
                                                   "use of cookies", "use cookies"};

    Scratch& s = scratch();
    auto byte_of = [&](uint32_t i) { return byte_at ? byte_at[i] : i; };
    if (split_paragraph) {
      split_lines_of(t, {0, size}, &s.lines);
    } else {
      // One "line" per sentence of the whole text (split_into_sentences: from the end of one
      // spaCy sentence to the end of the next, the last to the end of the text).
      s.lines.clear();
      thread_local std::vector<spacy::Token> tokens;
      thread_local std::vector<uint32_t> starts;
      spacy::tokenize(*text, &tokens);
      spacy::sentence_starts(*text, tokens, &starts);
      auto cp_of = [&](uint32_t byte) {
        return byte_at ? static_cast<uint32_t>(std::lower_bound(byte_at, byte_at + size + 1, byte) -
                                               byte_at)
                       : byte;
      };
      uint32_t start = 0;
      for (size_t k = 0; k + 1 < starts.size(); ++k) {
        const uint32_t end = cp_of(tokens[starts[k + 1] - 1].end);
        s.lines.push_back({start, end});
        start = end;
      }
      s.lines.push_back({start, size});
    }
    uint64_t sentences = 0;
    s.out.clear();
    bool first = true;
    for (Span raw : s.lines) {
      Span line = strip_of(t, raw);
      // A line whose end no citation can change (it does not end in ']') and that lacks the
      // terminal punctuation is dropped whatever else it holds.
      if (filter_no_terminal_punct && line.size() > 0 && t[line.end - 1] != ']') {
        const char32_t c = t[line.end - 1];
        const bool ok = c == '.' || c == '?' || c == '!' || c == '"' || c == '\'' ||
                        c == U'\u3002' || c == U'\uFF01' || c == U'\uFF1F' || c == U'\u300D' ||
                        c == U'\u300F';
        if (!ok || span_ends_with(t, line, U"...")) {
          // (the max_word_length rule would drop it too: same result either way)
          continue;
        }
      }
      // One pass over the line: words (white-space tokens; a token with CJK characters counts
      // one word per character), the longest token, and whether a citation may be there.
      // (the line lower-cased for the phrase checks on the way: s.lower)
      int64_t n_words = 0, longest = 0, token = 0, token_cjk = 0;
      bool bracket = false;
      s.lower.resize(line.size());
      char* low_out = s.lower.data();
      if constexpr (sizeof(Ch) == 1) {
        // (ASCII bytes: no CJK; simple loops the compiler vectorises. Words are the starts of
        // non-space runs; the longest token matters only on a line longer than the limit.)
        const Ch* p = t + line.begin;
        const uint32_t size = line.size();
        auto space = [](uint8_t c) {
          return static_cast<uint8_t>(c - 9) < 5 || static_cast<uint8_t>(c - 0x1C) < 5;
        };
        for (uint32_t k = 0; k < size; ++k)
          low_out[k] = static_cast<char>(p[k] + (static_cast<uint8_t>(p[k] - 'A') < 26 ? 32 : 0));
        uint32_t starts = size > 0 && !space(p[0]);
        for (uint32_t k = 1; k < size; ++k) starts += space(p[k - 1]) & !space(p[k]);
        n_words = starts;
        bracket = size > 0 && std::memchr(p, '[', size) != nullptr;
        if (max_word_length >= 0 && size > max_word_length) {
          for (uint32_t k = 0; k <= size; ++k) {
            if (k == size || space(p[k])) {
              longest = std::max(longest, token);
              token = 0;
            } else {
              ++token;
            }
          }
        }
      } else {
        for (uint32_t i = line.begin; i <= line.end; ++i) {
          if (i < line.end) low_out[i - line.begin] = lower_char(t[i]);
          if (i == line.end || is_space(t[i])) {
            if (token > 0) {
              n_words += std::max<int64_t>(1, token_cjk);
              longest = std::max(longest, token);
            }
            token = token_cjk = 0;
            continue;
          }
          ++token;
          token_cjk += is_cjk(t[i]);
          bracket |= t[i] == '[';
        }
      }
      if (max_word_length >= 0 && longest > max_word_length) continue;
      // Citations ([1], [edit], [citation needed]) removed: the kept line is the code points
      // that remain (copied only when the line has a '[').
      thread_local std::vector<Ch> cv;
      cv.clear();
      const bool copied = remove_citations && bracket;
      if (copied) {
        for (uint32_t i = line.begin; i < line.end;) {
          if (t[i] == '[') {
            uint32_t j = i + 1;
            while (j < line.end && t[j] >= '0' && t[j] <= '9') ++j;
            if (j < line.end && t[j] == ']') {
              i = j + 1;
              continue;
            }
            const Span rest{i, line.end};
            if (span_starts_with(t, rest, U"[edit]")) {
              i += 6;
              continue;
            }
            if (span_starts_with(t, rest, U"[citation needed]")) {
              i += 17;
              continue;
            }
          }
          cv.push_back(t[i++]);
        }
      }
      // The line after citations: cv, or (nothing to remove) the line itself.
      const Ch* lt = copied ? cv.data() : t;
      const Span cs = copied ? Span{0, static_cast<uint32_t>(cv.size())} : line;
      const std::span<const Ch> lv(lt + cs.begin, cs.size());
      if (filter_no_terminal_punct) {
        bool ok = false;
        if (!lv.empty()) {
          char32_t c = lv.back();
          ok = c == '.' || c == '?' || c == '!' || c == '"' || c == '\'' || c == U'\u3002' ||
               c == U'\uFF01' || c == U'\uFF1F' || c == U'\u300D' || c == U'\u300F';
        }
        if (!ok || span_ends_with(lt, cs, U"...")) continue;
      }
      if (n_words < min_words_per_line) continue;
      if (copied) lower_for_match(lv, &s.lower);
      const std::string_view low(s.lower);
      // `phrase in line.lower()`
      auto has = [&](std::string_view phrase) { return contains(low, phrase); };
      if (filter_lorem_ipsum && has("lorem ipsum")) return drop(d, "lorem_ipsum", 1, "==", 1);
      if (filter_javascript && has("javascript")) continue;
      if (filter_curly_bracket && has("{")) return drop(d, "curly_bracket", 1, "==", 1);
      if (filter_policy) {
        // (the last four all hold "cookie": searched only if the line has a 'k')
        bool policy = has(kPolicy[0]) || has(kPolicy[1]);
        if (!policy && low.find('k') != std::string_view::npos)
          for (size_t k = 2; k < std::size(kPolicy) && !policy; ++k) policy = has(kPolicy[k]);
        if (policy) continue;
      }
      if (min_num_sentences >= 0) sentences += split_paragraph ? count_sentences(lt, cs) : 1;
      if (!first) s.out.push_back(split_paragraph ? '\n' : ' ');
      first = false;
      if (cs.size() == line.size())  // nothing removed: the line's own bytes
        s.out.append(*text, byte_of(line.begin), byte_of(line.end) - byte_of(line.begin));
      else if constexpr (sizeof(Ch) == 1)
        s.out.append(reinterpret_cast<const char*>(lv.data()), lv.size());
      else
        for (char32_t c : lv) append_utf8(c, &s.out);
    }
    if (min_num_sentences >= 0 && static_cast<int64_t>(sentences) < min_num_sentences)
      return drop(d, "too_few_sentences", sentences, "<", min_num_sentences);
    // "\n".join(kept).strip() (" " without split_paragraph): the kept lines are stripped
    // already, so only empty kept lines (possible with the word and punctuation rules off) leave
    // white space at the ends.
    {
      const char sep = split_paragraph ? '\n' : ' ';
      size_t b = 0, e = s.out.size();
      while (b < e && s.out[b] == sep) ++b;
      while (e > b && s.out[e - 1] == sep) --e;
      if (b > 0 || e < s.out.size()) s.out = s.out.substr(b, e - b);
    }
    if (s.out.empty()) return drop(d, "empty", 0, "==", 0);
    if (s.out != *text) {
      text->swap(s.out);
      *edited = true;
    }
    return true;
  }
};

// ---- fineweb -----------------------------------------------------------------------------------

class FineWeb final : public Filter {
 public:
  double line_punct_thr = 0.12;
  bool line_punct_exclude_zero = false;
  double short_line_thr = 0.67;
  int64_t short_line_length = 30;
  double char_duplicates_ratio = 0.01;
  double new_line_ratio = 0.3;
  std::vector<char32_t> stop_single;       // one-character stop strings, ascending
  std::vector<std::u32string> stop_multi;  // the others

  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool*,
             FilterAnnotations*) const override {
    Scratch& s = scratch();
    const DocumentView& v = document_view(*text);
    const auto& t = v.cp;
    const bool ascii = take_ascii_path(*text);
    if (ascii)
      split_on_ascii(*text, whole(t), '\n', &s.parts);
    else
      split_on(t, whole(t), U'\n', &s.parts);
    s.lines.clear();
    for (const Span& l : s.parts)
      if (strip(t, l).size() > 0) s.lines.push_back(l);
    if (s.lines.empty()) return drop(d, "empty", 0, "==", 0);
    const double n_lines = static_cast<double>(s.lines.size());
    uint64_t punct = 0, short_lines = 0;
    for (const Span& l : s.lines) {
      // line.endswith(stop_chars): a one-character stop is looked up, a longer one compared
      if (l.size() > 0 &&
          std::binary_search(stop_single.begin(), stop_single.end(), t[l.end - 1])) {
        ++punct;
      } else {
        for (const auto& sc : stop_multi)
          if (ends_with(t, l, sc)) {
            ++punct;
            break;
          }
      }
      // Line length in columns: a CJK character is two (a 30-column line holds 15 of them; an
      // ASCII text has none).
      uint64_t cols = l.size();
      if (!ascii)
        for (uint32_t i = l.begin; i < l.end; ++i) cols += is_cjk(t[i]);
      short_lines += static_cast<int64_t>(cols) <= short_line_length;
    }
    double r = punct / n_lines;
    if (r < line_punct_thr && !(r == 0 && line_punct_exclude_zero))
      return drop(d, "line_punct_ratio", r, "<", line_punct_thr);
    r = short_lines / n_lines;
    if (r > short_line_thr) return drop(d, "short_line_ratio", r, ">", short_line_thr);
    const uint64_t newlines = count_bytes(*text, "\n");
    const double non_newline = static_cast<double>(t.size() - newlines);
    auto [dups, dup_chars] = find_duplicates(*text, v, s.lines, &s.table);
    (void)dups;
    r = non_newline > 0 ? dup_chars / non_newline : 0.0;
    if (r > char_duplicates_ratio) return drop(d, "char_dup_ratio", r, ">", char_duplicates_ratio);
    const size_t n_words = document_view_words(*text).words.size();
    r = n_words == 0 ? 0.0 : static_cast<double>(newlines) / n_words;
    if (r > new_line_ratio) return drop(d, "list_ratio", r, ">", new_line_ratio);
    return true;
  }
};

// ---- length ------------------------------------------------------------------------------------

class Length final : public Filter {
 public:
  std::optional<int64_t> min_chars, max_chars, min_words, max_words;
  bool apply(std::string* text, const FilterInput&, FilterDrop* d, bool*,
             FilterAnnotations*) const override {
    const auto& t = document_view(*text).cp;
    const int64_t chars = static_cast<int64_t>(t.size());
    if (min_chars && chars < *min_chars) return drop(d, "chars", chars, "<", *min_chars);
    if (max_chars && chars > *max_chars) return drop(d, "chars", chars, ">", *max_chars);
    if (min_words || max_words) {
      int64_t n = 0;
      for (const Span& w : document_view_words(*text).words) n += !is_symbol_word(t, w);
      if (min_words && n < *min_words) return drop(d, "words", n, "<", *min_words);
      if (max_words && n > *max_words) return drop(d, "words", n, ">", *max_words);
    }
    return true;
  }
};

std::u32string to_u32(const std::string& s) {
  CodePoints v;
  decode_utf8(s, &v);
  return std::u32string(v.begin(), v.end());
}

constexpr int64_t kBig = int64_t{1} << 40;

}  // namespace

Result<std::unique_ptr<Filter>> make_gopher_quality(Params& p) {
  auto f = std::make_unique<GopherQuality>();
  KILN_RETURN_IF_ERROR(p.integer("min_doc_words", 0, kBig, &f->min_doc_words));
  KILN_RETURN_IF_ERROR(p.integer("max_doc_words", 0, kBig, &f->max_doc_words));
  KILN_RETURN_IF_ERROR(p.number("min_avg_word_length", 0, 1e6, &f->min_avg_word_length));
  KILN_RETURN_IF_ERROR(p.number("max_avg_word_length", 0, 1e6, &f->max_avg_word_length));
  KILN_RETURN_IF_ERROR(p.number("max_symbol_word_ratio", 0, 1e6, &f->max_symbol_word_ratio));
  KILN_RETURN_IF_ERROR(p.number("max_bullet_lines_ratio", 0, 1, &f->max_bullet_lines_ratio));
  KILN_RETURN_IF_ERROR(p.number("max_ellipsis_lines_ratio", 0, 1, &f->max_ellipsis_lines_ratio));
  KILN_RETURN_IF_ERROR(p.number("max_non_alpha_words_ratio", 0, 1, &f->max_non_alpha_words_ratio));
  KILN_RETURN_IF_ERROR(p.integer("min_stop_words", 0, 64, &f->min_stop_words));
  std::vector<std::string> words = {"the", "be", "to", "of", "and", "that", "have", "with"};
  KILN_RETURN_IF_ERROR(p.texts("stop_words", &words));
  if (words.size() > 64)
    return Status::config("at most 64 stop words").with_key(p.key_of("stop_words"));
  std::vector<std::string> unique;
  for (const auto& w : words)
    if (std::find(unique.begin(), unique.end(), w) == unique.end()) unique.push_back(w);
  for (const auto& w : unique) f->stop_words.push_back(to_u32(w));
  // As in datatrove, a rule set to 0 (or null) is off.
  for (auto* o : {&f->min_doc_words, &f->max_doc_words, &f->min_stop_words})
    if (o->has_value() && **o == 0) o->reset();
  for (auto* o :
       {&f->min_avg_word_length, &f->max_avg_word_length, &f->max_symbol_word_ratio,
        &f->max_bullet_lines_ratio, &f->max_ellipsis_lines_ratio, &f->max_non_alpha_words_ratio})
    if (o->has_value() && **o == 0) o->reset();
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_gopher_repetition(Params& p) {
  auto f = std::make_unique<GopherRepetition>();
  KILN_RETURN_IF_ERROR(p.number("dup_line_frac", 0, 1, &f->dup_line_frac));
  KILN_RETURN_IF_ERROR(p.number("dup_para_frac", 0, 1, &f->dup_para_frac));
  KILN_RETURN_IF_ERROR(p.number("dup_line_char_frac", 0, 1, &f->dup_line_char_frac));
  KILN_RETURN_IF_ERROR(p.number("dup_para_char_frac", 0, 1, &f->dup_para_char_frac));
  KILN_RETURN_IF_ERROR(p.pairs("top_n_grams", 1, 64, &f->top_n_grams));
  KILN_RETURN_IF_ERROR(p.pairs("dup_n_grams", 1, 64, &f->dup_n_grams));
  for (auto* o :
       {&f->dup_line_frac, &f->dup_para_frac, &f->dup_line_char_frac, &f->dup_para_char_frac})
    if (o->has_value() && **o == 0) o->reset();  // 0 = off, as in datatrove
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_c4(Params& p) {
  auto f = std::make_unique<C4>();
  KILN_RETURN_IF_ERROR(p.boolean("split_paragraph", &f->split_paragraph));
  KILN_RETURN_IF_ERROR(p.boolean("remove_citations", &f->remove_citations));
  KILN_RETURN_IF_ERROR(p.boolean("filter_no_terminal_punct", &f->filter_no_terminal_punct));
  KILN_RETURN_IF_ERROR(p.integer("min_num_sentences", -1, kBig, &f->min_num_sentences));
  KILN_RETURN_IF_ERROR(p.integer("min_words_per_line", -1, kBig, &f->min_words_per_line));
  KILN_RETURN_IF_ERROR(p.integer("max_word_length", -1, kBig, &f->max_word_length));
  KILN_RETURN_IF_ERROR(p.boolean("filter_lorem_ipsum", &f->filter_lorem_ipsum));
  KILN_RETURN_IF_ERROR(p.boolean("filter_javascript", &f->filter_javascript));
  KILN_RETURN_IF_ERROR(p.boolean("filter_curly_bracket", &f->filter_curly_bracket));
  KILN_RETURN_IF_ERROR(p.boolean("filter_policy", &f->filter_policy));
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_fineweb(Params& p) {
  auto f = std::make_unique<FineWeb>();
  KILN_RETURN_IF_ERROR(p.number("line_punct_thr", 0, 1, &f->line_punct_thr));
  KILN_RETURN_IF_ERROR(p.boolean("line_punct_exclude_zero", &f->line_punct_exclude_zero));
  KILN_RETURN_IF_ERROR(p.number("short_line_thr", 0, 1, &f->short_line_thr));
  KILN_RETURN_IF_ERROR(p.integer("short_line_length", 0, kBig, &f->short_line_length));
  KILN_RETURN_IF_ERROR(p.number("char_duplicates_ratio", 0, 1, &f->char_duplicates_ratio));
  KILN_RETURN_IF_ERROR(p.number("new_line_ratio", 0, 1e6, &f->new_line_ratio));
  // datatrove's TERMINAL_PUNCTUATION
  std::vector<std::string> stops;
  for (char32_t c : terminal_punctuation()) {
    std::string one;
    append_utf8(c, &one);
    stops.push_back(one);
  }
  KILN_RETURN_IF_ERROR(p.texts("stop_chars", &stops));
  for (const auto& sc : stops) {
    if (sc.empty()) return Status::config("an empty stop string").with_key(p.key_of("stop_chars"));
    const std::u32string u = to_u32(sc);
    if (u.size() == 1)
      f->stop_single.push_back(u[0]);
    else
      f->stop_multi.push_back(u);
  }
  std::sort(f->stop_single.begin(), f->stop_single.end());
  return std::unique_ptr<Filter>(std::move(f));
}

Result<std::unique_ptr<Filter>> make_length(Params& p) {
  auto f = std::make_unique<Length>();
  KILN_RETURN_IF_ERROR(p.integer("min_chars", 0, kBig, &f->min_chars));
  KILN_RETURN_IF_ERROR(p.integer("max_chars", 0, kBig, &f->max_chars));
  KILN_RETURN_IF_ERROR(p.integer("min_words", 0, kBig, &f->min_words));
  KILN_RETURN_IF_ERROR(p.integer("max_words", 0, kBig, &f->max_words));
  if (!f->min_chars && !f->max_chars && !f->min_words && !f->max_words)
    return Status::config("set at least one of min_chars, max_chars, min_words, max_words")
        .with_key(p.key());
  return std::unique_ptr<Filter>(std::move(f));
}

}  // namespace kiln::prep::filter
