#include "engine/tensor_parallel.h"

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

Result<std::unique_ptr<TensorParallel>> TensorParallel::create(const TrainConfig& config,
                                                               comm::ProcessGroup& group,
                                                               comm::ProcessGroup* data_group) {
  const int64_t tp = group.size();
  const ModelConfig& m = config.model;
  auto refuse = [&](const std::string& what, const char* key) {
    return Status::config("parallel.tp " + std::to_string(tp) + ": " + what).with_key(key);
  };
  if (m.n_heads % tp != 0) {
    return refuse("model.n_heads " + std::to_string(m.n_heads) +
                      " is not divisible by it (each rank computes n_heads / tp heads)",
                  "model.n_heads");
  }
  if (m.vocab_size % tp != 0) {
    return refuse("model.vocab_size " + std::to_string(m.vocab_size) +
                      " is not divisible by it (each rank holds vocab_size / tp embedding rows); "
                      "pad the vocabulary to a multiple of tp",
                  "model.vocab_size");
  }
  if (config.stability.layer_clip_max_norm > 0) {
    return refuse("per-layer clipping needs whole-layer norms, not computed under tensor "
                  "parallelism yet; set stability.layer_clip.max_norm: 0",
                  "stability.layer_clip.max_norm");
  }
  if (config.stability.layer_stats_every > 0) {
    return refuse("per-layer statistics are not computed under tensor parallelism yet; set "
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
  check(group_.allreduce(x, n, comm::DType::kFloat32, comm::ReduceOp::kSum), "all-reduce",
        rank());
}

void TensorParallel::device_sum(float* x, size_t n) {
  check(data_.allreduce(x, n, comm::DType::kFloat32, comm::ReduceOp::kSum), "all-reduce", rank());
}

float* TensorParallel::device_wide(Backend& be, size_t n) {
  if (wide_dev_.size() < n || wide_dev_.backend() != &be) wide_dev_.reset(&be, n);
  return wide_dev_.data();
}

template <typename T>
void TensorParallel::host_allreduce(T* x, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    sum(x, n);
  } else {
    wide_.resize(n);
    for (size_t i = 0; i < n; ++i) wide_[i] = to_float(x[i]);
    sum(wide_.data(), n);
    for (size_t i = 0; i < n; ++i) x[i] = from_float<T>(wide_[i]);
  }
}

template <typename T>
void TensorParallel::host_embedding_forward(T* out, const int32_t* tokens, const T* wte_local,
                                            const T* wpe, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_, cols = static_cast<size_t>(C);
  const int64_t lo = rank() * vocab_local(), hi = lo + vocab_local();
  wide_.assign(rows * cols, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    float* o = wide_.data() + r * cols;
    const int64_t tok = tokens[r];
    KILN_CHECK(tok >= 0 && tok < model_.vocab_size, "embedding: token id out of range");
    if (tok >= lo && tok < hi) {
      const T* a = wte_local + static_cast<size_t>(tok - lo) * cols;
      for (size_t c = 0; c < cols; ++c) o[c] = to_float(a[c]);
    }
    if (rank() == 0) {  // the position embedding once in the sum
      const T* p = wpe + (r % static_cast<size_t>(T_)) * cols;
      for (size_t c = 0; c < cols; ++c) o[c] += to_float(p[c]);
    }
  }
  sum(wide_.data(), wide_.size());
  for (size_t i = 0; i < wide_.size(); ++i) out[i] = from_float<T>(wide_[i]);
}

template <typename T>
void TensorParallel::host_embedding_backward(float* dwte_local, float* dwpe, const T* dout,
                                             const int32_t* tokens, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_, cols = static_cast<size_t>(C);
  const int64_t lo = rank() * vocab_local(), hi = lo + vocab_local();
  // The order of kernels/cpu/encoder.cc: positions in order per row of wte, batches in order per
  // position.
  for (size_t r = 0; r < rows; ++r) {
    const int64_t tok = tokens[r];
    if (tok < lo || tok >= hi) continue;
    float* g = dwte_local + static_cast<size_t>(tok - lo) * cols;
    const T* d = dout + r * cols;
    for (size_t c = 0; c < cols; ++c) g[c] += to_float(d[c]);
  }
  for (size_t t = 0; t < static_cast<size_t>(T_); ++t) {
    float* g = dwpe + t * cols;
    for (int b = 0; b < B; ++b) {
      const T* d = dout + (static_cast<size_t>(b) * T_ + t) * cols;
      for (size_t c = 0; c < cols; ++c) g[c] += to_float(d[c]);
    }
  }
}

void TensorParallel::reduce_stats(Backend& be, float* x, size_t n, comm::ReduceOp op) {
  if (!be.host_addressable() && &data_ != &group_) {  // in place on the device (NCCL)
    check(data_.allreduce(x, n, comm::DType::kFloat32, op), "all-reduce", rank());
    return;
  }
  float* host = x;
  if (!be.host_addressable()) {
    staged_.resize(n);
    be.copy_to_host(staged_.data(), x, n * sizeof(float));
    host = staged_.data();
  }
  check(group_.allreduce(host, n, comm::DType::kFloat32, op), "all-reduce", rank());
  if (host != x) be.copy_to_device(x, host, n * sizeof(float));
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
  double ss = params.backend().sum_squares(ptrs.data(), sizes.data(), static_cast<int>(ptrs.size()));
  // inf/NaN anywhere makes the sum inf/NaN on every rank: one overflow decision.
  check(group_.allreduce(&ss, 1, comm::DType::kFloat64, comm::ReduceOp::kSum), "norm all-reduce",
        rank());
  return optimizer.stats_from_sum_squares(ss, loss_scale);
}

#define KILN_INSTANTIATE_CE(K, T)                                                             \
  template void TensorParallel::crossentropy<K, T>(Backend&, T*, float*, const T*,            \
                                                   const int32_t*, float, int);
#define KILN_INSTANTIATE(T)                                                                     \
  KILN_INSTANTIATE_CE(CpuBackend, T)                                                          \
  template void TensorParallel::host_allreduce<T>(T*, size_t);                                \
  template void TensorParallel::host_embedding_forward<T>(T*, const int32_t*, const T*,       \
                                                          const T*, int, int, int);           \
  template void TensorParallel::host_embedding_backward<T>(float*, float*, const T*,          \
                                                           const int32_t*, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE
#undef KILN_INSTANTIATE_CE

}  // namespace kiln::engine
