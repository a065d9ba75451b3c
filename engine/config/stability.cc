#include "engine/config/stability.h"

#include <array>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, SpikeAction>, 3> kActions{
    {{"warn", SpikeAction::kWarn},
     {"skip", SpikeAction::kSkip},
     {"rollback", SpikeAction::kRollback}}};

}  // namespace

const Schema<StabilityConfig>& stability_schema() {
  using S = StabilityConfig;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const Schema<S> schema{
      "stability",
      {
          flag<S>("skip_nonfinite", &S::skip_nonfinite),
          integer<S>(
              "spike.window", [](auto& s) -> auto& { return s.spike.window; }, 2, 1 << 20,
              "clean steps the z-scores are measured against"),
          real<S>(
              "spike.z_loss", [](auto& s) -> auto& { return s.spike.z_loss; }, 0.0, 1e6, "",
              Open::kLow),
          real<S>(
              "spike.z_grad", [](auto& s) -> auto& { return s.spike.z_grad; }, 0.0, 1e6, "",
              Open::kLow),
          integer<S>(
              "spike.warmup_steps", [](auto& s) -> auto& { return s.spike.warmup_steps; }, 0, kBig,
              "no spike detection before this step"),
          choice<S>(
              "spike.action", [](auto& s) -> auto& { return s.spike.action; },
              Names<SpikeAction>(kActions), "warn | skip | rollback"),
          integer<S>(
              "spike.max_rollbacks", [](auto& s) -> auto& { return s.spike.max_rollbacks; }, 0,
              1 << 20, "then spikes are skipped"),
          integer<S>("max_nonfinite_in_row", &S::max_nonfinite_in_row, 0, kBig,
                     "stop with a diagnosis after this many inf/NaN steps in a row (0: never)"),
          real<S>("bad_batch_token_fraction", &S::bad_batch_token_fraction, 0.0, 1.0,
                  "skip a batch one token id dominates beyond this (0: off)"),
          integer<S>("layer_stats_every", &S::layer_stats_every, 0, kBig,
                     "grad_norm_layers + update_ratio every N steps (0: off)"),
          real<S>("layer_clip.max_norm", &S::layer_clip_max_norm, 0.0, 1e12,
                  "clip a layer whose gradient norm exceeds this (0: off)"),
          real<S>("layer_clip.factor", &S::layer_clip_factor, 0.0, 1e12,
                  "... or exceeds factor x its moving average (0: off)"),
          steps<S>("inject_overflow_at", &S::inject_overflow_at),
          steps<S>("inject_lr_burst_at", &S::inject_lr_burst_at),
          real<S>("lr_burst_factor", &S::lr_burst_factor, 0.0, 1e12),
          steps<S>("inject_bad_batch_at", &S::inject_bad_batch_at),
      },
      [](const S& st) {
        if (st.layer_clip_factor > 0 && st.layer_clip_factor <= 1) {
          return bad("stability.layer_clip.factor", "must be 0 (off) or above 1");
        }
        return Status::ok();
      }};
  return schema;
}

const char* spike_action_name(SpikeAction a) { return name_of(Names<SpikeAction>(kActions), a); }

Result<StabilityConfig> parse_stability_config(const Config& cfg) {
  return parse_section(cfg, stability_schema());
}

}  // namespace kiln::engine
