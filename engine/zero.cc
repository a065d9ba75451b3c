#include "engine/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/plan.h"
#include "kernels/ops.h"

namespace kiln::engine {

ZeroOptimizer::ZeroOptimizer(ParamStore& params, comm::ProcessGroup& dp,
                             const OptimizerConfig& config)
    : dp_(dp), config_(config) {
  const int n = dp.size(), r = dp.rank();
  for (auto& u : params.units()) {
    Shard s;
    s.numel = u.numel;
    s.size = shard_numel(u.numel, n);
    s.begin = s.size * r;
    s.grad.reset(&cpu_backend(), s.size);
    s.m.reset(&cpu_backend(), s.size);
    s.v.reset(&cpu_backend(), s.size);
    const size_t have = s.begin < u.numel ? std::min(s.size, u.numel - s.begin) : 0;
    if (have) {
      std::memcpy(s.m.data(), u.m.data() + s.begin, have * sizeof(float));
      std::memcpy(s.v.data(), u.v.data() + s.begin, have * sizeof(float));
    }
    u.m.clear();
    u.v.clear();
    shards_.push_back(std::move(s));
  }
}

uint64_t ZeroOptimizer::shard_bytes() const {
  uint64_t b = 0;
  for (const auto& s : shards_) b += s.grad.bytes() + s.m.bytes() + s.v.bytes();
  return b;
}

Status ZeroOptimizer::reduce_scatter_gradients(ParamStore& params) {
  const int n = dp_.size();
  auto& units = params.units();
  for (size_t i = 0; i < units.size(); ++i) {
    Shard& s = shards_[i];
    const float* send = units[i].grad.data();
    if (s.size * n != s.numel) {  // the last shard runs past the unit: send a padded copy
      scratch_.assign(s.size * n * sizeof(float), 0);
      std::memcpy(scratch_.data(), send, s.numel * sizeof(float));
      send = reinterpret_cast<const float*>(scratch_.data());
    }
    KILN_RETURN_IF_ERROR(dp_.reduce_scatter(send, s.grad.data(), s.size, comm::DType::kFloat32,
                                            comm::ReduceOp::kSum)
                             .prefixed("gradient reduce-scatter of " + units[i].name));
  }
  return Status::ok();
}

Result<StepStats> ZeroOptimizer::inspect(double loss_scale) {
  double ss = 0;
  for (const auto& s : shards_) ss += cpu::sum_squares(s.grad.data(), s.size);
  KILN_RETURN_IF_ERROR(dp_.allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum));
  StepStats st;
  st.grad_norm = std::sqrt(ss) / loss_scale;
  st.finite = std::isfinite(st.grad_norm);
  if (st.finite && config_.clip_grad > 0 && st.grad_norm > config_.clip_grad)
    st.clip_coef = config_.clip_grad / (st.grad_norm + 1e-6);
  return st;
}

Status ZeroOptimizer::allgather_unit(void* full, size_t elem, size_t numel, size_t shard) {
  const int n = dp_.size();
  char* out = static_cast<char*>(full);
  const size_t mine = shard * elem * dp_.rank();
  if (shard * n == numel) return dp_.allgather(out + mine, shard * elem, out);
  scratch_.assign(shard * n * elem, 0);
  const size_t have = std::min(shard * elem, numel * elem > mine ? numel * elem - mine : 0);
  if (have) std::memcpy(scratch_.data() + mine, out + mine, have);
  KILN_RETURN_IF_ERROR(dp_.allgather(scratch_.data() + mine, shard * elem, scratch_.data()));
  std::memcpy(out, scratch_.data(), numel * elem);
  return Status::ok();
}

Status ZeroOptimizer::apply(ParamStore& params, double lr, double loss_scale,
                            const StepStats& stats, int64_t step) {
  KILN_CHECK(stats.finite, "ZeroOptimizer::apply with non-finite gradients");
  AdamWParams hp = adamw_params(config_, lr, loss_scale, stats, step);
  const auto& tensors = params.tensors();
  auto& units = params.units();
  const Precision prec = params.precision();
  for (size_t i = 0; i < units.size(); ++i) {
    Shard& s = shards_[i];
    ParamUnit& u = units[i];
    for (int t : u.tensors) {
      const ParamTensor& pt = tensors[t];
      const size_t a = std::max(pt.offset, s.begin);
      const size_t b = std::min(pt.offset + pt.numel, s.begin + s.size);
      if (a >= b) continue;
      hp.weight_decay = pt.decay ? config_.weight_decay : 0.0f;
      float* p = u.master.data() + a;
      float* m = s.m.data() + (a - s.begin);
      float* v = s.v.data() + (a - s.begin);
      const float* g = s.grad.data() + (a - s.begin);
      switch (prec) {
        case Precision::kFp32: cpu::adamw_update(p, m, v, g, b - a, hp); break;
        case Precision::kBf16:
          cpu::adamw_update(p, m, v, g, b - a, hp, reinterpret_cast<bf16*>(u.lp.data()) + a);
          break;
        case Precision::kFp16:
          cpu::adamw_update(p, m, v, g, b - a, hp, reinterpret_cast<fp16*>(u.lp.data()) + a);
          break;
      }
    }
    // Every rank gets the updated working weights.
    if (prec == Precision::kFp32) {
      KILN_RETURN_IF_ERROR(allgather_unit(u.master.data(), sizeof(float), u.numel, s.size));
    } else {
      KILN_RETURN_IF_ERROR(allgather_unit(u.lp.data(), sizeof(uint16_t), u.numel, s.size));
    }
  }
  return Status::ok();
}

Status ZeroOptimizer::consolidate(ParamStore& params) {
  const int n = dp_.size();
  const bool root = dp_.rank() == 0;
  auto& units = params.units();
  std::vector<float> all;
  for (size_t i = 0; i < units.size(); ++i) {
    Shard& s = shards_[i];
    ParamUnit& u = units[i];
    // bf16/fp16: the master weights are current only in each rank's own shard.
    if (params.precision() != Precision::kFp32) {
      KILN_RETURN_IF_ERROR(allgather_unit(u.master.data(), sizeof(float), u.numel, s.size));
    }
    std::vector<size_t> bytes(n, s.size * sizeof(float));
    for (auto [shard, full] : {std::pair{&s.m, &u.m}, std::pair{&s.v, &u.v}}) {
      if (root) all.assign(s.size * n, 0.0f);
      KILN_RETURN_IF_ERROR(dp_.gatherv(shard->data(), s.size * sizeof(float),
                                       root ? all.data() : nullptr, bytes.data(), 0));
      if (root) {
        full->reset(&params.backend(), u.numel);
        std::memcpy(full->data(), all.data(), u.numel * sizeof(float));
      }
    }
  }
  return Status::ok();
}

void ZeroOptimizer::release(ParamStore& params) {
  for (auto& u : params.units()) {
    u.m.clear();
    u.v.clear();
  }
}

}  // namespace kiln::engine
