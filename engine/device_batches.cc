#include "engine/device_batches.h"

#include <cstring>

namespace kiln::engine {

DeviceBatches::DeviceBatches(Backend* backend, int64_t rows, int64_t seq_len, int slot_base)
    : be_(backend), n_(static_cast<size_t>(rows * seq_len)), slot_base_(static_cast<size_t>(slot_base)) {}

DeviceBatches::~DeviceBatches() {
  be_->synchronize();
  if (pinned_losses_) be_->deallocate_pinned(pinned_losses_, pinned_count_ * n_ * sizeof(float));
  for (size_t i = 0; i < slots_.size(); ++i) {
    be_->deallocate_pinned(slots_[i].pinned, 2 * n_ * sizeof(int32_t));
  }
}

void DeviceBatches::reserve(size_t n) {
  if (n <= slots_.size()) return;
  be_->synchronize();
  const size_t old = slots_.size();
  slots_.resize(n);
  for (size_t i = old; i < n; ++i) {
    slots_[i].pinned = static_cast<int32_t*>(be_->allocate_pinned(2 * n_ * sizeof(int32_t)));
    slots_[i].tokens.reset(be_, 2 * n_);
  }
  losses_.reset(be_, n * n_);
}

void DeviceBatches::upload(size_t i, const MicroBatch& b) {
  KILN_CHECK(b.inputs.size() == n_ && b.targets.size() == n_,
             "micro-batch shape differs from the model's (rows x seq_len)");
  reserve(i + 1);
  const int slot = this->slot(i);
  be_->upload_done(slot);  // the pinned buffer's previous copy (if any) has finished
  Slot& s = slots_[i];
  std::memcpy(s.pinned, b.inputs.data(), n_ * sizeof(int32_t));
  std::memcpy(s.pinned + n_, b.targets.data(), n_ * sizeof(int32_t));
  be_->upload_async(s.tokens.data(), s.pinned, 2 * n_ * sizeof(int32_t), slot);
}

DeviceBatches::Tokens DeviceBatches::at(size_t i) {
  KILN_CHECK(i < slots_.size(), "DeviceBatches::at before upload");
  be_->wait_upload(slot(i));
  const int32_t* p = slots_[i].tokens.data();
  return {p, p + n_};
}

float* DeviceBatches::losses(size_t i) { return losses_.data() + i * n_; }

const float* DeviceBatches::host_losses(size_t count) {
  KILN_CHECK(count * n_ <= losses_.size(), "DeviceBatches::host_losses: more micro-batches than uploaded");
  if (be_->host_addressable()) {
    be_->synchronize();
    return losses_.data();
  }
  if (count > pinned_count_) {
    if (pinned_losses_) be_->deallocate_pinned(pinned_losses_, pinned_count_ * n_ * sizeof(float));
    pinned_count_ = slots_.size();  // all that losses_ holds, so it grows as rarely as losses_
    pinned_losses_ = static_cast<float*>(be_->allocate_pinned(pinned_count_ * n_ * sizeof(float)));
  }
  be_->copy_to_host(pinned_losses_, losses_.data(), count * n_ * sizeof(float));
  return pinned_losses_;
}

void DeviceBatches::download_losses(size_t count, float* out) {
  if (count == 0) return;
  std::memcpy(out, host_losses(count), count * n_ * sizeof(float));
}

}  // namespace kiln::engine
