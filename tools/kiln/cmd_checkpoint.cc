// kiln checkpoint consolidate STEP_DIR -o model.safetensors
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/params.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {
namespace fs = std::filesystem;

struct ConsolidateArgs {
  std::string dir;
  std::string output;
};

// One file with every parameter of a complete checkpoint, loadable by one process (safetensors,
// fp32): the checkpoint is loaded as a resume would (checksums verified, per-rank partitions of
// any data-parallel size reassembled) and its master weights written per tensor.
Status run_consolidate(const ConsolidateArgs& a) {
  const fs::path dir(a.dir);
  std::error_code ec;
  if (!fs::exists(dir / "state.json", ec)) {
    return Status::usage(a.dir + " is not a complete checkpoint (no state.json; a checkpoint "
                         "directory is RUN/checkpoints/step-NNNNNNNN)");
  }
  KILN_ASSIGN_OR_RETURN(auto shape, engine::checkpoint_model(a.dir));
  engine::ParamStore params(shape.first, shape.second);
  engine::TrainerState state;
  engine::CheckpointLayout layout;
  KILN_RETURN_IF_ERROR(engine::load_checkpoint(a.dir, &params, &state, &layout));
  std::vector<engine::TensorView> views;
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const engine::ParamTensor& t = params.tensors()[i];
    views.push_back({t.name, "F32", t.shape, params.master(static_cast<int>(i)), t.numel * 4});
  }
  std::map<std::string, std::string> meta;
  meta["format"] = "kiln-consolidated/1";
  meta["precision"] = engine::precision_name(shape.second);
  meta["source"] = fs::absolute(dir, ec).string();
  meta["step"] = std::to_string(state.step);
  meta["model"] = engine::model_shape_json(shape.first);
  KILN_RETURN_IF_ERROR(engine::write_safetensors(a.output, views, meta));
  const long long files = layout.sharded() ? layout.partitions * layout.tp_partitions : 2;
  std::printf("%s: %zu tensors from %s (step %s, %lld file%s: dp %lld, tp %lld, ZeRO-%lld)\n",
              a.output.c_str(), views.size(), a.dir.c_str(), meta["step"].c_str(), files,
              files == 1 ? "" : "s", static_cast<long long>(layout.dp),
              static_cast<long long>(layout.tp), static_cast<long long>(layout.zero_stage));
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
