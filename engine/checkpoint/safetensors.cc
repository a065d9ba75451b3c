#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "common/atomic_file.h"
#include "common/json.h"

namespace kiln::engine {

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 0;
}

namespace {
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

Status write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // nlohmann::ordered_json keeps insertion order, so the header bytes are deterministic.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  size_t offset = 0;
  for (const auto& t : tensors) {
    size_t esize = safetensors_dtype_size(t.dtype);
    KILN_CHECK(esize != 0, "unknown safetensors dtype " + t.dtype);
    size_t count = 1;
    for (int64_t d : t.shape) count *= static_cast<size_t>(d);
    KILN_CHECK(count * esize == t.bytes, "tensor " + t.name + " size does not match its shape");
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string head = header.dump();
  while (head.size() % 8 != 0) head.push_back(' ');
  uint64_t n = head.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  AtomicFile f;
  KILN_RETURN_IF_ERROR(f.open(path));
  KILN_RETURN_IF_ERROR(f.write(std::string_view(reinterpret_cast<const char*>(len), 8)));
  KILN_RETURN_IF_ERROR(f.write(head));
  for (const auto& t : tensors) {
    KILN_RETURN_IF_ERROR(f.write(std::string_view(static_cast<const char*>(t.data), t.bytes)));
  }
  return f.commit();
}

namespace {
// The header bytes of the tensors (in order) and metadata: JSON padded with spaces to a
// multiple of 8, as write_safetensors writes it. *offsets receives each tensor's end.
std::string header_bytes(const std::vector<SafetensorsWriter::Spec>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::vector<uint64_t>* ends) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const size_t esize = safetensors_dtype_size(t.dtype);
    KILN_CHECK(esize != 0, "unknown safetensors dtype " + t.dtype);
    uint64_t bytes = esize;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    ends->push_back(offset);
  }
  std::string head = header.dump();
  while (head.size() % 8 != 0) head.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(head.size()) >> (8 * i));
  return out + head;
}
}  // namespace

Status SafetensorsWriter::open(const std::string& path, const std::vector<Spec>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  ends_.clear();
  next_ = 0;
  written_ = 0;
  const std::string head = header_bytes(tensors, metadata, &ends_);
  total_ = ends_.empty() ? 0 : ends_.back();
  KILN_RETURN_IF_ERROR(file_.open(path));
  return file_.write(head);
}

Status SafetensorsWriter::append(const void* data, size_t bytes) {
  while (next_ < ends_.size() && written_ == ends_[next_]) ++next_;
  KILN_CHECK(next_ < ends_.size() && written_ + bytes <= ends_[next_],
             "SafetensorsWriter::append: more bytes than the tensor holds");
  written_ += bytes;
  return file_.write(std::string_view(static_cast<const char*>(data), bytes));
}

Status SafetensorsWriter::commit() {
  KILN_CHECK(written_ == total_, "SafetensorsWriter::commit: tensors incomplete");
  return file_.commit();
}

namespace {
uint64_t header_length(const unsigned char* b) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[i]) << (8 * i);
  return n;
}

// The header length n of a file of `size` bytes, checked against the cap and the size.
Status check_header_length(uint64_t n, uint64_t size, const std::string& path) {
  if (n > kMaxSafetensorsHeaderBytes) {
    return Status::data("safetensors header length " + std::to_string(n) +
                        " is over the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                        " bytes")
        .with_file(path);
  }
  if (n > size - 8) {
    return Status::data("safetensors header length " + std::to_string(n) +
                        " runs past the end of the " + std::to_string(size) +
                        "-byte file (truncated?)")
        .with_file(path);
  }
  return Status::ok();
}
}  // namespace

Result<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  KILN_ASSIGN_OR_RETURN(f.bytes_, read_file(path));
  if (f.bytes_.size() < 8) return Status::data("truncated safetensors file").with_file(path);
  const uint64_t n = header_length(reinterpret_cast<const unsigned char*>(f.bytes_.data()));
  KILN_RETURN_IF_ERROR(check_header_length(n, f.bytes_.size(), path));
  f.data_start_ = 8 + n;
  KILN_RETURN_IF_ERROR(
      f.parse_header(std::string_view(f.bytes_).substr(8, n), f.bytes_.size() - f.data_start_));
  return f;
}

