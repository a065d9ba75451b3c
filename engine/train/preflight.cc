#include "engine/train/preflight.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "common/host_memory.h"
#include "common/text.h"
#include "engine/parallel/layout_plan.h"

namespace kiln::engine {
namespace {

// The --set flags that turn this run's layout into `to` (only what differs).
std::string flags_for(const TrainConfig& config, const Layout& to) {
  std::string out;
  auto add = [&](const std::string& f) { out += (out.empty() ? "" : " ") + f; };
  if (to.tp != config.parallel.tp) add(fmt::format("--set parallel.tp={}", to.tp));
  if (to.pp != config.parallel.pp) add(fmt::format("--set parallel.pp={}", to.pp));
  if (to.pp > 1 && to.schedule != config.parallel.pp_schedule) {
    add(fmt::format("--set parallel.pp_schedule={}", pp_schedule_name(to.schedule)));
  }
  if (to.zero_stage != config.parallel.zero_stage) {
    add(fmt::format("--set parallel.zero_stage={}", to.zero_stage));
  }
  if (to.recompute != config.activation_checkpointing) {
    add(fmt::format("--set activation_checkpointing={}", recompute_name(to.recompute)));
  }
  return out;
}

// Up to three layouts of `world` ranks that fit `usable` and run in this version (the planner's
// suggestion first), as flags with their peak.
std::vector<std::string> fitting_layouts(const TrainConfig& config, int64_t world,
                                         uint64_t usable) {
  std::vector<std::string> out;
  auto plans = plan_layouts(config, world, usable, 0);
  if (!plans.is_ok()) return out;
  std::vector<const LayoutPlan*> fit;
  for (const LayoutPlan& p : *plans) {
    if (p.trainable && p.fits.value_or(false)) fit.push_back(&p);
  }
  std::stable_sort(fit.begin(), fit.end(), [](const LayoutPlan* a, const LayoutPlan* b) {
    return a->suggested > b->suggested;
  });
  for (const LayoutPlan* p : fit) {
    if (out.size() == 3) break;
    const std::string flags = flags_for(config, p->layout);
    out.push_back(fmt::format("{} (about {})", flags.empty() ? "as configured" : flags,
                              human_bytes(p->memory.peak())));
  }
  return out;
}

}  // namespace

MemoryBudget budget_for(const TrainConfig& config, Runtime& runtime, int ranks_on_machine) {
  MemoryBudget b;
  if (config.memory.budget) {
    b.bytes = *config.memory.budget;
    b.source = "memory.budget";
    return b;
  }
  const DeviceMemory dm = runtime.memory();
  if (dm.total > 0) {  // a device with its own memory
    b.bytes = dm.total > dm.used_by_process ? dm.total - dm.used_by_process : 0;
    b.source = "free memory of " + runtime.describe();
    return b;
  }
  const HostMemory host = host_memory();
  b.known = host.known;
  const int ranks = std::max(1, ranks_on_machine);
  b.bytes = host.available / static_cast<uint64_t>(ranks);
  b.source = host.source + " on this machine" +
             (ranks > 1 ? fmt::format(", shared by its {} ranks", ranks) : std::string());
  return b;
}

Status check_memory(const TrainConfig& config, int64_t world, const MemoryBudget& budget,
                    int pp_rank) {
  // (before the estimate: its byte counts must not wrap; with memory.check off too)
  KILN_RETURN_IF_ERROR(check_plan_sizes(config));
  if (!config.memory.check || !budget.known) return Status::ok();
  const int64_t tp = std::max<int64_t>(1, config.parallel.tp);
  const int64_t pp = std::clamp<int64_t>(config.parallel.pp, 1, config.model.n_layers);
  const Layout layout{tp,
                      std::max<int64_t>(1, world / (tp * pp)),
                      config.parallel.zero_stage,
                      config.activation_checkpointing,
                      pp,
                      config.parallel.pp_schedule};
  const LayoutPlan plan = plan_layout(config, layout);
  const int stage = pp_rank >= 0 && pp_rank < pp ? pp_rank : plan.worst_stage;
  const StagePlan& sp = plan.stages[static_cast<size_t>(stage)];
  const RankMemory& m = sp.memory;
  const uint64_t need = m.peak();
  const auto usable =
      static_cast<uint64_t>(static_cast<double>(budget.bytes) * (1.0 - config.memory.margin));
  if (need <= usable) return Status::ok();

  const std::string who =
      pp == 1
          ? std::string("per rank")
          : fmt::format(
                "per rank of pipeline stage {} of {} (blocks {}-{}{}, {} micro-batch{} "
                "in flight under {})",
                stage, pp, sp.stage.first_block, sp.stage.end_block - 1,
                sp.stage.first()  ? ", the embeddings"
                : sp.stage.last() ? ", the head"
                                  : "",
                sp.slots, sp.slots == 1 ? "" : "es", pp_schedule_name(config.parallel.pp_schedule));
  std::string msg = fmt::format(
      "this run needs about {} {} (parameters {}, gradients {}, optimizer states {}, "
      "activations {}, buffers {}; start-up peak {}), but a rank has {} ({}; {:.0f}% held back, "
      "memory.margin)",
      human_bytes(need), who, human_bytes(m.params), human_bytes(m.grads), human_bytes(m.optimizer),
      human_bytes(m.activations), human_bytes(m.buffers), human_bytes(m.startup),
      human_bytes(usable), budget.source, 100.0 * config.memory.margin);
  const std::vector<std::string> here = fitting_layouts(config, world, usable);
  if (!here.empty()) {
    msg += fmt::format(". Layouts of {} rank{} that fit: ", world, world == 1 ? "" : "s");
    for (size_t i = 0; i < here.size(); ++i) msg += (i ? "; " : "") + here[i];
  } else {
    msg += fmt::format(". No layout of {} rank{} fits", world, world == 1 ? "" : "s");
  }
  // More ranks, each with this budget (CPU ranks on one machine share it: more machines).
  for (int64_t w = world * 2; w <= world * 4096; w *= 2) {
    const std::vector<std::string> more = fitting_layouts(config, w, usable);
    if (more.empty()) continue;
    msg += fmt::format("; with {} ranks of this budget (kiln plan --world {}): {}", w, w, more[0]);
    break;
  }
  msg +=
      ". Or a smaller model (model.d_model, model.n_layers, data.micro_batch). To run anyway: "
      "--set memory.check=false, or --set memory.budget=SIZE";
  return Status::config(msg).with_key("memory");
}

}  // namespace kiln::engine
