// Tokenizers: Kiln's byte-level BPE (trained by Kiln), Hugging Face tokenizer.json files of the
// byte-level BPE family (GPT-2, Llama 3, Qwen2, Mistral-Nemo), GPT-2 vocab.json + merges.txt
// pairs, and SentencePiece models (.model: Llama 2, Mistral v1) through the SentencePiece library.
//
// Kiln writes its tokenizers as Hugging Face `tokenizer.json` files (a BPE model with a `Split`
// pre-tokenizer holding the regular expression of Kiln's pre-tokenizer, then ByteLevel), which
// Hugging Face tokenizers load with the same ids. It still reads its older file, format
// "kiln-tokenizer/1" (documented in docs/TOKENIZER.md):
//   {"format": "kiln-tokenizer/1", "type": "byte-bpe",
//    "pretokenizer": {"type": "kiln-v1", "cjk_chunk": 0},      // or {"type": "gpt2"}
//    "vocab_size": N, "eos_id": 0,
//    "special_tokens": {"<|endoftext|>": 0},
//    "vocab": {"<token>": id, ...},      // tokens in GPT-2's byte-to-unicode spelling
//    "merges": ["<left> <right>", ...]}  // in rank order (as in merges.txt)
// Ids are dense 0..vocab_size-1. Tokenizers Kiln trains put the special tokens first
// (<|endoftext|> = 0), then the 256 bytes, then one token per merge.
//
// encode() treats its input as plain text: special-token strings inside the text are encoded as
// ordinary bytes (a document can never inject an end-of-text), and nothing is added (no BOS).
// Non-special added tokens of a tokenizer.json are found in the text as Hugging Face does. For
// byte-level BPE, decode(encode(x)) == x for any byte string (with add_prefix_space, plus the
// space). All const methods are thread-safe; encode keeps a per-thread word cache.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "dataprep/tokenizer/pretokenize.h"

namespace kiln::prep {

inline constexpr const char* kTokenizerFormat = "kiln-tokenizer/1";
inline constexpr const char* kEndOfText = "<|endoftext|>";

struct TokenizerTrainOptions {
  size_t vocab_size = 8192;  // including the special tokens and the 256 byte tokens
  std::vector<std::string> special_tokens = {kEndOfText};  // ids 0..; the first is the EOS
  uint64_t min_frequency = 2;  // stop merging when the best pair occurs fewer times
  PretokenizerSpec pretokenizer = llama3_pretokenizer();  // Llama 3's (llama.cpp's llama-bpe)
};

// Caps on what a tokenizer file may make Kiln build (checked right after the JSON is read, before
// any table is built); past one, loading is a kData error naming the file and the limit.
struct TokenizerLimits {
  uint64_t max_vocab = uint64_t{1} << 24;   // 16.8M tokens (GPT-4o has 200k)
  uint64_t max_merges = uint64_t{1} << 24;
};

enum class SpecialTokens { kText, kParse };
// "text" / "parse"; usage error naming the value otherwise.
Result<SpecialTokens> parse_special_tokens(std::string_view name);

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Trains on `texts` (pre-tokenised and counted in parallel). The vocabulary may come out
  // smaller than requested when the text has too few repeated pairs. Usage error when
  // vocab_size < specials + 256.
  static Result<Tokenizer> train(const std::vector<std::string_view>& texts,
                                 const TokenizerTrainOptions& options);
  // Reads a tokenizer file, detecting its kind: a Hugging Face tokenizer.json, Kiln's older
  // "kiln-tokenizer/1" JSON, a SentencePiece .model, or a GPT-2 vocab.json with merges.txt
  // beside it. Unsupported parts of a tokenizer.json (another model type, a normalizer or
  // pre-tokenizer Kiln does not implement) are data errors naming the file and the field.
  static Result<Tokenizer> load(const std::string& path, const TokenizerLimits& limits = {});
  // A tokenizer.json or a kiln-tokenizer/1 file's text.
  static Result<Tokenizer> from_json(std::string_view json_text, const std::string& origin,
                                     const TokenizerLimits& limits = {});
  // A SentencePiece model's bytes (ModelProto).
  static Result<Tokenizer> from_sentencepiece(std::string model_bytes, const std::string& origin,
                                              const TokenizerLimits& limits = {});
  // GPT-2 style pair. Tokens of vocab.json that are neither a byte nor the result of a merge are
  // special tokens; "<|endoftext|>" (when present) is the EOS. Pre-tokenizer "gpt2".
  static Result<Tokenizer> load_gpt2(const std::string& vocab_json_path,
                                     const std::string& merges_txt_path,
                                     const TokenizerLimits& limits = {});

