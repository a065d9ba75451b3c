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

#include "dataprep/tokenizer/bpe.h"
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

// A non-special added token of a tokenizer.json (Tokenizer::Impl::inline_tokens).
struct InlineToken {
  std::string text;
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false;
};

struct Tokenizer::Impl {
  TokenizerSource source = TokenizerSource::kKiln;
  PretokenizerSpec pre;
  std::vector<std::string> tokens;   // bytes by id (special tokens: their text)
  std::vector<uint8_t> special;      // 1 for special ids
  std::vector<std::string> spelled;  // GPT-2 spelling by id (special / added tokens: their text)
  int64_t eos_id = -1;
  BpeModel model;

  // Hugging Face tokenizer.json extras (all off for Kiln's own tokenizers).
  std::string hf_json;         // the file as read: save() writes it back unchanged
  bool nfc = false;            // normalizer NFC
  bool prefix_space = false;   // ByteLevel add_prefix_space: " " before each segment
  bool ignore_merges = false;  // BPE ignore_merges: a word in the vocabulary is one token
  std::unordered_map<std::string, uint32_t> whole_words;  // ignore_merges: bytes -> id
  // Non-special added tokens, found in the text before pre-tokenisation as Hugging Face's
  // AddedVocabulary does (leftmost, then longest; the match iteration of its find_matches):
  // first those with normalized false in the raw text ([0]), then those with normalized true in
  // the normalised text between the first matches ([1]; their text normalised too). lstrip /
  // rstrip take the whitespace (Unicode White_Space) before / after a match into the token;
  // single_word drops a match with a word character (Rust regex \w) right before or after it.
  std::array<std::vector<InlineToken>, 2> inline_tokens;
  // Indices into inline_tokens[pass] by first byte, longest first.
  std::array<std::array<std::vector<uint32_t>, 256>, 2> inline_by_byte;
  bool has_inline = false;

  // SentencePiece model (encode / decode go through the library); its serialized bytes.
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp;
  std::string sp_model;

  // std::allocator, not oneTBB's default (libtbbmalloc, memory LeakSanitizer does not scan): a
  // tokenizer alive at exit otherwise has its caches reported as leaked (docs/HARDENING.md).
  mutable tbb::enumerable_thread_specific<WordCache, std::allocator<WordCache>> caches;

  void encode(std::string_view text, std::vector<uint32_t>* out) const;
  void encode_segment(std::string_view text, std::vector<uint32_t>* out) const;
  // encode_segment of text that is already normalised.
  void encode_normalized(std::string_view text, std::vector<uint32_t>* out) const;
  // The added tokens of pass 0/1 in text: gap(piece) for the text between matches, the id of each.
  template <class Gap>
  void split_added(std::string_view text, int pass, std::vector<uint32_t>* out,
                   const Gap& gap) const;
  void encode_pieces(std::string_view text, std::vector<uint32_t>* out) const;
  void encode_sentencepiece(std::string_view text, std::vector<uint32_t>* out) const;
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

// NFC of the valid UTF-8 runs of `text` (invalid bytes are kept as they are).
std::string nfc_normalize(std::string_view text);

}  // namespace kiln::prep
