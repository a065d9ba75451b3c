#include "engine/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>
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
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
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
// A JSON array of integers as T. nlohmann reads an integer past 64 bits as a double, and
// get<integer>() of a double outside the type's range is undefined behaviour (fuzz finding
// shape-dimension-past-int64-is-a-double): anything but integers throws.
template <typename T>
std::vector<T> json_integers(const nlohmann::json& a) {
  if (!a.is_array()) throw std::runtime_error("not an array");
  std::vector<T> out;
  out.reserve(a.size());
  for (const auto& x : a) {
    if (!x.is_number_integer()) throw std::runtime_error("not an integer");
    out.push_back(x.get<T>());
  }
  return out;
}
}  // namespace

Result<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  KILN_ASSIGN_OR_RETURN(f.bytes_, read_file(path));
  if (f.bytes_.size() < 8) return Status::data("truncated safetensors file").with_file(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(f.bytes_[i])) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Status::data("safetensors header length " + std::to_string(n) +
                        " is over the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                        " bytes")
        .with_file(path);
  }
  if (n > f.bytes_.size() - 8) {
    return Status::data("safetensors header length " + std::to_string(n) + " runs past the end of the " +
                        std::to_string(f.bytes_.size()) + "-byte file (truncated?)")
        .with_file(path);
  }
  f.data_start_ = 8 + n;
  const size_t data_size = f.bytes_.size() - f.data_start_;
  Result<nlohmann::json> parsed = parse_untrusted_json(std::string_view(f.bytes_).substr(8, n));
  if (!parsed.is_ok()) {
    return std::move(parsed).take_status().prefixed("safetensors header").with_file(path);
  }
  nlohmann::json header = std::move(parsed).value();
  if (!header.is_object()) return Status::data("safetensors header is not an object").with_file(path);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Status::data("bad __metadata__").with_file(path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return Status::data("metadata values must be strings").with_file(path);
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& v = it.value();
    Entry e;
    try {
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = json_integers<int64_t>(v.at("shape"));
      auto offs = json_integers<uint64_t>(v.at("data_offsets"));
      if (offs.size() != 2) throw std::runtime_error("data_offsets");
      e.begin = offs[0];
      e.end = offs[1];
    } catch (const std::exception&) {
      return Status::data("malformed tensor entry").with_file(path).with_key(it.key());
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
            .with_file(path).with_key(it.key());
      }
    }
    if (e.begin > e.end || e.end > data_size || e.end - e.begin != bytes) {
      return Status::data("tensor bytes do not match dtype/shape or lie outside the file")
          .with_file(path).with_key(it.key());
    }
    f.index_[it.key()] = e;
  }
  return f;
}

Result<const void*> SafetensorsFile::get(const std::string& name, const std::string& dtype,
                                         const std::vector<int64_t>& shape) const {
  auto it = index_.find(name);
  if (it == index_.end()) return Status::data("missing tensor").with_file(path_).with_key(name);
  if (it->second.dtype != dtype || it->second.shape != shape) {
    return Status::data("expected " + dtype + " " + shape_text(shape) + ", found " +
                        it->second.dtype + " " + shape_text(it->second.shape))
        .with_file(path_).with_key(name);
  }
  return static_cast<const void*>(bytes_.data() + data_start_ + it->second.begin);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

Result<TensorView> SafetensorsFile::view(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return Status::not_found("no tensor '" + name + "'").with_file(path_);
  const Entry& e = it->second;
  return TensorView{name, e.dtype, e.shape, bytes_.data() + data_start_ + e.begin, e.end - e.begin};
}

}  // namespace kiln::engine
