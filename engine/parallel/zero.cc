#include "engine/parallel/zero.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "engine/parallel/layout_plan.h"

namespace kiln::engine {

ZeroOptimizer::ZeroOptimizer(ParamStore& params, comm::ProcessGroup& dp,
                             const OptimizerConfig& config, int stage, int prefetch,
                             comm::ProcessGroup* tp, comm::ProcessGroup* dp_host,
                             comm::ProcessGroup* pp)
    : params_(params),
      rt_(params.runtime()),
      dp_(dp),
      dp_host_(dp_host ? *dp_host : dp),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      pp_(pp && pp->size() > 1 ? pp : nullptr),
      config_(config),
      stage_(stage),
      prefetch_(prefetch) {
  KILN_CHECK(stage >= 1 && stage <= 3, "ZeroOptimizer: stage 1, 2 or 3");
  KILN_CHECK(!pp_ || stage == 1, "ZeroOptimizer: pipeline stages with ZeRO-1 only");
  KILN_CHECK(dp_host_.size() == dp.size() && dp_host_.rank() == dp.rank(),
             "ZeroOptimizer: the host group has other ranks than the data-parallel group");
}

Result<std::unique_ptr<ZeroOptimizer>> ZeroOptimizer::create(
    ParamStore& params, StateSource& source, comm::ProcessGroup& dp, const OptimizerConfig& config,
    int stage, int prefetch, comm::ProcessGroup* tp, comm::ProcessGroup* dp_host,
    comm::ProcessGroup* pp) {
  KILN_CHECK(params.state_bytes() == 0,
             "ZeroOptimizer::create: the ParamStore must be made without buffers");
  std::unique_ptr<ZeroOptimizer> z(
      new ZeroOptimizer(params, dp, config, stage, prefetch, tp, dp_host, pp));
  KILN_RETURN_IF_ERROR(z->build(source));
  return z;
}

Status ZeroOptimizer::build(StateSource& source) {
  const int n = dp_.size(), r = dp_.rank();
  const bool low = params_.precision() != Precision::kFp32;
  for (size_t i = 0; i < params_.units().size(); ++i) {
    ParamUnit& u = params_.units()[i];
    Shard s;
    if (!held(i)) {  // another pipeline stage's unit: no shard (size 0)
      shards_.push_back(std::move(s));
      continue;
    }
    s.numel = u.numel;
    s.size = shard_numel(u.numel, n);
    s.begin = s.size * r;
    s.grad.reset(&rt_, s.size, u.name + " shard .grad");
    s.m.reset(&rt_, s.size, u.name + " shard .exp_avg");
    s.v.reset(&rt_, s.size, u.name + " shard .exp_avg_sq");
    // The fp32 master weights: optimizer state.
    if (master_sharded()) s.master.reset(&rt_, s.size, u.name + " shard .master");
    if (stage_ == 3) {
      if (low) s.lp.reset(&rt_, s.size, u.name + " shard .working_copy");
      s.weights = Weights::kAbsent;
    } else if (low) {  // stages 1-2 keep the full working weights
      u.lp.reset(&rt_, u.numel, u.name + ".working_copy");
    } else {
      u.master.reset(&rt_, u.numel, u.name + ".master");
    }
    if (stage_ == 1) u.grad.reset(&rt_, u.numel, u.name + ".grad");
    shards_.push_back(std::move(s));
  }
  return load(source);
}

Status ZeroOptimizer::load(StateSource& source) {
  const bool low = params_.precision() != Precision::kFp32;
  std::vector<float> staging;  // host staging (devices only)
  DeviceArray<float> chunk;    // fp32 values before their bf16/fp16 rounding
  // dst[0, count) in the backend's low-precision type = the master weights [begin, begin+count).
  auto read_low = [&](int unit, size_t begin, size_t count, uint16_t* dst) -> Status {
    if (chunk.empty()) {  // the largest unit's length at most
      size_t largest = 0;
      for (const auto& u : params_.units()) largest = std::max(largest, u.numel);
      chunk.reset(&rt_, std::min(kStateChunk, largest));
    }
    for (size_t done = 0; done < count;) {
      const size_t k = std::min(chunk.size(), count - done);
      KILN_RETURN_IF_ERROR(read_state(source, rt_, unit, ParamField::kMaster, begin + done, k,
                                      chunk.data(), &staging));
      rt_.cast_from_fp32(dst + done, params_.work_dtype(), chunk.data(), k);
      done += k;
    }
    return Status::ok();
  };
  auto& units = params_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    const int ui = static_cast<int>(i);
    if (!held(i)) continue;
    ParamUnit& u = units[i];
    Shard& s = shards_[i];
    KILN_CHECK(s.weights != Weights::kInFlight && !pending_.work,
               "ZeroOptimizer::load during a pass");
    if (stage_ == 3 && s.weights == Weights::kResident) release(ui);
    // This rank's elements of the unit (zero past its end: those stay zero).
    const size_t have = s.begin < u.numel ? std::min(s.size, u.numel - s.begin) : 0;
    s.grad.zero();
    if (source.zero_moments()) {
      s.m.zero();
      s.v.zero();
    } else if (have) {
      KILN_RETURN_IF_ERROR(
          read_state(source, rt_, ui, ParamField::kExpAvg, s.begin, have, s.m.data(), &staging));
      KILN_RETURN_IF_ERROR(
          read_state(source, rt_, ui, ParamField::kExpAvgSq, s.begin, have, s.v.data(), &staging));
    }
    if (master_sharded() && have) {
      KILN_RETURN_IF_ERROR(read_state(source, rt_, ui, ParamField::kMaster, s.begin, have,
                                      s.master.data(), &staging));
    }
    if (stage_ == 3) {
      if (low) {  // the master shard rounded (as sync_low_precision)
        rt_.cast_from_fp32(s.lp.data(), params_.work_dtype(), s.master.data(), s.size);
      }
    } else if (low) {
      KILN_RETURN_IF_ERROR(read_low(ui, 0, u.numel, u.lp.data()));
    } else {
      KILN_RETURN_IF_ERROR(
          read_state(source, rt_, ui, ParamField::kMaster, 0, u.numel, u.master.data(), &staging));
    }
    if (stage_ == 1) u.grad.zero();
  }
  return Status::ok();
}

