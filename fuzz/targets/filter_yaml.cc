// Fuzz target: the `filters:` list of a prep config (dataprep/filter/filter.h
// FilterChain::from_yaml): the input is the YAML of the list. Invariants on an accepted chain:
// running it on a fixed text and on the input itself gives an outcome that is consistent (a
// drop names a filter of the chain; a kept text is valid to describe), and running it again on
// the same text gives the same outcome (filters are deterministic).
#include <yaml-cpp/yaml.h>

#include "dataprep/filter/filter.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::quiet_logs();
  YAML::Node node;
  try {
    node = YAML::Load(std::string(fuzz::as_view(data, size)));
  } catch (const std::exception&) {
    return 0;
  }
  auto chain = prep::filter::FilterChain::from_yaml(node, "filters");
  if (!chain.is_ok()) return 0;
  const auto& c = **chain;
  for (std::string_view base :
       {std::string_view("The quick brown fox jumps over the lazy dog. It was a sunny day.\n"
                         "Contact me at someone@example.com or call 555-123-4567.\n"
                         "\xe4\xb8\xad\xe6\x96\x87 text, lorem ipsum dolor sit amet."),
        fuzz::as_view(data, std::min<size_t>(size, 512))}) {
    std::string a(base), b(base);
    const auto oa = c.run(&a, "http://www.example.com/page");
    const auto ob = c.run(&b, "http://www.example.com/page");
    FUZZ_REQUIRE(oa.keep == ob.keep && oa.dropped_by == ob.dropped_by && a == b);
    if (!oa.keep) {
      FUZZ_REQUIRE(oa.dropped_by >= 0 && static_cast<size_t>(oa.dropped_by) < c.size());
      (void)c.describe(oa);
    }
  }
  return 0;
}
