#include "dataprep/tokenizer/tokenizer_io.h"

#include <archive.h>
#include <archive_entry.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <filesystem>

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

Result<std::string> read_maybe_compressed(const std::string& path) {
  if (strip_compression(path) == path) return read_file(path);
  struct archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_raw(a);
  std::string out;
  Status st;
  if (archive_read_open_filename(a, path.c_str(), 1 << 20) != ARCHIVE_OK) {
    st = Status::io(std::string("cannot open: ") + archive_error_string(a)).with_file(path);
  } else {
    struct archive_entry* entry;
    if (archive_read_next_header(a, &entry) == ARCHIVE_OK) {
      char buf[1 << 16];
      la_ssize_t n;
      while ((n = archive_read_data(a, buf, sizeof(buf))) > 0) out.append(buf, size_t(n));
      if (n < 0) st = Status::data(std::string("cannot decompress: ") + archive_error_string(a)).with_file(path);
    }
  }
  archive_read_free(a);
  if (!st.is_ok()) return st;
  return out;
}

Result<TrainingTexts> read_training_texts(const std::vector<std::string>& paths, uint64_t max_bytes) {
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
    KILN_ASSIGN_OR_RETURN(std::string content, read_maybe_compressed(file));
    ++out.files;
    if (!is_jsonl_name(file)) {
      out.bytes += content.size();
      out.texts.push_back(std::move(content));
      continue;
    }
    size_t pos = 0;
    while (pos < content.size()) {
      size_t end = content.find('\n', pos);
      if (end == std::string::npos) end = content.size();
      std::string_view line(content.data() + pos, end - pos);
      pos = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        ++out.skipped_lines;
        continue;
      }
      std::string text = j["text"].get<std::string>();
      out.bytes += text.size();
      out.texts.push_back(std::move(text));
      if (max_bytes && out.bytes >= max_bytes) {
        out.truncated = true;
        break;
      }
    }
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
