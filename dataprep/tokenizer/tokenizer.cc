#include "dataprep/tokenizer/tokenizer.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/tsan.h"
#include "dataprep/tokenizer/bpe.h"
#include "dataprep/tokenizer/bpe_train.h"
#include "dataprep/tokenizer/tokenizer_impl.h"

namespace kiln::prep {
namespace {

// ---- GPT-2 byte <-> unicode spelling -----------------------------------------------------------

struct ByteUnicode {
  std::array<int32_t, 256> byte_to_cp{};
  std::unordered_map<int32_t, uint8_t> cp_to_byte;
  std::array<std::string, 256> byte_to_utf8;
  ByteUnicode() {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    std::array<bool, 256> direct{};
    for (int b : bs) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) byte_to_cp[b] = direct[b] ? b : 256 + n++;
    for (int b = 0; b < 256; ++b) {
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
      utf8proc_uint8_t buf[4];
      auto len = utf8proc_encode_char(byte_to_cp[b], buf);
      byte_to_utf8[b] = std::string(reinterpret_cast<char*>(buf), size_t(len));
    }
  }
};

const ByteUnicode& byte_unicode() {
  static const ByteUnicode table;
  return table;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp;
    auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (len <= 0) return false;
    i += size_t(len);
  }
  return true;
}

constexpr size_t kMaxCachedWordBytes = 64;

std::string json_string(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

}  // namespace

// ---- per-thread encode cache -------------------------------------------------------------------

WordCache::WordCache() { reset(); }

bool WordCache::find(std::string_view word, uint64_t hash, std::vector<uint32_t>* out) const {
  for (uint64_t slot = hash & kMask;; slot = (slot + 1) & kMask) {
    const Entry& e = entries_[slot];
    if (e.word_len == 0) return false;
    if (e.hash == hash && e.word_len == word.size() &&
        std::memcmp(words_.data() + e.word_off, word.data(), word.size()) == 0) {
      out->insert(out->end(), tokens_.begin() + e.tok_off, tokens_.begin() + e.tok_off + e.tok_len);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, const uint32_t* tokens, size_t n) {
  if (size_ * 2 >= kSlots || words_.size() + word.size() > kMaxArena ||
      tokens_.size() + n > kMaxArena)
    reset();
  uint64_t slot = hash & kMask;
  while (entries_[slot].word_len != 0) slot = (slot + 1) & kMask;
  entries_[slot] = {hash, uint32_t(words_.size()), uint32_t(word.size()), uint32_t(tokens_.size()),
                    uint32_t(n)};
  words_.append(word);
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  ++size_;
}

void WordCache::reset() {
  entries_.assign(kSlots, Entry{0, 0, 0, 0, 0});
  words_.clear();
  tokens_.clear();
  size_ = 0;
}

std::string bytes_to_gpt2_unicode(std::string_view bytes) {
  const auto& t = byte_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.byte_to_utf8[b];
  return out;
}

Result<std::string> gpt2_unicode_to_bytes(std::string_view text) {
  const auto& t = byte_unicode();
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp;
    auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (len <= 0) return Status::data("invalid UTF-8 in token '" + std::string(text) + "'");
    auto it = t.cp_to_byte.find(cp);
    if (it == t.cp_to_byte.end())
      return Status::data("token '" + std::string(text) +
                          "' has a character outside GPT-2's byte alphabet");
    out.push_back(static_cast<char>(it->second));
    i += size_t(len);
  }
  return out;
}

// ---- encoding ----------------------------------------------------------------------------------

void Tokenizer::Impl::encode_chars(std::string_view word, std::vector<uint32_t>* out) const {
  thread_local std::vector<uint32_t> symbols;
  symbols.clear();
  int64_t unk = -1;  // a pending unk token (fused with the next unknown characters)
  std::string piece;
  size_t len = 0;
  for (size_t i = 0; i < word.size(); i += len) {
    len = 1;
    auto b = static_cast<unsigned char>(word[i]);
    if (b >= 0x80) {
      utf8proc_int32_t cp;
      auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(word.data() + i),
                                static_cast<utf8proc_ssize_t>(word.size() - i), &cp);
      len = n > 0 ? size_t(n) : 1;
    }
    piece.clear();
    if (i > 0) piece += subword_prefix;
    piece.append(word.substr(i, len));
    if (i + len == word.size()) piece += word_suffix;
    auto it = whole_words.find(piece);
    if (it != whole_words.end()) {
      if (unk >= 0) symbols.push_back(uint32_t(unk));
      unk = -1;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char c : piece) all = all && fallback_ids[c] >= 0;
      if (all) {
        for (unsigned char c : piece) symbols.push_back(uint32_t(fallback_ids[c]));
        continue;
      }
    }
    if (unk_id >= 0) {
      if (unk >= 0 && !fuse_unk) symbols.push_back(uint32_t(unk));
      unk = unk_id;
    }
  }
  if (unk >= 0) symbols.push_back(uint32_t(unk));
  model.encode_symbols(symbols.data(), symbols.size(), out);
}

