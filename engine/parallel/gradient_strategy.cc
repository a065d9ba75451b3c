#include "engine/parallel/gradient_strategy.h"

#include <cmath>
#include <vector>

#include "engine/parallel/parallelism.h"
#include "engine/parallel/tensor_parallel.h"

namespace kiln::engine {

namespace {

// The first tensor this rank's stage holds (the last stage may not hold the embeddings).
float* first_held_grad(ParamStore& params) {
  int t = 0;
  while (!params.holds(params.tensors()[static_cast<size_t>(t)].unit)) ++t;
  return params.grad(t);
}

class PlainStrategy final : public GradientStrategy {
 public:
  PlainStrategy(Parallelism& par, ParamStore& params, AdamW& optimizer, TensorParallel* tp)
      : par_(par), params_(params), optimizer_(optimizer), tp_(tp) {}
  const char* name() const override { return "plain"; }
  Status reduce() override {
    KILN_RETURN_IF_ERROR(par_.sum_tied_embedding(params_));
    return par_.reduce_gradients(params_);
  }
  bool whole_units() const override { return true; }
  Result<StepStats> inspect(double loss_scale) override {
    // With tensor parallelism: the norm over every rank's slices, one overflow decision.
    if (tp_ != nullptr) return tp_->inspect(optimizer_, params_, loss_scale);
    return optimizer_.inspect(params_, loss_scale);
  }
  Status apply(double lr, double loss_scale, const StepStats& stats) override {
    optimizer_.apply(params_, lr, loss_scale, stats);
    return Status::ok();
  }
  Result<NonFinite> find_nonfinite() override { return engine::find_nonfinite(params_); }
  float* overflow_target() override { return first_held_grad(params_); }

 private:
  Parallelism& par_;
  ParamStore& params_;
  AdamW& optimizer_;
  TensorParallel* tp_;
};

class ZeroStrategy final : public GradientStrategy {
 public:
  ZeroStrategy(Parallelism& par, ParamStore& params, AdamW& optimizer)
      : par_(par), params_(params), optimizer_(optimizer), zero_(*par.zero()) {}
  const char* name() const override { return "zero"; }
  void zero_grads() override { zero_.zero_grads(); }
  Status reduce() override {
    KILN_RETURN_IF_ERROR(par_.sum_tied_embedding(params_));
    return zero_.reduce_scatter_gradients();
  }
  double take_wait_ms() override { return zero_.take_wait_ms(); }
  Result<StepStats> inspect(double loss_scale) override { return zero_.inspect(loss_scale); }
  Status apply(double lr, double loss_scale, const StepStats& stats) override {
    KILN_RETURN_IF_ERROR(zero_.apply(lr, loss_scale, stats, optimizer_.updates() + 1));
    optimizer_.set_updates(optimizer_.updates() + 1);
    return Status::ok();
  }
  Result<NonFinite> find_nonfinite() override {
    // ZeRO-2/3 (and a pipeline's ZeRO-1) no longer hold the full gradients: the shards.
    if (zero_.stage() >= 2 || par_.pp_size() > 1) return zero_.find_nonfinite();
    return engine::find_nonfinite(params_);
  }
  float* overflow_target() override {
    // ZeRO-2/3 reduced the gradients during backward: the shard gets it.
    return zero_.stage() >= 2 ? zero_.shard_grad(0) : first_held_grad(params_);
  }

