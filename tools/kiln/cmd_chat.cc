// kiln chat render --template PATH [--add-generation-prompt] [--training]
// Reads conversations, one JSON object per line on standard input ({"messages": [...], "tools":
// [...]}), renders each with the chat template and prints one JSON line per conversation:
// {"text": ...} ({"text", "spans": [[begin, end], ...]} with --training: the assistant turns'
// byte ranges the loss counts), or {"error": message} when the template fails.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dataprep/chat/chat_template.h"
#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_chat_command(CLI::App& root) {
  struct Flags {
    std::string template_path;
    bool generation_prompt = false;
    bool training = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = root.add_subcommand("chat", "render conversations with a model's chat template");
  cmd->require_subcommand(1);
  CLI::App* render = cmd->add_subcommand(
      "render",
      "read {\"messages\": [...], \"tools\": [...]} lines on stdin and print each rendered as "
      "transformers' apply_chat_template renders it: {\"text\"} (or {\"error\"})");
  render
      ->add_option("--template", f->template_path,
                   "a Hugging Face model or tokenizer directory, its tokenizer_config.json, or "
                   "a .jinja file; 'kiln' for Kiln's default template")
      ->required();
  render->add_flag("--add-generation-prompt", f->generation_prompt,
                   "end with the assistant's turn header (add_generation_prompt=True)");
  render->add_flag("--training", f->training,
                   "the training rendering: the whole conversation and \"spans\", the byte "
                   "ranges of the assistant turns the loss counts (dataprep/chat/chat_template.h)");
  return [f, render]() -> Status {
    if (!render->parsed()) return Status::usage("kiln chat: give a subcommand (render)");
    Result<chat::ChatTemplate> loaded =
        f->template_path == "kiln"
            ? chat::ChatTemplate::from_source(chat::kKilnChatTemplate,
                                              {{"eos_token", "<|endoftext|>"}}, "kiln")
            : chat::ChatTemplate::load(f->template_path);
    if (!loaded.is_ok()) return loaded.status();
    const chat::ChatTemplate& tmpl = *loaded;
    if (f->training) KILN_RETURN_IF_ERROR(tmpl.check_trainable());
    std::string line;
    uint64_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      if (line.empty()) continue;
      nlohmann::ordered_json in;
      try {
        in = nlohmann::ordered_json::parse(line);
      } catch (const std::exception& e) {
        return Status::data("stdin line " + std::to_string(line_no) +
                            ": not valid JSON: " + e.what());
      }
      if (!in.is_object() || !in.contains("messages") || !in["messages"].is_array())
        return Status::data("stdin line " + std::to_string(line_no) +
                            ": expected {\"messages\": [...]}");
      nlohmann::ordered_json tools =
          in.contains("tools") ? in["tools"] : nlohmann::ordered_json(nullptr);
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      if (f->training) {
        auto r = tmpl.render_for_training(in["messages"], tools);
        if (r.is_ok()) {
          out["text"] = r->text;
          out["spans"] = nlohmann::ordered_json::array();
          for (auto& [b, e] : r->spans) out["spans"].push_back({b, e});
        } else {
          out["error"] = r.status().message();
        }
      } else {
        auto r = tmpl.render(in["messages"], f->generation_prompt, tools);
        if (r.is_ok())
          out["text"] = *r;
        else
          out["error"] = r.status().message();
      }
      std::string text = out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    return Status::ok();
  };
}

}  // namespace kiln::cli
