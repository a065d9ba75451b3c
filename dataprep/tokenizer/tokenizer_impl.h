// Tokenizer's internals, shared by tokenizer.cc (Kiln's own file, GPT-2 pairs, training,
// encoding), hf_json.cc (Hugging Face tokenizer.json in and out) and sentencepiece.cc.
// Internal to dataprep/tokenizer/.
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dataprep/tokenizer/added_vocab.h"
#include "dataprep/tokenizer/bpe.h"
#include "dataprep/tokenizer/hf_pipeline.h"
#include "dataprep/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace kiln::prep {

// A per-thread cache of encoded words: open addressing over XXH3 hashes, with the word bytes and
// token ids kept in two arenas (no allocation per entry). Cleared whole when it fills up.
class WordCache {
 public:
  WordCache();
  // Appends the cached tokens of `word` to *out and returns true, or returns false.
  bool find(std::string_view word, uint64_t hash, std::vector<uint32_t>* out) const;
  void insert(std::string_view word, uint64_t hash, const uint32_t* tokens, size_t n);

 private:
  struct Entry {
    uint64_t hash;
    uint32_t word_off, word_len, tok_off, tok_len;
  };
  static constexpr uint64_t kSlots = 1 << 17;
  static constexpr uint64_t kMask = kSlots - 1;
  static constexpr size_t kMaxArena = 1 << 24;
  void reset();
  std::vector<Entry> entries_;
  std::string words_;
  std::vector<uint32_t> tokens_;
  size_t size_ = 0;
};

// Which file a tokenizer came from (what save() writes back).
enum class TokenizerSource { kKiln, kGpt2Pair, kHuggingFace, kSentencePiece };

struct Tokenizer::Impl {
  TokenizerSource source = TokenizerSource::kKiln;
  PretokenizerSpec pre;
  std::vector<std::string> tokens;   // bytes by id (special tokens: their text)
  std::vector<uint8_t> special;      // 1 for special ids
  std::vector<std::string> spelled;  // GPT-2 spelling by id (special / added tokens: their text)
  int64_t eos_id = -1;
  BpeModel model;

  // Hugging Face tokenizer.json extras (all off for Kiln's own tokenizers).
  std::string hf_json;  // the file as read: save() writes it back unchanged
  std::shared_ptr<const HfNormalizer> normalizer;  // null: none
  // The pre-tokenizer when it is not the fast path (`pre`, with prefix_space); null: fast path.
  std::shared_ptr<const HfPreTokenizer> pretokenizer;
  std::shared_ptr<const HfDecoder> decoder;  // null: the tokens' bytes, concatenated
  bool prefix_space = false;   // fast path: ByteLevel add_prefix_space: " " before each segment
  bool ignore_merges = false;  // BPE ignore_merges: a word in the vocabulary is one token
  std::unordered_map<std::string, uint32_t> whole_words;  // ignore_merges / char_level: text -> id

  // SentencePiece-style BPE (no ByteLevel pre-tokenizer): the model's first symbols are the
  // characters of a word (whole_words), else its bytes as <0xXX> tokens (byte_fallback), else
  // unk (consecutive ones fused with fuse_unk); continuing_subword_prefix before every character
  // but the first, end_of_word_suffix after the last.
  bool char_level = false;
  bool byte_fallback = false, fuse_unk = false;
  std::array<int64_t, 256> fallback_ids{};  // -1 where the vocabulary lacks <0xXX>
  int64_t unk_id = -1;
  std::string subword_prefix, word_suffix;

  // Added tokens found in the text before pre-tokenisation, as Hugging Face's AddedVocabulary
  // does: added[parse][0] those with normalized false, in the raw text; added[parse][1] those
  // with normalized true, in the normalised text between the first (their text normalised too).
  // parse = 0: the non-special ones only (special-token text stays text); 1: all.
  std::array<std::array<AddedMatcher, 2>, 2> added;
  bool parse_special = false;

  // SentencePiece model (encode / decode go through the library); its serialized bytes.
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp;
  std::string sp_model;

  // std::allocator, not oneTBB's default (libtbbmalloc, memory LeakSanitizer does not scan): a
  // tokenizer alive at exit otherwise has its caches reported as leaked (docs/HARDENING.md).
  mutable tbb::enumerable_thread_specific<WordCache, std::allocator<WordCache>> caches;

  Status encode(std::string_view text, std::vector<uint32_t>* out) const;
  // Text between added tokens: normalised, then encode_normalized. first: it starts the text.
  Status encode_segment(std::string_view text, bool first, std::vector<uint32_t>* out) const;
  Status encode_normalized(std::string_view text, bool first, std::vector<uint32_t>* out) const;
  // One pre-token (cached per thread when short).
  void encode_word(std::string_view word, WordCache& cache, std::vector<uint32_t>* out) const;
  void encode_word_uncached(std::string_view word, std::vector<uint32_t>* out) const;
  void encode_chars(std::string_view word, std::vector<uint32_t>* out) const;
  Status encode_sentencepiece(std::string_view text, std::vector<uint32_t>* out) const;
  bool has_added(bool parse) const { return !added[parse][0].empty() || !added[parse][1].empty(); }
};

// Access to Tokenizer internals for the builders in this folder.
class TokenizerAccess {
 public:
  static Tokenizer::Impl& impl(Tokenizer& t) { return *t.impl_; }
  static const Tokenizer::Impl& impl(const Tokenizer& t) { return *t.impl_; }
};

// Builds a byte-level BPE tokenizer from GPT-2-spelled vocabulary entries and merges.
// `literal_ids` are ids whose entry is literal text rather than a byte spelling (special and
// added tokens); of them, `special_ids` are special. Errors name `origin` and the field.
Result<Tokenizer> build_byte_bpe(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::unordered_set<int64_t>& literal_ids,
                                 const std::unordered_set<int64_t>& special_ids, int64_t eos_id,
                                 PretokenizerSpec pre, const std::string& origin,
                                 const std::string& vocab_field, const std::string& merges_field);

// Appends `"vocab": {...},\n<indent>"merges": [...]` (GPT-2 spellings, one entry a line,
// indented one space deeper than the keys) to `out`: the shared body of the tokenizer.json and
// kiln-tokenizer/1 writers.
void append_vocab_and_merges(std::string& out, const Tokenizer& tok, std::string_view indent);

// kData naming the file and the cap when `count` entries of `what` pass `limit`.
Status check_limit(uint64_t count, uint64_t limit, const char* what, const char* knob,
                   const std::string& origin);

// Hugging Face tokenizer.json (hf_json.cc).
bool looks_like_hf_tokenizer_json(std::string_view text);
Result<Tokenizer> load_hf_tokenizer_json(std::string_view text, const std::string& origin,
                                         const TokenizerLimits& limits);
// SentencePiece model (sentencepiece.cc).
Result<Tokenizer> load_sentencepiece(std::string bytes, const std::string& origin,
                                     const TokenizerLimits& limits);
Status sentencepiece_encode(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                            std::vector<uint32_t>* out);
Result<std::string> sentencepiece_decode(const sentencepiece::SentencePieceProcessor& sp,
                                         std::span<const uint32_t> ids);

}  // namespace kiln::prep
