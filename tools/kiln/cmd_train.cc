// kiln train --config FILE [--set k=v ...] [--resume] [--overwrite]
#include <memory>

#include "comm/comm.h"
#include "common/log.h"
#include "engine/train/train_config.h"
#include "engine/train/trainer.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct TrainArgs {
  ConfigFlags config;
  bool resume = false;
  bool overwrite = false;
  bool quiet = false;
};

Status run_train(const TrainArgs& args) {
  // Under mpirun, rank 0 speaks for the run; the others only warn.
  if (comm::launched_by_mpi() && comm::world().rank() != 0) set_log_level("warn");
  KILN_ASSIGN_OR_RETURN(Config cfg, engine::load_train_config(args.config.config_file, args.config.sets));
  KILN_ASSIGN_OR_RETURN(engine::TrainConfig tc, engine::parse_train_config(cfg));
  engine::TrainOptions opts;
  opts.resume = args.resume;
  opts.overwrite = args.overwrite;
  opts.console = !args.quiet;
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
