#include "dataprep/ingest/input.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace kiln::prep {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Name without the compression suffix.
std::string strip_compression(const std::string& name) {
  if (ends_with(name, ".gz")) return name.substr(0, name.size() - 3);
  if (ends_with(name, ".zst")) return name.substr(0, name.size() - 4);
  return name;
}

bool is_jsonl_name(const std::string& name) {
  std::string base = strip_compression(name);
  return ends_with(base, ".jsonl") || ends_with(base, ".ndjson") || ends_with(base, ".json");
}

bool is_text_name(const std::string& name) {
  std::string base = strip_compression(name);
  return ends_with(base, ".txt") || ends_with(base, ".md");
}

// "dir/name.jsonl.gz" -> "name".
std::string file_stem(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  name = strip_compression(name);
  for (const char* ext : {".jsonl", ".ndjson", ".json", ".txt", ".md"}) {
    if (ends_with(name, ext)) return name.substr(0, name.size() - std::string(ext).size());
  }
  return name;
}

Status stat_file(const std::string& path, InputFile* f) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno("stat", path);
  f->size = static_cast<uint64_t>(st.st_size);
  f->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return Status::ok();
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

Status add_folder(const std::string& root, std::map<std::string, InputFile>* out) {
  std::error_code ec;
  fs::recursive_directory_iterator it(
      root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return Status::io("cannot read folder: " + ec.message()).with_file(root);
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Status::io("cannot read folder: " + ec.message()).with_file(root);
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    InputFile f;
    f.path = p.string();
    f.compression = compression_for_name(name);
    if (is_jsonl_name(name)) {
      f.kind = InputKind::kJsonl;
      f.id_base = file_stem(f.path);
    } else {
      f.kind = InputKind::kText;
      f.id_base = fs::relative(p, root, ec).generic_string();
      if (ec || f.id_base.empty()) f.id_base = name;
    }
    KILN_RETURN_IF_ERROR(stat_file(f.path, &f));
    out->emplace(f.path, f);
  }
  return Status::ok();
}

Status add_path(const std::string& path, std::map<std::string, InputFile>* out) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return Status::usage("input not found: " + path);
  if (fs::is_directory(st)) return add_folder(path, out);
  if (!fs::is_regular_file(st)) return Status::usage("input is not a file or folder: " + path);
  InputFile f;
  f.path = path;
  std::string name = fs::path(path).filename().string();
  f.compression = compression_for_name(name);
  if (is_text_name(name)) {
    f.kind = InputKind::kText;
    f.id_base = name;
  } else {
    f.kind = InputKind::kJsonl;
    f.id_base = file_stem(path);
  }
  KILN_RETURN_IF_ERROR(stat_file(path, &f));
  out->emplace(f.path, f);
  return Status::ok();
}

}  // namespace

InputCompression compression_for_name(const std::string& name) {
  if (ends_with(name, ".gz")) return InputCompression::kGzip;
  if (ends_with(name, ".zst")) return InputCompression::kZstd;
  return InputCompression::kNone;
}

Result<std::vector<InputFile>> discover_inputs(const std::vector<std::string>& paths) {
  if (paths.empty()) return Status::usage("no input given (--input PATH...)");
  std::map<std::string, InputFile> found;  // sorted by path, duplicates merged
  for (const std::string& p : paths) {
    if (!has_glob_chars(p) || fs::exists(p)) {
      KILN_RETURN_IF_ERROR(add_path(p, &found));
      continue;
    }
    glob_t g{};
    int rc = ::glob(p.c_str(), GLOB_NOSORT, nullptr, &g);
    if (rc != 0 || g.gl_pathc == 0) {
      ::globfree(&g);
      return Status::usage("input pattern matches nothing: " + p);
    }
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    for (const auto& m : matches) KILN_RETURN_IF_ERROR(add_path(m, &found));
  }
  std::vector<InputFile> out;
  out.reserve(found.size());
  for (auto& [path, f] : found) out.push_back(std::move(f));
  if (out.empty()) return Status::usage("the inputs hold no files");
  return out;
}

}  // namespace kiln::prep
