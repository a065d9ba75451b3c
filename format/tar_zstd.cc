#include "format/tar_zstd.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kiln::format::detail {

std::string quote_name(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

Status shard_error(const std::string& shard, const std::string& what) {
  return Status::data("shard " + quote_name(shard) + ": " + what);
}

Status member_error(const std::string& shard, std::string_view member, const std::string& what) {
  return Status::data("shard " + quote_name(shard) + ": member " + quote_name(member) + ": " + what);
}

Status write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno("write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

// ---- writing ----------------------------------------------------------------------------------

TarFileSink::~TarFileSink() {
  if (cctx_) ZSTD_freeCCtx(cctx_);
  if (fd_ >= 0) ::close(fd_);
}

Status TarFileSink::open(const std::string& path, ShardCompression compression, int level) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::from_errno("open for writing", path);
  out_.resize(kIoBufferBytes);
  if (compression == ShardCompression::kZstd) {
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || level == 0) {
      return Status::config("zstd level " + std::to_string(level) + " is out of range (" +
                            std::to_string(ZSTD_minCLevel()) + ".." +
                            std::to_string(ZSTD_maxCLevel()) + ", not 0)");
    }
    cctx_ = ZSTD_createCCtx();
    if (!cctx_) return Status::internal("ZSTD_createCCtx failed");
    size_t r = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
    if (ZSTD_isError(r)) {
      return Status::config("zstd level " + std::to_string(level) + ": " +
                            ZSTD_getErrorName(r));
    }
  }
  return Status::ok();
}

Status TarFileSink::write(const void* data, size_t size) {
  if (!error_.is_ok()) return error_;
  if (discard_) return Status::ok();
  tar_bytes_ += size;
  if (!cctx_) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      size_t n = std::min(size, out_.size() - out_pos_);
      std::memcpy(out_.data() + out_pos_, p, n);
      out_pos_ += n;
      p += n;
      size -= n;
      if (out_pos_ == out_.size()) KILN_RETURN_IF_ERROR(remember(flush()));
    }
    return Status::ok();
  }
  ZSTD_inBuffer in{data, size, 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer out{out_.data(), out_.size(), out_pos_};
    size_t r = ZSTD_compressStream2(cctx_, &out, &in, ZSTD_e_continue);
    out_pos_ = out.pos;
    if (ZSTD_isError(r)) {
      return remember(Status::internal(std::string("zstd compression failed: ") +
                                       ZSTD_getErrorName(r)));
    }
    if (out_pos_ == out_.size()) KILN_RETURN_IF_ERROR(remember(flush()));
  }
  return Status::ok();
}

Status TarFileSink::finish() {
  if (!error_.is_ok()) return error_;
  if (cctx_) {
    for (;;) {
      ZSTD_inBuffer in{nullptr, 0, 0};
      ZSTD_outBuffer out{out_.data(), out_.size(), out_pos_};
      size_t left = ZSTD_compressStream2(cctx_, &out, &in, ZSTD_e_end);
      out_pos_ = out.pos;
      if (ZSTD_isError(left)) {
        return remember(Status::internal(std::string("zstd compression failed: ") +
                                         ZSTD_getErrorName(left)));
      }
      if (left == 0) break;
      KILN_RETURN_IF_ERROR(remember(flush()));
    }
  }
  KILN_RETURN_IF_ERROR(remember(flush()));
  if (::fsync(fd_) != 0) return remember(Status::from_errno("fsync", path_));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return remember(Status::from_errno("close", path_));
  return Status::ok();
}

Status TarFileSink::flush() {
  if (out_pos_ == 0) return Status::ok();
  hash_.update(out_.data(), out_pos_);
  KILN_RETURN_IF_ERROR(write_all(fd_, out_.data(), out_pos_, path_));
  file_bytes_ += out_pos_;
  out_pos_ = 0;
  return Status::ok();
}

Status TarFileSink::remember(Status st) {
  if (!st.is_ok() && error_.is_ok()) error_ = st;
  return st;
}

la_ssize_t tar_sink_write(struct archive* a, void* client, const void* buf, size_t n) {
  Status st = static_cast<TarFileSink*>(client)->write(buf, n);
  if (!st.is_ok()) {
    archive_set_error(a, EIO, "%s", st.message().c_str());
    return -1;
  }
  return static_cast<la_ssize_t>(n);
}

// ---- reading ----------------------------------------------------------------------------------

TarSource::~TarSource() {
  if (dctx_) ZSTD_freeDCtx(dctx_);
}

