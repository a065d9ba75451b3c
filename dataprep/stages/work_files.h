// The files of the work folder OUT/.kiln-prep/ (stage markers, blobs) and the crash hook of the
// resume tests. Every write is atomic (common/atomic_file.h): a file is complete or absent.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace kiln::prep::detail {

Status make_dirs(const std::string& path);
Status remove_all(const std::string& path);
std::string rank_tag(int rank);                                  // "00003"
Result<nlohmann::json> read_json_file(const std::string& path);  // kData when not JSON
Status write_json_file(const std::string& path, const nlohmann::json& j);
// A binary blob with a recorded checksum: writes `bytes` to path and sets (*info)["bytes"] and
// (*info)["xxh3"]; read_blob() refuses (kData) a file that does not match them.
Status write_blob(const std::string& path, const std::string& bytes, nlohmann::json* info);
Result<std::string> read_blob(const std::string& path, const nlohmann::json& info);

// Testing hook for kill -9 tests: when the environment variable KILN_PREP_CRASH_AT is "name" or
// "name:N", the process kills itself with SIGKILL at that point (the N-th time it is reached).
// Points: "scan-batch", "scan-unit", "stage-<name>" (after the stage is recorded),
// "write-doc", "final-removed" (after removed.jsonl, before the manifest), "append-*".
// KILN_PREP_CRASH_SIGNAL=N raises signal N there instead of SIGKILL (stop-signal tests).
void crash_point(const char* name);

}  // namespace kiln::prep::detail
