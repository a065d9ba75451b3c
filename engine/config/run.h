// Config section `run` and key `device`: where a run writes, how long it runs, what it runs on.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "kernels/ops.h"

namespace kiln::engine {

struct RunConfig {
  std::string dir = "runs/default";
  int64_t steps = 100;
  uint64_t seed = 1234;
  int64_t log_every = 1;  // console line every N steps (metrics.jsonl gets every step)
  int64_t threads = 0;    // host threads for kernels; 0: all cores
};

// The keys read and checked (kConfig naming the key).
Result<RunConfig> parse_run_config(const Config& cfg);
Result<Device> parse_device_key(const Config& cfg);  // `device`

const char* device_name(Device d);  // "cpu" | "cuda"
// "cpu" | "cuda"; anything else is a config error naming `key`.
Result<Device> parse_device(const std::string& text, const std::string& key = "device");

}  // namespace kiln::engine
