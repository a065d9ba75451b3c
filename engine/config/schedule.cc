#include "engine/config/schedule.h"

#include <array>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, ScheduleKind>, 3> kKinds{
    {{"constant", ScheduleKind::kConstant},
     {"cosine", ScheduleKind::kCosine},
     {"wsd", ScheduleKind::kWsd}}};
constexpr std::array<std::pair<const char*, DecayShape>, 3> kShapes{
    {{"linear", DecayShape::kLinear},
     {"cosine", DecayShape::kCosine},
     {"1-sqrt", DecayShape::kOneMinusSqrt}}};
constexpr int64_t kBig = int64_t{1} << 40;

}  // namespace

const Schema<ScheduleConfig>& schedule_schema() {
  using S = ScheduleConfig;
  static const Schema<S> schema{
      "schedule",
      {
          choice<S>("type", &S::kind, Names<ScheduleKind>(kKinds), "constant | cosine | wsd"),
          integer<S>("warmup_steps", &S::warmup_steps, 0, kBig),
          integer<S>("total_steps", &S::total_steps, 0, kBig, "0: run.steps"),
          real<S>("min_lr_ratio", &S::min_lr_ratio, 0.0, 1.0),
          real<S>("decay_fraction", &S::decay_fraction, 0.0, 1.0),
          choice<S>("decay_shape", &S::decay_shape, Names<DecayShape>(kShapes),
                    "wsd: linear | cosine | 1-sqrt"),
      }};
  return schema;
}

Result<ScheduleConfig> parse_schedule_config(const Config& cfg) {
  return parse_section(cfg, schedule_schema());
}

}  // namespace kiln::engine
