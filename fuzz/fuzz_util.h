// Helpers shared by the fuzz targets in fuzz/targets/ (see docs/HARDENING.md "Fuzzing").
//
// Every target defines LLVMFuzzerTestOneInput and is built twice: as a libFuzzer binary (clang,
// KILN_FUZZ=ON, tools/fuzz) and as a plain replay executable (any compiler, fuzz/replay_main.cc)
// that the test suite runs over the target's corpus. A target must never crash, hang, leak or
// trip a sanitizer on any input; invariants it checks on accepted input fail through
// FUZZ_REQUIRE, which aborts (a finding).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/log.h"

namespace kiln::fuzz {

// Aborts with the failed condition: libFuzzer reports it as a crash and saves the input.
#define FUZZ_REQUIRE(cond)                                                               \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__,       \
                   __LINE__);                                                            \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A per-process scratch directory (removed at exit) for parsers that read from a path.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm")
                                     ? std::filesystem::path("/dev/shm")
                                     : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("kiln-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{d};
    return d.string();
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  return path;
}

// Splits the input at the first occurrence of `sep` (a two-part input such as vocab + merges).
inline std::pair<std::string_view, std::string_view> split_two(std::string_view in,
                                                               std::string_view sep) {
  size_t at = in.find(sep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + sep.size())};
}

// Parsers log warnings; keep fuzzing output to findings only.
inline void quiet_logs() {
  static bool done = [] {
    set_log_level("off");
    return true;
  }();
  (void)done;
}

}  // namespace kiln::fuzz
