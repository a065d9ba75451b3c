// kiln plan --config FILE --world N [--memory-per-device SIZE] [--gpus-per-node N]
//           [--tp N] [--pp N] [--schedule 1f1b|gpipe] [--global-batch SEQUENCES]
//           [--intra-node-bandwidth GB/s] [--inter-node-bandwidth GB/s] [--peak-tflops T]
//           [--compute-efficiency F] [--json] [--set k=v ...]
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/text.h"
#include "engine/config/train_config.h"
#include "engine/parallel/layout_plan.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct PlanArgs {
  ConfigFlags config;
  int64_t world = 1;
  int64_t per_node = 8;
  std::string memory;
  bool json = false;
  double intra_gbps = engine::Links{}.intra_node / 1e9;
  double inter_gbps = engine::Links{}.inter_node / 1e9;
  double peak_tflops = engine::Hardware{}.peak_flops / 1e12;
  double efficiency = engine::Hardware{}.efficiency;
  int64_t tp = 0, pp = 0, global_batch = 0;  // 0: every size / data.grad_accum
  std::string schedule;                      // "": both
};

// Sizes in the table: GiB with two decimals, smaller ones in MiB or KiB.
std::string gib(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return bytes_in(b, ByteUnit::kGiB, 2);
  return bytes_in(b, b >= (uint64_t{1} << 20) ? ByteUnit::kMiB : ByteUnit::kKiB);
}

