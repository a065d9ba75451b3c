// Reading files that come from outside with a bound on the memory they can take: a config file
// that is /dev/zero, a task file without a newline, a 20 GiB "index.json" must give an error
// naming the file and the limit, not take all memory. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <istream>
#include <string>

#include "common/status.h"

namespace kiln {

// The whole file, when it holds at most max_bytes: otherwise a data error naming the file and
// the limit, found after reading at most max_bytes + 64 KiB (devices and pipes too).
Result<std::string> read_file_capped(const std::string& path, uint64_t max_bytes);

// The next line of `in` (without its '\n') into *line, holding at most max_bytes of it: a longer
// line sets *too_long and returns after max_bytes + 1 bytes, the rest unread (the stream is then
// mid-line: callers stop there). False at the end of the stream (a last line without '\n' still
// counts).
bool read_line_capped(std::istream& in, size_t max_bytes, std::string* line, bool* too_long);

}  // namespace kiln
