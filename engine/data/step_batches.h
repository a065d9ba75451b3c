// A training step's micro-batches, with the next step's drawn ahead (docs/GPU.md "Next batch
// overlapped").
//
// StepBatches owns the training loop's access to its DataSource. take(count) gives a step its
// micro-batches, checked against the vocabulary and uploaded (DeviceBatches): the ones prefetch()
// drew on a background thread while the previous step computed, or drawn now. Two sets of
// buffers alternate (pinned host memory; on a GPU the copy stream), so the next step's upload
// never touches what the current step reads.
//
// Exactness: the data a run sees does not depend on prefetching. prefetch() records the source's
// state and weights first. set_weights() and restore() wait for a draw in flight and, when one
// was made, put the source back to the recorded state (the drawn batches are dropped and
// counted) before they act, so they act on the position they would have without prefetching;
// state() is the recorded state while batches are drawn ahead (a checkpoint's position excludes
// them), weights() the recorded weights. Nothing else may move the source.
//
// The background thread touches only the source and the idle set of buffers; every other call is
// the owning thread's. Not thread-safe otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/data/data_source.h"
#include "engine/data/device_batches.h"
#include "engine/device/runtime.h"

namespace kiln::engine {

class StepBatches {
 public:
  // `data` and `backend` outlive this object. Every micro-batch is rows x seq_len; token ids must
  // be below `vocab`. prefetch false: prefetch() does nothing (every step draws when it starts).
  StepBatches(DataSource* data, Runtime* runtime, int64_t rows, int64_t seq_len, int64_t vocab,
              bool prefetch);
  ~StepBatches();  // waits for a draw in flight
  StepBatches(const StepBatches&) = delete;
  StepBatches& operator=(const StepBatches&) = delete;

  struct Drawn {
    Status status;       // the first error (the source's, or a token id outside the vocabulary)
    int64_t valid = 0;   // targets >= 0 over the batches drawn
    double wait_ms = 0;  // how long this call waited for data (the loader, or the prefetch)
    bool prefetched = false;
  };
  // The step's `count` micro-batches: batches() and, on the backend, staged().
  Drawn take(size_t count);
  std::vector<MicroBatch>& batches() { return sets_[cur_].batches; }
  DeviceBatches& staged() { return *sets_[cur_].staged; }

  // Starts drawing the next step's `count` micro-batches in the background (when enabled and
  // none are drawn ahead yet).
  void prefetch(size_t count);

  Status set_weights(const loader::DomainWeights& weights);
  Status restore(const std::string& state);
  std::string state() const;
  loader::DomainWeights weights() const;
  // The source, for what neither reads nor moves its position (domains, describe, merge_states,
  // validation_set).
  const DataSource& source() const { return *data_; }
  DataSource& source() { return *data_; }

  // Steps whose batches take() found drawn ahead; micro-batches drawn ahead and dropped because
  // the weights changed (or a restore came) first.
  int64_t prefetched_steps() const { return prefetched_steps_; }
  int64_t discarded() const { return discarded_; }

 private:
  struct Set {
    std::vector<MicroBatch> batches;
    std::unique_ptr<DeviceBatches> staged;
    Drawn drawn;
  };
  Drawn draw(Set& set, size_t count);  // on either thread
  // Waits for a draw in flight; when batches were drawn ahead, restores the recorded state.
  Status settle();

  DataSource* data_;
  Runtime* rt_;
  int64_t vocab_;
  bool enabled_;
  Set sets_[2];
  int cur_ = 0;               // the set take() filled last
  std::thread worker_;        // joinable while a draw is in flight or unclaimed
  size_t ahead_ = 0;          // micro-batches drawn ahead into sets_[1 - cur_] (0: none)
  std::string state_before_;  // the source's state / weights when prefetch() started
  loader::DomainWeights weights_before_;
  int64_t prefetched_steps_ = 0;
  int64_t discarded_ = 0;
};

}  // namespace kiln::engine
