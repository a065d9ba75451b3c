// Logging: a thin layer over spdlog so every module logs the same way.
// Messages go to stderr as "[kiln] [level] message"; KILN_LOG_LEVEL (trace..off) or
// set_log_level() changes the threshold. Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace kiln {

// Sets up the default logger once (idempotent). Called by the CLI; safe to call from tests.
void init_logging();
// "trace", "debug", "info", "warn", "error", "off". Unknown names leave the level unchanged.
void set_log_level(const std::string& level);
// True when stderr is a terminal (progress bars redraw in place only then).
bool stderr_is_terminal();

}  // namespace kiln

#define KILN_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define KILN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define KILN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define KILN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
