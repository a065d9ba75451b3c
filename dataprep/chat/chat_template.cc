#include "dataprep/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::chat {

const char* const kKilnChatTemplate =
    "{%- for message in messages %}\n"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] }}\n"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n"
    "{{- '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}\n";

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::from_errno("reading", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::from_errno("reading", path);
  return ss.str();
}

// transformers' special_tokens_map: the tokens that are set, as strings (an AddedToken object's
// "content").
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  auto text = [](const nlohmann::ordered_json& v) -> nlohmann::ordered_json {
    if (v.is_string()) return v;
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
    return nullptr;
  };
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    nlohmann::ordered_json t = text(config[name]);
    if (!t.is_null()) out[name] = t;
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (auto& v : config["additional_special_tokens"]) {
      nlohmann::ordered_json t = text(v);
      if (!t.is_null()) list.push_back(t);
    }
    out["additional_special_tokens"] = list;
  }
  return out;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

Result<ChatTemplate> ChatTemplate::from_source(std::string source,
                                               nlohmann::ordered_json special_tokens,
                                               std::string origin) {
  auto parsed = JinjaTemplate::parse(source);
  if (!parsed.is_ok()) return Status::data(origin + ": " + parsed.status().message());
  ChatTemplate t;
  t.template_ = std::move(parsed).value();
  t.source_ = std::move(source);
  t.origin_ = std::move(origin);
  if (special_tokens.is_object()) t.special_tokens_ = std::move(special_tokens);
  return t;
}

