#include "engine/config/eval.h"

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

Status read_tasks(const Config& cfg, const std::string& key, EvalConfig* e) {
  YAML::Node tasks = cfg.node(key);
  if (!tasks.IsDefined() || tasks.IsNull()) return Status::ok();
  if (!tasks.IsSequence()) return bad(key, "expected a list of task files");
  for (const auto& n : tasks) {
    if (!n.IsScalar() || n.as<std::string>().empty()) return bad(key, "expected file names");
    e->tasks.push_back(n.as<std::string>());
  }
  return Status::ok();
}

}  // namespace

const Schema<EvalConfig>& eval_schema() {
  using E = EvalConfig;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const Schema<E> schema{
      "eval",
      {
          integer<E>("every_steps", &E::every_steps, 0, kBig,
                     "per-domain validation loss every N steps (0: off)"),
          integer<E>("sequences_per_domain", &E::sequences_per_domain, 1, 1 << 20),
          custom<E>(
              "tasks", [](const E&) { return std::string("[]"); }, read_tasks,
              "multiple-choice task files (JSONL {context, choices, label}) scored then too"),
      }};
  return schema;
}

Result<EvalConfig> parse_eval_config(const Config& cfg) {
  return parse_section(cfg, eval_schema());
}

}  // namespace kiln::engine
