// Fuzz target: .npy token arrays (format/npy.h). Invariants: an accepted array's data lies
// inside the input, decoding gives the same values, and re-encoding them parses back equal.
#include "format/npy.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view in = fuzz::as_view(data, size);
  Result<NpyView> view = npy_parse(in);
  std::vector<uint32_t> values;
  Status st = npy_decode(in, &values);
  FUZZ_REQUIRE(st.is_ok() == view.is_ok());
  if (!view.is_ok()) {
    FUZZ_REQUIRE(values.empty());
    return 0;
  }
  size_t item = npy_itemsize(view->dtype);
  FUZZ_REQUIRE(view->data >= in.data() && view->data + view->size * item == in.data() + in.size());
  FUZZ_REQUIRE(values.size() == view->size);
  for (uint64_t i = 0; i < view->size; ++i) FUZZ_REQUIRE(values[i] == view->at(i));
  std::string again = npy_encode(values, view->dtype);
  std::vector<uint32_t> back;
  FUZZ_REQUIRE(npy_decode(again, &back).is_ok());
  FUZZ_REQUIRE(back == values);
  return 0;
}
