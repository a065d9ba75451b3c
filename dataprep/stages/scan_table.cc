// The scan tables' records and their reader (scan_table.h).
#include "dataprep/stages/scan_table.h"

#include <algorithm>
#include <cstring>

namespace kiln::prep::detail {

RecordLayout RecordLayout::make(bool near, int bands, int num_perm) {
  RecordLayout l;
  l.bands = near ? bands : 0;
  l.num_perm = near ? num_perm : 0;
  l.keys_offset = 32;
  l.sig_offset = l.keys_offset + 8 * static_cast<size_t>(l.bands);
  l.bytes = l.sig_offset + 8 * static_cast<size_t>(l.num_perm);
  return l;
}

uint64_t RecordView::load64(size_t off) const {
  uint64_t v;
  std::memcpy(&v, p + off, 8);
  return v;
}
uint32_t RecordView::load32(size_t off) const {
  uint32_t v;
  std::memcpy(&v, p + off, 4);
  return v;
}

TableScanner::~TableScanner() {
  if (f_) std::fclose(f_);
}

const uint8_t* TableScanner::next() {
  const size_t rb = layout_.bytes;
  while (at_ + rb > n_) {
    if (f_ && std::feof(f_)) {
      std::fclose(f_);
      f_ = nullptr;
    }
    if (!f_) {
      if (table_ >= tables_.size()) return nullptr;
      const std::string& path = tables_[table_++];
      f_ = std::fopen(path.c_str(), "rb");
      if (!f_) {
        status_ = Status::from_errno("open", path);
        return nullptr;
      }
      buf_.resize(std::max<size_t>(rb * 4096, size_t{4} << 20) / rb * rb);
      n_ = at_ = 0;
      continue;
    }
    size_t keep = n_ - at_;  // records never straddle files, so keep is 0 here normally
    std::memmove(buf_.data(), buf_.data() + at_, keep);
    size_t got = std::fread(buf_.data() + keep, 1, buf_.size() - keep, f_);
    if (got == 0 && std::ferror(f_)) {
      status_ = Status::io("reading a scan table failed");
      return nullptr;
    }
    n_ = keep + got;
    at_ = 0;
    if (got == 0) {
      std::fclose(f_);
      f_ = nullptr;
      n_ = at_ = 0;
    }
  }
  const uint8_t* p = buf_.data() + at_;
  at_ += rb;
  return p;
}

}  // namespace kiln::prep::detail
