#include "engine/data/data_source.h"

namespace kiln::engine {

std::string listed_samples(const std::vector<std::string>& samples) {
  std::string listed;
  for (size_t i = 0; i < samples.size() && i < 16; ++i) listed += (i ? ", " : "") + samples[i];
  if (samples.size() > 16) listed += ", ... (" + std::to_string(samples.size()) + " in all)";
  return listed;
}

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