void Tokenizer::Impl::encode_word_uncached(std::string_view word,
                                           std::vector<uint32_t>* out) const {
  if (ignore_merges) {
    auto it = whole_words.find(std::string(word));
    if (it != whole_words.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (char_level) return encode_chars(word, out);
  model.encode_word(word, out);
}

void Tokenizer::Impl::encode_word(std::string_view word, WordCache& cache,
                                  std::vector<uint32_t>* out) const {
  if (word.size() == 1 && !char_level) {  // a single byte is its own token
    out->push_back(model.byte_ids()[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kMaxCachedWordBytes) return encode_word_uncached(word, out);
  uint64_t hash = xxh3_64(word);
  if (cache.find(word, hash, out)) return;
  size_t before = out->size();
  encode_word_uncached(word, out);
  cache.insert(word, hash, out->data() + before, out->size() - before);
}

Status Tokenizer::Impl::encode_normalized(std::string_view text, bool first,
                                          std::vector<uint32_t>* out) const {
  if (text.empty()) return Status::ok();
  WordCache& cache = caches.local();
  if (pretokenizer) {
    thread_local std::vector<Piece> pieces;
    pieces.clear();
    KILN_RETURN_IF_ERROR(pretokenizer->apply(text, first, &pieces));
    for (const Piece& p : pieces) encode_word(p.text, cache, out);
    return Status::ok();
  }
  std::string spaced;
  if (prefix_space && text[0] != ' ') {
    spaced = " " + std::string(text);
    text = spaced;
  }
  thread_local std::vector<std::string_view> views;
  views.clear();
  KILN_RETURN_IF_ERROR(pretokenize(text, pre, &views));
  for (std::string_view piece : views) encode_word(piece, cache, out);
  return Status::ok();
}

Status Tokenizer::Impl::encode_segment(std::string_view text, bool first,
                                       std::vector<uint32_t>* out) const {
  if (text.empty()) return Status::ok();
  if (!normalizer) return encode_normalized(text, first, out);
  std::string norm;
  KILN_RETURN_IF_ERROR(normalizer->apply(text, &norm));
  return encode_normalized(norm, first, out);
}

Status Tokenizer::Impl::encode(std::string_view text, std::vector<uint32_t>* out) const {
  if (sp) return encode_sentencepiece(text, out);
  if (!has_added(parse_special)) return encode_segment(text, true, out);
  // Added tokens are cut out first, as Hugging Face does: those matched in the raw text, then in
  // each piece between them, normalised, those matched in normalised text.
  const auto& m = added[parse_special];
  Status st = Status::ok();
  m[0].split(text, out, [&](std::string_view raw, size_t off) {
    if (!st.is_ok()) return;
    if (m[1].empty()) {
      st = encode_segment(raw, off == 0, out);
      return;
    }
    std::string norm(raw);
    if (normalizer) {
      st = normalizer->apply(raw, &norm);
      if (!st.is_ok()) return;
    }
    m[1].split(norm, out, [&](std::string_view piece, size_t off2) {
      if (st.is_ok()) st = encode_normalized(piece, off == 0 && off2 == 0, out);
    });
  });
  return st;
}

Status Tokenizer::Impl::encode_sentencepiece(std::string_view text,
                                             std::vector<uint32_t>* out) const {
  // With parse_special, the control pieces' text (<s>, </s>) become their ids, the library
  // encoding the text between them.
  if (!parse_special || added[1][0].empty()) return sentencepiece_encode(*sp, text, out);
  Status st = Status::ok();
  added[1][0].split(text, out, [&](std::string_view gap, size_t) {
    if (st.is_ok()) st = sentencepiece_encode(*sp, gap, out);
  });
  return st;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
int64_t Tokenizer::eos_id() const { return impl_->eos_id; }
const PretokenizerSpec& Tokenizer::pretokenizer() const { return impl_->pre; }
const std::string& Tokenizer::token_bytes(uint32_t id) const { return impl_->tokens.at(id); }
bool Tokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id]; }
size_t Tokenizer::num_merges() const { return impl_->model.merges().size(); }

int64_t Tokenizer::special_id(std::string_view text) const {
  for (size_t id = 0; id < impl_->tokens.size(); ++id)
    if (impl_->special[id] && impl_->tokens[id] == text) return int64_t(id);
  return -1;
}

Status Tokenizer::encode(std::string_view text, std::vector<uint32_t>* out) const {
  return impl_->encode(text, out);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (Status st = impl_->encode(text, &out); !st.is_ok())
    KILN_LOG_ERROR("tokenizer: {}", st.message());
  return out;
}

void Tokenizer::set_special_tokens(SpecialTokens mode) {
  impl_->parse_special = mode == SpecialTokens::kParse;
}

SpecialTokens Tokenizer::special_tokens() const {
  return impl_->parse_special ? SpecialTokens::kParse : SpecialTokens::kText;
}

Result<SpecialTokens> parse_special_tokens(std::string_view name) {
  if (name == "text") return SpecialTokens::kText;
  if (name == "parse") return SpecialTokens::kParse;
  return Status::usage("special tokens must be 'text' or 'parse', not '" + std::string(name) + "'");
}

std::vector<std::vector<uint32_t>> Tokenizer::encode_batch(
    const std::vector<std::string_view>& texts) const {
  std::vector<std::vector<uint32_t>> out(texts.size());
  const tsan::ForkJoin fork_join;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, texts.size()), fork_join.task([&](const auto& range) {
    for (size_t i = range.begin(); i != range.end(); ++i) out[i] = encode(texts[i]);
  }));
  fork_join.join();
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= impl_->tokens.size())
      return Status::data("token id " + std::to_string(ids[i]) + " at position " +
                          std::to_string(i) + " is out of range (vocabulary size " +
                          std::to_string(impl_->tokens.size()) + ")");
    out += impl_->tokens[ids[i]];
  }
  if (impl_->sp) return sentencepiece_decode(*impl_->sp, ids);
  if (impl_->char_level && impl_->decoder) {
    std::vector<std::string> pieces;
    pieces.reserve(ids.size());
    for (uint32_t id : ids) pieces.push_back(impl_->tokens[id]);
    return impl_->decoder->decode(std::move(pieces));
  }
  return out;
}

