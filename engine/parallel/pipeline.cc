#include "engine/parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "common/text.h"

namespace kiln::engine {

const char* pp_op_name(PpOp op) {
  switch (op) {
    case PpOp::kPostRecvActivation:
      return "post-recv-activation";
    case PpOp::kWaitRecvActivation:
      return "wait-recv-activation";
    case PpOp::kForward:
      return "forward";
    case PpOp::kPostSendActivation:
      return "post-send-activation";
    case PpOp::kWaitSendActivation:
      return "wait-send-activation";
    case PpOp::kPostRecvGrad:
      return "post-recv-grad";
    case PpOp::kWaitRecvGrad:
      return "wait-recv-grad";
    case PpOp::kBackward:
      return "backward";
    case PpOp::kPostSendGrad:
      return "post-send-grad";
    case PpOp::kWaitSendGrad:
      return "wait-send-grad";
  }
  return "?";
}

int pp_in_flight(PpSchedule schedule, int stage, int stages, int micro_batches) {
  KILN_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
             "pp_in_flight: bad stage or micro-batch count");
  if (schedule == PpSchedule::kGPipe) return micro_batches;
  return std::min(micro_batches, stages - stage);
}

std::vector<PpAction> pp_compute_order(PpSchedule schedule, int stage, int stages,
                                       int micro_batches) {
  const int m = micro_batches;
  const int k = pp_in_flight(schedule, stage, stages, m);
  std::vector<PpAction> out;
  int f = 0, b = 0;
  auto fwd = [&] { out.push_back({PpOp::kForward, f, f % k}), ++f; };
  auto bwd = [&] { out.push_back({PpOp::kBackward, b, b % k}), ++b; };
  if (schedule == PpSchedule::kGPipe) {
    while (f < m) fwd();
    while (b < m) bwd();
    return out;
  }
  // 1F1B: k - 1 = min(m, p - s) - 1 warm-up forwards, then one forward one backward, then the
  // cool-down backwards.
  while (f < k - 1) fwd();
  while (f < m) {
    fwd();
    bwd();
  }
  while (b < m) bwd();
  return out;
}

std::vector<PpAction> pp_plan(PpSchedule schedule, int stage, int stages, int micro_batches,
                              PpPosting posting) {
  const int m = micro_batches;
  const int k = pp_in_flight(schedule, stage, stages, m);
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<PpAction> out;
  auto emit = [&](PpOp op, int mb) { out.push_back({op, mb, mb % k}); };
  std::vector<bool> send_act_waited(static_cast<size_t>(m), false);
  std::vector<bool> send_grad_waited(static_cast<size_t>(m), false);
  const bool eager = posting == PpPosting::kEager;
  if (!first && eager) {
    for (int mb = 0; mb < k; ++mb) emit(PpOp::kPostRecvActivation, mb);
  }
  for (const PpAction& c : pp_compute_order(schedule, stage, stages, m)) {
    const int mb = c.mb;
    if (c.op == PpOp::kForward) {
      if (!first) {
        if (!eager) emit(PpOp::kPostRecvActivation, mb);
        emit(PpOp::kWaitRecvActivation, mb);
      }
      if (!last && mb >= k) {  // the slot's output buffer is about to be written again
        emit(PpOp::kWaitSendActivation, mb - k);
        send_act_waited[static_cast<size_t>(mb - k)] = true;
      }
      // The slot's input-gradient buffer too: the last stage's forward runs the head's backward,
      // which writes it (the model's gradient runs in place there).
      if (!first && mb >= k) {
        emit(PpOp::kWaitSendGrad, mb - k);
        send_grad_waited[static_cast<size_t>(mb - k)] = true;
      }
      emit(PpOp::kForward, mb);
      if (!last) {
        emit(PpOp::kPostSendActivation, mb);
        if (eager) emit(PpOp::kPostRecvGrad, mb);
      }
    } else {
      if (!last) {
        if (!eager) emit(PpOp::kPostRecvGrad, mb);
        emit(PpOp::kWaitRecvGrad, mb);
      }
      emit(PpOp::kBackward, mb);
      if (!first) {
        emit(PpOp::kPostSendGrad, mb);
        // The slot is free: the micro-batch that uses it next can arrive.
        if (eager && mb + k < m) emit(PpOp::kPostRecvActivation, mb + k);
      }
    }
  }
  for (int mb = 0; mb < m; ++mb) {
    if (!last && !send_act_waited[static_cast<size_t>(mb)]) emit(PpOp::kWaitSendActivation, mb);
  }
  for (int mb = 0; mb < m; ++mb) {
    if (!first && !send_grad_waited[static_cast<size_t>(mb)]) emit(PpOp::kWaitSendGrad, mb);
  }
  return out;
}

double pp_bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

PipelineExecutor::PipelineExecutor(Model& model, comm::ProcessGroup& pp, PpSchedule schedule,
                                   size_t message_bytes)
    : model_(model),
      pp_(pp),
      schedule_(schedule),
      bytes_(message_bytes),
      stage_(pp.rank()),
      stages_(pp.size()) {}

namespace {
constexpr int kActivationTag = 0;
constexpr int kGradTag = 1;
}  // namespace

