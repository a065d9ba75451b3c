// Small text helpers shared by the subsystems: sizes for people, JSON strings without a JSON
// object. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

// "512 B", "1.5 KiB", "3.2 MiB", ... (binary units up to TiB; one decimal above bytes).
std::string human_bytes(uint64_t bytes);

// Appends `text` as a JSON string, quotes included, byte for byte as nlohmann::json::dump()
// writes it (UTF-8 kept as is; '"', '\\', \b \f \n \r \t escaped by letter, other control bytes
// as \u00XX). `text` must be valid UTF-8.
void append_json_string(std::string* out, std::string_view text);

}  // namespace kiln
