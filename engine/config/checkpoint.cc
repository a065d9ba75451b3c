#include "engine/config/checkpoint.h"

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

const Schema<CheckpointConfig>& checkpoint_schema() {
  using C = CheckpointConfig;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const Schema<C> schema{"checkpoint",
                                {
                                    integer<C>("every_steps", &C::every_steps, 0, kBig),
                                    integer<C>("keep_last", &C::keep_last, 0, kBig),
                                    flag<C>("at_end", &C::at_end),
                                }};
  return schema;
}

Result<CheckpointConfig> parse_checkpoint_config(const Config& cfg) {
  return parse_section(cfg, checkpoint_schema());
}

}  // namespace kiln::engine