 private:
  Parallelism& par_;
  ParamStore& params_;
  AdamW& optimizer_;
  ZeroOptimizer& zero_;
};

class PipelineStrategy final : public GradientStrategy {
 public:
  PipelineStrategy(Parallelism& par, ParamStore& params, AdamW& optimizer,
                   const OptimizerConfig& config)
      : par_(par), params_(params), optimizer_(optimizer), config_(config) {}
  const char* name() const override { return "pipeline"; }
  Status reduce() override {
    KILN_RETURN_IF_ERROR(par_.sum_tied_embedding(params_));
    return par_.reduce_gradients(params_);
  }
  Result<StepStats> inspect(double loss_scale) override {
    std::vector<const float*> ptrs;
    std::vector<size_t> sizes;
    for (size_t i = 0; i < params_.tensors().size(); ++i) {
      const int t = static_cast<int>(i);
      if (!counted_here(t, par_.tp_rank())) continue;
      ptrs.push_back(params_.grad(t));
      sizes.push_back(params_.tensors()[i].numel);
    }
    double ss =
        params_.runtime().sum_squares(ptrs.data(), sizes.data(), static_cast<int>(ptrs.size()));
    // inf/NaN anywhere makes the sum inf/NaN on every rank: one overflow decision.
    if (par_.tp_size() > 1) {
      KILN_RETURN_IF_ERROR(par_.tp_group()
                               .allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum)
                               .prefixed("gradient norm over the tensor-parallel group"));
    }
    KILN_RETURN_IF_ERROR(par_.pp_group()
                             .allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum)
                             .prefixed("gradient norm over the pipeline stages"));
    return optimizer_.stats_from_sum_squares(ss, loss_scale);
  }
  Status apply(double lr, double loss_scale, const StepStats& stats) override {
    KILN_CHECK(stats.finite, "a pipeline update with non-finite gradients");
    const int64_t update = optimizer_.updates() + 1;
    const AdamWParams hp = adamw_params(config_, lr, loss_scale, stats, update);
    // As AdamW::apply, over the tensors of this stage's units.
    const auto& tensors = params_.tensors();
    std::vector<AdamWTensor> batch;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int t = static_cast<int>(i);
      if (!params_.holds(tensors[i].unit)) continue;
      AdamWTensor& a = batch.emplace_back();
      a.params = params_.master(t);
      a.m = params_.exp_avg(t);
      a.v = params_.exp_avg_sq(t);
      a.grads = params_.grad(t);
      a.params_lp = params_.work_bytes(t);
      a.n = tensors[i].numel;
      a.weight_decay = tensors[i].decay ? config_.weight_decay : 0.0f;
    }
    params_.runtime().adamw_update_multi(batch.data(), static_cast<int>(batch.size()), hp,
                                         params_.work_dtype());
    optimizer_.set_updates(update);
    return Status::ok();
  }
  Result<NonFinite> find_nonfinite() override {
    const auto& units = params_.units();
    std::vector<int64_t> counts(units.size(), 0);
    std::vector<float> host;
    for (size_t i = 0; i < params_.tensors().size(); ++i) {
      const int t = static_cast<int>(i);
      if (!counted_here(t, 0)) continue;  // every TP rank its own slices
      const ParamTensor& pt = params_.tensors()[i];
      host.resize(pt.numel);  // after an overflow only: a copy is fine
      params_.runtime().copy_to_host(host.data(), params_.grad(t), pt.numel * sizeof(float));
      for (float v : host) counts[static_cast<size_t>(pt.unit)] += !std::isfinite(v);
    }
    KILN_RETURN_IF_ERROR(par_.pp_group().allreduce(counts.data(), counts.size(),
                                                   comm::DType::kInt64, comm::ReduceOp::kSum));
    NonFinite r;
    for (size_t i = counts.size(); i-- > 0;) {  // backward order, as engine/stability/monitor.h
      if (counts[i] > 0 && r.first_unit.empty()) r.first_unit = units[i].name;
      r.count += counts[i];
    }
    return r;
  }
  float* overflow_target() override { return first_held_grad(params_); }

 private:
  // Whether gradient norms and inf/NaN counts take tensor t on this rank: its stage holds it,
  // the tied embedding once (on the first stage; the last holds an identical copy), replicated
  // tensors of tensor parallelism on TP rank 0 (as TensorParallel::inspect).
  bool counted_here(int t, int tp_rank) const {
    const ParamTensor& pt = params_.tensors()[static_cast<size_t>(t)];
    if (!params_.holds(pt.unit)) return false;
    if (pt.unit == 0 && params_.pp_stage().last() && !params_.pp_stage().first()) return false;
    return pt.split_dim >= 0 || tp_rank == 0;
  }

  Parallelism& par_;
  ParamStore& params_;
  AdamW& optimizer_;
  OptimizerConfig config_;
};

}  // namespace

std::unique_ptr<GradientStrategy> make_gradient_strategy(Parallelism& par, ParamStore& params,
                                                         AdamW& optimizer,
                                                         const OptimizerConfig& config,
                                                         TensorParallel* tp) {
  if (par.zero() != nullptr) return std::make_unique<ZeroStrategy>(par, params, optimizer);
  if (par.pp_size() > 1) return std::make_unique<PipelineStrategy>(par, params, optimizer, config);
  return std::make_unique<PlainStrategy>(par, params, optimizer, tp);
}

}  // namespace kiln::engine
