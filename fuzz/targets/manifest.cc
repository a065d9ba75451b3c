// Fuzz target: manifest.json (format/manifest.h). Invariant: an accepted manifest serialises to
// bytes that read back to the same bytes (the writer and the reader agree).
#include "format/manifest.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  Result<Manifest> m = manifest_from_json(std::string(fuzz::as_view(data, size)), "fuzz.json");
  if (!m.is_ok()) {
    FUZZ_REQUIRE(m.status().file() == "fuzz.json");
    return 0;
  }
  std::string once = manifest_to_json(*m);
  Result<Manifest> back = manifest_from_json(once, "again.json");
  FUZZ_REQUIRE(back.is_ok());
  FUZZ_REQUIRE(manifest_to_json(*back) == once);
  (void)select_split(*m, true);
  (void)select_split(*m, false);
  return 0;
}
