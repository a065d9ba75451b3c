// Logging for sources that cannot include spdlog (CUDA: nvcc cannot compile fmt's compile-time
// format strings). The message is formatted already; it goes to the same logger as common/log.h.
#pragma once

#include <string>

namespace kiln {

void log_warning_text(const std::string& message);

}  // namespace kiln
