#include "engine/config/parallel.h"

#include <fmt/format.h>

#include <array>

#include "engine/config/model.h"
#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, PpSchedule>, 2> kSchedules{
    {{"1f1b", PpSchedule::k1F1B}, {"gpipe", PpSchedule::kGPipe}}};

Status read_pp_layers(const Config& cfg, const std::string& key, ParallelConfig* p) {
  YAML::Node layers = cfg.node(key);
  if (!layers.IsDefined() || layers.IsNull()) return Status::ok();
  if (!layers.IsSequence()) return bad(key, "expected a list of block counts");
  for (const auto& n : layers) {
    int64_t v = 0;
    try {
      v = n.as<int64_t>();
    } catch (const YAML::Exception&) {
      return bad(key, "expected whole numbers of blocks");
    }
    if (v < 1) return bad(key, "every stage needs at least one block");
    // Each entry at most model.n_layers' bound (2^16) and at most parallel.pp's bound (2^12)
    // entries, so the sum in check_parallel_fits cannot overflow (as [2^63 - 1, 2^63 - 1, 6]
    // once did, passing the sum check).
    if (v > (int64_t{1} << 16)) {
      return bad(key, fmt::format("a stage of {} blocks, more than model.n_layers can be", v));
    }
    if (p->pp_layers.size() >= (size_t{1} << 12)) {
      return bad(key, "has more entries than parallel.pp can be");
    }
    p->pp_layers.push_back(v);
  }
  return Status::ok();
}

Status check_parallel(const ParallelConfig& p) {
  if (!p.pp_layers.empty() && static_cast<int64_t>(p.pp_layers.size()) != p.pp) {
    return bad("parallel.pp_layers",
               fmt::format("has {} entries for parallel.pp {}", p.pp_layers.size(), p.pp));
  }
  // Pipeline parallelism (engine/parallel/pipeline.h): what does not combine with it.
  if (p.pp > 1 && p.zero_stage >= 2) {
    return bad(
        "parallel.zero_stage",
        fmt::format("ZeRO-{} with parallel.pp {}: ZeRO-2/3 reduce (and ZeRO-3 gathers) every "
                    "unit once per micro-batch, which a pipeline's interleaved micro-batches "
                    "would multiply by the micro-batch count (DeepSpeed refuses it too); use "
                    "parallel.zero_stage 1 (the optimizer states sharded, gradients reduced "
                    "once per step) or 0",
                    p.zero_stage, p.pp));
  }
  return Status::ok();
}

}  // namespace

const Schema<ParallelConfig>& parallel_schema() {
  using P = ParallelConfig;
  static const Schema<P> schema{
      "parallel",
      {
          integer<P>("tp", &P::tp, 1, 1 << 16),
          integer<P>("zero_stage", &P::zero_stage, 0, 3),
          integer<P>("prefetch", &P::prefetch, 0, 64),
          flag<P>("hierarchical", &P::hierarchical,
                  "data-parallel all-reduce inside each machine first, then across"),
          integer<P>("pp", &P::pp, 1, 1 << 12,
                     "pipeline stages (rank order: tp innermost, then pp, then dp)"),
          choice<P>("pp_schedule", &P::pp_schedule, Names<PpSchedule>(kSchedules), "1f1b | gpipe"),
          custom<P>(
              "pp_layers", [](const P&) { return std::string("[]"); }, read_pp_layers,
              "blocks per stage, e.g. [5, 6, 6, 5]; empty: balanced by cost"),
          // A whole number in the schema (YAML reads "600.5" as a different kind than "600").
          custom<P>(
              "collective_timeout_s",
              [](const P& p) { return fmt::format("{}", p.collective_timeout_s); },
              [](const Config& cfg, const std::string& k, P* p) {
                return read_real(cfg, k, 0.0, 1e7, false, &p->collective_timeout_s);
              },
              "a collective waiting longer stops every rank, naming who is missing (0: off)"),
      },
      check_parallel};
  return schema;
}

const char* pp_schedule_name(PpSchedule s) { return name_of(Names<PpSchedule>(kSchedules), s); }

Result<ParallelConfig> parse_parallel_config(const Config& cfg) {
  return parse_section(cfg, parallel_schema());
}

Status check_parallel_fits(const ParallelConfig& p, const ModelConfig& m) {
  if (!p.pp_layers.empty()) {
    int64_t total = 0;
    for (int64_t v : p.pp_layers) {
      if (v > m.n_layers) {
        return bad("parallel.pp_layers",
                   fmt::format("a stage of {} blocks, model.n_layers is {}", v, m.n_layers));
      }
      total += v;
    }
    if (total != m.n_layers) {
      return bad("parallel.pp_layers",
                 fmt::format("sums to {} blocks, model.n_layers is {}", total, m.n_layers));
    }
  }
  if (p.pp > m.n_layers) {
    return bad("parallel.pp",
               fmt::format("{} stages for {} blocks (each stage needs a block)", p.pp, m.n_layers));
  }
  return Status::ok();
}

}  // namespace kiln::engine