bool Tokenizer::round_trips() const {
  return !impl_->sp && !impl_->normalizer && !impl_->prefix_space && !impl_->char_level &&
         !impl_->pretokenizer;
}

const char* Tokenizer::kind() const {
  switch (impl_->source) {
    case TokenizerSource::kKiln:
      return "kiln";
    case TokenizerSource::kGpt2Pair:
      return "gpt2";
    case TokenizerSource::kHuggingFace:
      return "huggingface";
    case TokenizerSource::kSentencePiece:
      return "sentencepiece";
  }
  return "?";
}

// ---- training ----------------------------------------------------------------------------------

Result<Tokenizer> Tokenizer::train(const std::vector<std::string_view>& texts,
                                   const TokenizerTrainOptions& options) {
  const size_t num_special = options.special_tokens.size();
  std::unordered_set<std::string> seen;
  for (const auto& s : options.special_tokens) {
    if (s.empty() || !valid_utf8(s)) return Status::usage("special tokens must be non-empty UTF-8");
    if (!seen.insert(s).second) return Status::usage("special token '" + s + "' given twice");
  }
  if (options.vocab_size < num_special + 256)
    return Status::usage("vocabulary size " + std::to_string(options.vocab_size) +
                         " is below the " + std::to_string(num_special + 256) +
                         " special and byte tokens");
  if (options.vocab_size > (size_t(1) << 31)) return Status::usage("vocabulary size too large");

  // Words counted in parallel, in an order that does not depend on the thread count (nor does
  // training's result depend on the order).
  std::vector<WordCount> words = count_words(texts, options.pretokenizer);

  std::array<uint32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids[b] = uint32_t(num_special + b);
  const uint32_t first_merge = uint32_t(num_special + 256);
  BpeTrainResult trained =
      train_bpe(words, byte_ids, first_merge, options.vocab_size - first_merge,
                options.min_frequency);

  Tokenizer tok;
  Impl& impl = TokenizerAccess::impl(tok);
  impl.pre = options.pretokenizer;
  for (const auto& s : options.special_tokens) {
    impl.tokens.push_back(s);
    impl.special.push_back(1);
    impl.spelled.push_back(s);
  }
  for (int b = 0; b < 256; ++b) {
    impl.tokens.push_back(std::string(1, char(b)));
    impl.special.push_back(0);
    impl.spelled.push_back(byte_unicode().byte_to_utf8[b]);
  }
  for (auto& t : trained.tokens) {
    impl.spelled.push_back(bytes_to_gpt2_unicode(t));
    impl.tokens.push_back(std::move(t));
    impl.special.push_back(0);
  }
  impl.eos_id = num_special > 0 ? 0 : -1;
  impl.model = BpeModel(byte_ids, std::move(trained.merges));
  // Llama 3's pre-tokenizer goes with ignore_merges, as in its tokenizer.json and in llama.cpp
  // (which always applies it for "llama-bpe"): a word in the vocabulary is one token.
  if (pretokenizer_label(impl.pre) == "llama3") {
    impl.ignore_merges = true;
    impl.whole_words.reserve(impl.tokens.size());
    for (size_t id = num_special; id < impl.tokens.size(); ++id)
      impl.whole_words.emplace(impl.tokens[id], uint32_t(id));
  }
  return tok;
}

