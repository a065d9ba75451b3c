// Fuzz target: the live mixture control file RUN/control/mixture.json
// (engine/mixing/control_file.h), with and without a set of known domains. Invariant: accepted
// weights write out as JSON that parses back to the same weights.
#include "engine/mixing/control_file.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string text(fuzz::as_view(data, size));
  for (const std::set<std::string>& known :
       {std::set<std::string>{}, std::set<std::string>{"web", "code", "books"}}) {
    auto w = engine::parse_mixture_json(text, "mixture.json", known);
    if (!w.is_ok()) continue;
    std::string out = engine::mixture_to_json(*w);
    auto back = engine::parse_mixture_json(out, "again.json", known);
    FUZZ_REQUIRE(back.is_ok());
    FUZZ_REQUIRE(engine::mixture_to_json(*back) == out);
  }
  return 0;
}