char* ZeroOptimizer::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_.reset(&rt_, (bytes + 3) / 4);
  } else {
    rt_.fill_zero(scratch_.data(), bytes);
  }
  return reinterpret_cast<char*>(scratch_.data());
}

ZeroOptimizer::~ZeroOptimizer() {
  // Leave no collective running on buffers about to be freed.
  if (pending_.work) (void)pending_.work->wait();
  for (auto& s : shards_)
    if (s.gather) (void)s.gather->wait();
}

uint64_t ZeroOptimizer::shard_bytes() const {
  uint64_t b = 0;
  for (const auto& s : shards_)
    b += s.grad.bytes() + s.m.bytes() + s.v.bytes() + s.master.bytes() + s.lp.bytes();
  return b;
}

void ZeroOptimizer::note(Status st) {
  if (status_.is_ok() && !st.is_ok()) status_ = std::move(st);
}

void ZeroOptimizer::track(int64_t delta) {
  buffers_ += delta;
  peak_buffers_ =
      std::max<uint64_t>(peak_buffers_, static_cast<uint64_t>(std::max<int64_t>(0, buffers_)));
}

// Full-unit buffers are reused, not freed: allocating and freeing megabytes per unit per pass
// fragments the heap (glibc's adaptive mmap threshold), and the process grew by ~6 MiB a step.
// At most kSpares idle buffers of each size are kept; the held bytes (in use + idle) are what
// peak_buffer_bytes() reports.
template <typename T>
void ZeroOptimizer::take(std::vector<DeviceArray<T>>& spares, DeviceArray<T>& dst, size_t n) {
  for (size_t i = 0; i < spares.size(); ++i) {
    if (spares[i].size() == n) {
      dst = std::move(spares[i]);
      spares.erase(spares.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  dst.reset(&rt_, n);
  track(static_cast<int64_t>(dst.bytes()));
}

template <typename T>
void ZeroOptimizer::give(std::vector<DeviceArray<T>>& spares, DeviceArray<T>& src) {
  constexpr size_t kSpares = 3;
  size_t same = 0;
  for (const auto& b : spares) same += b.size() == src.size();
  if (same >= kSpares) {
    track(-static_cast<int64_t>(src.bytes()));
    src.clear();
    return;
  }
  spares.push_back(std::move(src));
  src.clear();
}

namespace {
// Runs wait() and adds its duration to *ms.
Status timed_wait(comm::Work& w, double* ms) {
  const auto t0 = std::chrono::steady_clock::now();
  Status st = w.wait();
  *ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return st;
}
}  // namespace

double ZeroOptimizer::take_wait_ms() {
  const double ms = wait_ms_;
  wait_ms_ = 0;
  return ms;
}

void ZeroOptimizer::zero_grads() {
  for (auto& s : shards_) s.grad.zero();
}

// ---- stages 2-3: the model's unit hooks ----

void ZeroOptimizer::begin_pass(const std::vector<int>& order) {
  order_ = order;
  cursor_ = 0;
}

void ZeroOptimizer::start_gather(int unit) {
  Shard& s = shards_[unit];
  ParamUnit& u = params_.units()[unit];
  const size_t full = s.size * static_cast<size_t>(dp_.size());
  if (params_.precision() == Precision::kFp32) {
    take(spare_f32_, u.master, full);
    s.gather = dp_.iallgather(s.master.data(), s.size * sizeof(float), u.master.data());
  } else {
    take(spare_u16_, u.lp, full);
    s.gather = dp_.iallgather(s.lp.data(), s.size * sizeof(uint16_t), u.lp.data());
  }
  s.weights = Weights::kInFlight;
}

void ZeroOptimizer::finish_gather(int unit) {
  Shard& s = shards_[unit];
  note(timed_wait(*s.gather, &wait_ms_)
           .prefixed("parameter all-gather of " + params_.units()[unit].name));
  s.gather.reset();
  s.weights = Weights::kResident;
}

void ZeroOptimizer::acquire(int unit, bool backward) {
  for (size_t i = cursor_; i < order_.size(); ++i) {
    if (order_[i] == unit) {
      cursor_ = i + 1;
      break;
    }
  }
  if (stage_ == 3) {
    Shard& s = shards_[unit];
    if (s.weights == Weights::kAbsent) start_gather(unit);
    if (s.weights == Weights::kInFlight) finish_gather(unit);
    // The next units of the pass, gathered while this one computes.
    for (size_t i = cursor_; i < std::min(order_.size(), cursor_ + prefetch_); ++i) {
      if (shards_[order_[i]].weights == Weights::kAbsent) start_gather(order_[i]);
    }
  }
  ParamUnit& u = params_.units()[unit];
  if (backward && u.grad.empty()) {
    take(spare_f32_, u.grad, shards_[unit].size * static_cast<size_t>(dp_.size()));
    u.grad.zero();
  }
}

void ZeroOptimizer::release(int unit) {
  if (stage_ != 3) return;
  Shard& s = shards_[unit];
  if (s.weights == Weights::kInFlight) finish_gather(unit);
  ParamUnit& u = params_.units()[unit];
  if (params_.precision() == Precision::kFp32) {  // the fp32 working weights are the master
    give(spare_f32_, u.master);
  } else {
    give(spare_u16_, u.lp);
  }
  s.weights = Weights::kAbsent;
}

void ZeroOptimizer::finish_scatter() {
  if (!pending_.work) return;
  const int unit = pending_.unit;
  ParamUnit& u = params_.units()[unit];
  Shard& s = shards_[unit];
  Status st = timed_wait(*pending_.work, &wait_ms_);
  const bool reduced = st.is_ok();
  note(std::move(st).prefixed("gradient reduce-scatter of " + u.name));
  if (reduced) rt_.accumulate(s.grad.data(), pending_.recv.data(), s.size);  // over micro-batches
  pending_.work.reset();
  give(spare_f32_, u.grad);
}

void ZeroOptimizer::gradients_ready(int unit) {
  if (stage_ < 2) return;
  finish_scatter();  // one reduction in flight: the previous unit's
  ParamUnit& u = params_.units()[unit];
  Shard& s = shards_[unit];
  pending_.unit = unit;
  if (pending_.recv.size() < s.size) pending_.recv.reset(&rt_, s.size);
  pending_.work = dp_.ireduce_scatter(u.grad.data(), pending_.recv.data(), s.size,
                                      comm::DType::kFloat32, comm::ReduceOp::kSum);
}

void ZeroOptimizer::end_pass() {
  finish_scatter();
  if (stage_ == 3) {  // nothing stays gathered between passes
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (shards_[i].weights != Weights::kAbsent) release(static_cast<int>(i));
    }
  }
  order_.clear();
  cursor_ = 0;
}

// ---- the optimizer step ----

Status ZeroOptimizer::reduce_scatter_gradients() {
  if (stage_ >= 2) {
    Status st = std::move(status_);
    status_ = Status::ok();
    return st;
  }
  const int n = dp_.size();
  auto& units = params_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    if (!held(i)) continue;
    Shard& s = shards_[i];
    const float* send = units[i].grad.data();
    if (s.size * n != s.numel) {  // the last shard runs past the unit: send a padded copy
      float* padded = reinterpret_cast<float*>(scratch(s.size * n * sizeof(float)));
      rt_.copy(padded, send, s.numel * sizeof(float));
      send = padded;
    }
    KILN_RETURN_IF_ERROR(
        dp_.reduce_scatter(send, s.grad.data(), s.size, comm::DType::kFloat32, comm::ReduceOp::kSum)
            .prefixed("gradient reduce-scatter of " + units[i].name));
  }
  return Status::ok();
}

template <typename Fn>
void ZeroOptimizer::for_each_run(size_t i, Fn fn) const {
  const Shard& s = shards_[i];
  const auto& tensors = params_.tensors();
  for (int t : params_.units()[i].tensors) {
    const ParamTensor& pt = tensors[t];
    const size_t a = std::max(pt.offset, s.begin);
    const size_t b = std::min(pt.offset + pt.numel, s.begin + s.size);
    if (a >= b) continue;
    fn(a - s.begin, b - s.begin, pt.split_dim >= 0 || tp_->rank() == 0);
  }
}

Result<StepStats> ZeroOptimizer::inspect(double loss_scale) {
  Runtime& rt = rt_;
  double ss = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const Shard& s = shards_[i];
    if (!counted(i)) continue;
    if (!tp_) {  // the whole shard (padding is zero)
      const float* g = s.grad.data();
      ss += rt.sum_squares(&g, &s.size, 1);
      continue;
    }
    // Split tensors on every TP rank, replicated ones on TP rank 0; a replicated run skipped
    // here still adds its inf/NaN, so every rank sees an overflow wherever it is.
    for_each_run(i, [&](size_t a, size_t b, bool counted) {
      const float* g = s.grad.data() + a;
      const size_t n = b - a;
      const double part = rt.sum_squares(&g, &n, 1);
      if (counted || !std::isfinite(part)) ss += part;
    });
  }
  KILN_RETURN_IF_ERROR(dp_host_.allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum));
  if (tp_) {
    KILN_RETURN_IF_ERROR(tp_->allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum)
                             .prefixed("gradient norm over the tensor-parallel group"));
  }
  if (pp_) {
    KILN_RETURN_IF_ERROR(pp_->allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum)
                             .prefixed("gradient norm over the pipeline stages"));
  }
  StepStats st;
  st.grad_norm = std::sqrt(ss) / loss_scale;
  st.finite = std::isfinite(st.grad_norm);
  if (st.finite && config_.clip_grad > 0 && st.grad_norm > config_.clip_grad)
    st.clip_coef = config_.clip_grad / (st.grad_norm + 1e-6);
  return st;
}

