// Fuzz target: safetensors checkpoint files (engine/checkpoint/safetensors.h). Invariants: every
// tensor of an accepted file lies inside it (all its bytes are read) and its size matches dtype and
// shape; the tensors' byte ranges are disjoint and together cover the data section exactly (the
// format's rule); read_header accepts the same file with the same tensors.
#include "engine/checkpoint/safetensors.h"

#include <algorithm>
#include <vector>

#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string path = fuzz::write_scratch("model.safetensors", fuzz::as_view(data, size));
  auto file = engine::SafetensorsFile::read(path);
  if (!file.is_ok()) return 0;
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(data[i]) << (8 * i);
  const uint64_t section_size = size - 8 - header;  // the data section's bytes
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const std::string& name : file->names()) {
    auto view = file->view(name);
    FUZZ_REQUIRE(view.is_ok());
    // (the views point into one copy of the file: their addresses order them as their offsets)
    ranges.push_back({reinterpret_cast<uintptr_t>(view->data), view->bytes});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    covered += ranges[i].second;
    if (i > 0) FUZZ_REQUIRE(ranges[i - 1].first + ranges[i - 1].second == ranges[i].first);
  }
  FUZZ_REQUIRE(covered == section_size);
  auto head = engine::SafetensorsFile::read_header(path);
  FUZZ_REQUIRE(head.is_ok() && head->names() == file->names());
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
