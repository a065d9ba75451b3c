// kiln: the command-line front end. Dispatches to subcommands; maps Status to exit codes:
// 0 success, 2 usage/config error, 3 input data error beyond tolerance, 1 anything else.
#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/log.h"
#include "common/text.h"
#include "kernels/cpu_isa.h"
#include "tools/kiln/command.h"

namespace kiln::cli {

void add_config_flags(CLI::App* app, ConfigFlags* flags) {
  app->add_option("--config", flags->config_file, "YAML config file")->check(CLI::ExistingFile);
  app->add_option("--set", flags->sets, "override a config key: --set key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->take_all();
}

Result<uint64_t> parse_size(const std::string& flag, const std::string& text) {
  auto bytes = parse_byte_size(text);
  if (!bytes.is_ok()) return Status::usage(flag + ": " + bytes.status().message());
  return *bytes;
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  using namespace kiln::cli;
  kiln::init_logging();
  // The CPU kernels' path (KILN_CPU_ISA, oneDNN probe) is chosen once, before anything runs.
  if (kiln::Status st = kiln::cpu::init_cpu_runtime(); !st.is_ok()) {
    std::fprintf(stderr, "kiln: %s: %s\n", kiln::status_code_name(st.code()), st.to_string().c_str());
    return st.exit_code();
  }
  CLI::App app{"kiln: from a raw text corpus to a trained language model"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION + "\n" +
                                        kiln::cpu::describe_cpu_runtime());
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->each([](const std::string& level) { kiln::set_log_level(level); });

  std::vector<std::pair<CLI::App*, RunFn>> commands;
  auto remember = [&](RunFn fn) { commands.emplace_back(app.get_subcommands({}).back(), fn); };
  remember(add_prep_command(app));
  remember(add_inspect_command(app));
  remember(add_tokenizer_command(app));
  remember(add_tagger_command(app));
  remember(add_stream_command(app));
  remember(add_train_command(app));
  remember(add_mix_command(app));
  remember(add_plan_command(app));
  remember(add_checkpoint_command(app));
  remember(add_generate_command(app));
  remember(add_eval_command(app));
  remember(add_chat_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    kiln::Status st = run();
    if (!st.is_ok()) {
      std::fprintf(stderr, "kiln %s: %s: %s\n", sub->get_name().c_str(),
                   kiln::status_code_name(st.code()), st.to_string().c_str());
      return st.exit_code();
    }
    return 0;
  }
  return 2;
}
