// The work folder's files: folders, JSON state files, checksummed blobs, the crash hook
// (work_files.h).
#include "dataprep/stages/work_files.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/hash.h"

namespace kiln::prep::detail {
namespace fs = std::filesystem;

void crash_point(const char* name) {
  static const std::string spec = [] {
    const char* v = std::getenv("KILN_PREP_CRASH_AT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  std::string want = spec;
  uint64_t nth = 1;
  if (auto colon = spec.rfind(':'); colon != std::string::npos) {
    want = spec.substr(0, colon);
    nth = std::strtoull(spec.c_str() + colon + 1, nullptr, 10);
  }
  if (want != name) return;
  static std::atomic<uint64_t> hits{0};
  // KILN_PREP_CRASH_SIGNAL=N sends signal N instead (the stop-signal tests use SIGTERM).
  static const int sig = [] {
    const char* v = std::getenv("KILN_PREP_CRASH_SIGNAL");
    return v ? std::atoi(v) : SIGKILL;
  }();
  if (hits.fetch_add(1) + 1 == nth) ::raise(sig);
}

Status make_dirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::io("cannot create folder: " + ec.message()).with_file(path);
  return Status::ok();
}

Status remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Status::io("cannot remove: " + ec.message()).with_file(path);
  return Status::ok();
}

std::string rank_tag(int rank) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", rank);
  return buf;
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::data("not valid JSON").with_file(path);
  return j;
}

Status write_json_file(const std::string& path, const nlohmann::json& j) {
  return write_file_atomic(path, j.dump(1) + "\n");
}

Status write_blob(const std::string& path, const std::string& bytes, nlohmann::json* info) {
  KILN_RETURN_IF_ERROR(write_file_atomic(path, bytes));
  (*info)["bytes"] = bytes.size();
  (*info)["xxh3"] = hex64(xxh3_64(bytes));
  return Status::ok();
}

Result<std::string> read_blob(const std::string& path, const nlohmann::json& info) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  if (!info.contains("bytes") || !info.contains("xxh3") || !info["bytes"].is_number_unsigned() ||
      bytes.size() != info["bytes"].get<uint64_t>() ||
      hex64(xxh3_64(bytes)) != info["xxh3"].get<std::string>())
    return Status::data("work file does not match its recorded checksum").with_file(path);
  return bytes;
}

}  // namespace kiln::prep::detail
