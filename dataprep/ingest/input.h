// Input discovery for `kiln prep`: files, folders and globs -> a sorted list of input files.
//
// - A JSONL file: name ends in .jsonl / .ndjson / .json, optionally + .gz or .zst. Any other file
//   named directly on the command line is read as JSONL too, except .txt / .md (+ .gz / .zst),
//   which are one text document each.
// - A folder: walked recursively (names starting with '.' skipped, symlinks followed once); its
//   JSONL files (by name, as above) are JSONL inputs, every other regular file is one text
//   document whose id is its path relative to the folder.
// - A glob (contains * ? or [): expanded; matching nothing is an error.
// The result is sorted by path (byte order) with duplicates removed: this is the global order.
// Errors: a missing path or empty glob is kUsage naming it; an unreadable folder kIo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

enum class InputKind { kJsonl, kText };
enum class InputCompression { kNone, kGzip, kZstd };

struct InputFile {
  std::string path;         // as found (absolute or relative to the working directory)
  InputKind kind = InputKind::kJsonl;
  InputCompression compression = InputCompression::kNone;
  std::string id_base;      // JSONL: file stem for default ids; text: path relative to its folder
  uint64_t size = 0;        // bytes on disk
  int64_t mtime_ns = 0;     // modification time (for resume fingerprints)
};

Result<std::vector<InputFile>> discover_inputs(const std::vector<std::string>& paths);

// Compression implied by a file name (".gz", ".zst", else none).
InputCompression compression_for_name(const std::string& name);

}  // namespace kiln::prep
