// Batches of raw input records and parsing one (input_batches.h).
#include "dataprep/stages/input_batches.h"

#include "dataprep/prep_config.h"

namespace kiln::prep::detail {

namespace {
constexpr size_t kBatchBytes = size_t{4} << 20;
constexpr size_t kBatchItems = 4096;

bool blank_line(std::string_view s) {
  for (char ch : s)
    if (!(ch == ' ' || (ch >= 0x09 && ch <= 0x0d))) return false;
  return true;
}
}  // namespace

Result<std::unique_ptr<FileBatcher>> FileBatcher::open(const InputView& in, uint32_t fid) {
  const InputFile& f = (*in.files)[fid];
  std::unique_ptr<FileBatcher> b(new FileBatcher());
  b->fid_ = fid;
  b->kind_ = f.kind;
  KILN_ASSIGN_OR_RETURN(b->reader_, LineReader::open(f.path, f.compression, in.max_line_bytes));
  return b;
}

Result<bool> FileBatcher::next(RawBatch* b) {
  b->fid = fid_;
  b->data.clear();
  b->items.clear();
  if (done_) return false;
  LineEvent ev;
  if (kind_ == InputKind::kText) {
    KILN_RETURN_IF_ERROR(reader_->read_all(&ev));
    done_ = true;
    RawItem it;
    it.ordinal = ordinal_++;
    it.line = 0;
    it.kind = ev.kind == LineEventKind::kEnd ? LineEventKind::kLine : ev.kind;
    it.detail = ev.detail;
    if (ev.kind == LineEventKind::kLine) {
      it.offset = 0;
      it.length = ev.text.size();
      b->data.assign(ev.text);
    } else if (ev.kind == LineEventKind::kTooLong) {
      it.length = ev.length;
    }
    b->items.push_back(std::move(it));
    b->data.reserve(b->data.size() + 64);
    return true;
  }
  while (b->data.size() < kBatchBytes && b->items.size() < kBatchItems) {
    KILN_RETURN_IF_ERROR(reader_->next(&ev));
    if (ev.kind == LineEventKind::kEnd) {
      done_ = true;
      break;
    }
    if (ev.kind == LineEventKind::kLine && blank_line(ev.text)) continue;
    RawItem it;
    it.ordinal = ordinal_++;
    it.line = ev.line;
    it.kind = ev.kind;
    if (ev.kind == LineEventKind::kLine) {
      it.offset = b->data.size();
      it.length = ev.text.size();
      b->data.append(ev.text);
    } else if (ev.kind == LineEventKind::kTooLong) {
      it.length = ev.length;
    } else {  // truncated / corrupt: the file ends here
      it.detail = ev.detail;
      b->items.push_back(std::move(it));
      done_ = true;
      break;
    }
    b->items.push_back(std::move(it));
  }
  b->data.reserve(b->data.size() + 64);  // in-place JSON parsing reads past the last line
  return !b->items.empty();
}

ParseResult parse_item(const InputView& in, const RawBatch& b, const RawItem& it, bool want_fields,
                       Document* doc, bool copy_text) {
  const InputFile& f = (*in.files)[b.fid];
  doc->file = f.path;
  doc->line = it.line;
  doc->index =
      in.file_base == nullptr || in.file_base->empty() ? 0 : (*in.file_base)[b.fid] + it.ordinal;
  ParseOptions po;
  po.repair_utf8 = in.repair_utf8;
  po.want_fields = want_fields;
  if (in.chat != nullptr) {
    po.chat = in.chat->resolved.get();
    po.chat_unavailable = in.chat->unavailable;
  }
  po.copy_text = copy_text;
  po.input_padded = b.data.capacity() >= b.data.size() + 64;
  ParseResult r;
  switch (it.kind) {
    case LineEventKind::kLine:
      if (f.kind == InputKind::kText) return parse_text_document(b.text(it), f.id_base, po, doc);
      return parse_jsonl_line(b.text(it), f.id_base, it.line, po, doc);
    case LineEventKind::kTooLong:
      r.reason = RejectReason::kTooLong;
      r.detail = std::to_string(it.length) +
                 " bytes, over input.max_line_bytes = " + std::to_string(in.max_line_bytes);
      return r;
    case LineEventKind::kTruncated:
      r.reason = RejectReason::kTruncatedFile;
      r.detail = "the compressed input ends early (truncated file); the rest is lost";
      return r;
    case LineEventKind::kCorrupt:
      r.reason = RejectReason::kCorruptFile;
      r.detail = "the compressed input cannot be decoded: " + it.detail;
      return r;
    case LineEventKind::kEnd:
      break;
  }
  r.reason = RejectReason::kInvalidJson;
  r.detail = "internal: unexpected end event";
  return r;
}

}  // namespace kiln::prep::detail
