// Hugging Face tokenizer.json in (the byte-level BPE family) and out (Kiln's own tokenizers),
// and the tokenizer files of a Hugging Face model directory. See docs/TOKENIZER.md.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/atomic_file.h"
#include "common/bounded_read.h"
#include "common/json.h"
#include "common/log.h"
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

// The pre-tokenizer: ByteLevel (GPT-2's regex), or Sequence [Split(regex, Isolated), ByteLevel
// without regex] (Llama 3, Qwen2, Mistral-Nemo, Kiln). Sets *prefix_space.
Result<PretokenizerSpec> read_pretokenizer(const Reader& r, const json& pt, bool* prefix_space) {
  const std::string type = Reader::type_of(pt);
  if (pt.is_null() || type.empty())
    return r.fail("pre_tokenizer",
                  "a byte-level BPE tokenizer.json needs a ByteLevel pre-tokenizer (found none)");
  auto byte_level_ok = [&](const json& bl, const std::string& field) -> Status {
    if (!is_null_or(bl, "trim_offsets", true) && !is_null_or(bl, "trim_offsets", false))
      return r.fail(field + ".trim_offsets", "must be true or false");
    return Status::ok();
  };
  if (type == "ByteLevel") {
    KILN_RETURN_IF_ERROR(byte_level_ok(pt, "pre_tokenizer"));
    if (!flag(pt, "use_regex", true))
      return r.fail("pre_tokenizer.use_regex",
                    "a ByteLevel pre-tokenizer without its regex and without a Split before it "
                    "makes the whole text one word; not supported");
    *prefix_space = flag(pt, "add_prefix_space", false);
    return pretokenizer_for_pattern(gpt2_pattern());
  }
  if (type != "Sequence")
    return r.fail("pre_tokenizer.type", "pre-tokenizer type '" + type +
                                            "' is not supported (supported: ByteLevel, Sequence of "
                                            "Split and ByteLevel)");
  auto list = pt.find("pretokenizers");
  if (list == pt.end() || !list->is_array())
    return r.fail("pre_tokenizer.pretokenizers", "missing or not an array");
  const json& items = *list;
  if (items.size() == 1 && Reader::type_of(items[0]) == "ByteLevel")
    return read_pretokenizer(r, items[0], prefix_space);
  if (items.size() != 2 || Reader::type_of(items[0]) != "Split" ||
      Reader::type_of(items[1]) != "ByteLevel")
    return r.fail("pre_tokenizer.pretokenizers",
                  "supported sequences are [Split, ByteLevel] and [ByteLevel]; found " +
                      std::to_string(items.size()) + " pre-tokenizers starting with '" +
                      (items.empty() ? std::string() : Reader::type_of(items[0])) + "'");
  const json& split = items[0];
  const json& bl = items[1];
  const std::string sf = "pre_tokenizer.pretokenizers[0]", bf = "pre_tokenizer.pretokenizers[1]";
  KILN_RETURN_IF_ERROR(byte_level_ok(bl, bf));
  if (flag(bl, "use_regex", true))
    return r.fail(bf + ".use_regex",
                  "a ByteLevel with its own regex after a Split is not supported (expected "
                  "use_regex: false)");
  if (flag(bl, "add_prefix_space", false))
    return r.fail(bf + ".add_prefix_space", "add_prefix_space after a Split is not supported");
  auto behavior = split.find("behavior");
  if (behavior == split.end() || !behavior->is_string() || *behavior != "Isolated")
    return r.fail(sf + ".behavior", "Split behavior '" +
                                        (behavior != split.end() ? behavior->dump() : "") +
                                        "' is not supported (supported: \"Isolated\")");
  if (flag(split, "invert", false)) return r.fail(sf + ".invert", "invert: true is not supported");
  auto pat = split.find("pattern");
  if (pat == split.end() || !pat->is_object() || pat->size() != 1)
    return r.fail(sf + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  std::string pattern;
  if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
    pattern = (*pat)["Regex"].get<std::string>();
  } else if (pat->contains("String") && (*pat)["String"].is_string()) {
    // A literal: every character escaped.
    for (char c : (*pat)["String"].get<std::string>()) {
      if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
      pattern += c;
    }
  } else {
    return r.fail(sf + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  if (pattern.empty()) return r.fail(sf + ".pattern", "empty pattern");
  auto spec = pretokenizer_for_pattern(pattern);
  if (!spec.is_ok())
    return std::move(spec).take_status().with_file(r.origin).with_key(sf + ".pattern");
  return spec;
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

  // The model: BPE on bytes.
  const std::string mtype = Reader::type_of(model);
  if (!mtype.empty() && mtype != "BPE")
    return r.fail("model.type",
                  "model type '" + mtype +
                      "' is not supported (Kiln reads byte-level BPE tokenizer.json files; for a "
                      "SentencePiece model give its .model file)");
  if (!model.contains("merges")) return r.fail("model.merges", "missing: not a BPE model");
  if (!is_null_or(model, "dropout", 0) && !is_null_or(model, "dropout", 0.0))
    return r.fail("model.dropout", "BPE dropout is not supported");
  if (!is_null_or(model, "continuing_subword_prefix", ""))
    return r.fail("model.continuing_subword_prefix", "a subword prefix is not supported");
  if (!is_null_or(model, "end_of_word_suffix", ""))
    return r.fail("model.end_of_word_suffix", "an end-of-word suffix is not supported");
  if (flag(model, "byte_fallback", false))
    return r.fail("model.byte_fallback",
                  "byte_fallback (SentencePiece-style BPE) is not supported; give the model's "
                  "SentencePiece tokenizer.model instead");
  const bool ignore_merges = flag(model, "ignore_merges", false);

  // Normalizer: none or NFC.
  bool nfc = false;
  if (auto n = root.find("normalizer"); n != root.end() && !n->is_null()) {
    std::string t = Reader::type_of(*n);
    const json* single = &*n;
    if (t == "Sequence" && n->contains("normalizers") && (*n)["normalizers"].is_array()) {
      const json& list = (*n)["normalizers"];
      if (list.size() > 1)
        return r.fail("normalizer.normalizers",
                      "a sequence of several normalizers is not supported");
      single = list.empty() ? nullptr : &list[0];
      t = single ? Reader::type_of(*single) : "";
    }
    if (single && t != "NFC")
      return r.fail("normalizer.type",
                    "normalizer '" + t + "' is not supported (supported: none, NFC)");
    nfc = single != nullptr;
  }

  // Pre-tokenizer.
  bool prefix_space = false;
  auto pt = root.find("pre_tokenizer");
  KILN_ASSIGN_OR_RETURN(PretokenizerSpec pre,
                        read_pretokenizer(r, pt == root.end() ? json() : *pt, &prefix_space));

  // Decoder: none or ByteLevel (ids decode to their bytes).
  if (auto d = root.find("decoder"); d != root.end() && !d->is_null()) {
    std::string t = Reader::type_of(*d);
    if (t != "ByteLevel")
      return r.fail("decoder.type", "decoder '" + t + "' is not supported (supported: ByteLevel)");
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

  // Added tokens: special ones are text of their own (never found in documents); the others are
  // found in the text before pre-tokenisation, as Hugging Face does.
  std::unordered_set<int64_t> literal_ids, special_ids;
  std::array<std::vector<InlineToken>, 2> inline_tokens;
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
      } else {  // normalized: Hugging Face's default is !special
        InlineToken t;
        t.id = uint32_t(id);
        t.lstrip = flag(a, "lstrip", false);
        t.rstrip = flag(a, "rstrip", false);
        t.single_word = flag(a, "single_word", false);
        const int pass = flag(a, "normalized", true) ? 1 : 0;
        t.text = content;
        inline_tokens[static_cast<size_t>(pass)].push_back(std::move(t));
      }
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

  KILN_ASSIGN_OR_RETURN(Tokenizer tok,
                        build_byte_bpe(vocab, merges, literal_ids, special_ids, eos, std::move(pre),
                                       origin, "model.vocab", "model.merges"));
  auto& impl = TokenizerAccess::impl(tok);
  impl.source = TokenizerSource::kHuggingFace;
  impl.hf_json = std::string(text);
  impl.nfc = nfc;
  impl.prefix_space = prefix_space;
  impl.ignore_merges = ignore_merges;
  if (ignore_merges) {
    impl.whole_words.reserve(impl.tokens.size());
    for (size_t id = 0; id < impl.tokens.size(); ++id)
      if (!literal_ids.count(int64_t(id))) impl.whole_words.emplace(impl.tokens[id], uint32_t(id));
  }
  // normalized tokens are matched as the normaliser writes them.
  if (nfc)
    for (auto& t : inline_tokens[1]) t.text = nfc_normalize(t.text);
  for (size_t pass = 0; pass < 2; ++pass) {
    impl.inline_tokens[pass] = std::move(inline_tokens[pass]);
    const auto& list = impl.inline_tokens[pass];
    auto& by_byte = impl.inline_by_byte[pass];
    for (uint32_t k = 0; k < list.size(); ++k)
      by_byte[static_cast<unsigned char>(list[k].text[0])].push_back(k);
    for (auto& l : by_byte)
      std::stable_sort(l.begin(), l.end(), [&](uint32_t a, uint32_t b) {
        return list[a].text.size() > list[b].text.size();
      });
  }
  if (!impl.inline_tokens[0].empty() || !impl.inline_tokens[1].empty()) {
    impl.has_inline = true;
  }
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
