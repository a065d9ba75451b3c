// Fuzz target: the `kiln train` YAML config with --set overrides (engine/config/train_config.h over
// common/config.h). The input is the YAML file, then optionally the line "#kiln-fuzz-sets"
// followed by one "key.path=value" override per line. Invariant: a config that validates dumps
// to YAML that loads and validates again.
#include "engine/config/train_config.h"

#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::quiet_logs();
  auto [yaml, sets_text] = fuzz::split_two(fuzz::as_view(data, size), "\n#kiln-fuzz-sets\n");
  std::vector<std::string> sets;
  while (!sets_text.empty()) {
    size_t nl = sets_text.find('\n');
    std::string_view line = sets_text.substr(0, nl);
    if (!line.empty()) sets.emplace_back(line);
    if (nl == std::string_view::npos) break;
    sets_text.remove_prefix(nl + 1);
  }
  std::string path = fuzz::write_scratch("train.yaml", yaml);
  auto cfg = engine::load_train_config(path, sets);
  if (!cfg.is_ok()) return 0;
  auto parsed = engine::parse_train_config(*cfg);
  if (!parsed.is_ok()) return 0;
  std::string again_path = fuzz::write_scratch("again.yaml", cfg->dump());
  auto again = engine::load_train_config(again_path, {});
  FUZZ_REQUIRE(again.is_ok());
  FUZZ_REQUIRE(engine::parse_train_config(*again).is_ok());
  return 0;
}
