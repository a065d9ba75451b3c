#include "engine/config/precision.h"

#include <array>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, Precision>, 3> kPrecisions{
    {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}}};
constexpr int64_t kBig = int64_t{1} << 40;

}  // namespace

const Schema<PrecisionKey>& precision_schema() {
  static const Schema<PrecisionKey> schema{
      "",
      {choice<PrecisionKey>("precision", &PrecisionKey::value, Names<Precision>(kPrecisions),
                            "fp32 | bf16 | fp16")}};
  return schema;
}

const Schema<LossScaleConfig>& loss_scale_schema() {
  using L = LossScaleConfig;
  static const Schema<L> schema{
      "loss_scale",
      {
          real<L>("initial", &L::initial, 0.0, 1e30, "", Open::kLow),
          real<L>("growth_factor", &L::growth_factor, 1.0, 1e6),
          real<L>("backoff_factor", &L::backoff_factor, 0.0, 1.0, "", Open::kLow),
          integer<L>("growth_interval", &L::growth_interval, 1, kBig),
          integer<L>("hysteresis", &L::hysteresis, 1, 1 << 20),
          real<L>("min_scale", &L::min_scale, 0.0, 1e30, "", Open::kLow),
      },
      [](const L& ls) {
        if (ls.min_scale > ls.initial) {
          return bad("loss_scale.min_scale", "must not exceed loss_scale.initial");
        }
        return Status::ok();
      }};
  return schema;
}

const char* precision_name(Precision p) { return name_of(Names<Precision>(kPrecisions), p); }

Result<Precision> parse_precision(const Config& cfg) {
  KILN_ASSIGN_OR_RETURN(PrecisionKey k, parse_section(cfg, precision_schema()));
  return k.value;
}

Result<LossScaleConfig> parse_loss_scale_config(const Config& cfg) {
  return parse_section(cfg, loss_scale_schema());
}

}  // namespace kiln::engine
