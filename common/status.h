// Status and Result<T>: expected failures as values.
//
// A Status is ok or carries a code, a message and optional context (file, line, key) naming
// where the problem is. The CLI maps codes to exit codes: kUsage/kConfig -> 2, kData -> 3,
// everything else -> 1. Functions that can fail return Status or Result<T>; callers propagate
// with KILN_RETURN_IF_ERROR / KILN_ASSIGN_OR_RETURN. Broken invariants use KILN_CHECK (aborts).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  kOk = 0,
  kUsage,         // bad command line
  kConfig,        // bad config key or value
  kData,          // bad input data (corpus, shard, manifest)
  kIo,            // OS-level I/O failure
  kNotFound,      // a file or key that must exist does not
  kInternal,      // everything else
  kUnimplemented  // a capability that is not built yet
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok

  static Status ok() { return Status(); }
  static Status usage(std::string msg) { return Status(StatusCode::kUsage, std::move(msg)); }
  static Status config(std::string msg) { return Status(StatusCode::kConfig, std::move(msg)); }
  static Status data(std::string msg) { return Status(StatusCode::kData, std::move(msg)); }
  static Status io(std::string msg) { return Status(StatusCode::kIo, std::move(msg)); }
  static Status not_found(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  static Status unimplemented(std::string msg) {
    return Status(StatusCode::kUnimplemented, std::move(msg));
  }
  // An I/O failure from errno, e.g. Status::from_errno("open", path).
  static Status from_errno(const std::string& what, const std::string& path, int err = -1);

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }
  long line() const { return line_; }
  const std::string& key() const { return key_; }

  // Context setters return *this so they chain: Status::data("bad").with_file(p).with_line(3).
  Status& with_file(std::string file) & { file_ = std::move(file); return *this; }
  Status&& with_file(std::string file) && { file_ = std::move(file); return std::move(*this); }
  Status& with_line(long line) & { line_ = line; return *this; }
  Status&& with_line(long line) && { line_ = line; return std::move(*this); }
  Status& with_key(std::string key) & { key_ = std::move(key); return *this; }
  Status&& with_key(std::string key) && { key_ = std::move(key); return std::move(*this); }
  // Prefixes the message with more context: "reading manifest: <old message>".
  Status&& prefixed(const std::string& what) && {
    if (!is_ok()) message_ = what + ": " + message_;
    return std::move(*this);
  }

  // "<file>:<line>: key 'k': message" with the parts that are set.
  std::string to_string() const;
  // Process exit code per the CLI contract: 0 ok, 2 usage/config, 3 data, 1 otherwise.
  int exit_code() const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string file_;
  long line_ = 0;
  std::string key_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {           // NOLINT(implicit)
    if (std::get<Status>(v_).is_ok()) v_ = Status::internal("Result constructed from ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  Status take_status() && { return is_ok() ? Status() : std::move(std::get<Status>(v_)); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::move(std::get<T>(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::kiln::Status _kiln_st = (expr);           \
    if (!_kiln_st.is_ok()) return _kiln_st;     \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return std::move(tmp).take_status(); \
  lhs = std::move(tmp).value()

#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_res_, __LINE__), lhs, expr)

// Broken invariants: abort with file and line. Never continue with corrupt state.
#define KILN_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::kiln::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