Status run_plan(const PlanArgs& a) {
  if (a.config.config_file.empty()) return Status::usage("--config FILE is required");
  KILN_ASSIGN_OR_RETURN(Config cfg, engine::load_train_config(a.config.config_file, a.config.sets));
  KILN_ASSIGN_OR_RETURN(engine::TrainConfig tc, engine::parse_train_config(cfg));
  std::optional<uint64_t> budget;
  std::string budget_note;
  if (!a.memory.empty()) {
    KILN_ASSIGN_OR_RETURN(uint64_t b, parse_size("--memory-per-device", a.memory));
    if (b == 0) return Status::usage("--memory-per-device: must be more than 0 bytes");
    budget = b;
    budget_note = gib(*budget) + " per device (--memory-per-device)";
  } else if (tc.device == Device::kCpu) {
    // CPU ranks of one machine share its memory.
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) {
      budget = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) /
               static_cast<uint64_t>(a.world);
      budget_note = gib(*budget) + " per rank (this machine's memory / world; set --memory-per-device)";
    }
  } else {
    budget_note = "unknown (set --memory-per-device)";
  }
  engine::Hardware hw;
  hw.ranks_per_node = a.per_node;
  hw.links = engine::Links{a.intra_gbps * 1e9, a.inter_gbps * 1e9};
  hw.peak_flops = a.peak_tflops * 1e12;
  hw.efficiency = a.efficiency;
  engine::PlanFilter filter;
  if (a.tp > 0) filter.tp = a.tp;
  if (a.pp > 0) filter.pp = a.pp;
  if (a.global_batch > 0) filter.global_batch = a.global_batch;
  if (a.schedule == "1f1b") filter.schedule = engine::PpSchedule::k1F1B;
  if (a.schedule == "gpipe") filter.schedule = engine::PpSchedule::kGPipe;
  KILN_ASSIGN_OR_RETURN(auto plans, engine::plan_layouts(tc, a.world, budget, hw, filter));
  if (plans.empty()) {
    return Status::usage("no layout of " + std::to_string(a.world) + " ranks matches" +
                         (a.tp ? " --tp " + std::to_string(a.tp) : std::string()) +
                         (a.pp ? " --pp " + std::to_string(a.pp) : std::string()) +
                         (a.global_batch ? " --global-batch " + std::to_string(a.global_batch) +
                                               " (it must be a multiple of dp x data.micro_batch)"
                                         : std::string()) +
                         " (tp divides the world and the head counts, pp divides world / tp)");
  }

  if (a.json) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const auto& p : plans) {
      nlohmann::ordered_json j;
      j["tp"] = p.layout.tp;
      j["dp"] = p.layout.dp;
      j["pp"] = p.layout.pp;
      j["pp_schedule"] = engine::pp_schedule_name(p.layout.schedule);
      j["zero_stage"] = p.layout.zero_stage;
      j["activation_checkpointing"] = engine::recompute_name(p.layout.recompute);
      j["micro_batches"] = p.micro_batches;
      j["bubble"] = p.bubble;
      j["bytes_per_rank"] = {{"params", p.memory.params},         {"grads", p.memory.grads},
                             {"optimizer", p.memory.optimizer},   {"activations", p.memory.activations},
                             {"buffers", p.memory.buffers},       {"total", p.memory.total()},
                             {"startup", p.memory.startup}};
      nlohmann::ordered_json comm = nlohmann::ordered_json::object();
      for (const auto& [k, v] : p.comm_bytes) comm[k] = v;
      j["comm_bytes_per_step"] = comm;
      j["comm_seconds_per_step"] = p.comm_seconds;
      j["compute_seconds_per_step"] = p.compute_seconds;
      j["step_seconds"] = p.step_seconds;
      j["tokens_per_second"] = p.tokens_per_second;
      j["worst_stage"] = p.worst_stage;
      nlohmann::ordered_json stages = nlohmann::ordered_json::array();
      for (const auto& st : p.stages) {
        nlohmann::ordered_json sj;
        sj["stage"] = st.stage.rank;
        sj["blocks"] = {st.stage.first_block, st.stage.end_block};
        sj["in_flight"] = st.slots;
        sj["bytes_per_rank"] = {
            {"params", st.memory.params},       {"grads", st.memory.grads},
            {"optimizer", st.memory.optimizer}, {"activations", st.memory.activations},
            {"buffers", st.memory.buffers},     {"total", st.memory.total()},
            {"startup", st.memory.startup}};
        nlohmann::ordered_json sc = nlohmann::ordered_json::object();
        for (const auto& [k, v] : st.comm_bytes) sc[k] = v;
        sj["comm_bytes_per_step"] = sc;
        stages.push_back(sj);
      }
      j["stages"] = stages;
      j["fits"] = p.fits ? nlohmann::ordered_json(*p.fits) : nlohmann::ordered_json(nullptr);
      j["within_node"] = p.within_node;
      j["trainable"] = p.trainable;
      j["suggested"] = p.suggested;
      arr.push_back(j);
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return Status::ok();
  }

  const auto units = engine::unit_numels(tc.model, 1);
  uint64_t params = 0;
  for (uint64_t n : units) params += n;
  std::printf(
      "kiln plan: %s on %lld ranks: %.2fM parameters (padded), %s, micro_batch %lld x "
      "seq_len %lld, %s\nmemory budget: %s\nmachines: %lld ranks each "
      "(--gpus-per-node); a tensor-parallel group must stay inside one\nlinks: %.0f GB/s "
      "per rank inside a machine, %.0f GB/s between machines (comm s: the busiest rank's "
      "collectives on them, nothing overlapped)\ncompute: %.0f%% of %.0f TFLOP/s per rank "
      "(step s: m + pp - 1 pipeline slots of compute, TP all-reduces and stage sends, then "
      "the data-parallel reduction; bubble: (pp - 1) / (m + pp - 1))\n"
      "memory: the worst rank's (stage: the pipeline stage it is in, and how many "
      "micro-batches it keeps in flight)\n\n",
      a.config.config_file.c_str(), static_cast<long long>(a.world), params / 1e6,
      engine::precision_name(tc.precision), static_cast<long long>(tc.data.micro_batch),
      static_cast<long long>(tc.model.seq_len),
      a.global_batch ? ("global batch " + std::to_string(a.global_batch) +
                        " sequences (m = global / (dp x micro_batch) per layout)")
                           .c_str()
                     : ("grad_accum " + std::to_string(tc.data.grad_accum) +
                        " (m; the global batch grows with dp)")
                           .c_str(),
      budget_note.c_str(), static_cast<long long>(a.per_node), a.intra_gbps, a.inter_gbps,
      100 * a.efficiency, a.peak_tflops);
  std::printf(
      "%3s %3s %4s %4s %-9s %-5s %4s %6s | %11s %11s %11s %11s %11s %11s %11s | %-4s "
      "%-5s %-4s | %6s %10s %9s | %s\n",
      "tp", "pp", "dp", "zero", "recompute", "sched", "m", "stage", "params", "grads", "optimizer",
      "activations", "buffers", "total", "start-up", "fits", "train", "node", "bubble", "step s",
      "comm s", "bytes moved per step (busiest rank)");
  const engine::LayoutPlan* best = nullptr;
  for (const auto& p : plans) {
    std::string comm;
    for (const auto& [k, v] : p.comm_bytes) comm += (comm.empty() ? "" : ", ") + k + " " + gib(v);
    if (comm.empty()) comm = "-";
    const auto& w = p.stages[static_cast<size_t>(p.worst_stage)];
    const std::string stage =
        p.layout.pp > 1 ? std::to_string(w.stage.rank) + "(" + std::to_string(w.slots) + ")" : "-";
    char bubble[16];
    std::snprintf(bubble, sizeof bubble, "%.1f%%", 100 * p.bubble);
    std::printf(
        "%3lld %3lld %4lld %4lld %-9s %-5s %4lld %6s | %11s %11s %11s %11s %11s %11s %11s "
        "| %-4s %-5s %-4s | %6s %10.4g %9.4g | %s%s\n",
        static_cast<long long>(p.layout.tp), static_cast<long long>(p.layout.pp),
        static_cast<long long>(p.layout.dp), static_cast<long long>(p.layout.zero_stage),
        engine::recompute_name(p.layout.recompute),
        p.layout.pp > 1 ? engine::pp_schedule_name(p.layout.schedule) : "-",
        static_cast<long long>(p.micro_batches), stage.c_str(), gib(p.memory.params).c_str(),
        gib(p.memory.grads).c_str(), gib(p.memory.optimizer).c_str(),
        gib(p.memory.activations).c_str(), gib(p.memory.buffers).c_str(),
        gib(p.memory.total()).c_str(), gib(p.memory.startup).c_str(),
        p.fits ? (*p.fits ? "yes" : "no") : "?", p.trainable ? "yes" : "paper",
        p.within_node ? "yes" : "no", bubble, p.step_seconds, p.comm_seconds, comm.c_str(),
        p.suggested ? "  <- suggested" : "");
    if (p.suggested) best = &p;
  }
  if (best) {
    const engine::Layout& l = best->layout;
    std::string flags =
        "--set parallel.tp=" + std::to_string(l.tp) + " --set parallel.pp=" + std::to_string(l.pp);
    if (l.pp > 1)
      flags += std::string(" --set parallel.pp_schedule=") + engine::pp_schedule_name(l.schedule);
    flags += " --set parallel.zero_stage=" + std::to_string(l.zero_stage) +
             " --set activation_checkpointing=" + engine::recompute_name(l.recompute);
    if (a.global_batch) flags += " --set data.grad_accum=" + std::to_string(best->micro_batches);
    std::printf(
        "\nsuggested: %s (mpirun -np %lld)\n  %s\n  why: the most tokens per second "
        "estimated (step s) among the layouts that fit, whose tensor-parallel groups stay "
        "inside one machine (node: yes) and that this version trains (train: yes)\n",
        flags.c_str(), static_cast<long long>(a.world),
        engine::describe_layout(*best, a.per_node, budget).c_str());
    if (l.pp > 1) {
      std::printf("  its stages (per rank):\n");
      for (const auto& st : best->stages) {
        std::string comm;
        for (const auto& [k, v] : st.comm_bytes)
          comm += (comm.empty() ? "" : ", ") + k + " " + gib(v);
        std::printf(
            "    stage %d: blocks %lld-%lld, %d micro-batch%s in flight: model states %s, "
            "activations %s, buffers %s, total %s; per step %s\n",
            st.stage.rank, static_cast<long long>(st.stage.first_block),
            static_cast<long long>(st.stage.end_block - 1), st.slots, st.slots == 1 ? "" : "es",
            gib(st.memory.model_states()).c_str(), gib(st.memory.activations).c_str(),
            gib(st.memory.buffers).c_str(), gib(st.memory.total()).c_str(), comm.c_str());
      }
    }
  } else {
    std::printf("\nno trainable layout fits %s with its tensor-parallel groups inside machines of "
                "%lld ranks: add ranks, or use a smaller micro_batch or model\n",
                budget_note.c_str(), static_cast<long long>(a.per_node));
  }
  return Status::ok();
}

}  // namespace

