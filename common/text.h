// Small text helpers shared by the subsystems: byte sizes read from people and written for them,
// elapsed times, JSON strings without a JSON object. Pure functions (but for the clock);
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kiln {

// "512 B", "1.5 KiB", "3.2 MiB", ... (binary units up to TiB; one decimal above bytes).
std::string human_bytes(uint64_t bytes);
// `bytes` in one unit with `decimals` digits: "12.3 MiB", "139.80 GiB".
enum class ByteUnit { kKiB, kMiB, kGiB };
std::string bytes_in(uint64_t bytes, ByteUnit unit, int decimals = 1);

// A size as people write it, in every config key and flag that takes one: a number (decimals and
// exponents allowed: "1.5G", "1e9") and an optional unit K, M, G or T, with or without "iB" or
// "B" (all binary: 16GB = 16GiB = 16 x 2^30), case and spaces ignored. Not a size, negative,
// or past 2^64: kUsage saying what was read and how to write one (callers with a config key
// re-issue it as a config error naming the key).
Result<uint64_t> parse_byte_size(std::string_view text);

// Seconds and milliseconds since t0 on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t0);
double ms_since(std::chrono::steady_clock::time_point t0);

// Appends `text` as a JSON string, quotes included, byte for byte as nlohmann::json::dump()
// writes it (UTF-8 kept as is; '"', '\\', \b \f \n \r \t escaped by letter, other control bytes
// as \u00XX). `text` must be valid UTF-8.
void append_json_string(std::string* out, std::string_view text);

}  // namespace kiln
