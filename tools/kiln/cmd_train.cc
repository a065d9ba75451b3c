// kiln train --config FILE [--set k=v ...] [--resume] [--overwrite]
#include <filesystem>
#include <memory>

#include "comm/comm.h"
#include "common/log.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "engine/config/train_config.h"
#include "engine/infer/eval_tasks.h"
#include "engine/train/trainer.h"
#include "format/manifest.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct TrainArgs {
  ConfigFlags config;
  bool resume = false;
  bool overwrite = false;
  bool quiet = false;
};

// eval.tasks read and tokenized with the dataset's tokenizer (the manifest's).
Result<engine::TokenizedTasks> tokenize_tasks(const engine::TrainConfig& tc) {
  engine::TokenizedTasks out;
  if (tc.eval.tasks.empty()) return out;
  if (tc.data.manifest.empty()) {
    return Status::config("needs data.manifest (its tokenizer encodes the tasks)")
        .with_key("eval.tasks");
  }
  KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(tc.data.manifest));
  if (m.tokenizer.path.empty()) {
    return Status::config("the dataset has no tokenizer to encode the tasks with")
        .with_key("eval.tasks");
  }
  KILN_ASSIGN_OR_RETURN(
      prep::Tokenizer tok,
      prep::Tokenizer::load((std::filesystem::path(m.dir) / m.tokenizer.path).string()));
  const int32_t eos = tok.eos_id() >= 0 ? static_cast<int32_t>(tok.eos_id()) : -1;
  auto encode = [&](std::string_view text) {
    std::vector<int32_t> ids;
    for (uint32_t id : tok.encode(text)) ids.push_back(static_cast<int32_t>(id));
    return ids;
  };
  for (const std::string& f : tc.eval.tasks) {
    auto ex = engine::read_mc_tasks(f);
    if (!ex.is_ok()) return std::move(ex).take_status().with_key("eval.tasks");
    out.emplace_back(std::filesystem::path(f).stem().string(),
                     engine::tokenize_mc(*ex, encode, eos));
  }
  return out;
}

Status run_train(const TrainArgs& args) {
  // Under mpirun, rank 0 speaks for the run; the others only warn.
  if (comm::launched_by_mpi() && comm::world().rank() != 0) set_log_level("warn");
  KILN_ASSIGN_OR_RETURN(Config cfg, engine::load_train_config(args.config.config_file, args.config.sets));
  KILN_ASSIGN_OR_RETURN(engine::TrainConfig tc, engine::parse_train_config(cfg));
  engine::TrainOptions opts;
  opts.resume = args.resume;
  opts.overwrite = args.overwrite;
  opts.console = !args.quiet;
  KILN_ASSIGN_OR_RETURN(opts.eval_tasks, tokenize_tasks(tc));
  KILN_ASSIGN_OR_RETURN(auto trainer, engine::Trainer::open(tc, cfg.dump(), opts));
  return trainer->run();
}

}  // namespace

RunFn add_train_command(CLI::App& root) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* app = root.add_subcommand(
      "train",
      "train a GPT-style model: writes RUN/config.yaml, RUN/metrics.jsonl (one line per step) and "
      "RUN/checkpoints/; RUN/control/mixture.json (see `kiln mix`) changes domain weights live");
  add_config_flags(app, &args->config);
  app->add_flag("--resume", args->resume,
                "continue from RUN/checkpoints/latest (starts at step 0 when there is none)");
  app->add_flag("--overwrite", args->overwrite,
                "start over in a run directory that already holds metrics or checkpoints");
  app->add_flag("--quiet", args->quiet, "no per-step progress lines on stdout");
  app->footer(
      "Config sections: model, parallel, precision, loss_scale, optimizer, schedule,\n"
      "activation_checkpointing, data, checkpoint, stability, run, device (docs/TRAINING.md).\n"
      "Example: kiln train --config configs/train/tiny.yaml --set run.dir=runs/tiny --set run.steps=200\n"
      "Data parallel: mpirun -np 4 kiln train --config configs/train/tiny.yaml (docs/DISTRIBUTED.md)");
  return [args] { return run_train(*args); };
}

}  // namespace kiln::cli