  // The tokenizer.json text (deterministic bytes): generated for byte-level BPE tokenizers made
  // or trained by Kiln; a loaded tokenizer.json's own text, unchanged. Empty for SentencePiece.
  std::string to_json() const;
  // The older kiln-tokenizer/1 text (for tools and tests of the old format; byte-level BPE with
  // the gpt2 or kiln-v1 pre-tokenizer only, else empty).
  std::string to_kiln_v1_json() const;
  // What this tokenizer is saved as: "tokenizer.json", or "tokenizer.model" for SentencePiece.
  const char* file_name() const;
  // Writes file_name()'s content to `path` (atomic): to_json(), or the SentencePiece model bytes.
  Status save(const std::string& path) const;
  // Writes the GPT-2 style pair (for other tools).
  Status save_gpt2(const std::string& vocab_json_path, const std::string& merges_txt_path) const;

  // Appends the ids of `text` to *out. A data error only when a pre-tokenizer regex gives up
  // (catastrophic backtracking), naming the pattern.
  Status encode(std::string_view text, std::vector<uint32_t>* out) const;
  // The same for text that cannot fail so (tests, tokenizers without a regex): an error is
  // logged and the ids so far returned.
  std::vector<uint32_t> encode(std::string_view text) const;
  // Special-token text in the input (e.g. "<|begin_of_text|>"): kText (the default) encodes it
  // as ordinary text, so a document can never inject a special id; kParse makes it the special
  // token's id, as Hugging Face's encode does (chat data).
  void set_special_tokens(SpecialTokens mode);
  SpecialTokens special_tokens() const;
  // Encodes many texts in parallel (oneTBB); result[i] belongs to texts[i].
  std::vector<std::vector<uint32_t>> encode_batch(const std::vector<std::string_view>& texts) const;
  // Data error naming the first id that is out of range.
  Result<std::string> decode(std::span<const uint32_t> ids) const;

  size_t vocab_size() const;
  int64_t eos_id() const;  // -1 when there is none
  const PretokenizerSpec& pretokenizer() const;
  // "kiln" (trained by Kiln or a kiln-tokenizer/1 file), "gpt2" (vocab.json + merges.txt),
  // "huggingface" (tokenizer.json), "sentencepiece".
  const char* kind() const;
  // True when decode(encode(x)) == x for every byte string x: byte-level BPE without a
  // normalizer or an added prefix space (false for SentencePiece).
  bool round_trips() const;
  // Bytes of one token (special tokens: their text). id must be < vocab_size().
  const std::string& token_bytes(uint32_t id) const;
  bool is_special(uint32_t id) const;
  // Id of a special token, or -1.
  int64_t special_id(std::string_view text) const;
  size_t num_merges() const;

 private:
  friend class TokenizerAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hugging Face's file pair for a model directory, for `kiln checkpoint export --format hf`:
// DIR/tokenizer.json (to_json()) and DIR/tokenizer_config.json (tokenizer class, special tokens,
// model_max_length, no added BOS, no clean-up of spaces) — loadable by transformers'
// AutoTokenizer with the same ids as Kiln. A SentencePiece tokenizer writes DIR/tokenizer.model
// and a LlamaTokenizer config instead. Files are written atomically.
struct HfTokenizerConfig {
  uint64_t model_max_length = 0;  // the model's context (seq_len); 0: not written
};
Status write_hf_tokenizer(const Tokenizer& tokenizer, const std::string& dir,
                          const HfTokenizerConfig& config = {});
// The tokenizer_config.json text write_hf_tokenizer writes.
std::string hf_tokenizer_config_json(const Tokenizer& tokenizer, const HfTokenizerConfig& config);

// GPT-2's byte-to-unicode spelling of raw bytes (as used in vocab.json / merges.txt), and back.
std::string bytes_to_gpt2_unicode(std::string_view bytes);
Result<std::string> gpt2_unicode_to_bytes(std::string_view text);

}  // namespace kiln::prep
