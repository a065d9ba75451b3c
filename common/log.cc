#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "common/log_text.h"

namespace kiln {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("kiln");
    logger->set_pattern("[kiln] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::info);
    if (const char* env = std::getenv("KILN_LOG_LEVEL")) set_log_level(env);
  });
}

void set_log_level(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return;
  spdlog::set_level(parsed);
}

void log_warning_text(const std::string& message) { KILN_LOG_WARN("{}", message); }

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace kiln
