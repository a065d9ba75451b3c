#include "dataprep/ingest/line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace kiln::prep {

namespace {
constexpr size_t kChunk = size_t{1} << 20;
}

// A stream of decompressed bytes.
class ByteSource {
 public:
  enum class State { kOk, kEnd, kTruncated, kCorrupt };
  virtual ~ByteSource() { if (fd_ >= 0) ::close(fd_); }
  // Reads up to cap bytes into buf; *n = 0 with a non-kOk state at the end.
  virtual Status read(char* buf, size_t cap, size_t* n, State* state) = 0;
  uint64_t disk_bytes() const { return disk_bytes_; }
  std::string detail;

 protected:
  Status raw_read(char* buf, size_t cap, size_t* n) {
    for (;;) {
      ssize_t r = ::read(fd_, buf, cap);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::from_errno("read", path_);
      *n = static_cast<size_t>(r);
      disk_bytes_ += *n;
      return Status::ok();
    }
  }
  int fd_ = -1;
  std::string path_;
  uint64_t disk_bytes_ = 0;
  friend class LineReader;
};

namespace {

class PlainSource final : public ByteSource {
 public:
  Status read(char* buf, size_t cap, size_t* n, State* state) override {
    KILN_RETURN_IF_ERROR(raw_read(buf, cap, n));
    *state = *n == 0 ? State::kEnd : State::kOk;
    return Status::ok();
  }
};

class GzipSource final : public ByteSource {
 public:
  GzipSource() : in_(size_t{128} << 10) {
    std::memset(&zs_, 0, sizeof zs_);
    inflateInit2(&zs_, 15 + 32);  // gzip or zlib header
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  Status read(char* buf, size_t cap, size_t* n, State* state) override {
    *n = 0;
    *state = State::kOk;
    if (pending_ != State::kOk) {
      *state = pending_;
      return Status::ok();
    }
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    zs_.avail_out = static_cast<uInt>(cap);
    while (zs_.avail_out > 0) {
      if (zs_.avail_in == 0 && !eof_) {
        size_t got = 0;
        KILN_RETURN_IF_ERROR(raw_read(in_.data(), in_.size(), &got));
        if (got == 0) eof_ = true;
        zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
        zs_.avail_in = static_cast<uInt>(got);
      }
      if (zs_.avail_in == 0 && eof_) {
        *state = in_member_ ? State::kTruncated : State::kEnd;
        break;
      }
      int rc = inflate(&zs_, Z_NO_FLUSH);
      in_member_ = true;
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&zs_);  // a following gzip member, if any
        continue;
      }
      if (rc == Z_BUF_ERROR && zs_.avail_in == 0) continue;  // needs more input
      if (rc != Z_OK) {
        detail = zs_.msg ? zs_.msg : "inflate error " + std::to_string(rc);
        *state = State::kCorrupt;
        break;
      }
    }
    *n = cap - zs_.avail_out;
    if (*n > 0 && *state != State::kOk) {
      // Deliver the bytes first; report the end state on the next call.
      pending_ = *state;
      *state = State::kOk;
    }
    if (*n == 0 && pending_ != State::kOk) *state = pending_;
    return Status::ok();
  }

 private:
  z_stream zs_;
  std::vector<char> in_;
  bool eof_ = false;
  bool in_member_ = false;
  State pending_ = State::kOk;
};

class ZstdSource final : public ByteSource {
 public:
  ZstdSource() : in_(ZSTD_DStreamInSize()), ds_(ZSTD_createDStream()) { ZSTD_initDStream(ds_); }
  ~ZstdSource() override { ZSTD_freeDStream(ds_); }
  Status read(char* buf, size_t cap, size_t* n, State* state) override {
    *n = 0;
    *state = State::kOk;
    if (pending_ != State::kOk) {
      *state = pending_;
      return Status::ok();
    }
    ZSTD_outBuffer out{buf, cap, 0};
    while (out.pos < out.size) {
      if (inb_.pos == inb_.size && !eof_) {
        size_t got = 0;
        KILN_RETURN_IF_ERROR(raw_read(in_.data(), in_.size(), &got));
        if (got == 0) eof_ = true;
        inb_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      if (inb_.pos == inb_.size && eof_) {
        // Flush anything the decoder still holds, then decide.
        size_t before = out.pos;
        size_t rc = ZSTD_decompressStream(ds_, &out, &inb_);
        if (ZSTD_isError(rc)) {
          detail = ZSTD_getErrorName(rc);
          pending_ = State::kCorrupt;
          break;
        }
        if (out.pos > before) continue;
        pending_ = last_hint_ == 0 ? State::kEnd : State::kTruncated;
        break;
      }
      size_t rc = ZSTD_decompressStream(ds_, &out, &inb_);
      if (ZSTD_isError(rc)) {
        detail = ZSTD_getErrorName(rc);
        pending_ = State::kCorrupt;
        break;
      }
      last_hint_ = rc;
    }
    *n = out.pos;
    if (*n == 0) *state = pending_;
    return Status::ok();
  }

 private:
  std::vector<char> in_;
  ZSTD_DStream* ds_;
  ZSTD_inBuffer inb_{nullptr, 0, 0};
  bool eof_ = false;
  size_t last_hint_ = 0;
  State pending_ = State::kOk;
};

}  // namespace

LineReader::~LineReader() = default;

