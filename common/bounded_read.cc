#include "common/bounded_read.h"

#include <cstdio>

namespace kiln {

Result<std::string> read_file_capped(const std::string& path, uint64_t max_bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::from_errno("open", path);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    out.append(buf, n);
    if (out.size() > max_bytes) {
      std::fclose(f);
      return Status::data("larger than the limit of " + std::to_string(max_bytes) +
                          " bytes for this file")
          .with_file(path);
    }
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::from_errno("read", path);
  return out;
}

bool read_line_capped(std::istream& in, size_t max_bytes, std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  std::streambuf* sb = in.rdbuf();
  if (!sb) return false;
  bool any = false;
  while (true) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line->size() == max_bytes) {  // (not read on: a stream without newlines never ends)
      *too_long = true;
      return true;
    }
    line->push_back(static_cast<char>(c));
  }
}

}  // namespace kiln
