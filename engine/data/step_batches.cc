#include "engine/data/step_batches.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "common/log.h"

namespace kiln::engine {

StepBatches::StepBatches(DataSource* data, Runtime* runtime, int64_t rows, int64_t seq_len,
                         int64_t vocab, bool prefetch)
    : data_(data), rt_(runtime), vocab_(vocab), enabled_(prefetch) {
  // Different upload slots for the two sets (engine/data/device_batches.h).
  for (int s = 0; s < 2; ++s) {
    sets_[s].staged =
        std::make_unique<DeviceBatches>(runtime, rows, seq_len, s * Runtime::kUploadSlots / 2);
  }
}

StepBatches::~StepBatches() {
  if (worker_.joinable()) worker_.join();
}

StepBatches::Drawn StepBatches::draw(Set& set, size_t count) {
  Drawn d;
  set.batches.resize(count);
  for (size_t bi = 0; bi < count; ++bi) {
    MicroBatch& b = set.batches[bi];
    d.status = data_->next(&b);
    if (!d.status.is_ok()) break;
    d.wait_ms += b.wait_ms;
    d.status = check_token_ids(b, vocab_);
    if (!d.status.is_ok()) break;
    for (int32_t t : b.targets) d.valid += t >= 0;
    set.staged->upload(bi, b);  // overlaps the next fetch and the compute queued before it
  }
  return d;
}

StepBatches::Drawn StepBatches::take(size_t count) {
  if (worker_.joinable()) {
    const auto t0 = std::chrono::steady_clock::now();
    worker_.join();
    const double waited =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ahead_ == count) {
      ahead_ = 0;
      cur_ = 1 - cur_;
      Drawn d = std::move(sets_[cur_].drawn);
      d.wait_ms = waited;
      d.prefetched = true;
      ++prefetched_steps_;
      return d;
    }
    // A different count (not in a run: grad_accum is fixed): draw again from the recorded state.
    Status st = settle();
    if (!st.is_ok()) return Drawn{std::move(st)};
  }
  Set& set = sets_[1 - cur_];
  set.staged->reserve(count);
  Drawn d = draw(set, count);
  cur_ = 1 - cur_;
  return d;
}

void StepBatches::prefetch(size_t count) {
  if (!enabled_ || worker_.joinable() || count == 0) return;
  Set& set = sets_[1 - cur_];
  set.staged->reserve(count);  // backend allocations stay on this thread
  state_before_ = data_->state();
  weights_before_ = data_->weights();
  ahead_ = count;
  std::function<void()> bind = rt_->thread_binding();
  worker_ = std::thread([this, &set, count, bind = std::move(bind)] {
    if (bind) bind();
    set.drawn = draw(set, count);
  });
}

Status StepBatches::settle() {
  if (!worker_.joinable()) return Status::ok();
  worker_.join();
  discarded_ += static_cast<int64_t>(ahead_);
  ahead_ = 0;
  sets_[1 - cur_].drawn = Drawn{};
  return data_->restore(state_before_)
      .prefixed(
          "returning the data source to before the batches "
          "drawn ahead");
}

Status StepBatches::set_weights(const loader::DomainWeights& weights) {
  KILN_RETURN_IF_ERROR(settle());
  return data_->set_weights(weights);
}

Status StepBatches::restore(const std::string& state) {
  KILN_RETURN_IF_ERROR(settle());
  return data_->restore(state);
}

std::string StepBatches::state() const {
  return worker_.joinable() ? state_before_ : data_->state();
}

loader::DomainWeights StepBatches::weights() const {
  return worker_.joinable() ? weights_before_ : data_->weights();
}

}  // namespace kiln::engine