Result<SafetensorsFile> SafetensorsFile::read_header(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.header_only_ = true;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("open", path);
  struct stat st {};
  std::string header;
  Status status = Status::ok();
  unsigned char len[8];
  if (::fstat(fd, &st) != 0) {
    status = Status::from_errno("stat", path);
  } else if (st.st_size < 8) {
    status = Status::data("truncated safetensors file").with_file(path);
  } else if (::pread(fd, len, 8, 0) != 8) {
    status = Status::from_errno("read", path);
  } else {
    const uint64_t n = header_length(len);
    status = check_header_length(n, static_cast<uint64_t>(st.st_size), path);
    if (status.is_ok()) {
      header.resize(n);
      size_t got = 0;
      while (got < n) {
        const ssize_t r = ::pread(fd, header.data() + got, n - got, static_cast<off_t>(8 + got));
        if (r <= 0) {
          status = r < 0 ? Status::from_errno("read", path)
                         : Status::data("truncated safetensors header").with_file(path);
          break;
        }
        got += static_cast<size_t>(r);
      }
      f.data_start_ = 8 + n;
    }
  }
  ::close(fd);
  KILN_RETURN_IF_ERROR(status);
  KILN_RETURN_IF_ERROR(f.parse_header(header, static_cast<size_t>(st.st_size) - f.data_start_));
  return f;
}

Status SafetensorsFile::parse_header(std::string_view text, size_t data_size) {
  const std::string& path = path_;
  Result<nlohmann::json> parsed = parse_untrusted_json(text);
  if (!parsed.is_ok()) {
    return std::move(parsed).take_status().prefixed("safetensors header").with_file(path);
  }
  nlohmann::json header = std::move(parsed).value();
  if (!header.is_object())
    return Status::data("safetensors header is not an object").with_file(path);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Status::data("bad __metadata__").with_file(path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          return Status::data("metadata values must be strings").with_file(path);
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& v = it.value();
    Entry e;
    try {
      e.dtype = v.at("dtype").get<std::string>();
      // (integers only: nlohmann reads one past 64 bits as a double, fuzz finding
      // shape-dimension-past-int64-is-a-double)
      e.shape = json_integers<int64_t>(v.at("shape"), "shape");
      auto offs = json_integers<uint64_t>(v.at("data_offsets"), "data_offsets");
      if (offs.size() != 2) throw std::runtime_error("data_offsets");
      e.begin = offs[0];
      e.end = offs[1];
    } catch (const std::exception& ex) {
      return Status::data(std::string("malformed tensor entry: ") + ex.what())
          .with_file(path)
          .with_key(it.key());
    }
    size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0) {
      return Status::data("unknown dtype '" + e.dtype + "'").with_file(path).with_key(it.key());
    }
    uint64_t bytes = esize;
    for (int64_t d : e.shape) {
      if (d < 0) return Status::data("negative dimension").with_file(path).with_key(it.key());
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return Status::data("shape " + shape_text(e.shape) + " of " + e.dtype +
                            " overflows 64-bit byte counts")
            .with_file(path)
            .with_key(it.key());
      }
    }
    if (e.begin > e.end || e.end > data_size || e.end - e.begin != bytes) {
      return Status::data("tensor bytes do not match dtype/shape or lie outside the file")
          .with_file(path)
          .with_key(it.key());
    }
    index_[it.key()] = e;
  }
  // The format's rule (the safetensors library's validate): the tensors' byte ranges, taken in
  // order of their offsets, follow one another from 0 with no gap or overlap and end where the
  // data section ends - two tensors cannot share bytes, and no bytes are left unaccounted for.
  std::vector<std::pair<std::pair<size_t, size_t>, const std::string*>> ranges;
  ranges.reserve(index_.size());
  for (const auto& [name, e] : index_) ranges.push_back({{e.begin, e.end}, &name});
  std::sort(ranges.begin(), ranges.end());
  size_t at = 0;
  for (const auto& [range, name] : ranges) {
    if (range.first != at) {
      return Status::data(range.first < at
                              ? "data_offsets [" + std::to_string(range.first) + ", " +
                                    std::to_string(range.second) +
                                    ") overlap another tensor's bytes (which end at " +
                                    std::to_string(at) + ")"
                              : "data_offsets [" + std::to_string(range.first) + ", " +
                                    std::to_string(range.second) + ") leave the bytes [" +
                                    std::to_string(at) + ", " + std::to_string(range.first) +
                                    ") of the data section to no tensor")
          .with_file(path)
          .with_key(*name);
    }
    at = range.second;
  }
  if (at != data_size) {
    return Status::data("the tensors' data_offsets end at byte " + std::to_string(at) +
                        " but the data section has " + std::to_string(data_size) +
                        " bytes (truncated, or bytes no tensor accounts for)")
        .with_file(path);
  }
  return Status::ok();
}

Result<const SafetensorsFile::Entry*> SafetensorsFile::entry(
    const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape) const {
  auto it = index_.find(name);
  if (it == index_.end()) return Status::data("missing tensor").with_file(path_).with_key(name);
  if (it->second.dtype != dtype || it->second.shape != shape) {
    return Status::data("expected " + dtype + " " + shape_text(shape) + ", found " +
                        it->second.dtype + " " + shape_text(it->second.shape))
        .with_file(path_)
        .with_key(name);
  }
  return &it->second;
}