// ---- building from a vocabulary ----------------------------------------------------------------

Result<Tokenizer> build_byte_bpe(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::unordered_set<int64_t>& literal_ids,
                                 const std::unordered_set<int64_t>& special_ids, int64_t eos_id,
                                 PretokenizerSpec pre, const std::string& origin,
                                 const std::string& vocab_field, const std::string& merges_field) {
  const size_t n = vocab.size();
  if (n == 0) return Status::data("empty vocabulary").with_file(origin).with_key(vocab_field);
  if (n > (size_t(1) << 31))
    return Status::data("vocabulary too large").with_file(origin).with_key(vocab_field);
  Tokenizer tok;
  std::vector<std::string> spelled(n);
  std::vector<uint8_t> have(n, 0);
  std::unordered_map<std::string, uint32_t> spelled_to_id;
  for (const auto& [s, id] : vocab) {
    if (id < 0 || size_t(id) >= n)
      return Status::data("token '" + s + "' has id " + std::to_string(id) + " outside 0.." +
                          std::to_string(n - 1) + " (ids must be dense)")
          .with_file(origin)
          .with_key(vocab_field);
    if (have[id])
      return Status::data("id " + std::to_string(id) + " is used twice")
          .with_file(origin)
          .with_key(vocab_field);
    if (!spelled_to_id.emplace(s, uint32_t(id)).second)
      return Status::data("token '" + s + "' appears twice")
          .with_file(origin)
          .with_key(vocab_field);
    have[id] = 1;
    spelled[id] = s;
  }
  for (int64_t id : literal_ids)
    if (id < 0 || size_t(id) >= n)
      return Status::data("special token id " + std::to_string(id) + " is not in the vocabulary")
          .with_file(origin);
  if (eos_id >= 0 && !special_ids.count(eos_id))
    return Status::data("eos_id " + std::to_string(eos_id) + " is not a special token")
        .with_file(origin);

  auto* impl = &TokenizerAccess::impl(tok);
  impl->pre = pre;
  impl->eos_id = eos_id;
  impl->tokens.resize(n);
  impl->special.assign(n, 0);
  for (size_t id = 0; id < n; ++id) {
    if (literal_ids.count(int64_t(id))) {
      impl->special[id] = special_ids.count(int64_t(id)) ? 1 : 0;
      impl->tokens[id] = spelled[id];
      if (spelled[id].empty())
        return Status::data("empty token at id " + std::to_string(id))
            .with_file(origin)
            .with_key(vocab_field);
      continue;
    }
    auto bytes = gpt2_unicode_to_bytes(spelled[id]);
    if (!bytes.is_ok())
      return std::move(bytes).take_status().with_file(origin).with_key(vocab_field);
    if (bytes->empty())
      return Status::data("empty token at id " + std::to_string(id))
          .with_file(origin)
          .with_key(vocab_field);
    impl->tokens[id] = std::move(bytes).value();
  }
  std::array<uint32_t, 256> byte_ids;
  const auto& bu = byte_unicode();
  for (int b = 0; b < 256; ++b) {
    auto it = spelled_to_id.find(bu.byte_to_utf8[b]);
    if (it == spelled_to_id.end() || literal_ids.count(it->second))
      return Status::data("the vocabulary lacks the token for byte " + std::to_string(b))
          .with_file(origin)
          .with_key(vocab_field);
    byte_ids[b] = it->second;
  }
  std::vector<BpeMerge> model_merges;
  model_merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [l, r] = merges[rank];
    auto li = spelled_to_id.find(l), ri = spelled_to_id.find(r), xi = spelled_to_id.find(l + r);
    if (li == spelled_to_id.end() || ri == spelled_to_id.end() || xi == spelled_to_id.end() ||
        literal_ids.count(li->second) || literal_ids.count(ri->second) ||
        literal_ids.count(xi->second))
      return Status::data("merge " + std::to_string(rank) + " '" + l + " " + r +
                          "' uses or makes a token that is not in the vocabulary")
          .with_file(origin)
          .with_key(merges_field);
    model_merges.push_back({li->second, ri->second, xi->second});
  }
  impl->spelled = std::move(spelled);
  impl->model = BpeModel(byte_ids, std::move(model_merges));
  return tok;
}

