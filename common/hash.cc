#include "common/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace kiln {

uint64_t xxh3_64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

Hash128 xxh3_128(const void* data, size_t size, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data, size, seed);
  return Hash128{h.low64, h.high64};
}

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return std::string(buf, 16);
}

Result<uint64_t> parse_hex64(std::string_view text) {
  if (text.size() != 16) return Status::data("expected 16 hex digits, got '" + std::string(text) + "'");
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return Status::data("not a hex digit in '" + std::string(text) + "'");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

Xxh3Stream::Xxh3Stream(uint64_t seed) : state_(XXH3_createState()) {
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

Result<uint64_t> xxh3_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::from_errno("open", path);
  Xxh3Stream h;
  static thread_local char buf[1 << 20];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) h.update(buf, n);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::from_errno("read", path);
  return h.digest();
}

}  // namespace kiln