Result<const void*> SafetensorsFile::get(const std::string& name, const std::string& dtype,
                                         const std::vector<int64_t>& shape) const {
  KILN_CHECK(!header_only_, "SafetensorsFile::get on a file read with read_header");
  KILN_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype, shape));
  return static_cast<const void*>(bytes_.data() + data_start_ + e->begin);
}

Status SafetensorsFile::read_range(const std::string& name, const std::string& dtype,
                                   const std::vector<int64_t>& shape, size_t first, size_t count,
                                   void* dst) const {
  KILN_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype, shape));
  const size_t esize = safetensors_dtype_size(dtype);
  const size_t n = (e->end - e->begin) / esize;
  if (first > n || count > n - first) {
    return Status::data("elements [" + std::to_string(first) + ", " +
                        std::to_string(first + count) + ") lie outside the tensor's " +
                        std::to_string(n))
        .with_file(path_)
        .with_key(name);
  }
  const size_t at = data_start_ + e->begin + first * esize, bytes = count * esize;
  if (!header_only_) {
    if (bytes) std::memcpy(dst, bytes_.data() + at, bytes);
    return Status::ok();
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("open", path_);
  size_t got = 0;
  Status status = Status::ok();
  while (got < bytes) {
    const ssize_t r =
        ::pread(fd, static_cast<char*>(dst) + got, bytes - got, static_cast<off_t>(at + got));
    if (r <= 0) {
      status =
          r < 0 ? Status::from_errno("read", path_)
                : Status::data("file shorter than its header says (truncated?)").with_file(path_);
      break;
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return status;
}

Status SafetensorsFile::read_block(const std::string& name, const std::string& dtype,
                                   const std::vector<int64_t>& shape, size_t row0, size_t nrows,
                                   size_t col0, size_t ncols, void* dst) const {
  KILN_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype, shape));
  const size_t esize = safetensors_dtype_size(dtype);
  if (shape.size() != 2 || row0 + nrows > static_cast<size_t>(shape[0]) ||
      col0 + ncols > static_cast<size_t>(shape[1])) {
    return Status::data("block rows [" + std::to_string(row0) + ", " +
                        std::to_string(row0 + nrows) + ") x columns [" + std::to_string(col0) +
                        ", " + std::to_string(col0 + ncols) + ") outside the tensor " +
                        shape_text(shape))
        .with_file(path_)
        .with_key(name);
  }
  const size_t cols = static_cast<size_t>(shape[1]);
  char* out = static_cast<char*>(dst);
  if (!header_only_) {
    for (size_t r = 0; r < nrows; ++r) {
      std::memcpy(out + r * ncols * esize,
                  bytes_.data() + data_start_ + e->begin + ((row0 + r) * cols + col0) * esize,
                  ncols * esize);
    }
    return Status::ok();
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("open", path_);
  Status status = Status::ok();
  // Whole rows: one read; else one read per row.
  const bool whole = col0 == 0 && ncols == cols;
  const size_t pieces = whole ? 1 : nrows;
  const size_t piece_bytes = whole ? nrows * cols * esize : ncols * esize;
  for (size_t p = 0; p < pieces && status.is_ok(); ++p) {
    const size_t at = data_start_ + e->begin + ((row0 + p) * cols + col0) * esize;
    size_t got = 0;
    while (got < piece_bytes) {
      const ssize_t r =
          ::pread(fd, out + p * piece_bytes + got, piece_bytes - got, static_cast<off_t>(at + got));
      if (r <= 0) {
        status =
            r < 0 ? Status::from_errno("read", path_)
                  : Status::data("file shorter than its header says (truncated?)").with_file(path_);
        break;
      }
      got += static_cast<size_t>(r);
    }
  }
  ::close(fd);
  return status;
}

Result<std::pair<std::string, std::vector<int64_t>>> SafetensorsFile::info(
    const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return Status::not_found("no tensor '" + name + "'").with_file(path_);
  return std::make_pair(it->second.dtype, it->second.shape);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

Result<TensorView> SafetensorsFile::view(const std::string& name) const {
  KILN_CHECK(!header_only_, "SafetensorsFile::view on a file read with read_header");
  auto it = index_.find(name);
  if (it == index_.end()) return Status::not_found("no tensor '" + name + "'").with_file(path_);
  const Entry& e = it->second;
  return TensorView{name, e.dtype, e.shape, bytes_.data() + data_start_ + e.begin, e.end - e.begin};
}

}  // namespace kiln::engine