Result<NonFinite> ZeroOptimizer::find_nonfinite() {
  std::vector<int64_t> counts(shards_.size(), 0);
  std::vector<float> host;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!counted(i)) continue;
    host.resize(shards_[i].size);  // after an overflow only: a copy is fine
    rt_.copy_to_host(host.data(), shards_[i].grad.data(), host.size() * sizeof(float));
    const float* g = host.data();
    if (!tp_) {
      for (size_t k = 0; k < shards_[i].size; ++k) counts[i] += !std::isfinite(g[k]);
      continue;
    }
    for_each_run(i, [&](size_t a, size_t b, bool counted) {
      if (!counted) return;  // replicated: counted on TP rank 0
      for (size_t k = a; k < b; ++k) counts[i] += !std::isfinite(g[k]);
    });
  }
  KILN_RETURN_IF_ERROR(
      dp_host_.allreduce(counts.data(), counts.size(), comm::DType::kInt64, comm::ReduceOp::kSum));
  if (tp_) {
    KILN_RETURN_IF_ERROR(
        tp_->allreduce(counts.data(), counts.size(), comm::DType::kInt64, comm::ReduceOp::kSum));
  }
  if (pp_) {
    KILN_RETURN_IF_ERROR(
        pp_->allreduce(counts.data(), counts.size(), comm::DType::kInt64, comm::ReduceOp::kSum));
  }
  NonFinite r;
  for (size_t i = counts.size(); i-- > 0;) {  // backward order, as engine/stability/monitor.h
    if (counts[i] > 0 && r.first_unit.empty()) r.first_unit = params_.units()[i].name;
    r.count += counts[i];
  }
  return r;
}

