// Chat data for `kiln prep` (docs/PREP.md "Chat data"): reading a conversation from a JSONL line,
// and tokenizing its rendering with a per-token loss mask.
//
// A chat line is a JSON object without "text" that has either
//   "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "<string>", ...}, ...]
// (other message fields such as tool_calls or tool_call_id are kept for the template), optionally
// with "tools": [...], or the prompt/completion form
//   "prompt": "<string>", "completion": "<string>"        (one user turn, one assistant turn)
//   "prompt": [messages...], "completion": [messages...]  (only the completion's assistant turns
//   count)
// Validation (each a counted reject with its reason): no messages (chat_empty), a role outside the
// four (chat_unknown_role), a content that is not a string (chat_content_not_string), no assistant
// turn to learn from (chat_no_assistant), and structure errors (chat_malformed: messages not a
// list, a message not an object, prompt and completion of different forms, tools not a list).
//
// Thread safety: all functions are pure; ChatEncoder is immutable after construction.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "dataprep/tokenizer/tokenizer.h"

namespace kiln::chat {

enum class ChatProblem { kNone, kEmpty, kUnknownRole, kContentNotString, kNoAssistant, kMalformed };

struct Conversation {
  ChatProblem problem = ChatProblem::kNone;
  std::string detail;               // what is wrong, for rejects/ (problem != kNone)
  nlohmann::ordered_json messages;  // the messages, as given (key order kept)
  nlohmann::ordered_json tools;     // null when absent
  size_t first_counted = 0;         // messages before this index are prompt (prompt/completion)
};

// True when the object is a chat line (no "text"; "messages", or "prompt" and "completion").
bool is_chat_line(const nlohmann::ordered_json& line);
// Reads and validates the conversation of a chat line.
Conversation read_conversation(const nlohmann::ordered_json& line);

// Tokenizes rendered chat text as Hugging Face's tokenizer(text, add_special_tokens=False) does:
// the text of every special token of the vocabulary (e.g. "<|eot_id|>") becomes that token
// (leftmost, longest match), the text between them is encoded normally. mask[t] = 1 when token t
// begins inside one of `spans` (byte ranges of the text), else 0; token offsets are the lengths
// of the tokens' bytes (exact for byte-level BPE without a normaliser, and wherever a normaliser
// leaves the text as it is). SentencePiece models are refused (usage error).
class ChatEncoder {
 public:
  static Result<ChatEncoder> create(const prep::Tokenizer& tokenizer);
  void encode(std::string_view text, const std::vector<std::pair<size_t, size_t>>& spans,
              std::vector<uint32_t>* ids, std::vector<uint8_t>* mask) const;

 private:
  const prep::Tokenizer* tokenizer_ = nullptr;
  std::vector<std::pair<std::string, uint32_t>> specials_;  // sorted by text
};

}  // namespace kiln::chat
