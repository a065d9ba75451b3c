#include "engine/model/optimizer.h"

#include <cmath>
#include <vector>

namespace kiln::engine {

StepStats AdamW::inspect(const ParamStore& params, double loss_scale) const {
  std::vector<const float*> ptrs;
  std::vector<size_t> sizes;
  for (const auto& u : params.units()) {
    ptrs.push_back(u.grad.data());
    sizes.push_back(u.numel);
  }
  // One fused pass over every unit, one read back to the host: the norm and the overflow check.
  const double ss =
      params.runtime().sum_squares(ptrs.data(), sizes.data(), static_cast<int>(ptrs.size()));
  return stats_from_sum_squares(ss, loss_scale);
}

StepStats AdamW::stats_from_sum_squares(double ss, double loss_scale) const {
  const double clip = config_.clip_grad;
  StepStats s;
  s.grad_norm = std::sqrt(ss) / loss_scale;
  s.finite = std::isfinite(s.grad_norm);
  if (s.finite && clip > 0 && s.grad_norm > clip) s.clip_coef = clip / (s.grad_norm + 1e-6);
  return s;
}

AdamWParams adamw_params(const OptimizerConfig& config, double lr, double loss_scale,
                         const StepStats& stats, int64_t step) {
  AdamWParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = config.beta1;
  hp.beta2 = config.beta2;
  hp.eps = config.eps;
  hp.grad_scale = static_cast<float>(stats.clip_coef / loss_scale);
  hp.step = step;
  return hp;
}

StepStats AdamW::step(ParamStore& params, double lr, double loss_scale) {
  StepStats s = inspect(params, loss_scale);
  if (s.finite) apply(params, lr, loss_scale, s);
  return s;
}

void AdamW::apply(ParamStore& params, double lr, double loss_scale, const StepStats& s) {
  KILN_CHECK(s.finite, "AdamW::apply with non-finite gradients");
  ++updates_;
  AdamWParams hp = adamw_params(config_, lr, loss_scale, s, updates_);
  // All tensors in one call: the CUDA backend updates them in one launch (multi-tensor).
  const auto& tensors = params.tensors();
  std::vector<AdamWTensor> batch(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int t = static_cast<int>(i);
    AdamWTensor& a = batch[i];
    a.params = params.master(t);
    a.m = params.exp_avg(t);
    a.v = params.exp_avg_sq(t);
    a.grads = params.grad(t);
    a.params_lp = params.work_bytes(t);  // nullptr in fp32
    a.n = tensors[i].numel;
    a.weight_decay = tensors[i].decay ? config_.weight_decay : 0.0f;
  }
  params.runtime().adamw_update_multi(batch.data(), static_cast<int>(batch.size()), hp,
                                      params.work_dtype());
}

}  // namespace kiln::engine
