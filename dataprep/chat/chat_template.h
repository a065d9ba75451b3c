// A model's chat template: the Jinja `chat_template` of a Hugging Face tokenizer_config.json (or a
// chat_template.jinja beside it), rendered as transformers' apply_chat_template renders it, and
// the rendering Kiln uses to train on chat data — the text of a whole conversation plus the byte
// ranges of it that are the assistant's turns (the targets the loss counts).
//
// The variables a template sees are transformers': `messages` (the list of message objects as
// given, every field kept: role, content, tool_calls, ...), `tools` (None when absent),
// `documents` (None), `add_generation_prompt`, and the tokenizer's special tokens from
// tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, ... as strings, when set),
// plus the globals raise_exception and strftime_now (dataprep/chat/jinja.h).
//
// Assistant ranges (render_for_training):
// - a template with {% generation %} blocks: exactly those blocks (transformers'
//   return_assistant_tokens_mask);
// - any other template: assistant message i's content as the template renders it (located by
//   rendering the conversation with a sentinel in its place: the text before and after the
//   sentinel must be the text before and after the content), followed by its end-of-turn text
//   (what the template writes after the content when the message is the last one, as far as the
//   conversation's rendering goes on with it: "<|eot_id|>", "<|im_end|>", "</s>"). Template text
//   before the content (role headers, Qwen3's empty <think> block) does not count. Where the
//   text around the content depends on the content (Qwen3 renders a reasoning block out of it),
//   the turn runs instead from the end of messages[:i] rendered with the generation prompt to the
//   end of messages[:i+1] rendered (or to the first end-of-turn text after its start). Trailing
//   whitespace (the newline after an end-of-turn token) is dropped from every range. A template
//   that ends every rendering with the assistant's header whatever add_generation_prompt says (a
//   base model's, such as Llama 3 8B's) writes that header into every turn's end and is refused
//   by check_trainable().
//
// Thread safety: immutable after loading; render from any number of threads.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "dataprep/chat/jinja.h"

namespace kiln::chat {

// Kiln's own chat template, for models whose tokenizer has no chat template (those Kiln trains):
//   <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n{content}{eos_token}\n ...
// and, with the generation prompt, a final "<|assistant|>\n". The role markers are ordinary text;
// the tokenizer's EOS (Kiln's <|endoftext|>) ends an assistant turn, so `kiln generate --chat`
// stops at it. docs/PREP.md ("Chat data") shows a rendering.
extern const char* const kKilnChatTemplate;

struct TrainingRender {
  std::string text;                              // the whole conversation, no generation prompt
  std::vector<std::pair<size_t, size_t>> spans;  // byte ranges [begin, end) of assistant turns
};

class ChatTemplate {
 public:
  // `source` is Jinja; `special_tokens` a JSON object of name -> string (bos_token, eos_token,
  // ...).
  static Result<ChatTemplate> from_source(std::string source, nlohmann::ordered_json special_tokens,
                                          std::string origin);
  // From a Hugging Face model or tokenizer directory (chat_template.jinja if present, else
  // tokenizer_config.json's chat_template), or a tokenizer_config.json file, or a .jinja file (no
  // special tokens then). A `chat_template` that is a list of {name, template} uses "default".
  // Data error naming the file when there is no template or it does not parse.
  static Result<ChatTemplate> load(const std::string& path);

  // apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False).
  // `tools` null means None. Data error with the template's message (raise_exception) on failure.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr) const;

  // The whole conversation and its assistant ranges (see the header comment). Data error when
  // the template fails or its output cannot be split into turns.
  // Assistant messages before index `first_counted` get no range (the prompt of a
  // prompt/completion line).
  Result<TrainingRender> render_for_training(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools = nullptr,
                                             size_t first_counted = 0) const;

  // Usage error when the template cannot delimit assistant turns (it ignores
  // add_generation_prompt); called by `kiln prep` before reading chat data.
  Status check_trainable() const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  Result<RenderOutput> render_raw(const nlohmann::ordered_json& messages,
                                  bool add_generation_prompt,
                                  const nlohmann::ordered_json& tools) const;
  Result<std::string> turn_tail(const nlohmann::ordered_json& before,
                                const nlohmann::ordered_json& message,
                                const nlohmann::ordered_json& tools) const;

  JinjaTemplate template_;
  std::string source_;
  std::string origin_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace kiln::chat
