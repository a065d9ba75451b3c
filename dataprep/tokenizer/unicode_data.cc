#include "dataprep/tokenizer/unicode_data.h"

#include <algorithm>
#include <array>
#include <memory>

namespace kiln::prep::unicode {
namespace {

struct GcRange {
  int32_t lo, hi;
  uint8_t cat;
};

#include "dataprep/tokenizer/unicode/tables.inc"

// One byte per code point below U+40000 (1 MiB, built on first use); beyond, the ranges.
constexpr int32_t kDense = 0x40000;

const uint8_t* dense_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kDense);
    std::fill(t.get(), t.get() + kDense, uint8_t(kCn));
    for (const GcRange& r : kGc16Ranges) {
      if (r.lo >= kDense) break;
      std::fill(t.get() + r.lo, t.get() + std::min(r.hi + 1, kDense), r.cat);
    }
    return t;
  }();
  return table.get();
}

}  // namespace

Gc category(int32_t cp) {
  if (cp < 0 || cp > 0x10FFFF) return kCn;
  if (cp < kDense) return Gc(dense_table()[cp]);
  auto it = std::upper_bound(std::begin(kGc16Ranges), std::end(kGc16Ranges), cp,
                             [](int32_t c, const GcRange& r) { return c < r.lo; });
  if (it == std::begin(kGc16Ranges)) return kCn;
  --it;
  return cp <= it->hi ? Gc(it->cat) : kCn;
}

bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::vector<CpRange> added_since_pcre2(std::string_view name) {
  std::vector<CpRange> out;
  for (const auto& [cat, ranges] : kGcAdded16) {
    std::string_view c(cat);
    if (c == name || (name.size() == 1 && c[0] == name[0]))
      out.insert(out.end(), ranges.begin(), ranges.end());
  }
  std::sort(out.begin(), out.end(), [](CpRange a, CpRange b) { return a.lo < b.lo; });
  return out;
}

bool new_since_unicode9(int32_t cp) {
  auto it = std::upper_bound(std::begin(kNewSince9), std::end(kNewSince9), cp,
                             [](int32_t c, const CpRange& r) { return c < r.lo; });
  if (it == std::begin(kNewSince9)) return false;
  --it;
  return cp <= it->hi;
}

}  // namespace kiln::prep::unicode
