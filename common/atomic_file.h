// Atomic file output: a file appears complete under its final name or not at all.
//
// AtomicFile writes to "<path>.tmp.<pid>" in the same directory; commit() flushes, fsyncs,
// renames onto <path> and fsyncs the directory. Destroying an uncommitted AtomicFile removes the
// temporary. Not thread-safe; one writer per object.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kiln {

class AtomicFile {
 public:
  AtomicFile() = default;
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Opens the temporary next to `path`; creates missing parent directories.
  Status open(const std::string& path);
  Status write(std::string_view bytes);
  // fflush + fsync + rename + fsync(dir). After commit the object is closed.
  Status commit();
  // Removes the temporary without touching `path`.
  void abort();
  const std::string& temp_path() const { return temp_path_; }
  FILE* stream() { return file_; }

 private:
  std::string path_;
  std::string temp_path_;
  FILE* file_ = nullptr;
};

// Whole-file helpers.
Status write_file_atomic(const std::string& path, std::string_view bytes);
Result<std::string> read_file(const std::string& path);
// fsync a directory (after a rename inside it).
Status fsync_dir(const std::string& dir);
// rename + fsync of the destination's directory.
Status rename_durable(const std::string& from, const std::string& to);
// Removes AtomicFile temporaries ("<name>.tmp.<pid>") left under `dir` (recursively) by a killed
// process, so a resumed job's output tree holds only complete files. Call it only while no other
// process writes under `dir`. Returns how many were removed.
Result<size_t> remove_stale_temporaries(const std::string& dir);

}  // namespace kiln
