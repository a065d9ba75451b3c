#include "engine/config/optimizer.h"

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

// optimizer.betas: [beta1, beta2], each in [0, 1).
Status read_betas(const Config& cfg, const std::string& key, OptimizerConfig* o) {
  YAML::Node betas = cfg.node(key);
  if (!betas.IsSequence() || betas.size() != 2) {
    return bad(key, "expected a list of two numbers, e.g. [0.9, 0.95]");
  }
  double b[2];
  for (int i = 0; i < 2; ++i) {
    try {
      b[i] = betas[i].as<double>();
    } catch (const YAML::Exception&) {
      return bad(key, "expected numbers");
    }
    if (!(b[i] >= 0.0 && b[i] < 1.0)) return bad(key, "each beta must be in [0, 1)");
  }
  o->beta1 = static_cast<float>(b[0]);
  o->beta2 = static_cast<float>(b[1]);
  return Status::ok();
}

}  // namespace

const Schema<OptimizerConfig>& optimizer_schema() {
  using O = OptimizerConfig;
  static const Schema<O> schema{
      "optimizer",
      {
          real<O>("lr", &O::lr, 0.0, 10.0),
          custom<O>(
              "betas",
              [](const O& o) { return "[" + yaml_real(o.beta1) + ", " + yaml_real(o.beta2) + "]"; },
              read_betas),
          real<O>("eps", &O::eps, 0.0, 1.0, "", Open::kLow),
          real<O>("weight_decay", &O::weight_decay, 0.0, 10.0),
          real<O>("clip_grad", &O::clip_grad, 0.0, 1e12),
          flag<O>("decay_norms_and_biases", &O::decay_norms_and_biases),
      }};
  return schema;
}

Result<OptimizerConfig> parse_optimizer_config(const Config& cfg) {
  return parse_section(cfg, optimizer_schema());
}

}  // namespace kiln::engine