RunFn add_plan_command(CLI::App& root) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = root.add_subcommand(
      "plan",
      "estimate memory per rank, bytes communicated and time per step for every layout (tensor "
      "parallel, pipeline stages and schedule, data parallel, ZeRO stage, activation "
      "checkpointing) of a training config, and suggest one");
  add_config_flags(cmd, &args->config);
  cmd->add_option("--world", args->world, "number of ranks to plan for")->check(CLI::PositiveNumber);
  cmd->add_option("--memory-per-device", args->memory,
                  "memory of one device, e.g. 80GiB (default on CPU: this machine's memory / world)");
  cmd->add_option("--gpus-per-node", args->per_node,
                  "ranks (devices) per machine: a tensor-parallel group must stay inside one, so "
                  "only layouts whose tp divides it are suggested (default 8)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--intra-node-bandwidth", args->intra_gbps,
                  "GB/s per rank between the ranks of one machine (NVLink; default 300)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
         "--inter-node-bandwidth", args->inter_gbps,
         "GB/s per rank between machines (the network; default 50: 400 Gb/s InfiniBand per "
         "GPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--tp", args->tp, "list only layouts of this tensor-parallel size")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pp", args->pp,
                  "list only layouts of this many pipeline stages (default: every count dividing "
                  "world / tp, at most model.n_layers)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--schedule", args->schedule,
                  "pipeline schedule of the pp > 1 layouts: 1f1b or gpipe (default: both)")
      ->check(CLI::IsMember({"1f1b", "gpipe"}));
  cmd->add_option("--global-batch", args->global_batch,
                  "sequences per optimizer step, the same for every layout: each runs "
                  "global / (dp x micro_batch) micro-batches (default: data.grad_accum each)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--peak-tflops", args->peak_tflops,
                  "peak TFLOP/s of one rank in the run's precision (default 989: H100 SXM dense "
                  "bf16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--compute-efficiency", args->efficiency,
                  "share of the peak the model's kernels reach (default 0.5)")
      ->check(CLI::Range(0.001, 1.0));
  cmd->add_flag("--json", args->json, "print the layouts as a JSON array");
  cmd->footer("Bytes follow docs/DISTRIBUTED.md; example: kiln plan --config configs/train/tiny.yaml --world 4");
  return [args] { return run_plan(*args); };
}

}  // namespace kiln::cli
