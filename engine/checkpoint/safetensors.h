// safetensors files (https://github.com/huggingface/safetensors): the tensor format of Kiln
// checkpoints, readable by the wider ecosystem (safetensors / transformers in Python).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// padded with spaces to a multiple of 8, then the tensor bytes, contiguous, in the order given.
// Writing is atomic (common/atomic_file.h). Reading validates the header (at most
// kMaxSafetensorsHeaderBytes, JSON nested at most kMaxJsonDepth; offsets inside the file, sizes =
// product(shape) * element size, checked for 64-bit overflow) and names the file and tensor on
// error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/status.h"

namespace kiln::engine {

struct TensorView {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I64", "U8"
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

size_t safetensors_dtype_size(const std::string& dtype);  // 0 when unknown

// The JSON header of a file Kiln reads may not be longer (the safetensors library's own cap).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

Status write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// A safetensors file written tensor by tensor (a file larger than memory): the header is made
// from every tensor's name, dtype and shape up front, then each tensor's bytes are appended in
// that order, in any number of pieces; commit() checks every byte was given and renames the
// temporary onto the path (common/atomic_file.h), so the file appears complete or not at all.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
  };
  Status open(const std::string& path, const std::vector<Spec>& tensors,
              const std::map<std::string, std::string>& metadata = {});
  // The next bytes of the tensors, in order (a piece may not cross into the next tensor).
  Status append(const void* data, size_t bytes);
  Status commit();
  // The bytes the file's tensor data holds (the sum of the tensors').
  uint64_t data_bytes() const { return total_; }

 private:
  AtomicFile file_;
  std::vector<uint64_t> ends_;  // each tensor's end offset
  size_t next_ = 0;             // the tensor being written
  uint64_t written_ = 0, total_ = 0;
};

// A whole file read into memory, or (read_header) only its header, its tensors then read in byte
// ranges with read_range - what a rank that needs a part of a large file uses (a ZeRO shard of a
// checkpoint). Not thread-safe for concurrent loads; reads are const.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> read(const std::string& path);
  // The header only (validated against the file's size as read() does); get() and view() then
  // fail, read_range() reads from the file.
  static Result<SafetensorsFile> read_header(const std::string& path);
  // dst = `count` elements of tensor `name` from element `first` on, checking dtype and shape
  // (and first + count within the tensor); from the file (read_header) or the bytes in memory.
  Status read_range(const std::string& name, const std::string& dtype,
                    const std::vector<int64_t>& shape, size_t first, size_t count, void* dst) const;
  // The tensor's bytes, checking dtype and shape. Data error naming file and tensor otherwise.
  Result<const void*> get(const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& shape) const;
  // dst = the sub-matrix rows [row0, row0 + nrows) x columns [col0, col0 + ncols) of 2-D tensor
  // `name` (dtype and shape checked), row-major, nrows * ncols elements, one open of the file.
  Status read_block(const std::string& name, const std::string& dtype,
                    const std::vector<int64_t>& shape, size_t row0, size_t nrows, size_t col0,
                    size_t ncols, void* dst) const;
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // The stored dtype and shape of tensor `name`; kNotFound when absent.
  Result<std::pair<std::string, std::vector<int64_t>>> info(const std::string& name) const;
  const std::string& path() const { return path_; }
  // The named tensor as stored (data points into this object); kNotFound when absent.
  Result<TensorView> view(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;
  };
  // Parses the header (text) of a file whose tensor data is data_size bytes from data_start_.
  Status parse_header(std::string_view header, size_t data_size);
  Result<const Entry*> entry(const std::string& name, const std::string& dtype,
                             const std::vector<int64_t>& shape) const;
  std::string path_;
  std::string bytes_;
  bool header_only_ = false;
  size_t data_start_ = 0;
  std::map<std::string, Entry> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln::engine
