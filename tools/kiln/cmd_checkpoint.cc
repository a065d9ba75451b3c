// kiln checkpoint consolidate STEP_DIR -o model.safetensors
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "engine/safetensors.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {
namespace fs = std::filesystem;

struct ConsolidateArgs {
  std::string dir;
  std::string output;
};

// One file with every parameter of a complete checkpoint, loadable by one process (safetensors,
// fp32). This version's checkpoints keep one copy of every tensor (ZeRO-0/1 gather to rank 0
// before writing), so consolidation verifies the checkpoint and extracts the weights; sharded
// layouts (ZeRO-3, tensor parallelism) will be merged here.
Status run_consolidate(const ConsolidateArgs& a) {
  const fs::path dir(a.dir);
  const std::string state_path = (dir / "state.json").string();
  std::error_code ec;
  if (!fs::exists(state_path, ec)) {
    return Status::usage(a.dir + " is not a complete checkpoint (no state.json; a checkpoint "
                         "directory is RUN/checkpoints/step-NNNNNNNN)");
  }
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  nlohmann::json state;
  uint64_t want = 0;
  try {
    state = nlohmann::json::parse(text);
    KILN_ASSIGN_OR_RETURN(want,
                          parse_hex64(state.at("files").at("model.safetensors").get<std::string>()));
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
  const std::string model_path = (dir / "model.safetensors").string();
  KILN_ASSIGN_OR_RETURN(uint64_t got, xxh3_file(model_path));
  if (got != want) {
    return Status::data("checksum mismatch (state.json says " + hex64(want) + ", the file is " +
                        hex64(got) + ")")
        .with_file(model_path);
  }
  KILN_ASSIGN_OR_RETURN(engine::SafetensorsFile model, engine::SafetensorsFile::read(model_path));
  std::vector<engine::TensorView> views;
  for (const std::string& name : model.names()) {
    KILN_ASSIGN_OR_RETURN(engine::TensorView v, model.view(name));
    views.push_back(std::move(v));
  }
  std::map<std::string, std::string> meta = model.metadata();
  meta["format"] = "kiln-consolidated/1";
  meta["source"] = fs::absolute(dir, ec).string();
  meta["step"] = std::to_string(state.value("step", int64_t{0}));
  meta["model"] = state.value("model", nlohmann::json::object()).dump();
  KILN_RETURN_IF_ERROR(engine::write_safetensors(a.output, views, meta));
  std::printf("%s: %zu tensors from %s (step %s)\n", a.output.c_str(), views.size(),
              a.dir.c_str(), meta["step"].c_str());
  return Status::ok();
}

}  // namespace

RunFn add_checkpoint_command(CLI::App& root) {
  CLI::App* cmd = root.add_subcommand("checkpoint", "work with training checkpoints");
  cmd->require_subcommand(1);
  auto args = std::make_shared<ConsolidateArgs>();
  CLI::App* con = cmd->add_subcommand(
      "consolidate",
      "write one safetensors file with every parameter of a checkpoint (fp32), loadable by one "
      "process, after verifying its checksum");
  con->add_option("STEP_DIR", args->dir, "RUN/checkpoints/step-NNNNNNNN")->required();
  con->add_option("-o,--output", args->output, "the safetensors file to write")->required();
  return [args] { return run_consolidate(*args); };
}

}  // namespace kiln::cli
