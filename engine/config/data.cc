#include "engine/config/data.h"

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

// data.mixture: {domain: weight} (an open path: any domain names).
Status read_mixture(const Config& cfg, const std::string& key, DataConfig* d) {
  YAML::Node mix = cfg.node(key);
  if (!mix.IsDefined() || mix.IsNull()) return Status::ok();
  if (!mix.IsMap()) return bad(key, "expected a mapping domain: weight");
  for (const auto& kv : mix) {
    const std::string name = kv.first.as<std::string>();
    try {
      d->mixture.set(name, kv.second.as<double>());
    } catch (const YAML::Exception&) {
      return bad(key + "." + name, "expected a number");
    }
  }
  loader::WeightRules rules;
  rules.key = key;
  if (!d->mixture.empty()) KILN_RETURN_IF_ERROR(d->mixture.check(rules));
  return Status::ok();
}

}  // namespace

const Schema<DataConfig>& data_schema() {
  using D = DataConfig;
  static const Schema<D> schema{
      "data",
      {
          text<D>("manifest", &D::manifest, "empty: synthetic data"),
          integer<D>("micro_batch", &D::micro_batch, 1, 1 << 20),
          integer<D>("grad_accum", &D::grad_accum, 1, 1 << 20),
          custom<D>(
              "mixture", [](const D&) { return std::string("{}"); }, read_mixture),
          integer<D>("prefetch_depth", &D::prefetch_depth, 1, 1 << 12),
          integer<D>("workers", &D::workers, 1, 256),
          flag<D>("prefetch_next_step", &D::prefetch_next_step,
                  "draw and upload the next step's batches while a step computes"),
          integer<D>("partitions", &D::partitions, 0, 1 << 24,
                     "canonical loader partitions; 0: the global batch (docs/LOADER.md)"),
          flag<D>("repartition", &D::repartition,
                  "resume on a layout the partitions do not allow, in another data order"),
      }};
  return schema;
}

Result<DataConfig> parse_data_config(const Config& cfg) {
  return parse_section(cfg, data_schema());
}

}  // namespace kiln::engine