// ---- JSON file ---------------------------------------------------------------------------------

std::string Tokenizer::to_kiln_v1_json() const {
  const Impl& m = *impl_;
  if (m.sp || m.pre.kind == PretokenizerKind::kRegex || m.normalizer || m.prefix_space ||
      m.ignore_merges || m.has_added(true) || m.pretokenizer || m.char_level)
    return {};
  std::string out;
  out.reserve(m.tokens.size() * 24);
  out += "{\"format\": \"";
  out += kTokenizerFormat;
  out += "\",\n \"type\": \"byte-bpe\",\n \"pretokenizer\": {\"type\": \"";
  out += pretokenizer_name(m.pre.kind);
  out += "\"";
  if (m.pre.kind == PretokenizerKind::kKiln)
    out += ", \"cjk_chunk\": " + std::to_string(m.pre.cjk_chunk);
  out += "},\n \"vocab_size\": " + std::to_string(m.tokens.size());
  out += ",\n \"eos_id\": " + std::to_string(m.eos_id);
  out += ",\n \"special_tokens\": {";
  bool first = true;
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    if (!m.special[id]) continue;
    out += first ? "" : ", ";
    first = false;
    out += json_string(m.tokens[id]) + ": " + std::to_string(id);
  }
  out += "},\n ";
  append_vocab_and_merges(out, *this, " ");
  out += "}\n";
  return out;
}

