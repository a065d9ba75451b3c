// The host memory this process can still use: MemAvailable of /proc/meminfo, capped by the
// tightest cgroup limit above it less that cgroup's usage (v2 memory.max / memory.current of its
// cgroup and every parent, or v1 memory.limit_in_bytes / memory.usage_in_bytes; usage without the
// inactive file cache, which the kernel reclaims first) - what a container or a batch
// scheduler's allocation allows, which is often far less than the machine has. Read on every
// call (a few small files); thread-safe. Used by kiln train's memory preflight
// (engine/train/preflight.h) and kiln prep's --memory check.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

struct HostMemory {
  bool known = false;          // something was readable (else available is 0 and means nothing)
  uint64_t available = 0;      // what the process can still allocate
  uint64_t mem_available = 0;  // /proc/meminfo MemAvailable (0: unknown)
  uint64_t cgroup_limit = 0;   // the cgroup's limit (0: none or unknown)
  uint64_t cgroup_usage = 0;   // its usage less the inactive file cache
  // "MemAvailable 23.1 GiB" or "cgroup limit 8.0 GiB - in use 1.2 GiB": where `available` is from.
  std::string source;
};

// root: prepended to /proc and /sys paths (tests point it at a fake tree); "" for the real ones.
HostMemory host_memory(const std::string& root = "");

}  // namespace kiln
