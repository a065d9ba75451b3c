#include "dataprep/ingest/doc_parser.h"

#include <simdjson.h>

#include <cstdlib>
#include <cstring>

#include "common/json.h"
#include "dataprep/chat/chat_data.h"
#include "dataprep/chat/chat_template.h"

namespace kiln::prep {
namespace {

bool is_blank(std::string_view s) {
  for (char c : s)
    if (!(c == ' ' || (c >= 0x09 && c <= 0x0d))) return false;
  return true;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads \uXXXX at s[i] (s[i] == '\\'); -1 when it is not one.
int read_u_escape(std::string_view s, size_t i) {
  if (i + 6 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return -1;
  int v = 0;
  for (size_t k = 2; k < 6; ++k) {
    int h = hexval(s[i + k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

// Replaces unpaired surrogate escapes with \ufffd. Returns true when it changed anything.
bool repair_surrogate_escapes(std::string_view in, std::string* out) {
  out->clear();
  bool changed = false;
  size_t i = 0;
  while (i < in.size()) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out->push_back(in[i++]);
      continue;
    }
    if (in[i + 1] != 'u') {  // any other escape: copy both characters
      out->append(in.substr(i, 2));
      i += 2;
      continue;
    }
    int v = read_u_escape(in, i);
    if (v < 0) {
      out->append(in.substr(i, 2));
      i += 2;
      continue;
    }
    if (v >= 0xD800 && v <= 0xDBFF) {
      int lo = read_u_escape(in, i + 6);
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        out->append(in.substr(i, 12));
        i += 12;
        continue;
      }
      out->append("\\ufffd");
      changed = true;
      i += 6;
      continue;
    }
    if (v >= 0xDC00 && v <= 0xDFFF) {
      out->append("\\ufffd");
      changed = true;
      i += 6;
      continue;
    }
    out->append(in.substr(i, 6));
    i += 6;
  }
  return changed;
}

struct ThreadParser {
  ThreadParser() {
    // The nesting cap every Kiln JSON reader keeps (common/json.h); simdjson's default is 1024.
    if (parser.allocate(4096, kMaxJsonDepth) != simdjson::SUCCESS) std::abort();
  }
  simdjson::dom::parser parser;
  std::string padded;
  std::string repaired;
  std::string repaired2;
};

ThreadParser& thread_parser() {
  thread_local ThreadParser tp;
  return tp;
}

simdjson::error_code parse_padded(ThreadParser& tp, std::string_view line,
                                  simdjson::dom::element* root, bool in_place = false) {
  if (in_place) return tp.parser.parse(line.data(), line.size(), false).get(*root);
  tp.padded.resize(line.size() + simdjson::SIMDJSON_PADDING);
  std::memcpy(tp.padded.data(), line.data(), line.size());
  std::memset(tp.padded.data() + line.size(), 0, simdjson::SIMDJSON_PADDING);
  return tp.parser.parse(tp.padded.data(), line.size(), false).get(*root);
}

ParseResult reject(RejectReason r, std::string detail) {
  ParseResult res;
  res.ok = false;
  res.reason = r;
  res.detail = std::move(detail);
  return res;
}

// simdjson element -> nlohmann::json (for carried fields; rare and small).
nlohmann::json to_nlohmann(simdjson::dom::element e) {
  std::string text = simdjson::minify(e);
  return nlohmann::json::parse(text, nullptr, false);
}

// A string-or-null field; false (bad field) for other types.
bool string_field(simdjson::dom::element e, std::string* out) {
  if (e.is_null()) {
    out->clear();
    return true;
  }
  std::string_view sv;
  if (e.get_string().get(sv) != simdjson::SUCCESS) return false;
  out->assign(sv);
  return true;
}

}  // namespace

const char* reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::kInvalidJson: return "invalid_json";
    case RejectReason::kNotObject: return "not_object";
    case RejectReason::kMissingText: return "missing_text";
    case RejectReason::kTextNotString: return "text_not_string";
    case RejectReason::kInvalidUtf8: return "invalid_utf8";
    case RejectReason::kEmptyText: return "empty_text";
    case RejectReason::kTooLong: return "too_long";
    case RejectReason::kBadField: return "bad_field";
    case RejectReason::kTruncatedFile: return "truncated_file";
    case RejectReason::kCorruptFile: return "corrupt_file";
    case RejectReason::kChatEmpty:
      return "chat_empty";
    case RejectReason::kChatUnknownRole:
      return "chat_unknown_role";
    case RejectReason::kChatContentNotString:
      return "chat_content_not_string";
    case RejectReason::kChatNoAssistant:
      return "chat_no_assistant";
    case RejectReason::kChatMalformed:
      return "chat_malformed";
    case RejectReason::kChatTemplate:
      return "chat_template_error";
  }
  return "unknown";
}

bool is_valid_utf8(std::string_view in) { return simdjson::validate_utf8(in.data(), in.size()); }

bool repair_utf8(std::string_view in, std::string* out) {
  if (is_valid_utf8(in)) return false;
  out->clear();
  out->reserve(in.size() + 16);
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  static const char kReplacement[] = "\xEF\xBF\xBD";
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out->append(kReplacement, 3);
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k <= need && i + k < n; ++k) {
      unsigned char b = s[i + k];
      unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
    }
    if (k == need + 1) {
      out->append(in.substr(i, need + 1));
      i += need + 1;
    } else {  // maximal subpart [i, i+k) is invalid: one replacement character
      out->append(kReplacement, 3);
      i += k;
    }
  }
  return true;
}

