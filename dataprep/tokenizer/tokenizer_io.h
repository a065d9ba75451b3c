// Reading texts for `kiln tokenizer train` (and ids for `kiln tokenizer decode`).
//
// Inputs are files or folders (walked recursively, sorted, names starting with '.' skipped).
// A file whose name ends in .jsonl / .ndjson / .json (optionally + .gz / .zst / .xz / .bz2) is
// JSONL: the "text" string of every line is one text; lines that are not JSON objects with a
// string "text" are counted as skipped. Any other file is one text (decompressed when its name
// ends in a compression suffix). Decompression goes through libarchive's raw format, streamed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

struct TrainingTexts {
  std::vector<std::string> texts;
  uint64_t bytes = 0;
  uint64_t files = 0;
  uint64_t skipped_lines = 0;
  bool truncated = false;  // stopped at max_bytes
};

// The largest single text (a whole text file, or one JSONL line) read for training, after
// decompression: a bound on what one input file can make Kiln hold (`--max-text-bytes`).
inline constexpr uint64_t kDefaultMaxTextBytes = uint64_t(1) << 30;

// Reads texts in sorted path order until max_bytes of text (0 = no limit), streaming each file
// (a JSONL file is never held whole; reading stops mid-file at max_bytes). A text file or JSONL
// line longer than max_text_bytes is a kData error naming the file (and line) and the limit.
// Missing paths are kUsage errors naming them; unreadable or corrupt files kIo / kData naming
// the file.
Result<TrainingTexts> read_training_texts(const std::vector<std::string>& paths,
                                          uint64_t max_bytes = 0,
                                          uint64_t max_text_bytes = kDefaultMaxTextBytes);

// Calls fn(line, line_no, &stop) for each line of the file (1-based numbers; "\n" ends a line and
// is not passed; a last line without one still counts), decompressed when the name ends in a
// compression suffix, streamed: only the current line is held. Stops when fn returns an error
// (returned) or sets stop. A line longer than max_line_bytes is a kData error naming the file,
// the line and the limit (`--max-text-bytes`).
using LineFn = std::function<Status(std::string_view line, uint64_t line_no, bool* stop)>;
Status for_each_line(const std::string& path, uint64_t max_line_bytes, const LineFn& fn);

// Whole file contents, decompressed when the name ends in .gz / .zst / .xz / .bz2; more than
// max_bytes (after decompression) is a kData error naming the file and the limit.
Result<std::string> read_maybe_compressed(const std::string& path,
                                          uint64_t max_bytes = kDefaultMaxTextBytes);

// Parses whitespace-separated decimal token ids. kData naming the first bad item.
Result<std::vector<uint32_t>> parse_token_ids(std::string_view text);

}  // namespace kiln::prep