Result<PpTiming> PipelineExecutor::train(const std::vector<PpMicroBatch>& micro_batches,
                                         float dloss) {
  const int m = static_cast<int>(micro_batches.size());
  KILN_CHECK(m >= 1, "PipelineExecutor::train: no micro-batches");
  KILN_CHECK(model_.pp_slots() >= pp_in_flight(schedule_, stage_, stages_, m),
             "PipelineExecutor: the model keeps fewer slots than the schedule has in flight");
  const size_t bytes = bytes_;
  const int prev = stage_ - 1, next = stage_ + 1;
  std::vector<std::unique_ptr<comm::Work>> recv_act(static_cast<size_t>(m)),
      send_act(static_cast<size_t>(m)), recv_grad(static_cast<size_t>(m)),
      send_grad(static_cast<size_t>(m));
  PpTiming timing;
  const auto t0 = std::chrono::steady_clock::now();
  // Waits for a message; the time blocked is the stage waiting for its neighbours.
  auto wait = [&](std::unique_ptr<comm::Work>& w, const char* what, int mb, int peer) -> Status {
    KILN_CHECK(w != nullptr, "PipelineExecutor: waiting for a message never posted");
    const auto w0 = std::chrono::steady_clock::now();
    Status st = w->wait();
    timing.wait_ms += ms_since(w0);
    w.reset();
    return std::move(st).prefixed(
        fmt::format("pipeline stage {} of {}: {} of micro-batch {} {} stage {}", stage_, stages_,
                    what, mb, std::string(what).rfind("send", 0) == 0 ? "to" : "from", peer));
  };
  Status failed = Status::ok();
  // NCCL launches the operations posted since its last wait together, one launch after another
  // (comm/comm.h): receives posted early would tie the launches of neighbouring stages into a
  // cycle, so on NCCL each receive is posted just before its wait (paired with the sends posted
  // since, as Megatron-LM's send_forward_recv_backward).
  const PpPosting posting =
      std::string(pp_.backend()) == "nccl" ? PpPosting::kPaired : PpPosting::kEager;
  for (const PpAction& a : pp_plan(schedule_, stage_, stages_, m, posting)) {
    const size_t i = static_cast<size_t>(a.mb);
    const PpMicroBatch& b = micro_batches[i];
    Status st = Status::ok();
    switch (a.op) {
      case PpOp::kPostRecvActivation:
        recv_act[i] = pp_.irecv(model_.stage_input(a.slot), bytes, prev, kActivationTag);
        break;
      case PpOp::kWaitRecvActivation:
        st = wait(recv_act[i], "receive of the activations", a.mb, prev);
        break;
      case PpOp::kForward:
        model_.stage_forward(a.slot, b.inputs, b.targets, b.losses, b.doc_start, dloss, true);
        break;
      case PpOp::kPostSendActivation:
        send_act[i] = pp_.isend(model_.stage_output(a.slot), bytes, next, kActivationTag);
        break;
      case PpOp::kWaitSendActivation:
        st = wait(send_act[i], "send of the activations", a.mb, next);
        break;
      case PpOp::kPostRecvGrad:
        recv_grad[i] = pp_.irecv(model_.stage_output_grad(a.slot), bytes, next, kGradTag);
        break;
      case PpOp::kWaitRecvGrad:
        st = wait(recv_grad[i], "receive of the gradients", a.mb, next);
        break;
      case PpOp::kBackward:
        model_.stage_backward(a.slot, b.inputs, b.doc_start);
        break;
      case PpOp::kPostSendGrad:
        send_grad[i] = pp_.isend(model_.stage_input_grad(a.slot), bytes, prev, kGradTag);
        break;
      case PpOp::kWaitSendGrad:
        st = wait(send_grad[i], "send of the gradients", a.mb, prev);
        break;
    }
    if (!st.is_ok()) {
      failed = std::move(st);
      break;
    }
  }
  if (!failed.is_ok()) {
    // Leave no message running on the model's buffers: the remaining handles wait as they go.
    for (auto* v : {&recv_act, &send_act, &recv_grad, &send_grad}) v->clear();
    return failed;
  }
  timing.total_ms = ms_since(t0);
  return timing;
}

Status PipelineExecutor::forward(const std::vector<PpMicroBatch>& micro_batches) {
  const int prev = stage_ - 1, next = stage_ + 1;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const PpMicroBatch& b = micro_batches[i];
    auto named = [&](Status st, const char* what, int peer) {
      return std::move(st).prefixed(
          fmt::format("pipeline stage {} of {} (evaluation): {} of "
                      "micro-batch {} {} stage {}",
                      stage_, stages_, what, i, peer == prev ? "from" : "to", peer));
    };
    if (!first()) {
      KILN_RETURN_IF_ERROR(
          named(pp_.irecv(model_.stage_input(0), bytes_, prev, kActivationTag)->wait(),
                "receive of the activations", prev));
    }
    model_.stage_forward(0, b.inputs, b.targets, b.losses, b.doc_start, 0.0f, false);
    if (!last()) {
      KILN_RETURN_IF_ERROR(
          named(pp_.isend(model_.stage_output(0), bytes_, next, kActivationTag)->wait(),
                "send of the activations", next));
    }
  }
  return Status::ok();
}

}  // namespace kiln::engine
