// A Jinja template engine for the chat templates of Hugging Face models (tokenizer_config.json's
// `chat_template`), rendering them as transformers' `apply_chat_template` does: Jinja2 with
// trim_blocks, lstrip_blocks, the loopcontrols extension (break / continue), the `generation` tag
// (transformers' AssistantTracker), the default Undefined, no autoescape, and the immutable
// sandbox (no method that changes a list or dict can be called).
//
// Why not a library: Debian packages no C++ Jinja engine (only python3-jinja2, transformers' own
// engine, which tests/python/chat_template_parity.py holds this one to, byte for byte, on the
// templates of real models: Llama 3 / 3.1, Qwen 2.5 / 3, Gemma 3, Mistral Nemo).
//
// What it covers: text, {{ }}, {% %}, {# #} with `-` / `+` whitespace control; if / elif / else,
// for (tuple targets, `if` filter, else, the loop object), set (also `ns.attr` and block set),
// macro, break / continue, generation, filter blocks, raw; Python's expression grammar as Jinja
// parses it (literals, lists, dicts, tuples, slices, calls with keywords, `|filter`, `is test`,
// `x if c else y`, `in`, `~`, `**`, `//`); Python semantics for str() / repr() of values, ==,
// truthiness, `+`, `%`, string methods (strip, split, startswith, replace, ...), dict methods
// (items, keys, values, get); Jinja's common filters and tests and the globals `namespace`,
// `range`, `dict`, plus what transformers adds: `raise_exception`, `strftime_now` and its own
// `tojson` (json.dumps with ensure_ascii=False). Strings are UTF-8; length, indexing and slicing
// count code points as Python does. Not covered (a parse error names them): extends / include /
// import (a chat template is one string), `do`, `with`, `call` blocks.
//
// Errors: parse errors name the line; render errors (raise_exception's message, an undefined
// value used where Jinja raises, a type error) are kData statuses. Thread safety: a parsed
// template is immutable and may be rendered from several threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln::chat {

struct RenderOutput {
  std::string text;
  // Byte ranges [begin, end) of `text` rendered inside {% generation %} ... {% endgeneration %}
  // (transformers' return_assistant_tokens_mask), in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class JinjaTemplate {
 public:
  JinjaTemplate();
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

  // Parses `source`. A syntax error is a kData status "chat template line N: ...".
  static Result<JinjaTemplate> parse(std::string_view source);

  // Renders with the top-level names of `context` (a JSON object; arrays become lists, objects
  // dicts in their key order, null None). kData status on a render error.
  Result<RenderOutput> render(const nlohmann::ordered_json& context) const;

  // True when the template uses {% generation %}.
  bool has_generation_tags() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln::chat