namespace {

// A chat line: the conversation validated, rendered with the template into doc->text, and the
// assistant turns' byte ranges into doc->chat_spans.
ParseResult parse_chat(const simdjson::dom::element* fields, const bool* have,
                       const std::string& id_base, uint64_t line_no, bool have_id,
                       const ParseOptions& options, Document* doc, ParseResult result) {
  static constexpr const char* kChatKeys[4] = {"messages", "prompt", "completion", "tools"};
  nlohmann::ordered_json line = nlohmann::ordered_json::object();
  for (int k = 0; k < 4; ++k) {
    if (!have[k]) continue;
    doc->carried.erase(kChatKeys[k]);  // the conversation is the sample's text, not metadata
    line[kChatKeys[k]] = nlohmann::ordered_json::parse(simdjson::to_string(fields[k]));
  }
  chat::Conversation conv = chat::read_conversation(line);
  switch (conv.problem) {
    case chat::ChatProblem::kNone:
      break;
    case chat::ChatProblem::kEmpty:
      return reject(RejectReason::kChatEmpty, conv.detail);
    case chat::ChatProblem::kUnknownRole:
      return reject(RejectReason::kChatUnknownRole, conv.detail);
    case chat::ChatProblem::kContentNotString:
      return reject(RejectReason::kChatContentNotString, conv.detail);
    case chat::ChatProblem::kNoAssistant:
      return reject(RejectReason::kChatNoAssistant, conv.detail);
    case chat::ChatProblem::kMalformed:
      return reject(RejectReason::kChatMalformed, conv.detail);
  }
  if (!options.chat)
    return reject(RejectReason::kChatTemplate, std::string(options.chat_unavailable));
  auto rendered = options.chat->render_for_training(conv.messages, conv.tools, conv.first_counted);
  if (!rendered.is_ok()) return reject(RejectReason::kChatTemplate, rendered.status().message());
  if (rendered->spans.empty() || is_blank(rendered->text))
    return reject(RejectReason::kChatNoAssistant, "the template renders no assistant turn");
  doc->text = std::move(rendered->text);
  result.text = doc->text;
  doc->chat = true;
  for (auto& [b, e] : rendered->spans)
    doc->chat_spans.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
  if (!have_id) doc->id = id_base + ":" + std::to_string(line_no);
  result.ok = true;
  return result;
}

}  // namespace

