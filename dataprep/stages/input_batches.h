// Reading this run's input records in batches, and parsing one record, for every stage that
// passes over the input (scan, URL dedup, tokenizer sampling, write). Only the input side of the
// run is needed (InputView), not the stages' state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "dataprep/ingest/doc_parser.h"
#include "dataprep/ingest/input.h"
#include "dataprep/ingest/line_reader.h"

namespace kiln::prep {
struct ChatOptions;  // prep_config.h
}  // namespace kiln::prep

namespace kiln::prep::detail {

// What reading and parsing records needs. Pointers into the caller's state, which outlives it.
struct InputView {
  const std::vector<InputFile>* files = nullptr;     // the run's input files, in global order
  const std::vector<uint64_t>* file_base = nullptr;  // global index of each file's first record;
                                                     // empty before the scan's counts are known
  bool repair_utf8 = true;                           // input.repair_utf8
  uint64_t max_line_bytes = 0;                       // input.max_line_bytes
  const ChatOptions* chat = nullptr;                 // chat.*: how chat lines are rendered
};

// One batch of raw records read from one input file, in order.
struct RawItem {
  uint64_t ordinal = 0;
  uint64_t line = 0;
  LineEventKind kind = LineEventKind::kLine;
  size_t offset = 0;  // into RawBatch::data (kLine)
  size_t length = 0;  // kLine: text length; kTooLong: the line's length
  std::string detail;
};
struct RawBatch {
  uint32_t fid = 0;
  std::string data;
  std::vector<RawItem> items;
  std::string_view text(const RawItem& it) const { return {data.data() + it.offset, it.length}; }
};

// Reads one input file as batches of raw records (blank JSONL lines are skipped, not counted).
// RawBatch::data always has 64 readable bytes after its end, so lines parse in place.
// Not thread-safe (one reader per file).
class FileBatcher {
 public:
  static Result<std::unique_ptr<FileBatcher>> open(const InputView& in, uint32_t fid);
  // Fills *b (cleared) with up to ~4 MiB / 4096 records. Returns false at the end of the file.
  Result<bool> next(RawBatch* b);
  uint64_t disk_bytes() const { return reader_->disk_bytes(); }

 private:
  uint32_t fid_ = 0;
  InputKind kind_ = InputKind::kJsonl;
  std::unique_ptr<LineReader> reader_;
  uint64_t ordinal_ = 0;
  bool done_ = false;
};

// Parses one raw record into doc (or a reject). Sets doc->index/file/line as well. With
// copy_text false, doc->text is left alone and only the result's text view is set. Thread-safe.
ParseResult parse_item(const InputView& in, const RawBatch& b, const RawItem& it, bool want_fields,
                       Document* doc, bool copy_text = true);

}  // namespace kiln::prep::detail