Result<ChatTemplate> ChatTemplate::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string config_path = path, jinja_path;
  if (fs::is_directory(path, ec)) {
    config_path = (fs::path(path) / "tokenizer_config.json").string();
    std::string j = (fs::path(path) / "chat_template.jinja").string();
    if (fs::exists(j, ec)) jinja_path = j;
  } else if (path.ends_with(".jinja")) {
    jinja_path = path;
    config_path.clear();
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (!config_path.empty() && fs::exists(config_path, ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
    try {
      config = nlohmann::ordered_json::parse(text);
    } catch (const std::exception& e) {
      return Status::data(config_path + ": not valid JSON: " + e.what());
    }
    if (!config.is_object()) return Status::data(config_path + ": expected a JSON object");
  }
  nlohmann::ordered_json specials = special_tokens_of(config);
  if (!jinja_path.empty()) {
    KILN_ASSIGN_OR_RETURN(std::string source, read_file(jinja_path));
    return from_source(std::move(source), std::move(specials), jinja_path);
  }
  if (config_path.empty() || !fs::exists(config_path, ec))
    return Status::data(path + ": no tokenizer_config.json or chat_template.jinja");
  if (!config.contains("chat_template"))
    return Status::data(config_path + ": no 'chat_template' (give a template with chat.template)");
  const auto& ct = config["chat_template"];
  if (ct.is_string()) return from_source(ct.get<std::string>(), std::move(specials), config_path);
  if (ct.is_array()) {
    for (auto& entry : ct)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return from_source(entry["template"].get<std::string>(), std::move(specials), config_path);
    return Status::data(config_path + ": key 'chat_template': a list without a 'default' template");
  }
  return Status::data(config_path + ": key 'chat_template': expected a string or a list");
}

Result<RenderOutput> ChatTemplate::render_raw(const nlohmann::ordered_json& messages,
                                              bool add_generation_prompt,
                                              const nlohmann::ordered_json& tools) const {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (auto& [k, v] : special_tokens_.items()) ctx[k] = v;
  auto out = template_.render(ctx);
  if (!out.is_ok()) return Status::data("chat template: " + out.status().message());
  return out;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& tools) const {
  KILN_ASSIGN_OR_RETURN(RenderOutput out, render_raw(messages, add_generation_prompt, tools));
  return std::move(out.text);
}

Status ChatTemplate::check_trainable() const {
  if (template_.has_generation_tags()) return Status::ok();
  // A template that ends every rendering with an assistant header, whatever
  // add_generation_prompt says (Llama 3 8B base's), writes that header after each assistant turn
  // too, where no turn boundary can be told from it.
  nlohmann::ordered_json user = nlohmann::ordered_json::array();
  user.push_back({{"role", "user"}, {"content", "Hi"}});
  auto with = render(user, true), without = render(user, false);
  auto tail = turn_tail(user, {{"role", "assistant"}, {"content", ""}}, nullptr);
  if (!with.is_ok() || !without.is_ok() || !tail.is_ok() || *with != *without) return Status::ok();
  size_t n = std::min<size_t>(16, without->size());
  if (n >= 4 && tail->size() >= n &&
      tail->compare(tail->size() - n, n, *without, without->size() - n, n) == 0)
    return Status::usage(origin_ +
                         ": the chat template ends every rendering with the assistant's header and "
                         "ignores add_generation_prompt (a base model's template?), so assistant "
                         "turns cannot be delimited; give another with chat.template");
  return Status::ok();
}

namespace {

const std::string kSentinel = "\x01kiln-chat-sentinel\x01";

nlohmann::ordered_json before_of(const nlohmann::ordered_json& messages, size_t i) {
  nlohmann::ordered_json before = nlohmann::ordered_json::array();
  for (size_t j = 0; j < i; ++j) before.push_back(messages[j]);
  return before;
}

}  // namespace

// What the template writes after an assistant message's content when that message is the last
// one (its end-of-turn text): rendered with a sentinel content.
Result<std::string> ChatTemplate::turn_tail(const nlohmann::ordered_json& before,
                                            const nlohmann::ordered_json& message,
                                            const nlohmann::ordered_json& tools) const {
  nlohmann::ordered_json probe = before;
  nlohmann::ordered_json m = message;
  m["content"] = kSentinel;
  probe.push_back(m);
  KILN_ASSIGN_OR_RETURN(std::string text, render(probe, false, tools));
  size_t at = text.rfind(kSentinel);
  if (at == std::string::npos) return std::string();
  return text.substr(at + kSentinel.size());
}

Result<TrainingRender> ChatTemplate::render_for_training(const nlohmann::ordered_json& messages,
                                                         const nlohmann::ordered_json& tools,
                                                         size_t first_counted) const {
  TrainingRender result;
  KILN_ASSIGN_OR_RETURN(RenderOutput whole, render_raw(messages, false, tools));
  result.text = std::move(whole.text);
  const std::string& full = result.text;
  if (template_.has_generation_tags()) {
    // The blocks are the assistant turns in order; those of prompt messages do not count.
    size_t skip = 0;
    for (size_t j = 0; j < first_counted && j < messages.size(); ++j)
      skip += messages[j].is_object() && messages[j].value("role", "") == "assistant";
    for (size_t k = skip; k < whole.generation_spans.size(); ++k)
      result.spans.push_back(whole.generation_spans[k]);
  } else {
    for (size_t i = first_counted; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (!m.is_object() || m.value("role", "") != "assistant") continue;
      // The whole conversation with this message's content replaced by a sentinel: the text
      // before the sentinel is the text before the content, the text after it what follows the
      // content, both as in `full` (checked).
      nlohmann::ordered_json probe = messages;
      probe[i]["content"] = kSentinel;
      KILN_ASSIGN_OR_RETURN(std::string probed, render(probe, false, tools));
      size_t at = probed.find(kSentinel);
      size_t after = at == std::string::npos ? 0 : probed.size() - at - kSentinel.size();
      KILN_ASSIGN_OR_RETURN(std::string tail, turn_tail(before_of(messages, i), m, tools));
      if (at != std::string::npos && probed.find(kSentinel, at + 1) == std::string::npos &&
          at + after <= full.size() && full.compare(0, at, probed, 0, at) == 0 &&
          full.compare(full.size() - after, after, probed, at + kSentinel.size(), after) == 0) {
        size_t end = full.size() - after;
        // Then the end-of-turn text: what the template writes after the content when the
        // message is the last, as far as the conversation goes on with it.
        size_t k = 0;
        while (k < tail.size() && end + k < full.size() && full[end + k] == tail[k]) ++k;
        result.spans.emplace_back(at, end + k);
        continue;
      }
      // The text around the content depends on it (Qwen3 renders a reasoning block out of it):
      // the turn runs from the end of messages[:i] rendered with the generation prompt to the end
      // of messages[:i+1] rendered, or to the first end-of-turn text after that start.
      KILN_ASSIGN_OR_RETURN(std::string prompt, render(before_of(messages, i), true, tools));
      nlohmann::ordered_json upto = before_of(messages, i);
      upto.push_back(m);
      KILN_ASSIGN_OR_RETURN(std::string turn, render(upto, false, tools));
      size_t begin = prompt.size(), end = std::string::npos;
      if (full.compare(0, begin, prompt) != 0)
        return Status::data("chat template: cannot locate assistant message " + std::to_string(i) +
                            " in the rendering (the template's output around its content depends "
                            "on the content, and the conversation up to it is rendered otherwise "
                            "alone)");
      if (turn.size() >= begin && full.compare(0, turn.size(), turn) == 0) {
        end = turn.size();
      } else if (!tail.empty()) {
        size_t e = full.find(tail, begin);
        if (e != std::string::npos) end = e + tail.size();
      }
      if (end == std::string::npos)
        return Status::data("chat template: cannot find the end of assistant message " +
                            std::to_string(i) + "'s turn in the rendering");
      result.spans.emplace_back(begin, end);
    }
  }
  // Drop trailing whitespace (the newline after an end-of-turn token); keep ranges ordered.
  size_t last_end = 0;
  for (auto& [b, e] : result.spans) {
    while (e > b && is_ascii_space(full[e - 1])) --e;
    if (b < last_end || e > full.size())
      return Status::data("chat template: assistant ranges overlap or run past the text");
    last_end = e;
  }
  return result;
}

}  // namespace kiln::chat