ParseResult parse_jsonl_line(std::string_view line, const std::string& id_base, uint64_t line_no,
                             const ParseOptions& options, Document* doc) {
  ThreadParser& tp = thread_parser();
  ParseResult result;
  simdjson::dom::element root;
  simdjson::error_code err = parse_padded(tp, line, &root, options.input_padded);
  if (err == simdjson::UTF8_ERROR || err == simdjson::STRING_ERROR) {
    // Raw invalid UTF-8, or an unpaired surrogate escape.
    std::string_view fixed = line;
    bool changed = false;
    if (err == simdjson::UTF8_ERROR && repair_utf8(line, &tp.repaired)) {
      fixed = tp.repaired;
      changed = true;
    }
    if (repair_surrogate_escapes(fixed, &tp.repaired2)) {
      fixed = tp.repaired2;
      changed = true;
    }
    if (!changed) return reject(RejectReason::kInvalidJson, simdjson::error_message(err));
    if (!options.repair_utf8)
      return reject(RejectReason::kInvalidUtf8,
                    err == simdjson::UTF8_ERROR ? "invalid UTF-8 bytes"
                                                : "unpaired UTF-16 surrogate escape");
    std::string copy(fixed);  // `fixed` may alias tp buffers that parse_padded reuses
    err = parse_padded(tp, copy, &root);
    result.repaired = true;
  }
  if (err == simdjson::DEPTH_ERROR) {
    return reject(RejectReason::kInvalidJson, "JSON nested deeper than the limit of " +
                                                  std::to_string(kMaxJsonDepth) + " levels");
  }
  if (err != simdjson::SUCCESS) return reject(RejectReason::kInvalidJson, simdjson::error_message(err));
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS)
    return reject(RejectReason::kNotObject, "the line is JSON but not an object");

  bool have_text = false, have_id = false;
  simdjson::dom::element chat_fields[4];  // messages, prompt, completion, tools
  bool have_chat_field[4] = {false, false, false, false};
  doc->id_is_number = false;
  doc->chat = false;
  doc->chat_spans.clear();
  doc->loss_mask.clear();
  doc->source.clear();
  doc->url.clear();
  doc->input_domain.clear();
  if (options.want_fields) doc->carried = nlohmann::json::object();
  for (auto field : obj) {
    std::string_view key = field.key;
    simdjson::dom::element value = field.value;
    if (key == "text") {
      std::string_view text;
      if (value.get_string().get(text) != simdjson::SUCCESS)
        return reject(RejectReason::kTextNotString, "\"text\" is not a string");
      if (options.copy_text) {
        doc->text.assign(text);
        result.text = doc->text;
      } else {
        result.text = text;  // lives in the parser's string buffer until the next parse
      }
      have_text = true;
    } else if (key == "id") {
      if (value.is_string()) {
        std::string_view sv = value.get_string().value_unsafe();
        doc->id.assign(sv);
        have_id = !sv.empty();
      } else if (value.is_number()) {
        // Canonical JSON text (as nlohmann writes it, so readers that re-dump get the same).
        int64_t i;
        uint64_t u;
        if (value.get_int64().get(i) == simdjson::SUCCESS) doc->id = std::to_string(i);
        else if (value.get_uint64().get(u) == simdjson::SUCCESS) doc->id = std::to_string(u);
        else doc->id = nlohmann::json(value.get_double().value_unsafe()).dump();
        doc->id_is_number = true;
        have_id = true;
      } else if (!value.is_null()) {
        return reject(RejectReason::kBadField, "\"id\" must be a string or a number");
      }
    } else if (key == "source") {
      if (!string_field(value, &doc->source))
        return reject(RejectReason::kBadField, "\"source\" must be a string");
    } else if (key == "url") {
      if (!string_field(value, &doc->url))
        return reject(RejectReason::kBadField, "\"url\" must be a string");
    } else if (key == "domain") {
      if (!string_field(value, &doc->input_domain))
        return reject(RejectReason::kBadField, "\"domain\" must be a string");
      if (!doc->input_domain.empty() && !is_valid_domain_name(doc->input_domain))
        return reject(RejectReason::kBadField,
                      "\"domain\" must match [A-Za-z0-9_-]{1,64}: '" + doc->input_domain + "'");
    } else if (key == "meta") {
      if (!value.is_null() && !value.is_object())
        return reject(RejectReason::kBadField, "\"meta\" must be an object");
      if (options.want_fields && value.is_object()) doc->carried["meta"] = to_nlohmann(value);
    } else {
      static constexpr std::string_view kChatKeys[4] = {"messages", "prompt", "completion",
                                                        "tools"};
      for (int k = 0; k < 4; ++k)
        if (key == kChatKeys[k]) {
          chat_fields[k] = value;
          have_chat_field[k] = true;
        }
      if (options.want_fields) doc->carried[std::string(key)] = to_nlohmann(value);
    }
  }
  if (!have_text && (have_chat_field[0] || (have_chat_field[1] && have_chat_field[2]))) {
    return parse_chat(chat_fields, have_chat_field, id_base, line_no, have_id, options, doc,
                      result);
  }
  if (!have_text) return reject(RejectReason::kMissingText, "no \"text\" field");
  if (is_blank(result.text)) return reject(RejectReason::kEmptyText, "\"text\" is empty");
  if (!have_id) doc->id = id_base + ":" + std::to_string(line_no);
  result.ok = true;
  return result;
}

ParseResult parse_text_document(std::string_view content, const std::string& id_base,
                                const ParseOptions& options, Document* doc) {
  ParseResult result;
  ThreadParser& tp = thread_parser();
  if (repair_utf8(content, &tp.repaired)) {
    if (!options.repair_utf8) return reject(RejectReason::kInvalidUtf8, "invalid UTF-8 bytes");
    result.text = tp.repaired;
    result.repaired = true;
  } else {
    result.text = content;
  }
  if (options.copy_text) {
    doc->text.assign(result.text);
    result.text = doc->text;
  }
  if (is_blank(result.text)) return reject(RejectReason::kEmptyText, "the file is empty");
  doc->id = id_base;
  doc->id_is_number = false;
  doc->chat = false;
  doc->chat_spans.clear();
  doc->loss_mask.clear();
  doc->source.clear();
  doc->url.clear();
  doc->input_domain.clear();
  if (options.want_fields) doc->carried = nlohmann::json::object();
  result.ok = true;
  return result;
}

}  // namespace kiln::prep
