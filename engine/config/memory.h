// Config key `activation_checkpointing` and section `memory`: what a rank keeps and the memory
// preflight (engine/train/preflight.h).
#pragma once

#include <cstdint>
#include <optional>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

enum class Recompute { kNone, kSelective, kFull };  // activation checkpointing
const char* recompute_name(Recompute r);            // "none" | "selective" | "full"

// The memory preflight: before allocating, every rank compares its estimated peak with what it
// has.
struct MemoryConfig {
  bool check = true;
  double margin = 0.1;             // held back from the budget
  std::optional<uint64_t> budget;  // bytes per rank; unset: measured (host or device memory)
};

// The keys read and checked (kConfig naming the key).
Result<Recompute> parse_activation_checkpointing(const Config& cfg);
Result<MemoryConfig> parse_memory_config(const Config& cfg);

}  // namespace kiln::engine
