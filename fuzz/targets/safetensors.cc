// Fuzz target: safetensors checkpoint files (engine/checkpoint/safetensors.h). Invariant: every
// tensor of an accepted file lies inside it (all its bytes are read) and its size matches dtype and
// shape.
#include "engine/checkpoint/safetensors.h"

#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string path = fuzz::write_scratch("model.safetensors", fuzz::as_view(data, size));
  auto file = engine::SafetensorsFile::read(path);
  if (!file.is_ok()) return 0;
  for (const std::string& name : file->names()) {
    auto view = file->view(name);
    FUZZ_REQUIRE(view.is_ok());
    size_t esize = engine::safetensors_dtype_size(view->dtype);
    FUZZ_REQUIRE(esize != 0);
    uint64_t count = 1;
    for (int64_t d : view->shape) {
      FUZZ_REQUIRE(d >= 0 && !__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count));
    }
    uint64_t bytes = 0;
    FUZZ_REQUIRE(!__builtin_mul_overflow(count, esize, &bytes) && bytes == view->bytes);
    const auto* p = static_cast<const unsigned char*>(view->data);
    unsigned sum = 0;
    for (size_t i = 0; i < view->bytes; ++i) sum += p[i];  // ASan: must be inside the file
    (void)sum;
    FUZZ_REQUIRE(file->get(name, view->dtype, view->shape).is_ok());
  }
  return 0;
}
