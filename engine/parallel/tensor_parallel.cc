#include "engine/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace kiln::engine {
namespace {

// A failed collective leaves the group's ranks unable to agree: stop this rank (mpirun stops the
// others and names it).
void check(const Status& st, const char* what, int rank) {
  KILN_CHECK(st.is_ok(), "tensor-parallel " + std::string(what) + " on tp rank " +
                             std::to_string(rank) + ": " + st.to_string());
}

}  // namespace

Result<std::unique_ptr<TensorParallel>> TensorParallel::create(const ModelConfig& m,
                                                               const StabilityConfig& stability,
                                                               comm::ProcessGroup& group,
                                                               comm::ProcessGroup* data_group) {
  const int64_t tp = group.size();
  auto refuse = [&](const std::string& what, const char* key) {
    return Status::config("parallel.tp " + std::to_string(tp) + ": " + what).with_key(key);
  };
  if (m.n_heads % tp != 0) {
    return refuse("model.n_heads " + std::to_string(m.n_heads) +
                      " is not divisible by it (each rank computes n_heads / tp heads)",
                  "model.n_heads");
  }
  if (m.kv_heads() % tp != 0) {
    return refuse("model.n_kv_heads " + std::to_string(m.kv_heads()) +
                      " is not divisible by it (each rank computes n_kv_heads / tp key/value "
                      "heads with the query heads they serve)",
                  "model.n_kv_heads");
  }
  if (m.ffn() % tp != 0) {
    return refuse("model.ffn_hidden " + std::to_string(m.ffn()) +
                      " is not divisible by it (each rank computes ffn_hidden / tp MLP units)",
                  "model.ffn_hidden");
  }
  if (m.vocab_size % tp != 0) {
    return refuse("model.vocab_size " + std::to_string(m.vocab_size) +
                      " is not divisible by it (each rank holds vocab_size / tp embedding rows); "
                      "pad the vocabulary to a multiple of tp",
                  "model.vocab_size");
  }
  if (stability.layer_clip_max_norm > 0) {
    return refuse(
        "per-layer clipping needs whole-layer norms, not computed under tensor "
        "parallelism yet; set stability.layer_clip.max_norm: 0",
        "stability.layer_clip.max_norm");
  }
  if (stability.layer_stats_every > 0) {
    return refuse(
        "per-layer statistics are not computed under tensor parallelism yet; set "
        "stability.layer_stats_every: 0",
        "stability.layer_stats_every");
  }
  if (data_group != nullptr && data_group->size() != group.size()) {
    return Status::internal("tensor parallelism: the data group has " +
                            std::to_string(data_group->size()) + " ranks, the host group " +
                            std::to_string(group.size()));
  }
  return std::unique_ptr<TensorParallel>(
      new TensorParallel(group, data_group ? *data_group : group, m));
}

void TensorParallel::sum(float* x, size_t n) {
  check(group_.allreduce(x, n, comm::DType::kFloat32, comm::ReduceOp::kSum), "all-reduce", rank());
}

void TensorParallel::device_sum(float* x, size_t n) {
  check(data_.allreduce(x, n, comm::DType::kFloat32, comm::ReduceOp::kSum), "all-reduce", rank());
}

float* TensorParallel::device_wide(Runtime& rt, size_t n) {
  if (wide_dev_.size() < n || wide_dev_.runtime() != &rt) wide_dev_.reset(&rt, n);
  return wide_dev_.data();
}

void TensorParallel::reduce_stats(Runtime& rt, float* x, size_t n, comm::ReduceOp op) {
  if (!rt.host_addressable() && &data_ != &group_) {  // in place on the device (NCCL)
    check(data_.allreduce(x, n, comm::DType::kFloat32, op), "all-reduce", rank());
    return;
  }
  float* host = x;
  if (!rt.host_addressable()) {
    staged_.resize(n);
    rt.copy_to_host(staged_.data(), x, n * sizeof(float));
    host = staged_.data();
  }
  check(group_.allreduce(host, n, comm::DType::kFloat32, op), "all-reduce", rank());
  if (host != x) rt.copy_to_device(x, host, n * sizeof(float));
}

StepStats TensorParallel::inspect(const AdamW& optimizer, const ParamStore& params,
                                  double loss_scale) {
  std::vector<const float*> ptrs;
  std::vector<size_t> sizes;
  const auto& tensors = params.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    // Split tensors: every rank its own part; replicated ones (the same on every rank): rank 0.
    if (tensors[i].split_dim < 0 && rank() != 0) continue;
    ptrs.push_back(params.grad(static_cast<int>(i)));
    sizes.push_back(tensors[i].numel);
  }
  double ss =
      params.runtime().sum_squares(ptrs.data(), sizes.data(), static_cast<int>(ptrs.size()));
  // inf/NaN anywhere makes the sum inf/NaN on every rank: one overflow decision.
  check(group_.allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum), "norm all-reduce",
        rank());
  return optimizer.stats_from_sum_squares(ss, loss_scale);
}

#define KILN_INSTANTIATE_CE(K, T)                                                                  \
  template void TensorParallel::crossentropy<K, T>(Runtime&, T*, float*, const T*, const int32_t*, \
                                                   float, int);
#define KILN_INSTANTIATE(T) KILN_INSTANTIATE_CE(CpuBackend, T)
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE
#undef KILN_INSTANTIATE_CE

}  // namespace kiln::engine
