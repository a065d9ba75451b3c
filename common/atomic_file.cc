#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace kiln {
namespace fs = std::filesystem;

AtomicFile::~AtomicFile() { abort(); }

Status AtomicFile::open(const std::string& path) {
  abort();
  path_ = path;
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) return Status::io("create directory failed: " + ec.message()).with_file(p.parent_path());
  temp_path_ = path + ".tmp." + std::to_string(::getpid());
  file_ = std::fopen(temp_path_.c_str(), "wb");
  if (!file_) return Status::from_errno("open for writing", temp_path_);
  return Status::ok();
}

Status AtomicFile::write(std::string_view bytes) {
  KILN_CHECK(file_ != nullptr, "AtomicFile::write before open");
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return Status::from_errno("write", temp_path_);
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  KILN_CHECK(file_ != nullptr, "AtomicFile::commit before open");
  if (std::fflush(file_) != 0) return Status::from_errno("flush", temp_path_);
  if (::fsync(::fileno(file_)) != 0) return Status::from_errno("fsync", temp_path_);
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    return Status::from_errno("close", temp_path_);
  }
  file_ = nullptr;
  Status st = rename_durable(temp_path_, path_);
  if (!st.is_ok()) return st;
  temp_path_.clear();
  return Status::ok();
}

void AtomicFile::abort() {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (!temp_path_.empty()) {
    std::error_code ec;
    fs::remove(temp_path_, ec);
    temp_path_.clear();
  }
}

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f;
  KILN_RETURN_IF_ERROR(f.open(path));
  KILN_RETURN_IF_ERROR(f.write(bytes));
  return f.commit();
}

Result<std::string> read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::from_errno("open", path);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::from_errno("read", path);
  return out;
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::from_errno("open directory", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::from_errno("fsync directory", dir, err);
  return Status::ok();
}

Status rename_durable(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) return Status::from_errno("rename to " + to, from);
  return fsync_dir(fs::path(to).parent_path().string());
}

Result<size_t> remove_stale_temporaries(const std::string& dir) {
  size_t removed = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string name = it->path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 == name.size()) continue;
    bool digits = true;
    for (size_t i = at + 5; i < name.size(); ++i) digits = digits && name[i] >= '0' && name[i] <= '9';
    if (!digits) continue;
    std::error_code rm;
    if (!fs::remove(it->path(), rm) || rm) {
      return Status::io("cannot remove a stale temporary file: " + rm.message())
          .with_file(it->path().string());
    }
    ++removed;
  }
  if (ec) return Status::io("cannot list the directory: " + ec.message()).with_file(dir);
  return removed;
}

}  // namespace kiln