Status ZeroOptimizer::allgather_unit(void* full, size_t elem, size_t numel, size_t shard) {
  const int n = dp_.size();
  char* out = static_cast<char*>(full);
  const size_t mine = shard * elem * dp_.rank();
  if (shard * n == numel) return dp_.allgather(out + mine, shard * elem, out);
  char* padded = scratch(shard * n * elem);
  const size_t have = std::min(shard * elem, numel * elem > mine ? numel * elem - mine : 0);
  if (have) rt_.copy(padded + mine, out + mine, have);
  KILN_RETURN_IF_ERROR(dp_.allgather(padded + mine, shard * elem, padded));
  rt_.copy(out, padded, numel * elem);
  return Status::ok();
}

Status ZeroOptimizer::apply(double lr, double loss_scale, const StepStats& stats, int64_t step) {
  KILN_CHECK(stats.finite, "ZeroOptimizer::apply with non-finite gradients");
  AdamWParams hp = adamw_params(config_, lr, loss_scale, stats, step);
  const auto& tensors = params_.tensors();
  auto& units = params_.units();
  const Precision prec = params_.precision();
  // Every unit's shard ranges in one call: the CUDA backend updates them in one launch.
  std::vector<AdamWTensor> batch;
  for (size_t i = 0; i < units.size(); ++i) {
    if (!held(i)) continue;
    Shard& s = shards_[i];
    ParamUnit& u = units[i];
    // Stages 1-2 update the full master buffer in place (their own shard of it); stage 3 its
    // shard copy (and the low-precision shard the next forward gathers).
    for (int t : u.tensors) {
      const ParamTensor& pt = tensors[t];
      const size_t a = std::max(pt.offset, s.begin);
      const size_t b = std::min(pt.offset + pt.numel, s.begin + s.size);
      if (a >= b) continue;
      AdamWTensor& x = batch.emplace_back();
      x.weight_decay = pt.decay ? config_.weight_decay : 0.0f;
      // Into the shard or the full buffer.
      x.params = master_sharded() ? s.master.data() + (a - s.begin) : u.master.data() + a;
      // nullptr (kF32): no low-precision copy.
      x.params_lp = prec == Precision::kFp32 ? nullptr
                    : stage_ == 3            ? s.lp.data() + (a - s.begin)
                                             : u.lp.data() + a;
      x.m = s.m.data() + (a - s.begin);
      x.v = s.v.data() + (a - s.begin);
      x.grads = s.grad.data() + (a - s.begin);
      x.n = b - a;
    }
  }
  rt_.adamw_update_multi(batch.data(), static_cast<int>(batch.size()), hp, params_.work_dtype());
  if (stage_ == 3) return Status::ok();  // the next forward gathers them
  // Every rank gets the updated working weights.
  for (size_t i = 0; i < units.size(); ++i) {
    if (!held(i)) continue;
    const Shard& s = shards_[i];
    ParamUnit& u = units[i];
    if (prec == Precision::kFp32) {
      KILN_RETURN_IF_ERROR(allgather_unit(u.master.data(), sizeof(float), u.numel, s.size));
    } else {
      KILN_RETURN_IF_ERROR(allgather_unit(u.lp.data(), sizeof(uint16_t), u.numel, s.size));
    }
  }
  return Status::ok();
}

