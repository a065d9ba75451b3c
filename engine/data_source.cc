#include "engine/data_source.h"

namespace kiln::engine {

Result<std::unique_ptr<DataSource>> open_loader_source(const TrainConfig& config, DataRank rank);

Result<std::unique_ptr<DataSource>> open_data_source(const TrainConfig& config, DataRank rank) {
  if (config.data.manifest.empty()) {
    std::unique_ptr<DataSource> s = make_synthetic_source(config, rank);
    if (!config.data.mixture.empty()) KILN_RETURN_IF_ERROR(s->set_weights(config.data.mixture));
    return s;
  }
  return open_loader_source(config, rank);
}

}  // namespace kiln::engine
