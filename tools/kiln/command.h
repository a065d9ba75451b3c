// How a `kiln` subcommand plugs into the front end.
//
// Each tools/kiln/cmd_<name>.cc defines add_<name>_command(): it adds a CLI11 subcommand with
// its flags and returns the function to run when that subcommand is chosen. The function returns
// a Status; main() prints a failing Status as one message and exits with its exit_code().
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace kiln::cli {

using RunFn = std::function<Status()>;

RunFn add_prep_command(CLI::App& root);
RunFn add_inspect_command(CLI::App& root);
RunFn add_tokenizer_command(CLI::App& root);
RunFn add_tagger_command(CLI::App& root);
RunFn add_stream_command(CLI::App& root);
RunFn add_train_command(CLI::App& root);
RunFn add_mix_command(CLI::App& root);
RunFn add_plan_command(CLI::App& root);
RunFn add_checkpoint_command(CLI::App& root);
RunFn add_generate_command(CLI::App& root);
RunFn add_eval_command(CLI::App& root);
RunFn add_chat_command(CLI::App& root);  // tools/kiln/cmd_chat.cc

// Adds the common "--config FILE" and repeatable "--set key.path=value" options.
struct ConfigFlags {
  std::string config_file;
  std::vector<std::string> sets;
};
void add_config_flags(CLI::App* app, ConfigFlags* flags);

// A size flag's value: plain bytes or with a K/M/G (KiB/MiB/GiB) suffix, binary units. kUsage
// naming the flag for anything else or a value past 2^64 - 1.
Result<uint64_t> parse_size(const std::string& flag, const std::string& text);

}  // namespace kiln::cli
