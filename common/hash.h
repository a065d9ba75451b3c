// Hashing helpers over xxHash (XXH3). Stable across runs and machines: these values are
// written to manifests and used for dedup, so never change the seeds or the algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kiln {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Hash128&) const = default;
  auto operator<=>(const Hash128&) const = default;
};

uint64_t xxh3_64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t xxh3_64(std::string_view s, uint64_t seed = 0) {
  return xxh3_64(s.data(), s.size(), seed);
}
// xxh3_64("text", seed) would bind to (data, size) and read `seed` bytes from the literal:
// write xxh3_64(std::string_view("text"), seed).
uint64_t xxh3_64(const char* text, uint64_t seed) = delete;
Hash128 xxh3_128(const void* data, size_t size, uint64_t seed = 0);
Hash128 xxh3_128(const char* text, uint64_t seed) = delete;  // as above
inline Hash128 xxh3_128(std::string_view s, uint64_t seed = 0) {
  return xxh3_128(s.data(), s.size(), seed);
}

// 16 lowercase hex digits, as stored in manifest.json.
std::string hex64(uint64_t value);
// Parses 16 hex digits; a data error otherwise.
Result<uint64_t> parse_hex64(std::string_view text);

// Streaming XXH3-64 for large files / shards. Not thread-safe.
class Xxh3Stream {
 public:
  explicit Xxh3Stream(uint64_t seed = 0);
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  uint64_t digest() const;

 private:
  void* state_;
};

// XXH3-64 of a whole file, streamed.
Result<uint64_t> xxh3_file(const std::string& path);

}  // namespace kiln
