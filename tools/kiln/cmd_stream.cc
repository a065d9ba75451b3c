// kiln stream OUT --world W --rank R --steps N [--seq-len T --micro-batch B --global-batch G
//   --partitions P --repartition --seed S]
//   [--weights d1=w1,d2=w2] [--state-in F]... [--state-out F] — see loader/stream.h.
#include <filesystem>
#include <cstdio>
#include <memory>

#include "comm/comm.h"
#include "loader/domain_weights.h"
#include "loader/stream.h"
#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_stream_command(CLI::App& root) {
  struct Flags {
    loader::StreamOptions options;
    std::string weights;
    int world = 0;
    int rank = -1;
    std::string split = "train";
  };
  auto f = std::make_shared<Flags>();
  auto& o = f->options;
  CLI::App* cmd = root.add_subcommand(
      "stream",
      "run the loader alone and print what one data-parallel rank sees: one JSON line per "
      "sequence {\"step\",\"row\",\"rank\",\"domain\",\"samples\":[input ids]}");
  cmd->add_option("OUT", o.dataset,
                  "the output folder of kiln prep (or its manifest.json); several datasets with "
                  "the same tokenizer read as one: OUT1,OUT2")
      ->required()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // Several datasets as one: "ds1,ds2" (format/manifest.h read_manifest).
            size_t at = 0;
            while (at <= v.size()) {
              size_t comma = v.find(',', at);
              std::string one = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
              std::error_code ec;
              if (!one.empty() && !std::filesystem::exists(one, ec)) return "no such path: " + one;
              if (comma == std::string::npos) break;
              at = comma + 1;
            }
            return "";
          },
          "PATH[,PATH...]"));
  cmd->add_option("--world", f->world,
                  "data-parallel world size (default: from mpirun's environment, else 1)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--rank", f->rank,
                  "data-parallel rank, 0 <= R < W (default: from mpirun's environment, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", o.steps, "batches to read")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--seq-len", o.loader.seq_len, "tokens per sequence, plus one for the targets")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  CLI::Option* micro = cmd->add_option("--micro-batch", o.loader.micro_batch,
                                       "sequences per batch and rank (default 8, or with "
                                       "--global-batch G: G / W)")
                           ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--global-batch", o.loader.global_batch,
                  "sequences per step over all ranks (default: micro-batch x W); the same G "
                  "shows the same global batches at every --world")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--partitions", o.loader.partitions,
                  "canonical partitions (default: the global batch; W must divide it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_flag("--repartition", o.loader.repartition,
                "continue a --state-in whose partitions W does not divide (or whose global "
                "batch differs) in another order instead of refusing");
  cmd->add_flag(
      "--show-tokens", o.show_tokens,
      "also print each sequence's \"tokens\", \"doc_starts\" and \"loss_mask\" (a '0'/'1' "
      "per token: 1 = a target the loss counts; chat samples count their assistant turns)");
  cmd->add_option("--seed", o.loader.seed, "shuffle and mixture seed (shared by all ranks)")
      ->capture_default_str();
  cmd->add_option("--weights", f->weights,
                  "domain weights d1=w1,d2=w2 (normalised; domains not named get 0; default: the "
                  "manifest's token shares, or the state's weights with --state-in)")
      ->type_name("D=W,...");
  cmd->add_option("--state-in", o.state_in,
                  "continue from a loader state; give the states of all ranks of a run to "
                  "continue it with a different --world")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  cmd->add_option("--state-out", o.state_out,
                  "write the loader state after the last step ('{rank}' is replaced by the rank)")
      ->type_name("FILE");
  cmd->add_option("--workers", o.loader.workers, "reader threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--prefetch", o.loader.prefetch_depth, "batches prepared ahead")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--split", f->split,
                  "which shards to read: train (default) or val (the validation split of "
                  "kiln prep's split.val_fraction / split.val_min_docs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_flag("--skip-bad-shards", o.loader.skip_bad_shards,
                "skip (count and log) unreadable shards instead of stopping");
  return [f, micro]() -> Status {
    auto& o = f->options;
    const comm::LaunchEnv env = comm::launch_env();
    o.loader.dp_world = f->world > 0 ? f->world : env.world;
    o.loader.dp_rank = f->rank >= 0 ? f->rank : (env.world > 1 ? env.rank : 0);
    if (o.loader.dp_rank >= o.loader.dp_world) {
      return Status::usage("--rank " + std::to_string(o.loader.dp_rank) + " is not below --world " +
                           std::to_string(o.loader.dp_world))
          .with_key("--rank");
    }
    if (o.loader.global_batch > 0 && micro->count() == 0) {
      if (o.loader.global_batch % o.loader.dp_world != 0) {
        return Status::usage("--global-batch " + std::to_string(o.loader.global_batch) +
                             " is not a multiple of --world " + std::to_string(o.loader.dp_world))
            .with_key("--global-batch");
      }
      o.loader.micro_batch = o.loader.global_batch / o.loader.dp_world;
    }
    o.loader.val_split = f->split == "val";
    if (!f->weights.empty()) {
      loader::WeightRules rules;
      rules.code = StatusCode::kUsage;
      rules.key = "--weights";
      rules.key_per_domain = false;
      KILN_ASSIGN_OR_RETURN(o.loader.weights, loader::DomainWeights::parse(f->weights, rules));
    }
    return loader::run_stream(o, stdout);
  };
}

}  // namespace kiln::cli
