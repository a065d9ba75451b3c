// Fuzz target: the streaming JSONL line reader (dataprep/ingest/line_reader.h) over plain, gzip
// and zstd input. Byte 0 picks the compression (0 plain, 1 gzip, 2 zstd), byte 1 the line limit
// (16 << (b % 12) bytes); the rest is the file. Invariants: lines hold no '\n' and fit the limit,
// a kTooLong length is over it, plain input gives at most one event per byte, and the reader ends.
#include "dataprep/ingest/line_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::quiet_logs();
  if (size < 2) return 0;
  prep::InputCompression compression = data[0] % 3 == 0   ? prep::InputCompression::kNone
                                 : data[0] % 3 == 1 ? prep::InputCompression::kGzip
                                                    : prep::InputCompression::kZstd;
  size_t max_line = size_t{16} << (data[1] % 12);
  std::string path = fuzz::write_scratch("input.jsonl", fuzz::as_view(data + 2, size - 2));
  auto reader = prep::LineReader::open(path, compression, max_line);
  if (!reader.is_ok()) return 0;
  prep::LineEvent ev;
  uint64_t events = 0;
  for (;;) {
    Status st = (*reader)->next(&ev);
    if (!st.is_ok()) break;
    // Plain input: every event consumes input (or ends). Compressed input can expand by up to
    // ~32768x (a zstd RLE block), so its events are bounded only by the decompressed bytes: the
    // fuzzer found 36 bytes of zstd that decode to 246,726 newlines, each a correct empty line
    // (corpus/jsonl_reader/zstd-newline-bomb-246726-empty-lines).
    ++events;
    if (compression == prep::InputCompression::kNone) FUZZ_REQUIRE(events <= size + 2);
    if (ev.kind == prep::LineEventKind::kEnd || ev.kind == prep::LineEventKind::kTruncated ||
        ev.kind == prep::LineEventKind::kCorrupt) {
      prep::LineEvent after;
      FUZZ_REQUIRE((*reader)->next(&after).is_ok() && after.kind == prep::LineEventKind::kEnd);
      break;
    }
    if (ev.kind == prep::LineEventKind::kLine) {
      FUZZ_REQUIRE(ev.text.size() <= max_line);
      FUZZ_REQUIRE(ev.text.find('\n') == std::string_view::npos);
    } else if (ev.kind == prep::LineEventKind::kTooLong) {
      FUZZ_REQUIRE(ev.length > max_line);
    }
  }
  return 0;
}
