// Streaming, decompressing line reader for `kiln prep` inputs (plain, gzip, zstd).
//
// Memory stays bounded by max_line_bytes plus one read chunk (1 MiB): a line longer than the
// limit is skipped as it streams past, never held whole, and reported as kTooLong with its length.
// "\n" ends a line, a trailing "\r" is dropped, and a last line without "\n" still counts.
// A compressed stream that ends early is reported once as kTruncated (a partial last line is
// dropped with it), a corrupt one as kCorrupt (with the decoder's message); both end the file.
// Concatenated gzip members and zstd frames are read through. OS read errors are kIo Statuses.
// Not thread-safe; one reader per file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "dataprep/ingest/input.h"

namespace kiln::prep {

enum class LineEventKind { kLine, kTooLong, kTruncated, kCorrupt, kEnd };

struct LineEvent {
  LineEventKind kind = LineEventKind::kEnd;
  std::string_view text;  // kLine: the line (valid until the next call)
  uint64_t line = 0;      // 1-based line number (kTruncated/kCorrupt: the line being read)
  uint64_t length = 0;    // kTooLong: the line's full length in bytes
  std::string detail;     // kCorrupt: the decoder's message
};

class ByteSource;

class LineReader {
 public:
  ~LineReader();
  static Result<std::unique_ptr<LineReader>> open(const std::string& path,
                                                  InputCompression compression,
                                                  size_t max_line_bytes);
  // The next line or event. After kEnd, kTruncated or kCorrupt, every call returns kEnd.
  Status next(LineEvent* ev);
  // The whole (remaining) content as one kLine event (text-folder documents); kTooLong when it
  // passes max_line_bytes (the content is then skipped, not kept).
  Status read_all(LineEvent* ev);
  // Bytes read from the file on disk so far (compressed bytes for .gz / .zst).
  uint64_t disk_bytes() const;

 private:
  LineReader() = default;
  enum class Fill { kMore, kEnd, kTruncated, kCorrupt };
  Result<Fill> fill();

  std::unique_ptr<ByteSource> source_;
  std::string path_;
  size_t max_line_ = 0;
  std::string buf_;
  size_t start_ = 0;    // first byte of the current line
  size_t scanned_ = 0;  // bytes after start_ already searched for '\n'
  size_t end_ = 0;      // end of valid data
  uint64_t line_ = 0;
  bool done_ = false;
  std::string detail_;
};

}  // namespace kiln::prep