void append_vocab_and_merges(std::string& out, const Tokenizer& tok, std::string_view indent) {
  const auto& m = TokenizerAccess::impl(tok);
  const std::string entry = ",\n" + std::string(indent) + " ";
  out += "\"vocab\": {";
  for (size_t id = 0; id < m.spelled.size(); ++id) {
    out += id ? entry : entry.substr(1);
    out += json_string(m.spelled[id]) + ": " + std::to_string(id);
  }
  out += "},\n" + std::string(indent) + "\"merges\": [";
  const auto& merges = m.model.merges();
  for (size_t r = 0; r < merges.size(); ++r) {
    out += r ? entry : entry.substr(1);
    out += json_string(m.spelled[merges[r].left] + " " + m.spelled[merges[r].right]);
  }
  out += "]";
}

const char* Tokenizer::file_name() const {
  return impl_->sp ? "tokenizer.model" : "tokenizer.json";
}

Status Tokenizer::save(const std::string& path) const {
  return write_file_atomic(path, impl_->sp ? impl_->sp_model : to_json());
}

Status Tokenizer::save_gpt2(const std::string& vocab_json_path,
                            const std::string& merges_txt_path) const {
  const Impl& m = *impl_;
  if (m.sp) return Status::usage("a SentencePiece tokenizer has no vocab.json + merges.txt form");
  std::string vocab = "{";
  for (size_t id = 0; id < m.spelled.size(); ++id) {
    vocab += id ? ", " : "";
    vocab += json_string(m.spelled[id]) + ": " + std::to_string(id);
  }
  vocab += "}";
  std::string merges = "#version: 0.2\n";
  for (const auto& mg : m.model.merges())
    merges += m.spelled[mg.left] + " " + m.spelled[mg.right] + "\n";
  KILN_RETURN_IF_ERROR(write_file_atomic(vocab_json_path, vocab));
  return write_file_atomic(merges_txt_path, merges);
}

static Result<std::pair<std::string, std::string>> split_merge(const std::string& line, size_t rank,
                                                              const std::string& origin) {
  size_t sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string::npos)
    return Status::data("merge " + std::to_string(rank) + " '" + line +
                        "' is not two tokens separated by one space")
        .with_file(origin)
        .with_key("merges");
  return std::make_pair(line.substr(0, sp), line.substr(sp + 1));
}