std::vector<TensorView> ZeroOptimizer::checkpoint_partition(
    std::deque<std::vector<float>>* scratch) const {
  std::vector<TensorView> out;
  const auto& units = params_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    if (!held(i)) continue;  // another pipeline stage writes it
    const Shard& s = shards_[i];
    const ParamUnit& u = units[i];
    const std::vector<int64_t> shape{static_cast<int64_t>(s.size)};
    const size_t bytes = s.size * sizeof(float);
    // A host view of shard memory: the buffer itself on the CPU, a copy in *scratch otherwise.
    auto host = [&](const float* src, size_t n) -> const float* {
      if (rt_.host_addressable() && n == s.size) return src;
      scratch->emplace_back(s.size, 0.0f);
      rt_.copy_to_host(scratch->back().data(), src, n * sizeof(float));
      return scratch->back().data();
    };
    const float* master = nullptr;
    if (master_sharded()) {
      master = host(s.master.data(), s.size);
    } else {  // this rank's slice of the full buffer (zero past the unit's end)
      const size_t have = s.begin < u.numel ? std::min(s.size, u.numel - s.begin) : 0;
      master = host(have > 0 ? u.master.data() + s.begin : nullptr, have);
    }
    out.push_back({u.name + ".master", "F32", shape, master, bytes});
    out.push_back({u.name + ".exp_avg", "F32", shape, host(s.m.data(), s.size), bytes});
    out.push_back({u.name + ".exp_avg_sq", "F32", shape, host(s.v.data(), s.size), bytes});
  }
  return out;
}

}  // namespace kiln::engine
