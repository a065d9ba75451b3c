#include "format/shard.h"

#include <cinttypes>
#include <cstdio>

#include "format/tar_zstd.h"

namespace kiln {

using format::detail::kTarBlock;
using format::detail::quote_name;

namespace {

constexpr size_t kMaxKeyBytes = 200;
constexpr size_t kMaxExtBytes = 64;
constexpr size_t kUstarNameBytes = 100;

uint64_t round_up_block(uint64_t n) { return (n + kTarBlock - 1) / kTarBlock * kTarBlock; }

uint64_t member_tar_bytes(size_t name_bytes, uint64_t data_bytes) {
  uint64_t bytes = kTarBlock + round_up_block(data_bytes);
  if (name_bytes > kUstarNameBytes) {
    // "NN path=<name>\n" in a pax extended header of its own.
    uint64_t record = name_bytes + 8 + 4;
    bytes += kTarBlock + round_up_block(record);
  }
  return bytes;
}
}  // namespace

const char* shard_extension(ShardCompression c) {
  return c == ShardCompression::kZstd ? ".tar.zst" : ".tar";
}
Result<ShardCompression> shard_compression_for_path(const std::string& path) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() > suffix.size() &&
           std::string_view(path).substr(path.size() - suffix.size()) == suffix;
  };
  if (ends_with(".tar.zst")) return ShardCompression::kZstd;
  if (ends_with(".tar")) return ShardCompression::kNone;
  return Status::data("shard " + quote_name(path) + ": not a shard path (expected .tar or .tar.zst)");
}
const ShardMember* ShardSample::find(std::string_view ext) const {
  for (const ShardMember& m : members) {
    if (m.ext == ext) return &m;
  }
  return nullptr;
}
Status validate_sample_key(std::string_view key) {
  if (key.empty()) return Status::data("sample key is empty");
  if (key.size() > kMaxKeyBytes) {
    return Status::data("sample key " + quote_name(key.substr(0, 40)) + "... is " +
                        std::to_string(key.size()) + " bytes, over " +
                        std::to_string(kMaxKeyBytes));
  }
  for (char c : key) {
    auto u = static_cast<unsigned char>(c);
    if (c == '.' || c == '/') {
      return Status::data("sample key " + quote_name(key) + " contains '" + std::string(1, c) + "'");
    }
    if (u < 0x20 || u > 0x7e) {
      return Status::data("sample key " + quote_name(key) +
                          " contains a byte outside printable ASCII");
    }
  }
  return Status::ok();
}
Status validate_member_ext(std::string_view ext) {
  if (ext.empty()) return Status::data("member ext is empty");
  if (ext.size() > kMaxExtBytes) {
    return Status::data("member ext " + quote_name(ext.substr(0, 40)) + "... is over " +
                        std::to_string(kMaxExtBytes) + " bytes");
  }
  bool part_empty = true;
  for (char c : ext) {
    if (c == '.') {
      if (part_empty) return Status::data("member ext " + quote_name(ext) + " has an empty part");
      part_empty = true;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) {
      return Status::data("member ext " + quote_name(ext) +
                          " may hold only letters, digits, '_', '-' and '.'");
    }
    part_empty = false;
  }
  if (part_empty) return Status::data("member ext " + quote_name(ext) + " has an empty part");
  return Status::ok();
}
int member_order(std::string_view ext) {
  if (ext == "txt") return 0;
  if (ext == "json") return 1;
  if (ext == "tokens.npy") return 2;
  return 3;
}
Status validate_sample(const ShardSample& sample) {
  KILN_RETURN_IF_ERROR(validate_sample_key(sample.key));
  for (size_t i = 0; i < sample.members.size(); ++i) {
    Status st = validate_member_ext(sample.members[i].ext);
    if (!st.is_ok()) {
      return Status::data("sample " + quote_name(sample.key) + ": " + st.message());
    }
    for (size_t j = 0; j < i; ++j) {
      if (sample.members[j].ext == sample.members[i].ext) {
        return Status::data("sample " + quote_name(sample.key) + ": duplicate member ext " +
                            quote_name(sample.members[i].ext));
      }
    }
  }
  if (sample.members.empty()) {
    return Status::data("sample " + quote_name(sample.key) + ": has no members");
  }
  return Status::ok();
}
uint64_t sample_tar_bytes(const ShardSample& sample) {
  uint64_t bytes = 0;
  for (const ShardMember& m : sample.members) {
    bytes += member_tar_bytes(sample.key.size() + 1 + m.ext.size(), m.data.size());
  }
  return bytes;
}

std::string shard_file_name(std::string_view prefix, uint64_t index, ShardCompression compression) {
  char num[32];
  std::snprintf(num, sizeof num, "-%06" PRIu64, index);
  return std::string(prefix) + num + shard_extension(compression);
}

}  // namespace kiln
