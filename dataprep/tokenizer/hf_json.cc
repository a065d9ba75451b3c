// Hugging Face tokenizer.json in (the byte-level BPE family) and out (Kiln's own tokenizers),
// and the tokenizer files of a Hugging Face model directory. See docs/TOKENIZER.md.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/atomic_file.h"
#include "common/bounded_read.h"
#include "common/json.h"
#include "common/log.h"
#include "dataprep/tokenizer/charsmap.h"
#include "dataprep/tokenizer/hf_pipeline.h"
#include "dataprep/tokenizer/regex_split.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "dataprep/tokenizer/tokenizer_impl.h"

namespace kiln::prep {
namespace {

using nlohmann::json;

std::string json_string(std::string_view s) { return json(std::string(s)).dump(); }

// Names Hugging Face tokenizers give their end-of-text token, in order of preference, for a
// tokenizer.json without a tokenizer_config.json beside it.
constexpr const char* kEosNames[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};

struct Reader {
  const json& root;
  const std::string& origin;
  Status fail(const std::string& field, const std::string& msg) const {
    return Status::data(msg).with_file(origin).with_key(field);
  }
  // "type" of an object field, or "" when the field is null / absent.
  static std::string type_of(const json& j) {
    if (!j.is_object()) return "";
    auto it = j.find("type");
    return it != j.end() && it->is_string() ? it->get<std::string>() : "";
  }
};

bool is_null_or(const json& j, const char* key, const json& allowed) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || *it == allowed;
}

bool flag(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// The eos token's text from a tokenizer_config.json beside the file, or "".
std::string eos_from_config(const std::string& origin) {
  std::error_code ec;
  auto cfg = std::filesystem::path(origin).parent_path() / "tokenizer_config.json";
  if (origin.empty() || !std::filesystem::is_regular_file(cfg, ec)) return "";
  // (64 MiB: a tokenizer_config.json is a few KiB; one that is /dev/zero must not take memory)
  auto text = read_file_capped(cfg.string(), uint64_t{64} << 20);
  if (!text.is_ok()) {
    KILN_LOG_WARN("{}: not read ({}); the end-of-text token is taken from the tokenizer itself",
                  cfg.string(), text.status().message());
    return "";
  }
  auto parsed = parse_untrusted_json(*text);
  if (!parsed.is_ok() || !parsed->is_object()) {
    KILN_LOG_WARN("{}: not a JSON object; the end-of-text token is taken from the tokenizer itself",
                  cfg.string());
    return "";
  }
  auto it = parsed->find("eos_token");
  if (it == parsed->end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

bool base64_decode(std::string_view in, std::string* out);

Result<HfPattern> read_pattern(const Reader& r, const json& j, const std::string& field) {
  auto pat = j.find("pattern");
  if (pat == j.end() || !pat->is_object() || pat->size() != 1)
    return r.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  HfPattern p;
  if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
    const std::string re = (*pat)["Regex"].get<std::string>();
    if (re.empty()) return r.fail(field + ".pattern", "empty pattern");
    auto compiled = RegexSplitter::compile(re);
    if (!compiled.is_ok())
      return std::move(compiled).take_status().with_file(r.origin).with_key(field + ".pattern");
    p.regex = std::move(compiled).value();
  } else if (pat->contains("String") && (*pat)["String"].is_string()) {
    p.literal = (*pat)["String"].get<std::string>();
  } else {
    return r.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  return p;
}

Result<SplitBehavior> read_behavior(const Reader& r, const json& j, const std::string& field,
                                    SplitBehavior fallback) {
  auto it = j.find("behavior");
  if (it == j.end() || it->is_null()) return fallback;
  const std::string b = it->is_string() ? it->get<std::string>() : it->dump();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return r.fail(field + ".behavior", "Split behavior '" + b +
                                         "' is not one of Removed, Isolated, MergedWithPrevious, "
                                         "MergedWithNext, Contiguous");
}

std::string read_string(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Metaspace's prepend scheme (or the older add_prefix_space).
Result<PreTokenizerStep::Prepend> read_prepend(const Reader& r, const json& j,
                                               const std::string& field) {
  auto it = j.find("prepend_scheme");
  if (it != j.end() && it->is_string()) {
    const std::string v = it->get<std::string>();
    if (v == "always") return PreTokenizerStep::kAlways;
    if (v == "first") return PreTokenizerStep::kFirst;
    if (v == "never") return PreTokenizerStep::kNever;
    return r.fail(field + ".prepend_scheme", "'" + v + "' is not always, first or never");
  }
  return flag(j, "add_prefix_space", true) ? PreTokenizerStep::kAlways : PreTokenizerStep::kNever;
}

// The normalizer's steps (a Sequence flattened).
Status read_normalizer(const Reader& r, const json& n, const std::string& field,
                       HfNormalizer* out) {
  if (n.is_null()) return Status::ok();
  const std::string t = Reader::type_of(n);
  NormalizerStep step;
  if (t == "Sequence") {
    auto list = n.find("normalizers");
    if (list == n.end() || !list->is_array())
      return r.fail(field + ".normalizers", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      KILN_RETURN_IF_ERROR(
          read_normalizer(r, (*list)[i], field + ".normalizers[" + std::to_string(i) + "]", out));
    return Status::ok();
  }
  if (t == "NFC") {
    step.kind = NormalizerStep::kNfc;
  } else if (t == "NFD") {
    step.kind = NormalizerStep::kNfd;
  } else if (t == "NFKC") {
    step.kind = NormalizerStep::kNfkc;
  } else if (t == "NFKD") {
    step.kind = NormalizerStep::kNfkd;
  } else if (t == "Lowercase") {
    step.kind = NormalizerStep::kLowercase;
  } else if (t == "Replace") {
    step.kind = NormalizerStep::kReplace;
    KILN_ASSIGN_OR_RETURN(step.pattern, read_pattern(r, n, field));
    auto c = n.find("content");
    if (c == n.end() || !c->is_string())
      return r.fail(field + ".content", "missing or not a string");
    step.content = c->get<std::string>();
  } else if (t == "Prepend") {
    step.kind = NormalizerStep::kPrepend;
    auto c = n.find("prepend");
    if (c == n.end() || !c->is_string())
      return r.fail(field + ".prepend", "missing or not a string");
    step.content = c->get<std::string>();
  } else if (t == "Strip") {
    step.kind = NormalizerStep::kStrip;
    step.left = flag(n, "strip_left", true);
    step.right = flag(n, "strip_right", true);
  } else if (t == "Precompiled") {
    step.kind = NormalizerStep::kPrecompiled;
    auto c = n.find("precompiled_charsmap");
    if (c == n.end() || c->is_null()) return Status::ok();  // (an empty map changes nothing)
    if (!c->is_string()) return r.fail(field + ".precompiled_charsmap", "not a base64 string");
    std::string blob;
    if (!base64_decode(c->get<std::string>(), &blob))
      return r.fail(field + ".precompiled_charsmap", "not valid base64");
    if (blob.empty()) return Status::ok();
    auto map = PrecompiledCharsmap::parse(blob);
    if (!map.is_ok())
      return std::move(map).take_status().with_file(r.origin).with_key(field +
                                                                       ".precompiled_charsmap");
    step.charsmap = std::move(map).value();
  } else {
    return r.fail(field + ".type",
                  "normalizer '" + t +
                      "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
                      "Prepend, Strip, Precompiled, Sequence)");
  }
  out->steps.push_back(std::move(step));
  return Status::ok();
}

Status read_pretokenizer(const Reader& r, const json& p, const std::string& field,
                         HfPreTokenizer* out) {
  if (p.is_null()) return Status::ok();
  const std::string t = Reader::type_of(p);
  if (!out->steps.empty() && out->steps.back().kind == PreTokenizerStep::kByteLevel)
    return r.fail(field + ".type",
                  "a pre-tokenizer after ByteLevel is not supported (ByteLevel must be last)");
  PreTokenizerStep step;
  if (t == "Sequence") {
    auto list = p.find("pretokenizers");
    if (list == p.end() || !list->is_array())
      return r.fail(field + ".pretokenizers", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      KILN_RETURN_IF_ERROR(read_pretokenizer(
          r, (*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", out));
    return Status::ok();
  }
  if (t == "Split") {
    step.kind = PreTokenizerStep::kSplit;
    KILN_ASSIGN_OR_RETURN(step.pattern, read_pattern(r, p, field));
    KILN_ASSIGN_OR_RETURN(step.behavior, read_behavior(r, p, field, SplitBehavior::kIsolated));
    step.invert = flag(p, "invert", false);
  } else if (t == "Digits") {
    step.kind = PreTokenizerStep::kDigits;
    step.individual_digits = flag(p, "individual_digits", false);
  } else if (t == "Punctuation") {
    step.kind = PreTokenizerStep::kPunctuation;
    KILN_ASSIGN_OR_RETURN(step.behavior, read_behavior(r, p, field, SplitBehavior::kIsolated));
  } else if (t == "Whitespace") {
    step.kind = PreTokenizerStep::kWhitespace;
    auto re = RegexSplitter::compile("\\w+|[^\\w\\s]+");
    if (!re.is_ok()) return std::move(re).take_status();
    step.pattern.regex = std::move(re).value();
  } else if (t == "WhitespaceSplit") {
    step.kind = PreTokenizerStep::kWhitespaceSplit;
  } else if (t == "Metaspace") {
    step.kind = PreTokenizerStep::kMetaspace;
    step.replacement = read_string(p, "replacement", "\xE2\x96\x81");
    if (step.replacement.empty()) return r.fail(field + ".replacement", "empty");
    KILN_ASSIGN_OR_RETURN(step.prepend, read_prepend(r, p, field));
    step.split = flag(p, "split", true);
  } else if (t == "ByteLevel") {
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = flag(p, "add_prefix_space", false);
    step.use_regex = flag(p, "use_regex", true);
  } else {
    return r.fail(field + ".type",
                  "pre-tokenizer '" + t +
                      "' is not supported (supported: Split, Digits, Punctuation, Whitespace, "
                      "WhitespaceSplit, Metaspace, ByteLevel, Sequence)");
  }
  out->steps.push_back(std::move(step));
  return Status::ok();
}

Status read_decoder(const Reader& r, const json& d, const std::string& field, HfDecoder* out) {
  if (d.is_null()) return Status::ok();
  const std::string t = Reader::type_of(d);
  DecoderStep step;
  if (t == "Sequence") {
    auto list = d.find("decoders");
    if (list == d.end() || !list->is_array())
      return r.fail(field + ".decoders", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      KILN_RETURN_IF_ERROR(
          read_decoder(r, (*list)[i], field + ".decoders[" + std::to_string(i) + "]", out));
    return Status::ok();
  }
  if (t == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (t == "Replace") {
    step.kind = DecoderStep::kReplace;
    auto pat = d.find("pattern");
    if (pat == d.end() || !pat->is_object() || !pat->contains("String") ||
        !(*pat)["String"].is_string())
      return r.fail(field + ".pattern", "a Replace decoder needs {\"String\": ...}");
    step.pattern = (*pat)["String"].get<std::string>();
    step.content = read_string(d, "content", "");
  } else if (t == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (t == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (t == "Strip") {
    step.kind = DecoderStep::kStrip;
    step.content = read_string(d, "content", " ");
    auto num = [&](const char* key) -> size_t {
      auto it = d.find(key);
      return it != d.end() && it->is_number_unsigned() ? it->get<size_t>() : 0;
    };
    step.start = num("start");
    step.stop = num("stop");
  } else if (t == "Metaspace") {
    step.kind = DecoderStep::kMetaspace;
    step.replacement = read_string(d, "replacement", "\xE2\x96\x81");
    KILN_ASSIGN_OR_RETURN(auto prepend, read_prepend(r, d, field));
    step.prepend = prepend != PreTokenizerStep::kNever;
  } else {
    return r.fail(field + ".type", "decoder '" + t +
                                       "' is not supported (supported: ByteLevel, Replace, "
                                       "ByteFallback, Fuse, Strip, Metaspace, Sequence)");
  }
  out->steps.push_back(std::move(step));
  return Status::ok();
}

bool base64_decode(std::string_view in, std::string* out) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r') continue;
    int v = val(c);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  return true;
}

// SentencePiece-style BPE: tokens are literal text; a merge's result is left + right (right
// without the continuing-subword prefix).
Result<Tokenizer> build_char_bpe(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::unordered_set<int64_t>& special_ids, int64_t eos_id,
                                 const std::string& prefix, const std::string& origin) {
  Tokenizer tok;
  auto& impl = TokenizerAccess::impl(tok);
  const size_t n = vocab.size();
  std::vector<std::string> spelled(n);
  std::vector<uint8_t> set(n, 0);
  std::unordered_map<std::string, uint32_t> ids;
  ids.reserve(n);
  for (const auto& [text, id] : vocab) {
    if (id < 0 || size_t(id) >= n)
      return Status::data("token '" + text + "' has id " + std::to_string(id) +
                          ": ids must be dense, 0 .. " + std::to_string(n - 1))
          .with_file(origin)
          .with_key("model.vocab");
    if (set[size_t(id)])
      return Status::data("id " + std::to_string(id) + " is used twice")
          .with_file(origin)
          .with_key("model.vocab");
    set[size_t(id)] = 1;
    spelled[size_t(id)] = text;
    ids.emplace(text, uint32_t(id));
  }
  std::vector<BpeMerge> model_merges;
  model_merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [l, rr] = merges[rank];
    std::string result =
        l + (!prefix.empty() && rr.compare(0, prefix.size(), prefix) == 0 ? rr.substr(prefix.size())
                                                                          : rr);
    auto li = ids.find(l), ri = ids.find(rr), xi = ids.find(result);
    if (li == ids.end() || ri == ids.end() || xi == ids.end())
      return Status::data("merge " + std::to_string(rank) + " '" + l + " " + rr +
                          "' uses or makes a token that is not in the vocabulary")
          .with_file(origin)
          .with_key("model.merges");
    model_merges.push_back({li->second, ri->second, xi->second});
  }
  if (eos_id >= 0 && !special_ids.count(eos_id))
    return Status::data("eos_id " + std::to_string(eos_id) + " is not a special token")
        .with_file(origin);
  impl.eos_id = eos_id;
  impl.tokens = spelled;
  impl.special.assign(n, 0);
  for (int64_t id : special_ids)
    if (id >= 0 && size_t(id) < n) impl.special[size_t(id)] = 1;
  impl.spelled = std::move(spelled);
  std::array<uint32_t, 256> no_bytes{};
  impl.model = BpeModel(no_bytes, std::move(model_merges));
  return tok;
}

}  // namespace

bool looks_like_hf_tokenizer_json(std::string_view text) {
  // A top-level "model": { ... } (a GPT-2 vocab.json maps "model" to a number).
  for (size_t at = text.find("\"model\""); at != std::string_view::npos;
       at = text.find("\"model\"", at + 1)) {
    size_t k = text.find_first_not_of(" \t\r\n", at + 7);
    if (k == std::string_view::npos || text[k] != ':') continue;
    k = text.find_first_not_of(" \t\r\n", k + 1);
    if (k != std::string_view::npos && text[k] == '{') return true;
  }
  return false;
}

Result<Tokenizer> load_hf_tokenizer_json(std::string_view text, const std::string& origin,
                                         const TokenizerLimits& limits) {
  Result<json> parsed = parse_untrusted_json(text);
  if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(origin);
  const json root = std::move(parsed).value();
  Reader r{root, origin};
  if (!root.is_object())
    return Status::data("a tokenizer.json must hold a JSON object").with_file(origin);
  auto mit = root.find("model");
  if (mit == root.end() || !mit->is_object()) return r.fail("model", "missing or not an object");
  const json& model = *mit;

  // The model: BPE.
  const std::string mtype = Reader::type_of(model);
  if (!mtype.empty() && mtype != "BPE")
    return r.fail("model.type",
                  "model type '" + mtype +
                      "' is not supported (Kiln reads BPE tokenizer.json files; for a "
                      "SentencePiece Unigram model give its .model file)");
  if (!model.contains("merges")) return r.fail("model.merges", "missing: not a BPE model");
  if (!is_null_or(model, "dropout", 0) && !is_null_or(model, "dropout", 0.0))
    return r.fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  const bool ignore_merges = flag(model, "ignore_merges", false);
  const bool byte_fallback = flag(model, "byte_fallback", false);
  const bool fuse_unk = flag(model, "fuse_unk", false);
  const std::string subword_prefix = read_string(model, "continuing_subword_prefix", "");
  const std::string word_suffix = read_string(model, "end_of_word_suffix", "");
  const std::string unk_token = read_string(model, "unk_token", "");

  auto normalizer = std::make_shared<HfNormalizer>();
  if (auto n = root.find("normalizer"); n != root.end())
    KILN_RETURN_IF_ERROR(read_normalizer(r, *n, "normalizer", normalizer.get()));
  auto pretok = std::make_shared<HfPreTokenizer>();
  if (auto pt = root.find("pre_tokenizer"); pt != root.end())
    KILN_RETURN_IF_ERROR(read_pretokenizer(r, *pt, "pre_tokenizer", pretok.get()));
  auto decoder = std::make_shared<HfDecoder>();
  if (auto d = root.find("decoder"); d != root.end())
    KILN_RETURN_IF_ERROR(read_decoder(r, *d, "decoder", decoder.get()));

  // Byte-level BPE (GPT-2's family: a ByteLevel pre-tokenizer, tokens spelled in GPT-2's byte
  // alphabet), else SentencePiece-style BPE over characters (Llama 2, Gemma).
  const bool byte_level =
      !pretok->steps.empty() && pretok->steps.back().kind == PreTokenizerStep::kByteLevel;
  if (byte_level && (!subword_prefix.empty() || !word_suffix.empty()))
    return r.fail(
        subword_prefix.empty() ? "model.end_of_word_suffix" : "model.continuing_subword_prefix",
        "a subword prefix or word suffix with byte-level BPE is not supported");
  // The fast path: ByteLevel alone, or one Split (Isolated) before a ByteLevel without regex.
  PretokenizerSpec pre;
  bool prefix_space = false, fast = false;
  const auto& steps = pretok->steps;
  if (steps.size() == 1 && byte_level && steps[0].use_regex) {
    KILN_ASSIGN_OR_RETURN(pre, pretokenizer_for_pattern(gpt2_pattern()));
    prefix_space = steps[0].add_prefix_space;
    fast = true;
  } else if (steps.size() == 2 && byte_level && !steps[1].use_regex && !steps[1].add_prefix_space &&
             steps[0].kind == PreTokenizerStep::kSplit && steps[0].pattern.regex &&
             steps[0].behavior == SplitBehavior::kIsolated && !steps[0].invert) {
    auto spec = pretokenizer_for_pattern(steps[0].pattern.regex->pattern());
    if (!spec.is_ok())
      return std::move(spec).take_status().with_file(origin).with_key(
          "pre_tokenizer.pretokenizers[0].pattern");
    pre = std::move(spec).value();
    fast = true;
  } else if (steps.size() == 1 && byte_level && !steps[0].use_regex) {
    // ByteLevel without a regex: the whole segment is one word. (Also the general path.)
  }

  // Vocabulary and merges.
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object())
    return r.fail("model.vocab", "missing or not an object");
  KILN_RETURN_IF_ERROR(
      check_limit(vit->size(), limits.max_vocab, "model.vocab", "max_vocab", origin));
  const json& mj = model["merges"];
  if (!mj.is_array()) return r.fail("model.merges", "not an array");
  KILN_RETURN_IF_ERROR(
      check_limit(mj.size(), limits.max_merges, "model.merges", "max_merges", origin));
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(vit->size() + 512);
  std::unordered_map<std::string, int64_t> vocab_ids;
  vocab_ids.reserve(vit->size());
  for (const auto& [k, v] : vit->items()) {
    if (!v.is_number_integer())
      return r.fail("model.vocab", "id of token '" + k + "' is not an integer");
    vocab.emplace_back(k, v.get<int64_t>());
    vocab_ids.emplace(k, v.get<int64_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(mj.size());
  for (size_t i = 0; i < mj.size(); ++i) {
    const json& m = mj[i];
    if (m.is_string()) {  // "left right"
      const std::string& line = m.get_ref<const std::string&>();
      size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        return r.fail("model.merges", "merge " + std::to_string(i) + " '" + line +
                                          "' is not two tokens separated by one space");
      merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string() &&
               !m[0].get_ref<const std::string&>().empty() &&
               !m[1].get_ref<const std::string&>().empty()) {  // ["left", "right"]
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return r.fail("model.merges", "merge " + std::to_string(i) +
                                        " is neither \"left right\" nor [\"left\", \"right\"]");
    }
  }

  // Added tokens: found in the text before pre-tokenisation, as Hugging Face does; the special
  // ones only when the special tokens are parsed (Tokenizer::set_special_tokens).
  std::unordered_set<int64_t> literal_ids, special_ids;
  std::array<std::array<std::vector<AddedToken>, 2>, 2> added;  // [parse][pass]
  std::unordered_map<std::string, int64_t> special_by_text;
  if (auto at = root.find("added_tokens"); at != root.end() && !at->is_null()) {
    if (!at->is_array()) return r.fail("added_tokens", "not an array");
    std::unordered_map<int64_t, std::string> added_ids;
    for (size_t i = 0; i < at->size(); ++i) {
      const json& a = (*at)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get_ref<const std::string&>().empty())
        return r.fail(field, "needs an integer \"id\" and a non-empty \"content\"");
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      const bool special = flag(a, "special", false);
      if (auto [it, fresh] = added_ids.emplace(id, content); !fresh)
        return r.fail(field + ".id", "id " + std::to_string(id) + " is used twice");
      auto in_vocab = vocab_ids.find(content);
      if (in_vocab != vocab_ids.end() && in_vocab->second != id)
        return r.fail(field, "'" + content + "' has id " + std::to_string(id) +
                                 " but the model's vocabulary gives it " +
                                 std::to_string(in_vocab->second));
      if (in_vocab == vocab_ids.end()) {
        vocab.emplace_back(content, id);
        vocab_ids.emplace(content, id);
        literal_ids.insert(id);
      } else if (special) {
        literal_ids.insert(id);
      }
      if (special) {
        special_ids.insert(id);
        special_by_text.emplace(content, id);
      }
      AddedToken t;
      t.id = uint32_t(id);
      t.lstrip = flag(a, "lstrip", false);
      t.rstrip = flag(a, "rstrip", false);
      t.single_word = flag(a, "single_word", false);
      t.text = content;
      const size_t pass = flag(a, "normalized", !special) ? 1 : 0;
      // normalized tokens are matched as the normaliser writes them.
      if (pass == 1 && !normalizer->steps.empty()) {
        KILN_RETURN_IF_ERROR(normalizer->apply(content, &t.text));
        if (t.text.empty()) continue;
      }
      if (!special) added[0][pass].push_back(t);
      added[1][pass].push_back(std::move(t));
    }
  }
  for (int64_t id : special_ids) literal_ids.insert(id);

  // The end of text: tokenizer_config.json's eos_token when it is beside the file, else a
  // special token with a usual name.
  int64_t eos = -1;
  std::string eos_text = eos_from_config(origin);
  if (auto it = special_by_text.find(eos_text); !eos_text.empty() && it != special_by_text.end())
    eos = it->second;
  for (const char* name : kEosNames) {
    if (eos >= 0) break;
    if (auto it = special_by_text.find(name); it != special_by_text.end()) eos = it->second;
  }

  // Hugging Face allows ids with gaps (GPT-4o: 200,000 tokens, then specials at 199,999 and
  // 200,018): each unused id gets a placeholder that no text makes and that decodes to nothing.
  std::vector<int64_t> gaps;
  {
    int64_t max_id = -1;
    for (const auto& [t, id] : vocab) max_id = std::max(max_id, id);
    if (max_id >= 0 && uint64_t(max_id) + 1 > vocab.size() && uint64_t(max_id) < limits.max_vocab) {
      std::vector<uint8_t> used(size_t(max_id) + 1, 0);
      for (const auto& [t, id] : vocab)
        if (id >= 0) used[size_t(id)] = 1;
      for (int64_t id = 0; id <= max_id; ++id)
        if (!used[size_t(id)]) {
          gaps.push_back(id);
          vocab.emplace_back("\xFF\xFE<unused " + std::to_string(id) + ">", id);
          literal_ids.insert(id);
          special_ids.insert(id);
        }
    }
  }
  Tokenizer tok;
  if (byte_level) {
    KILN_ASSIGN_OR_RETURN(
        tok, build_byte_bpe(vocab, merges, literal_ids, special_ids, eos, std::move(pre), origin,
                            "model.vocab", "model.merges"));
  } else {
    KILN_ASSIGN_OR_RETURN(tok,
                          build_char_bpe(vocab, merges, special_ids, eos, subword_prefix, origin));
  }
  auto& impl = TokenizerAccess::impl(tok);
  for (int64_t id : gaps) impl.tokens[size_t(id)].clear();
  impl.source = TokenizerSource::kHuggingFace;
  impl.hf_json = std::string(text);
  if (!normalizer->steps.empty()) impl.normalizer = std::move(normalizer);
  if (!fast) impl.pretokenizer = std::move(pretok);
  if (!decoder->steps.empty()) impl.decoder = std::move(decoder);
  impl.prefix_space = prefix_space;
  impl.ignore_merges = ignore_merges;
  impl.char_level = !byte_level;
  impl.byte_fallback = byte_fallback;
  impl.fuse_unk = fuse_unk;
  impl.subword_prefix = subword_prefix;
  impl.word_suffix = word_suffix;
  if (ignore_merges || !byte_level) {
    impl.whole_words.reserve(impl.tokens.size());
    for (size_t id = 0; id < impl.tokens.size(); ++id)
      if (!literal_ids.count(int64_t(id)) || !byte_level)
        impl.whole_words.emplace(impl.tokens[id], uint32_t(id));
  }
  if (!unk_token.empty()) {
    auto it = vocab_ids.find(unk_token);
    if (it == vocab_ids.end())
      return r.fail("model.unk_token", "'" + unk_token + "' is not in the vocabulary");
    impl.unk_id = it->second;
  }
  impl.fallback_ids.fill(-1);
  if (!byte_level)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto it = vocab_ids.find(name); it != vocab_ids.end()) impl.fallback_ids[b] = it->second;
    }
  for (size_t parse = 0; parse < 2; ++parse)
    for (size_t pass = 0; pass < 2; ++pass)
      impl.added[parse][pass] = AddedMatcher(std::move(added[parse][pass]));
  return tok;
}

// ---- writing ----------------------------------------------------------------------------------

std::string Tokenizer::to_json() const {
  const Impl& m = *impl_;
  if (m.source == TokenizerSource::kHuggingFace) return m.hf_json;
  if (m.sp) return {};
  std::string out;
  out.reserve(m.tokens.size() * 24);
  out +=
      "{\"version\": \"1.0\",\n \"truncation\": null,\n \"padding\": null,\n \"added_tokens\": [";
  bool first = true;
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    if (!m.special[id]) continue;
    out += first ? "\n  " : ",\n  ";
    first = false;
    out += "{\"id\": " + std::to_string(id) + ", \"content\": " + json_string(m.tokens[id]) +
           ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
           "\"special\": true}";
  }
  out += "],\n \"normalizer\": null,\n \"pre_tokenizer\": ";
  const std::string byte_level =
      "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
      "\"use_regex\": ";
  if (m.pre.kind == PretokenizerKind::kGpt2) {
    out += byte_level + "true}";
  } else {
    out +=
        "{\"type\": \"Sequence\", \"pretokenizers\": [\n  {\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": " +
        json_string(pretokenizer_pattern(m.pre)) +
        "}, \"behavior\": \"Isolated\", \"invert\": false},\n  " + byte_level + "false}]}";
  }
  out +=
      ",\n \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
      "\"trim_offsets\": false, \"use_regex\": true},\n \"decoder\": {\"type\": \"ByteLevel\", "
      "\"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n \"model\": "
      "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": "
      "null, \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false,\n  ";
  if (m.ignore_merges) out += "\"ignore_merges\": true,\n  ";
  append_vocab_and_merges(out, *this, "  ");
  out += "}}\n";
  return out;
}

std::string hf_tokenizer_config_json(const Tokenizer& tok, const HfTokenizerConfig& config) {
  const auto& m = TokenizerAccess::impl(tok);
  json j = json::object();
  auto piece = [&](int64_t id) { return m.tokens.at(size_t(id)); };
  if (m.sp) {
    j["tokenizer_class"] = "LlamaTokenizer";
    for (auto [key, id] : {std::pair<const char*, int64_t>{"bos_token", tok.special_id("<s>")},
                           {"eos_token", m.eos_id},
                           {"unk_token", tok.special_id("<unk>")}})
      if (id >= 0) j[key] = piece(id);
    j["legacy"] = true;
  } else {
    j["tokenizer_class"] = "PreTrainedTokenizerFast";
    if (m.eos_id >= 0) {
      j["bos_token"] = piece(m.eos_id);  // as GPT-2: one token begins and ends texts
      j["eos_token"] = piece(m.eos_id);
    }
  }
  // Kiln's data holds no BOS / EOS inside documents: nothing is added when encoding.
  j["add_bos_token"] = false;
  j["add_eos_token"] = false;
  j["clean_up_tokenization_spaces"] = false;
  if (config.model_max_length) j["model_max_length"] = config.model_max_length;
  return j.dump(2) + "\n";
}

Status write_hf_tokenizer(const Tokenizer& tok, const std::string& dir,
                          const HfTokenizerConfig& config) {
  KILN_RETURN_IF_ERROR(tok.save((std::filesystem::path(dir) / tok.file_name()).string()));
  return write_file_atomic((std::filesystem::path(dir) / "tokenizer_config.json").string(),
                           hf_tokenizer_config_json(tok, config));
}

}  // namespace kiln::prep
