#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kUsage: return "usage error";
    case StatusCode::kConfig: return "config error";
    case StatusCode::kData: return "data error";
    case StatusCode::kIo: return "I/O error";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnimplemented: return "not implemented";
  }
  return "unknown";
}

Status Status::from_errno(const std::string& what, const std::string& path, int err) {
  if (err < 0) err = errno;
  Status st(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIo,
            what + " failed: " + std::strerror(err));
  st.file_ = path;
  return st;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string out;
  if (!file_.empty()) {
    out += file_;
    if (line_ > 0) out += ":" + std::to_string(line_);
    out += ": ";
  }
  if (!key_.empty()) out += "key '" + key_ + "': ";
  out += message_;
  return out;
}

int Status::exit_code() const {
  switch (code_) {
    case StatusCode::kOk: return 0;
    case StatusCode::kUsage:
    case StatusCode::kConfig:
    case StatusCode::kUnimplemented: return 2;
    case StatusCode::kData: return 3;
    default: return 1;
  }
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "kiln: internal check failed at %s:%d: %s%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kiln
