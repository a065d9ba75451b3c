// Internal to engine/ (used by engine/data/step_batches.h): moves a step's micro-batches to the
// device and the per-token losses back.
//
// upload(i, batch) copies micro-batch i's inputs and targets into a pinned host buffer and starts
// an asynchronous copy to backend memory (on a GPU, on the copy stream, so it overlaps the compute
// already queued and the loader's work on the next micro-batch); at(i) returns the backend
// pointers, making the compute queued afterwards wait for that copy (no host sync). Each
// micro-batch writes its losses to losses(i); host_losses() brings all of a step's losses to the
// host in one copy into pinned memory (a direct DMA; on the CPU no copy at all), download_losses()
// copies them on into a caller's buffer. On the CPU the copies are memcpy and nothing waits.
// Buffers grow to the largest grad_accum seen (or reserve()) and are reused. Micro-batch i uses the
// backend's upload slot (slot_base + i) % Runtime::kUploadSlots (two objects filled at once:
// different bases). Not thread-safe; upload() may run on another thread than the compute once
// reserve() has allocated (backend allocations are the owning thread's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/data/data_source.h"
#include "engine/device/runtime.h"

namespace kiln::engine {

class DeviceBatches {
 public:
  DeviceBatches(Runtime* runtime, int64_t rows, int64_t seq_len, int slot_base = 0);
  ~DeviceBatches();
  DeviceBatches(const DeviceBatches&) = delete;
  DeviceBatches& operator=(const DeviceBatches&) = delete;

  // Buffers for n micro-batches (allocates when more than before).
  void reserve(size_t n);
  void upload(size_t i, const MicroBatch& batch);
  struct Tokens {
    const int32_t* inputs;
    const int32_t* targets;
    const int32_t* doc_start;  // zeros (one document per row) when the batch has none
  };
  Tokens at(size_t i);
  float* losses(size_t i);
  // Micro-batches 0..count-1's losses, count * rows * seq_len values, readable by the host: the
  // backend's buffer itself where the host can address it (CPU), else a pinned host copy (waits
  // for the work queued before). Valid until the next host_losses / download_losses.
  const float* host_losses(size_t count);
  // The same into host `out`.
  void download_losses(size_t count, float* out);

 private:
  struct Slot {
    int32_t* pinned = nullptr;    // inputs, targets, doc_start: 3 * rows * seq_len
    DeviceArray<int32_t> tokens;  // the same on the backend
  };
  int slot(size_t i) const { return static_cast<int>((slot_base_ + i) % Runtime::kUploadSlots); }
  Runtime* rt_;
  size_t n_;  // rows * seq_len
  size_t slot_base_;
  std::vector<Slot> slots_;
  DeviceArray<float> losses_;
  float* pinned_losses_ = nullptr;  // host copy of losses_ (device backends), pinned_count_ * n_
  size_t pinned_count_ = 0;
};

}  // namespace kiln::engine
