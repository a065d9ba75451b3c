// kiln plan --config FILE --world N [--memory-per-device SIZE] [--gpus-per-node N] [--json]
//           [--set k=v ...]
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/text.h"
#include "engine/parallel/layout_plan.h"
#include "engine/train/train_config.h"
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
  const engine::Links links{a.intra_gbps * 1e9, a.inter_gbps * 1e9};
  KILN_ASSIGN_OR_RETURN(auto plans, engine::plan_layouts(tc, a.world, budget, a.per_node, links));

  if (a.json) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const auto& p : plans) {
      nlohmann::ordered_json j;
      j["tp"] = p.layout.tp;
      j["dp"] = p.layout.dp;
      j["zero_stage"] = p.layout.zero_stage;
      j["activation_checkpointing"] = engine::recompute_name(p.layout.recompute);
      j["bytes_per_rank"] = {{"params", p.memory.params},         {"grads", p.memory.grads},
                             {"optimizer", p.memory.optimizer},   {"activations", p.memory.activations},
                             {"buffers", p.memory.buffers},       {"total", p.memory.total()},
                             {"startup", p.memory.startup}};
      nlohmann::ordered_json comm = nlohmann::ordered_json::object();
      for (const auto& [k, v] : p.comm_bytes) comm[k] = v;
      j["comm_bytes_per_step"] = comm;
      j["comm_seconds_per_step"] = p.comm_seconds;
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
  std::printf("kiln plan: %s on %lld ranks: %.2fM parameters (padded), %s, micro_batch %lld x "
              "seq_len %lld, grad_accum %lld\nmemory budget: %s\nmachines: %lld ranks each "
              "(--gpus-per-node); a tensor-parallel group must stay inside one\nlinks: %.0f GB/s "
              "per rank inside a machine, %.0f GB/s between machines (comm s: the step's "
              "collectives on them, nothing overlapped)\n\n",
              a.config.config_file.c_str(), static_cast<long long>(a.world), params / 1e6,
              engine::precision_name(tc.precision), static_cast<long long>(tc.data.micro_batch),
              static_cast<long long>(tc.model.seq_len), static_cast<long long>(tc.data.grad_accum),
              budget_note.c_str(), static_cast<long long>(a.per_node), a.intra_gbps, a.inter_gbps);
  std::printf("%3s %4s %4s %-9s | %11s %11s %11s %11s %11s %11s %11s | %-4s %-5s %-4s | %9s | %s\n",
              "tp", "dp", "zero", "recompute", "params", "grads", "optimizer", "activations",
              "buffers", "total", "start-up", "fits", "train", "node", "comm s", "bytes moved per step");
  const engine::LayoutPlan* best = nullptr;
  for (const auto& p : plans) {
    std::string comm;
    for (const auto& [k, v] : p.comm_bytes) comm += (comm.empty() ? "" : ", ") + k + " " + gib(v);
    if (comm.empty()) comm = "-";
    std::printf("%3lld %4lld %4lld %-9s | %11s %11s %11s %11s %11s %11s %11s | %-4s %-5s %-4s | %9.4f | %s%s\n",
                static_cast<long long>(p.layout.tp), static_cast<long long>(p.layout.dp),
                static_cast<long long>(p.layout.zero_stage),
                engine::recompute_name(p.layout.recompute), gib(p.memory.params).c_str(),
                gib(p.memory.grads).c_str(), gib(p.memory.optimizer).c_str(),
                gib(p.memory.activations).c_str(), gib(p.memory.buffers).c_str(),
                gib(p.memory.total()).c_str(), gib(p.memory.startup).c_str(),
                p.fits ? (*p.fits ? "yes" : "no") : "?",
                p.trainable ? "yes" : "paper", p.within_node ? "yes" : "no", p.comm_seconds,
                comm.c_str(),
                p.suggested ? "  <- suggested" : "");
    if (p.suggested) best = &p;
  }
  if (best) {
    std::printf("\nsuggested: --set parallel.tp=%lld --set parallel.zero_stage=%lld --set "
                "activation_checkpointing=%s (mpirun -np %lld): the least recomputation, then "
                "the least time in collectives per step (bytes over the links they cross), among "
                "the layouts that fit, whose tensor-parallel "
                "groups stay inside one machine (node: yes) and that this version trains "
                "(train: yes)\n",
                static_cast<long long>(best->layout.tp),
                static_cast<long long>(best->layout.zero_stage),
                engine::recompute_name(best->layout.recompute), static_cast<long long>(a.world));
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
      "estimate memory per rank and bytes communicated per step for every layout (tensor "
      "parallel, data parallel, ZeRO stage, activation checkpointing) of a training config");
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
  cmd->add_option("--inter-node-bandwidth", args->inter_gbps,
                  "GB/s per rank between machines (the network; default 25: 200 Gb/s per GPU)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", args->json, "print the layouts as a JSON array");
  cmd->footer("Bytes follow docs/DISTRIBUTED.md; example: kiln plan --config configs/train/tiny.yaml --world 4");
  return [args] { return run_plan(*args); };
}

}  // namespace kiln::cli
