#include "engine/data_source.h"

namespace kiln::engine {

Result<std::unique_ptr<DataSource>> open_loader_source(const TrainConfig& config);

Result<std::unique_ptr<DataSource>> open_data_source(const TrainConfig& config) {
  if (config.data.manifest.empty()) {
    std::unique_ptr<DataSource> s = make_synthetic_source(config);
    if (!config.data.mixture.empty()) KILN_RETURN_IF_ERROR(s->set_weights(config.data.mixture));
    return s;
  }
  return open_loader_source(config);
}

}  // namespace kiln::engine
