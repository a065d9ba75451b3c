#include "engine/config/memory.h"

#include <array>

#include "common/text.h"
#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, Recompute>, 3> kModes{
    {{"none", Recompute::kNone}, {"selective", Recompute::kSelective}, {"full", Recompute::kFull}}};

// memory.budget: a byte size ("20GiB"); empty: unset.
Status read_budget(const Config& cfg, const std::string& key, MemoryConfig* m) {
  KILN_ASSIGN_OR_RETURN(std::string budget, cfg.get<std::string>(key));
  if (budget.empty()) return Status::ok();
  auto b = parse_byte_size(budget);
  if (!b.is_ok()) return Status::config(b.status().message()).with_key(key);
  if (*b == 0) return Status::config("must be more than 0 bytes").with_key(key);
  m->budget = *b;
  return Status::ok();
}

}  // namespace

const Schema<RecomputeKey>& recompute_schema() {
  static const Schema<RecomputeKey> schema{
      "",
      {choice<RecomputeKey>("activation_checkpointing", &RecomputeKey::value,
                            Names<Recompute>(kModes), "none | selective | full")}};
  return schema;
}

const Schema<MemoryConfig>& memory_schema() {
  using M = MemoryConfig;
  static const Schema<M> schema{
      "memory",
      {
          flag<M>("check", &M::check,
                  "refuse a run whose estimated peak per rank exceeds what the rank has"),
          real<M>("margin", &M::margin, 0.0, 0.9,
                  "the share of the budget held back for what the estimate leaves out"),
          custom<M>(
              "budget", [](const M&) { return std::string("\"\""); }, read_budget,
              "bytes per rank to check against (\"20GiB\"); empty: what the machine has"),
      }};
  return schema;
}

const char* recompute_name(Recompute r) { return name_of(Names<Recompute>(kModes), r); }

Result<Recompute> parse_activation_checkpointing(const Config& cfg) {
  KILN_ASSIGN_OR_RETURN(RecomputeKey k, parse_section(cfg, recompute_schema()));
  return k.value;
}

Result<MemoryConfig> parse_memory_config(const Config& cfg) {
  return parse_section(cfg, memory_schema());
}

}  // namespace kiln::engine
