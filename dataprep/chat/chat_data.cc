#include "dataprep/chat/chat_data.h"

#include <algorithm>

namespace kiln::chat {
namespace {

Conversation problem(ChatProblem p, std::string detail) {
  Conversation c;
  c.problem = p;
  c.detail = std::move(detail);
  return c;
}

// Checks one message list; `where` names it in messages ("messages", "prompt", "completion").
Conversation check_messages(const nlohmann::ordered_json& list, const std::string& where) {
  Conversation c;
  if (!list.is_array()) return problem(ChatProblem::kMalformed, "\"" + where + "\" is not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return problem(ChatProblem::kMalformed, at + " is not an object");
    if (!m.contains("role") || !m["role"].is_string())
      return problem(ChatProblem::kUnknownRole, at + " has no \"role\" string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return problem(ChatProblem::kUnknownRole,
                     at + ": unknown role '" + role + "' (system, user, assistant or tool)");
    if (!m.contains("content") || !m["content"].is_string())
      return problem(ChatProblem::kContentNotString,
                     at + " (" + role + "): \"content\" is " +
                         (m.contains("content") ? "not a string" : "missing"));
  }
  c.messages = list;
  return c;
}

bool has_assistant(const nlohmann::ordered_json& messages, size_t from) {
  for (size_t i = from; i < messages.size(); ++i)
    if (messages[i]["role"] == "assistant") return true;
  return false;
}

}  // namespace

bool is_chat_line(const nlohmann::ordered_json& line) {
  if (!line.is_object() || line.contains("text")) return false;
  return line.contains("messages") || (line.contains("prompt") && line.contains("completion"));
}

Conversation read_conversation(const nlohmann::ordered_json& line) {
  Conversation c;
  size_t first_counted = 0;
  if (line.contains("messages")) {
    c = check_messages(line["messages"], "messages");
    if (c.problem != ChatProblem::kNone) return c;
  } else {
    const auto& prompt = line["prompt"];
    const auto& completion = line["completion"];
    if (prompt.is_string() && completion.is_string()) {
      c.messages = nlohmann::ordered_json::array();
      c.messages.push_back({{"role", "user"}, {"content", prompt}});
      c.messages.push_back({{"role", "assistant"}, {"content", completion}});
    } else if (prompt.is_array() && completion.is_array()) {
      Conversation p = check_messages(prompt, "prompt");
      if (p.problem != ChatProblem::kNone) return p;
      Conversation q = check_messages(completion, "completion");
      if (q.problem != ChatProblem::kNone) return q;
      c.messages = p.messages;
      first_counted = c.messages.size();
      for (auto& m : q.messages) c.messages.push_back(m);
    } else {
      return problem(ChatProblem::kMalformed,
                     "\"prompt\" and \"completion\" must both be strings or both be message lists");
    }
  }
  if (c.messages.empty()) return problem(ChatProblem::kEmpty, "the conversation has no messages");
  if (!has_assistant(c.messages, first_counted))
    return problem(ChatProblem::kNoAssistant,
                   first_counted ? "the completion has no assistant message"
                                 : "the conversation has no assistant message to learn from");
  if (line.contains("tools") && !line["tools"].is_null()) {
    if (!line["tools"].is_array())
      return problem(ChatProblem::kMalformed, "\"tools\" is not a list");
    c.tools = line["tools"];
  }
  c.first_counted = first_counted;
  return c;
}

Result<ChatEncoder> ChatEncoder::create(const prep::Tokenizer& tokenizer) {
  if (std::string_view(tokenizer.kind()) == "sentencepiece")
    return Status::usage(
        "chat data needs a byte-level BPE tokenizer (a SentencePiece model was given): the loss "
        "mask is placed by the byte offsets of the tokens");
  ChatEncoder e;
  e.tokenizer_ = &tokenizer;
  for (uint32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.is_special(id) && !tokenizer.token_bytes(id).empty())
      e.specials_.emplace_back(tokenizer.token_bytes(id), id);
  std::sort(e.specials_.begin(), e.specials_.end());
  return e;
}

void ChatEncoder::encode(std::string_view text, const std::vector<std::pair<size_t, size_t>>& spans,
                         std::vector<uint32_t>* ids, std::vector<uint8_t>* mask) const {
  ids->clear();
  mask->clear();
  std::vector<size_t> starts;  // byte offset of each token
  size_t pos = 0, plain = 0;
  auto flush_plain = [&](size_t end) {
    if (end <= plain) return;
    // Byte-level BPE tokens spell the (normalised) text: their lengths give the offsets. A
    // normaliser that changed the text (NFC on decomposed input) shifts them within the segment
    // at most; offsets stay inside it.
    size_t at = plain;
    for (uint32_t id : tokenizer_->encode(text.substr(plain, end - plain))) {
      ids->push_back(id);
      starts.push_back(std::min(at, end - 1));
      at += tokenizer_->token_bytes(id).size();
    }
  };
  while (pos < text.size()) {
    // Leftmost-longest special token at pos (the candidates share its first byte).
    const std::pair<std::string, uint32_t>* best = nullptr;
    auto it = std::lower_bound(specials_.begin(), specials_.end(), std::string(1, text[pos]),
                               [](const auto& a, const std::string& b) { return a.first < b; });
    for (; it != specials_.end() && it->first[0] == text[pos]; ++it)
      if (text.compare(pos, it->first.size(), it->first) == 0 &&
          (!best || it->first.size() > best->first.size()))
        best = &*it;
    if (!best) {
      ++pos;
      continue;
    }
    flush_plain(pos);
    ids->push_back(best->second);
    starts.push_back(pos);
    pos += best->first.size();
    plain = pos;
  }
  flush_plain(text.size());
  mask->assign(ids->size(), 0);
  size_t s = 0;
  for (size_t t = 0; t < ids->size(); ++t) {
    while (s < spans.size() && spans[s].second <= starts[t]) ++s;
    if (s < spans.size() && starts[t] >= spans[s].first && starts[t] < spans[s].second)
      (*mask)[t] = 1;
  }
}

}  // namespace kiln::chat
