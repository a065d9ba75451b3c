#include "engine/data/data_source.h"

namespace kiln::engine {

std::string listed_samples(const std::vector<std::string>& samples) {
  std::string listed;
  for (size_t i = 0; i < samples.size() && i < 16; ++i) listed += (i ? ", " : "") + samples[i];
  if (samples.size() > 16) listed += ", ... (" + std::to_string(samples.size()) + " in all)";
  return listed;
}

Result<std::unique_ptr<DataSource>> open_loader_source(const DataConfig& data,
                                                       const ModelConfig& model, uint64_t seed,
                                                       DataRank rank);

Result<std::unique_ptr<DataSource>> open_data_source(const DataConfig& data,
                                                     const ModelConfig& model, uint64_t seed,
                                                     DataRank rank) {
  if (data.manifest.empty()) {
    std::unique_ptr<DataSource> s = make_synthetic_source(data, model, seed, rank);
    if (!data.mixture.empty()) KILN_RETURN_IF_ERROR(s->set_weights(data.mixture));
    return s;
  }
  return open_loader_source(data, model, seed, rank);
}

Status check_token_ids(const MicroBatch& b, int64_t vocab) {
  for (size_t i = 0; i < b.inputs.size(); ++i) {
    // Targets are token ids or -1 (padding, ignored by the loss); inputs are token ids.
    const bool bad_input = b.inputs[i] < 0 || b.inputs[i] >= vocab;
    if (!bad_input && b.targets[i] >= -1 && b.targets[i] < vocab) continue;
    const int64_t id = bad_input ? b.inputs[i] : b.targets[i];
    return Status::data(
        "token id " + std::to_string(id) + " (as " + (bad_input ? "input" : "target") + " " +
        std::to_string(i) + " of a batch of " + std::to_string(b.inputs.size()) +
        ") is outside the model's vocabulary (model.vocab_size " + std::to_string(vocab) + ")" +
        (b.samples.empty() ? std::string() : "; samples: " + listed_samples(b.samples)));
  }
  return Status::ok();
}

}  // namespace kiln::engine
