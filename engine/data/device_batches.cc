#include "engine/data/device_batches.h"

#include <cstring>

namespace kiln::engine {

namespace {
constexpr size_t kParts = 3;  // inputs, targets, doc_start
}  // namespace

DeviceBatches::DeviceBatches(Runtime* runtime, int64_t rows, int64_t seq_len, int slot_base)
    : rt_(runtime),
      n_(static_cast<size_t>(rows * seq_len)),
      slot_base_(static_cast<size_t>(slot_base)) {}

DeviceBatches::~DeviceBatches() {
  rt_->synchronize();
  if (pinned_losses_) rt_->deallocate_pinned(pinned_losses_, pinned_count_ * n_ * sizeof(float));
  for (size_t i = 0; i < slots_.size(); ++i) {
    rt_->deallocate_pinned(slots_[i].pinned, kParts * n_ * sizeof(int32_t));
  }
}

void DeviceBatches::reserve(size_t n) {
  if (n <= slots_.size()) return;
  rt_->synchronize();
  const size_t old = slots_.size();
  slots_.resize(n);
  for (size_t i = old; i < n; ++i) {
    slots_[i].pinned = static_cast<int32_t*>(rt_->allocate_pinned(kParts * n_ * sizeof(int32_t)));
    slots_[i].tokens.reset(rt_, kParts * n_);
  }
  losses_.reset(rt_, n * n_);
}

void DeviceBatches::upload(size_t i, const MicroBatch& b) {
  KILN_CHECK(b.inputs.size() == n_ && b.targets.size() == n_,
             "micro-batch shape differs from the model's (rows x seq_len)");
  reserve(i + 1);
  const int slot = this->slot(i);
  rt_->upload_done(slot);  // the pinned buffer's previous copy (if any) has finished
  Slot& s = slots_[i];
  std::memcpy(s.pinned, b.inputs.data(), n_ * sizeof(int32_t));
  std::memcpy(s.pinned + n_, b.targets.data(), n_ * sizeof(int32_t));
  KILN_CHECK(b.doc_start.empty() || b.doc_start.size() == n_,
             "micro-batch document starts differ from its shape");
  if (b.doc_start.empty()) {
    std::memset(s.pinned + 2 * n_, 0, n_ * sizeof(int32_t));
  } else {
    std::memcpy(s.pinned + 2 * n_, b.doc_start.data(), n_ * sizeof(int32_t));
  }
  rt_->upload_async(s.tokens.data(), s.pinned, kParts * n_ * sizeof(int32_t), slot);
}

DeviceBatches::Tokens DeviceBatches::at(size_t i) {
  KILN_CHECK(i < slots_.size(), "DeviceBatches::at before upload");
  rt_->wait_upload(slot(i));
  const int32_t* p = slots_[i].tokens.data();
  return {p, p + n_, p + 2 * n_};
}

float* DeviceBatches::losses(size_t i) { return losses_.data() + i * n_; }

const float* DeviceBatches::host_losses(size_t count) {
  KILN_CHECK(count * n_ <= losses_.size(),
             "DeviceBatches::host_losses: more micro-batches than uploaded");
  if (rt_->host_addressable()) {
    rt_->synchronize();
    return losses_.data();
  }
  if (count > pinned_count_) {
    if (pinned_losses_) rt_->deallocate_pinned(pinned_losses_, pinned_count_ * n_ * sizeof(float));
    pinned_count_ = slots_.size();  // all that losses_ holds, so it grows as rarely as losses_
    pinned_losses_ = static_cast<float*>(rt_->allocate_pinned(pinned_count_ * n_ * sizeof(float)));
  }
  rt_->copy_to_host(pinned_losses_, losses_.data(), count * n_ * sizeof(float));
  return pinned_losses_;
}

void DeviceBatches::download_losses(size_t count, float* out) {
  if (count == 0) return;
  std::memcpy(out, host_losses(count), count * n_ * sizeof(float));
}

}  // namespace kiln::engine