Status TarSource::open(int fd, bool zstd, const std::string& path) {
  fd_ = fd;
  path_ = path;
  for (auto& b : out_) b.resize(kIoBufferBytes);
  if (zstd) {
    dctx_ = ZSTD_createDCtx();
    if (!dctx_) return Status::internal("ZSTD_createDCtx failed");
    in_.resize(kIoBufferBytes);
  }
  return Status::ok();
}

la_ssize_t TarSource::read(const void** buf) {
  if (!error_.empty()) return -1;
  cur_ ^= 1;
  std::vector<char>& out = out_[cur_];
  size_t n = 0;
  if (!dctx_) {
    Result<size_t> r = read_file(out.data(), out.size());
    if (!r.is_ok()) return -1;
    n = *r;
  } else {
    Result<size_t> r = decompress(out.data(), out.size());
    if (!r.is_ok()) return -1;
    n = *r;
  }
  if (!within_limit(n)) return -1;
  len_[cur_] = n;
  delivered_ += n;
  *buf = out.data();
  return static_cast<la_ssize_t>(n);
}

bool TarSource::delivered_tail_is_zero(uint64_t from, bool* checkable) const {
  uint64_t back = delivered_ - from;
  *checkable = back <= len_[0] + len_[1];
  if (!*checkable) return false;
  size_t last = len_[cur_];
  size_t in_last = static_cast<size_t>(std::min<uint64_t>(back, last));
  if (!all_zero(out_[cur_].data() + last - in_last, in_last)) return false;
  size_t in_prev = static_cast<size_t>(back - in_last);
  size_t prev_len = len_[cur_ ^ 1];
  return all_zero(out_[cur_ ^ 1].data() + prev_len - in_prev, in_prev);
}

std::string TarSource::drain_zero_tail() {
  std::vector<char>& out = out_[cur_ ^ 1];
  for (;;) {
    Result<size_t> r = dctx_ ? decompress(out.data(), out.size())
                             : read_file(out.data(), out.size());
    if (!r.is_ok()) return error_;
    if (*r == 0) break;
    if (!within_limit(*r)) return error_;
    delivered_ += *r;
    if (!all_zero(out.data(), *r)) {
      return "data follows the end-of-archive marker (concatenated or damaged archive)";
    }
  }
  if (delivered_ % kTarBlock != 0) {
    return "the tar stream is " + std::to_string(delivered_) +
           " bytes, not a whole number of 512-byte blocks (truncated shard)";
  }
  return "";
}

bool TarSource::within_limit(size_t more) {
  if (delivered_ + more <= limit_) return true;
  error_ = "the uncompressed tar stream is longer than " + std::to_string(limit_) + " bytes (" +
           limit_why_ + "); damaged shard or decompression bomb";
  return false;
}

bool TarSource::all_zero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

Result<size_t> TarSource::read_file(char* dst, size_t cap) {
  size_t got = 0;
  while (got < cap) {
    ssize_t r = ::read(fd_, dst + got, cap - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      error_ = std::string("read failed: ") + std::strerror(errno);
      return Status::io(error_);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

Result<size_t> TarSource::decompress(char* dst, size_t cap) {
  if (!deferred_error_.empty()) {
    error_ = deferred_error_;
    return Status::data(error_);
  }
  ZSTD_outBuffer out{dst, cap, 0};
  while (out.pos < out.size) {
    if (in_buf_.pos == in_buf_.size) {
      if (input_eof_) break;
      Result<size_t> r = read_file(in_.data(), in_.size());
      if (!r.is_ok()) return r;
      if (*r == 0) {
        input_eof_ = true;
        break;
      }
      in_buf_ = ZSTD_inBuffer{in_.data(), *r, 0};
    }
    size_t ret = ZSTD_decompressStream(dctx_, &out, &in_buf_);
    if (ZSTD_isError(ret)) {
      std::string msg = std::string("corrupt zstd data: ") + ZSTD_getErrorName(ret);
      if (out.pos > 0) {
        deferred_error_ = msg;
        return out.pos;
      }
      error_ = msg;
      return Status::data(error_);
    }
    frame_open_ = ret != 0;
  }
  if (out.pos == 0 && input_eof_ && frame_open_) {
    error_ = "truncated zstd stream (the file ends inside a frame)";
    return Status::data(error_);
  }
  return out.pos;
}

la_ssize_t tar_source_read(struct archive* a, void* client, const void** buf) {
  auto* src = static_cast<TarSource*>(client);
  la_ssize_t n = src->read(buf);
  if (n < 0) archive_set_error(a, EIO, "%s", src->error().c_str());
  return n;
}

}  // namespace kiln::format::detail
