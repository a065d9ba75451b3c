// Turns one input record (a JSONL line, or a text-folder file) into a Document or a reject.
//
// JSONL contract (docs/PREP.md "Input"): one JSON object per line; "text" (string)
// required, or a chat line (docs/PREP.md "Chat data"); optional "id" (string or number; default
// "<file stem>:<line>"), "source", "url", "domain" (strings or null; a domain must match
// [A-Za-z0-9_-]{1,64}), "meta" (object or null); any other field is carried into the sample
// metadata as-is. Invalid UTF-8 (raw bytes or unpaired \uD800-\uDFFF escapes) is repaired with
// U+FFFD when repair_utf8 is set (each maximal invalid subsequence becomes one U+FFFD), else
// rejected. Thread-safe: each thread uses its own parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dataprep/ingest/document.h"

namespace kiln::chat {
class ChatTemplate;
}

namespace kiln::prep {

// Stable names (used in stats.json and rejects/): see reject_reason_name().
enum class RejectReason {
  kInvalidJson,    // "invalid_json"
  kNotObject,      // "not_object"
  kMissingText,    // "missing_text"
  kTextNotString,  // "text_not_string"
  kInvalidUtf8,    // "invalid_utf8"
  kEmptyText,      // "empty_text"
  kTooLong,        // "too_long"       (line or text file over input.max_line_bytes)
  kBadField,       // "bad_field"      (id/source/url/domain/meta of the wrong type or form)
  kTruncatedFile,  // "truncated_file" (compressed input ends early)
  kCorruptFile,    // "corrupt_file"   (compressed input fails to decode)
  // Chat lines (dataprep/chat/chat_data.h):
  kChatEmpty,             // "chat_empty"              (no messages)
  kChatUnknownRole,       // "chat_unknown_role"       (not system/user/assistant/tool, or none)
  kChatContentNotString,  // "chat_content_not_string"
  kChatNoAssistant,       // "chat_no_assistant"       (nothing to learn from)
  kChatMalformed,  // "chat_malformed"          (messages not a list, a message not an object, ...)
  kChatTemplate,   // "chat_template_error"     (the template raised, or its turns cannot be found)
};
inline constexpr int kRejectReasonCount = 16;
const char* reject_reason_name(RejectReason r);

struct ParseOptions {
  bool repair_utf8 = true;
  // Fill doc->carried / source / url / domain (the scan pass needs only the text).
  bool want_fields = true;
  // Copy the text into doc->text. When false, only ParseResult::text is set (a view valid until
  // the next parse on this thread, or as long as the input for text documents).
  bool copy_text = true;
  // The caller guarantees that SIMDJSON_PADDING (64) readable bytes follow a JSONL line, so it is
  // parsed in place instead of being copied first.
  bool input_padded = false;
  // Chat lines (no "text"; "messages", or "prompt" and "completion": dataprep/chat/chat_data.h)
  // are rendered with this template into doc->text, with doc->chat_spans; null: they are
  // rejected (chat_template_error) with `chat_unavailable` as the detail.
  const chat::ChatTemplate* chat = nullptr;
  std::string_view chat_unavailable;
};

struct ParseResult {
  bool ok = false;
  RejectReason reason = RejectReason::kInvalidJson;
  std::string detail;     // human-readable, for rejects/
  bool repaired = false;  // UTF-8 was repaired
  std::string_view text;  // the document's text (see ParseOptions::copy_text)
};

// Parses a JSONL line. On success fills doc->id, text, and (want_fields) source, url,
// input_domain, carried. id_base is the file stem used for default ids.
ParseResult parse_jsonl_line(std::string_view line, const std::string& id_base, uint64_t line_no,
                             const ParseOptions& options, Document* doc);

// A text-folder document: the whole file content. id = id_base (its relative path).
ParseResult parse_text_document(std::string_view content, const std::string& id_base,
                                const ParseOptions& options, Document* doc);

// Replaces every maximal invalid UTF-8 subsequence with U+FFFD (WHATWG / Unicode "maximal
// subpart" practice). Returns false (and leaves *out untouched) when `in` is already valid.
bool repair_utf8(std::string_view in, std::string* out);
bool is_valid_utf8(std::string_view in);

}  // namespace kiln::prep