Status check_limit(uint64_t count, uint64_t limit, const char* what, const char* knob,
                   const std::string& origin) {
  if (count <= limit) return Status::ok();
  return Status::data(std::string(what) + " has " + std::to_string(count) +
                      " entries, over the limit of " + std::to_string(limit) + " (" + knob + ")")
      .with_file(origin);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& origin,
                                       const TokenizerLimits& limits) {
  if (looks_like_hf_tokenizer_json(json_text))
    return load_hf_tokenizer_json(json_text, origin, limits);
  Result<nlohmann::json> parsed = parse_untrusted_json(json_text);
  if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(origin);
  nlohmann::json j = std::move(parsed).value();
  if (!j.is_object()) return Status::data("a tokenizer file must hold a JSON object").with_file(origin);
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  auto fmt = field("format");
  if (!fmt || !fmt->is_string() || fmt->get<std::string>() != kTokenizerFormat)
    return Status::data(std::string("expected \"format\": \"") + kTokenizerFormat + "\"")
        .with_file(origin)
        .with_key("format");
  auto type = field("type");
  if (!type || !type->is_string() || type->get<std::string>() != "byte-bpe")
    return Status::data("expected \"type\": \"byte-bpe\"").with_file(origin).with_key("type");
  PretokenizerSpec pre;
  auto pt = field("pretokenizer");
  if (!pt || !pt->is_object() || !pt->contains("type") || !(*pt)["type"].is_string())
    return Status::data("missing or malformed").with_file(origin).with_key("pretokenizer");
  auto kind = parse_pretokenizer_name((*pt)["type"].get<std::string>());
  if (!kind.is_ok()) return std::move(kind).take_status().with_file(origin).with_key("pretokenizer.type");
  pre.kind = *kind;
  if (pt->contains("cjk_chunk")) {
    const auto& c = (*pt)["cjk_chunk"];
    if (!c.is_number_unsigned() || c.get<uint64_t>() > 1024)
      return Status::data("must be an integer 0..1024").with_file(origin).with_key("pretokenizer.cjk_chunk");
    pre.cjk_chunk = c.get<uint32_t>();
  }
  auto vocab_j = field("vocab");
  if (!vocab_j || !vocab_j->is_object())
    return Status::data("missing or not an object").with_file(origin).with_key("vocab");
  KILN_RETURN_IF_ERROR(check_limit(vocab_j->size(), limits.max_vocab, "vocab", "max_vocab", origin));
  if (auto m = field("merges"); m && m->is_array()) {
    KILN_RETURN_IF_ERROR(check_limit(m->size(), limits.max_merges, "merges", "max_merges", origin));
  }
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(vocab_j->size());
  for (const auto& [k, v] : vocab_j->items()) {
    if (!v.is_number_integer())
      return Status::data("id of token '" + k + "' is not an integer").with_file(origin).with_key("vocab");
    vocab.emplace_back(k, v.get<int64_t>());
  }
  std::unordered_set<int64_t> special_ids;
  if (auto sp = field("special_tokens")) {
    if (!sp->is_object())
      return Status::data("must be an object").with_file(origin).with_key("special_tokens");
    for (const auto& [k, v] : sp->items()) {
      if (!v.is_number_integer())
        return Status::data("id of '" + k + "' is not an integer").with_file(origin).with_key("special_tokens");
      auto it = vocab_j->find(k);
      if (it == vocab_j->end() || !it->is_number_integer() || *it != v)
        return Status::data("special token '" + k + "' must be in vocab with the same id")
            .with_file(origin)
            .with_key("special_tokens");
      special_ids.insert(v.get<int64_t>());
    }
  }
  int64_t eos = -1;
  if (auto e = field("eos_id")) {
    if (!e->is_number_integer()) return Status::data("must be an integer").with_file(origin).with_key("eos_id");
    eos = e->get<int64_t>();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  auto merges_j = field("merges");
  if (!merges_j || !merges_j->is_array())
    return Status::data("missing or not an array").with_file(origin).with_key("merges");
  merges.reserve(merges_j->size());
  for (size_t r = 0; r < merges_j->size(); ++r) {
    const auto& mj = (*merges_j)[r];
    if (!mj.is_string()) return Status::data("merge " + std::to_string(r) + " is not a string").with_file(origin).with_key("merges");
    KILN_ASSIGN_OR_RETURN(auto pair, split_merge(mj.get<std::string>(), r, origin));
    merges.push_back(std::move(pair));
  }
  KILN_ASSIGN_OR_RETURN(Tokenizer tok, build_byte_bpe(vocab, merges, special_ids, special_ids, eos,
                                                      pre, origin, "vocab", "merges"));
  if (auto vs = field("vocab_size")) {
    if (!vs->is_number_unsigned() || vs->get<uint64_t>() != tok.vocab_size())
      return Status::data("vocab_size does not match the vocabulary (" +
                          std::to_string(tok.vocab_size()) + " tokens)")
          .with_file(origin)
          .with_key("vocab_size");
  }
  return tok;
}

Result<Tokenizer> Tokenizer::load_gpt2(const std::string& vocab_json_path,
                                       const std::string& merges_txt_path,
                                       const TokenizerLimits& limits) {
  KILN_ASSIGN_OR_RETURN(std::string vocab_text, read_file(vocab_json_path));
  KILN_ASSIGN_OR_RETURN(std::string merges_text, read_file(merges_txt_path));
  Result<nlohmann::json> parsed = parse_untrusted_json(vocab_text);
  if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(vocab_json_path);
  nlohmann::json j = std::move(parsed).value();
  if (!j.is_object())
    return Status::data("vocab.json must map token strings to ids").with_file(vocab_json_path);
  KILN_RETURN_IF_ERROR(check_limit(j.size(), limits.max_vocab, "vocab.json", "max_vocab", vocab_json_path));
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(j.size());
  for (const auto& [k, v] : j.items()) {
    if (!v.is_number_integer())
      return Status::data("id of token '" + k + "' is not an integer").with_file(vocab_json_path);
    vocab.emplace_back(k, v.get<int64_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  size_t pos = 0, line_no = 0;
  while (pos < merges_text.size()) {
    size_t end = merges_text.find('\n', pos);
    if (end == std::string::npos) end = merges_text.size();
    std::string line = merges_text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    if (merges.size() == limits.max_merges) {
      return check_limit(merges.size() + 1, limits.max_merges, "merges.txt", "max_merges",
                         merges_txt_path)
          .with_line(long(line_no));
    }
    auto pair = split_merge(line, merges.size(), merges_txt_path);
    if (!pair.is_ok()) return std::move(pair).take_status().with_line(long(line_no));
    merges.push_back(std::move(pair).value());
  }
  // Special tokens: entries that are neither a byte nor the result of a merge.
  std::unordered_set<std::string> producible;
  const auto& bu = byte_unicode();
  for (int b = 0; b < 256; ++b) producible.insert(bu.byte_to_utf8[b]);
  for (const auto& [l, r] : merges) producible.insert(l + r);
  std::unordered_set<int64_t> special_ids;
  int64_t eos = -1;
  for (const auto& [s, id] : vocab) {
    if (producible.count(s)) continue;
    special_ids.insert(id);
    if (s == kEndOfText) eos = id;
  }
  PretokenizerSpec pre;
  pre.kind = PretokenizerKind::kGpt2;
  KILN_ASSIGN_OR_RETURN(Tokenizer tok, build_byte_bpe(vocab, merges, special_ids, special_ids, eos,
                                                      pre, vocab_json_path, "vocab", "merges"));
  TokenizerAccess::impl(tok).source = TokenizerSource::kGpt2Pair;
  return tok;
}

Result<Tokenizer> Tokenizer::load(const std::string& path, const TokenizerLimits& limits) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  // A JSON object: a tokenizer.json, a Kiln file (names its format) or a GPT-2 vocab.json.
  // Anything else (a protobuf) is taken as a SentencePiece model.
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{')
    return from_sentencepiece(std::move(text), path, limits);
  if (looks_like_hf_tokenizer_json(text) || text.find(kTokenizerFormat) != std::string::npos)
    return from_json(text, path, limits);
  std::filesystem::path merges = std::filesystem::path(path).parent_path() / "merges.txt";
  if (!std::filesystem::exists(merges))
    return Status::data(std::string("neither a ") + kTokenizerFormat +
                        " file nor a vocab.json with merges.txt beside it")
        .with_file(path);
  return load_gpt2(path, merges.string(), limits);
}

}  // namespace kiln::prep
