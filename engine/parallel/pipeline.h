// Internal to engine/ (used by the trainer): pipeline parallelism's schedules and their executor.
//
// A pipeline of `stages` ranks (the pp group, comm/topology.h: stage s is group rank s) runs a
// step's m micro-batches through a model split into contiguous stages (engine/model/params.h
// PpStage; the stage models of engine/model/model.h, stage_* calls). Stage s receives the
// activations of stage s-1 and sends its own to s+1; backward sends the input gradients back.
//
// Schedules (pp_compute_order):
//   1F1B   stage s runs p-s-1 warm-up forwards, then alternates one forward and one backward,
//          then the remaining backwards (cool-down). At most min(m, p-s) micro-batches are in
//          flight (forwarded, not yet backwarded) on stage s: activation memory bounded by the
//          stage count, not by m (PipeDream-Flush / Megatron-LM's non-interleaved schedule).
//   GPipe  all m forwards, then all m backwards (m in flight).
// Both run the backwards in micro-batch order, so micro-batch mb uses slot mb % in_flight: the
// slot's previous micro-batch (mb - in_flight) has finished its backward before mb's forward.
// Both give the same gradients (every micro-batch's, summed in micro-batch order on every stage).
// The idle fraction of a stage with equal stage times (the "bubble") is (p-1)/(m+p-1) for both.
//
// The plan (pp_plan) is the schedule with its messages, as data: when each receive is posted and
// waited for, when each send is posted and waited for. On MPI (host memory) receives are posted
// as soon as their buffer (the slot's stage_input / stage_output_grad) is free - at the start for
// the first slots, else after the backward that frees the slot; on NCCL just before their wait
// (PpPosting). They are waited for just before the compute that reads them; sends are posted just
// after the compute that wrote them and waited for only before the slot's buffers are written
// again - both before the slot's next forward, as the last stage's forward runs the head's
// backward into the input-gradient buffer - and at the end of the step. So messages travel while
// the stage computes. pipeline_test.cc
// simulates every stage of every (p, m, schedule) with rendezvous semantics (a send completes only
// once its receive is posted: MPI's large messages) and with NCCL's (the operations posted since
// the last wait are launched together and launches run one after another) and checks that every
// stage finishes.
//
// PipelineExecutor carries out a plan on a Model of one stage over the pp group: host memory
// (MPI) on the CPU, device memory (the pp group's NCCL twin, engine/parallel/parallelism.h) on
// cuda. Activations are tagged 0, gradients 1. A failed or stalled message is reported by the
// group (the collective watchdog names the peer, comm/comm.h). Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"
#include "engine/config/parallel.h"
#include "engine/model/model.h"

namespace kiln::engine {

enum class PpOp : uint8_t {
  kPostRecvActivation,  // irecv the previous stage's output of mb into stage_input(slot)
  kWaitRecvActivation,
  kForward,             // stage_forward(slot, mb's tokens)
  kPostSendActivation,  // isend stage_output(slot) to the next stage
  kWaitSendActivation,
  kPostRecvGrad,  // irecv the next stage's input gradient of mb into stage_output_grad(slot)
  kWaitRecvGrad,
  kBackward,      // stage_backward(slot, mb's tokens)
  kPostSendGrad,  // isend stage_input_grad(slot) to the previous stage
  kWaitSendGrad,
};
const char* pp_op_name(PpOp op);

struct PpAction {
  PpOp op;
  int mb;    // micro-batch 0 .. m-1
  int slot;  // mb % pp_in_flight(...)
  bool operator==(const PpAction&) const = default;
};

// Micro-batches stage `stage` of `stages` keeps in flight at most: 1F1B min(m, stages - stage),
// GPipe m. The Model's pp_slots.
int pp_in_flight(PpSchedule schedule, int stage, int stages, int micro_batches);
// The stage's forwards and backwards in order (kForward / kBackward only).
std::vector<PpAction> pp_compute_order(PpSchedule schedule, int stage, int stages,
                                       int micro_batches);
// When receives are posted. kEager: as soon as their buffer is free (MPI: every posted operation
// progresses on its own). kPaired: just before their wait, so that they are launched together
// with the sends posted since (NCCL: the operations posted since the last wait are launched as
// one group, and a rank's launches run one after another; early receives would tie neighbouring
// stages' launches into a cycle - pipeline_test.cc finds one at p 3, m 4).
enum class PpPosting { kEager, kPaired };
// The compute order with the messages (see the header comment). One stage: the compute order.
std::vector<PpAction> pp_plan(PpSchedule schedule, int stage, int stages, int micro_batches,
                              PpPosting posting = PpPosting::kEager);
// The idle fraction with equal stage times: (p - 1) / (m + p - 1).
double pp_bubble_fraction(int stages, int micro_batches);

// One micro-batch's tokens in the runtime's memory (engine/data/device_batches.h): inputs (the
// first stage embeds them), targets and per-token losses (the last stage), doc_start (every
// stage; nullptr without document masking).
struct PpMicroBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  float* losses = nullptr;
  const int32_t* doc_start = nullptr;
};

// What one step's pipeline took, on this stage.
struct PpTiming {
  double total_ms = 0;  // the whole plan
  double wait_ms = 0;   // blocked waiting for messages (the neighbours)
  // The measured bubble: wait_ms / total_ms (0 with one stage).
  double bubble() const { return total_ms > 0 ? wait_ms / total_ms : 0.0; }
};

class PipelineExecutor {
 public:
  // model: this stage's model, made with pp_slots >= pp_in_flight(schedule, ...) for every m it
  // will run. pp: the stages (group rank = stage), carrying the model's memory. Both outlive
  // this object. message_bytes: what the stages exchange per micro-batch (the model's
  // stage_activation_elems() values of the work dtype).
  PipelineExecutor(Model& model, comm::ProcessGroup& pp, PpSchedule schedule, size_t message_bytes);

  // One training step's micro-batches through the pipeline: every stage calls it with the same
  // number of micro-batches. Parameter gradients accumulate (as forward_backward); the last
  // stage writes each micro-batch's per-token losses. dloss: as Model::forward_backward.
  Result<PpTiming> train(const std::vector<PpMicroBatch>& micro_batches, float dloss);
  // Forward only (evaluation): the micro-batches one after another through the stages in slot
  // 0, the last stage writing each one's per-token losses; no gradient is touched. Every stage
  // calls it with the same micro-batches.
  Status forward(const std::vector<PpMicroBatch>& micro_batches);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }

 private:
  Model& model_;
  comm::ProcessGroup& pp_;
  PpSchedule schedule_;
  size_t bytes_;
  int stage_;
  int stages_;
};

}  // namespace kiln::engine