Result<std::unique_ptr<LineReader>> LineReader::open(const std::string& path,
                                                    InputCompression compression,
                                                    size_t max_line_bytes) {
  std::unique_ptr<ByteSource> src;
  switch (compression) {
    case InputCompression::kNone: src = std::make_unique<PlainSource>(); break;
    case InputCompression::kGzip: src = std::make_unique<GzipSource>(); break;
    case InputCompression::kZstd: src = std::make_unique<ZstdSource>(); break;
  }
  src->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (src->fd_ < 0) return Status::from_errno("open", path);
  src->path_ = path;
  std::unique_ptr<LineReader> r(new LineReader());
  r->source_ = std::move(src);
  r->path_ = path;
  r->max_line_ = max_line_bytes < 1 ? 1 : max_line_bytes;
  // Start small (many inputs are small files) and grow up to max_line + one chunk.
  size_t initial = size_t{256} << 10;
  if (compression == InputCompression::kNone) {
    struct stat st;
    if (::fstat(r->source_->fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) + 64 < initial)
      initial = static_cast<size_t>(st.st_size) + 64;
  }
  r->buf_.resize(std::min(initial, r->max_line_ + kChunk + 1));
  return r;
}

uint64_t LineReader::disk_bytes() const { return source_->disk_bytes(); }

Result<LineReader::Fill> LineReader::fill() {
  // Make room: move the current line to the front, grow up to max_line + one chunk.
  if (start_ > 0) {
    std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
    end_ -= start_;
    start_ = 0;
  }
  if (buf_.size() - end_ < std::min(buf_.size() / 2, kChunk / 4) &&
      buf_.size() < max_line_ + kChunk + 1) {
    buf_.resize(std::min(std::max(buf_.size() * 2, size_t{4096}), max_line_ + kChunk + 1));
  }
  size_t n = 0;
  ByteSource::State state;
  KILN_RETURN_IF_ERROR(source_->read(buf_.data() + end_, buf_.size() - end_, &n, &state));
  end_ += n;
  if (n > 0) return Fill::kMore;
  switch (state) {
    case ByteSource::State::kTruncated: return Fill::kTruncated;
    case ByteSource::State::kCorrupt: detail_ = source_->detail; return Fill::kCorrupt;
    default: return Fill::kEnd;
  }
}

// A complete line of len bytes at text: kLine (a trailing '\r' dropped), or kTooLong with its
// whole length when it is longer than max_line (skipped counts its bytes already dropped).
static void emit_line(LineEvent* ev, const char* text, size_t len, bool skipping, uint64_t skipped,
                      size_t max_line) {
  if (skipping || len > max_line) {
    ev->kind = LineEventKind::kTooLong;
    ev->length = skipped + len;
    return;
  }
  if (len > 0 && text[len - 1] == '\r') --len;
  ev->kind = LineEventKind::kLine;
  ev->text = std::string_view(text, len);
}

Status LineReader::next(LineEvent* ev) {
  ev->detail.clear();
  ev->length = 0;
  ev->text = {};
  if (done_) {
    ev->kind = LineEventKind::kEnd;
    ev->line = line_;
    return Status::ok();
  }
  bool skipping = false;  // inside a line longer than max_line_ (its bytes are dropped)
  uint64_t skipped = 0;
  for (;;) {
    const char* base = buf_.data();
    const void* nl = std::memchr(base + start_ + scanned_, '\n', end_ - start_ - scanned_);
    if (nl != nullptr) {
      size_t pos = static_cast<size_t>(static_cast<const char*>(nl) - base);
      size_t len = pos - start_;
      ++line_;
      ev->line = line_;
      emit_line(ev, base + start_, len, skipping, skipped, max_line_);
      start_ = pos + 1;
      scanned_ = 0;
      return Status::ok();
    }
    scanned_ = end_ - start_;
    if (end_ - start_ > max_line_) {  // too long: drop what we have, keep counting
      skipping = true;
      skipped += end_ - start_;
      start_ = end_ = 0;
      scanned_ = 0;
    }
    KILN_ASSIGN_OR_RETURN(Fill f, fill());
    if (f == Fill::kMore) continue;
    done_ = true;
    if (f == Fill::kTruncated || f == Fill::kCorrupt) {
      ev->kind = f == Fill::kTruncated ? LineEventKind::kTruncated : LineEventKind::kCorrupt;
      ev->line = line_ + 1;
      ev->detail = detail_;
      return Status::ok();
    }
    if (end_ > start_ || skipping) {  // last line without '\n'
      size_t len = end_ - start_;
      ++line_;
      ev->line = line_;
      emit_line(ev, buf_.data() + start_, len, skipping, skipped, max_line_);
      start_ = end_;
      return Status::ok();
    }
    ev->kind = LineEventKind::kEnd;
    ev->line = line_;
    return Status::ok();
  }
}

Status LineReader::read_all(LineEvent* ev) {
  ev->detail.clear();
  ev->length = 0;
  ev->text = {};
  ev->line = 0;
  if (done_) {
    ev->kind = LineEventKind::kEnd;
    return Status::ok();
  }
  bool skipping = false;
  uint64_t skipped = 0;
  for (;;) {
    if (end_ - start_ > max_line_) {
      skipping = true;
      skipped += end_ - start_;
      start_ = end_ = 0;
    }
    KILN_ASSIGN_OR_RETURN(Fill f, fill());
    if (f == Fill::kMore) continue;
    done_ = true;
    if (f == Fill::kTruncated || f == Fill::kCorrupt) {
      ev->kind = f == Fill::kTruncated ? LineEventKind::kTruncated : LineEventKind::kCorrupt;
      ev->detail = detail_;
      return Status::ok();
    }
    if (skipping) {
      ev->kind = LineEventKind::kTooLong;
      ev->length = skipped + (end_ - start_);
    } else {
      ev->kind = LineEventKind::kLine;
      ev->text = std::string_view(buf_.data() + start_, end_ - start_);
    }
    return Status::ok();
  }
}

}  // namespace kiln::prep
