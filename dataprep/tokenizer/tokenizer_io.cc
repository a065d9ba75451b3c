#include "dataprep/tokenizer/tokenizer_io.h"

#include <archive.h>
#include <archive_entry.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "common/atomic_file.h"

namespace kiln::prep {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_compression(const std::string& name) {
  for (const char* ext : {".gz", ".zst", ".xz", ".bz2"})
    if (ends_with(name, ext)) return name.substr(0, name.size() - std::strlen(ext));
  return name;
}

bool is_jsonl_name(const std::string& name) {
  std::string base = strip_compression(name);
  return ends_with(base, ".jsonl") || ends_with(base, ".ndjson") || ends_with(base, ".json");
}

}  // namespace

namespace {

// Calls fn(chunk, &stop) with consecutive pieces of the file's bytes, decompressed when the name
// ends in a compression suffix, until the end of the file or until fn sets stop.
using ChunkFn = std::function<Status(std::string_view chunk, bool* stop)>;

Status stream_file(const std::string& path, const ChunkFn& fn) {
  std::vector<char> buf(1 << 20);
  bool stop = false;
  if (strip_compression(path) == path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return Status::from_errno("open", path);
    Status st;
    while (st.is_ok() && !stop) {
      size_t n = std::fread(buf.data(), 1, buf.size(), f);
      if (n > 0) st = fn(std::string_view(buf.data(), n), &stop);
      if (n < buf.size()) {
        if (std::ferror(f)) st = Status::from_errno("read", path);
        break;
      }
    }
    std::fclose(f);
    return st;
  }
  struct archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_raw(a);
  Status st;
  if (archive_read_open_filename(a, path.c_str(), 1 << 20) != ARCHIVE_OK) {
    st = Status::io(std::string("cannot open: ") + archive_error_string(a)).with_file(path);
  } else {
    struct archive_entry* entry;
    if (archive_read_next_header(a, &entry) == ARCHIVE_OK) {
      la_ssize_t n;
      while (st.is_ok() && !stop && (n = archive_read_data(a, buf.data(), buf.size())) != 0) {
        if (n < 0) {
          st = Status::data(std::string("cannot decompress: ") + archive_error_string(a)).with_file(path);
          break;
        }
        st = fn(std::string_view(buf.data(), size_t(n)), &stop);
      }
    }
  }
  archive_read_free(a);
  return st;
}

Status too_long(const std::string& what, uint64_t limit, const std::string& path) {
  return Status::data(what + " is longer than the limit of " + std::to_string(limit) +
                      " bytes (--max-text-bytes)")
      .with_file(path);
}

}  // namespace

Status for_each_line(const std::string& path, uint64_t max_line_bytes, const LineFn& fn) {
  std::string line;
  uint64_t line_no = 0;
  bool stopped = false;
  KILN_RETURN_IF_ERROR(stream_file(path, [&](std::string_view chunk, bool* stop) -> Status {
    while (!chunk.empty()) {
      size_t nl = chunk.find('\n');
      std::string_view piece = chunk.substr(0, nl);
      if (line.size() + piece.size() > max_line_bytes)
        return too_long("line " + std::to_string(line_no + 1), max_line_bytes, path);
      line.append(piece);
      if (nl == std::string_view::npos) break;
      chunk.remove_prefix(nl + 1);
      KILN_RETURN_IF_ERROR(fn(line, ++line_no, stop));
      line.clear();
      if (*stop) {
        stopped = true;
        return Status::ok();
      }
    }
    return Status::ok();
  }));
  if (!stopped && !line.empty()) {  // a last line without '\n'
    bool stop = false;
    KILN_RETURN_IF_ERROR(fn(line, ++line_no, &stop));
  }
  return Status::ok();
}

Result<std::string> read_maybe_compressed(const std::string& path, uint64_t max_bytes) {
  std::string out;
  KILN_RETURN_IF_ERROR(stream_file(path, [&](std::string_view chunk, bool*) -> Status {
    if (out.size() + chunk.size() > max_bytes)
      return Status::data("decompressed content is larger than the limit of " +
                          std::to_string(max_bytes) + " bytes")
          .with_file(path);
    out.append(chunk);
    return Status::ok();
  }));
  return out;
}

Result<TrainingTexts> read_training_texts(const std::vector<std::string>& paths, uint64_t max_bytes,
                                          uint64_t max_text_bytes) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::follow_directory_symlink, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) return Status::from_errno("walk", p);
        std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file()) found.push_back(it->path().string());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      return Status::usage("input not found: " + p);
    }
  }
  TrainingTexts out;
  for (const auto& file : files) {
    if (max_bytes && out.bytes >= max_bytes) {
      out.truncated = true;
      break;
    }
    ++out.files;
    if (!is_jsonl_name(file)) {
      std::string content;
      KILN_RETURN_IF_ERROR(stream_file(file, [&](std::string_view chunk, bool*) -> Status {
        if (content.size() + chunk.size() > max_text_bytes) return too_long("the text", max_text_bytes, file);
        content.append(chunk);
        return Status::ok();
      }));
      out.bytes += content.size();
      out.texts.push_back(std::move(content));
      continue;
    }
    // JSONL: one line at a time; only the current line is held.
    KILN_RETURN_IF_ERROR(for_each_line(file, max_text_bytes,
                                       [&](std::string_view line, uint64_t, bool* stop) -> Status {
      if (line.find_first_not_of(" \t\r") == std::string::npos) return Status::ok();
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        ++out.skipped_lines;
        return Status::ok();
      }
      std::string text = j["text"].get<std::string>();
      out.bytes += text.size();
      out.texts.push_back(std::move(text));
      if (max_bytes && out.bytes >= max_bytes) {
        out.truncated = true;
        *stop = true;
      }
      return Status::ok();
    }));
    if (out.truncated) break;
  }
  return out;
}

Result<std::vector<uint32_t>> parse_token_ids(std::string_view text) {
  std::vector<uint32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i == text.size()) break;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    uint32_t id = 0;
    auto [ptr, ec] = std::from_chars(text.data() + i, text.data() + j, id);
    if (ec != std::errc() || ptr != text.data() + j)
      return Status::data("not a token id: '" + std::string(text.substr(i, std::min<size_t>(j - i, 40))) +
                          "' (item " + std::to_string(ids.size() + 1) + ")");
    ids.push_back(id);
    i = j;
  }
  return ids;
}

}  // namespace kiln::prep
