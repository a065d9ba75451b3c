#include "engine/train/step_loss.h"

namespace kiln::engine {

StepLoss sum_step_loss(const std::vector<MicroBatch>& batches, const float* losses, size_t stride,
                       size_t n_domains) {
  StepLoss out;
  out.domain_sum.assign(n_domains, 0.0);
  out.domain_targets.assign(n_domains, 0);
  const float* batch_losses = losses;
  for (const MicroBatch& b : batches) {
    const int64_t T = b.seq_len;
    for (int64_t r = 0; r < b.rows; ++r) {
      double row = 0;
      int64_t n = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (b.targets[r * T + i] < 0) continue;
        row += batch_losses[r * T + i];
        ++n;
      }
      out.sum += row;
      const int32_t d = b.domains[r];
      if (d >= 0 && static_cast<size_t>(d) < n_domains) {
        out.domain_sum[d] += row;
        out.domain_targets[d] += n;
      }
    }
    batch_losses += stride;
  }
  return out;
}

std::vector<int64_t> count_domain_sequences(const std::vector<MicroBatch>& batches,
                                            size_t n_domains) {
  std::vector<int64_t> counts(n_domains, 0);
  for (const MicroBatch& b : batches)
    for (int32_t d : b.domains)
      if (d >= 0 && static_cast<size_t>(d) < n_domains) ++counts[d];
  return counts;
}

}  // namespace kiln::engine
