#include "engine/params.h"

#include <algorithm>
#include <cmath>

#include "common/hash.h"
#include "engine/rng.h"

namespace kiln::engine {
namespace {
constexpr size_t kAlign = 16;  // elements (64 bytes of fp32)
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

ParamStore::ParamStore(const ModelConfig& model, Precision precision, bool decay_norms_and_biases,
                       Backend* backend, TpShard tp)
    : backend_(backend ? backend : &cpu_backend()),
      model_(model),
      precision_(precision),
      decay_norms_and_biases_(decay_norms_and_biases),
      tp_(tp) {
  KILN_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "ParamStore: bad TpShard");
  const int64_t V = model.vocab_size, C = model.d_model, T = model.seq_len;
  add_unit("embed");
  wte_ = add(0, "wte", {V, C}, TensorRole::kEmbedding, 0);  // vocabulary-parallel
  wpe_ = add(0, "wpe", {T, C}, TensorRole::kEmbedding);
  for (int l = 0; l < model.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    add_unit("blocks." + std::to_string(l));
    const int u = static_cast<int>(units_.size()) - 1;
    BlockTensors b;
    b.ln1_w = add(u, p + "ln1.weight", {C}, TensorRole::kNormGain);
    b.ln1_b = add(u, p + "ln1.bias", {C}, TensorRole::kNormBias);
    b.qkv_w = add(u, p + "attn.qkv.weight", {3 * C, C}, TensorRole::kMatrix, 0, 3);
    b.qkv_b = add(u, p + "attn.qkv.bias", {3 * C}, TensorRole::kBias, 0, 3);
    b.attn_proj_w = add(u, p + "attn.proj.weight", {C, C}, TensorRole::kResidualOut, 1);
    b.attn_proj_b = add(u, p + "attn.proj.bias", {C}, TensorRole::kBias);
    b.ln2_w = add(u, p + "ln2.weight", {C}, TensorRole::kNormGain);
    b.ln2_b = add(u, p + "ln2.bias", {C}, TensorRole::kNormBias);
    b.fc_w = add(u, p + "mlp.fc.weight", {4 * C, C}, TensorRole::kMatrix, 0);
    b.fc_b = add(u, p + "mlp.fc.bias", {4 * C}, TensorRole::kBias, 0);
    b.fc_proj_w = add(u, p + "mlp.proj.weight", {C, 4 * C}, TensorRole::kResidualOut, 1);
    b.fc_proj_b = add(u, p + "mlp.proj.bias", {C}, TensorRole::kBias);
    blocks_.push_back(b);
  }
  add_unit("final");
  const int uf = static_cast<int>(units_.size()) - 1;
  lnf_w_ = add(uf, "ln_f.weight", {C}, TensorRole::kNormGain);
  lnf_b_ = add(uf, "ln_f.bias", {C}, TensorRole::kNormBias);

  const bool low = precision != Precision::kFp32;
  for (auto& u : units_) {
    u.numel = round_up(u.numel, 64);
    u.master.reset(backend_, u.numel);
    u.grad.reset(backend_, u.numel);
    u.m.reset(backend_, u.numel);
    u.v.reset(backend_, u.numel);
    if (low) u.lp.reset(backend_, u.numel);
  }
}

void ParamStore::add_unit(const std::string& name) {
  units_.emplace_back();
  units_.back().name = name;
}

int ParamStore::add(int unit, const std::string& name, std::vector<int64_t> shape,
                    TensorRole role, int split_dim, int split_parts) {
  ParamTensor t;
  t.name = name;
  t.global_shape = shape;
  t.shape = std::move(shape);
  if (tp_.size > 1 && split_dim >= 0) {
    const int64_t parts = split_parts * tp_.size;
    KILN_CHECK(t.shape[split_dim] % parts == 0,
               "ParamStore: " + name + " does not split over the tensor-parallel ranks");
    t.shape[split_dim] /= tp_.size;
    t.split_dim = split_dim;
    t.split_parts = split_parts;
  }
  t.unit = unit;
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
  t.role = role;
  const bool is_vector = role == TensorRole::kBias || role == TensorRole::kNormGain ||
                         role == TensorRole::kNormBias;
  t.decay = !is_vector || decay_norms_and_biases_;
  ParamUnit& u = units_[unit];
  t.offset = round_up(u.numel, kAlign);
  u.numel = t.offset + t.numel;
  tensors_.push_back(std::move(t));
  u.tensors.push_back(static_cast<int>(tensors_.size()) - 1);
  return static_cast<int>(tensors_.size()) - 1;
}

DType ParamStore::work_dtype() const {
  switch (precision_) {
    case Precision::kFp32: return DType::kF32;
    case Precision::kBf16: return DType::kBF16;
    case Precision::kFp16: return DType::kF16;
  }
  return DType::kF32;
}

int ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

void ParamStore::init(uint64_t seed) {
  const double L = static_cast<double>(model_.n_layers);
  const double std0 = model_.init_std;
  // DeepNet (Wang et al. 2022) decoder init: Xavier-normal, with gain beta = (8N)^(-1/4) on the
  // value projection, attention output and both MLP matrices (N = layers).
  const double beta = std::pow(8.0 * L, -0.25);
  for (auto& u : units_) {
    u.master.zero();
    u.grad.zero();
    u.m.zero();
    u.v.zero();
  }
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const ParamTensor& t = tensors_[ti];
    float* w = master(static_cast<int>(ti));
    if (t.role == TensorRole::kBias || t.role == TensorRole::kNormBias) continue;  // zeros
    if (t.role == TensorRole::kNormGain) {
      backend_->fill(w, 1.0f, t.numel);
      continue;
    }
    const uint64_t stream = xxh3_64(t.name);
    // The whole tensor's shape: a tensor-parallel slice gets the values of its elements in the
    // whole tensor (the same model on any number of ranks).
    const std::vector<int64_t>& shape = t.global_shape;
    const size_t cols = static_cast<size_t>(shape.back());
    // std per row: DeepNet's q/k/v split needs rows of qkv to differ.
    auto row_std = [&](size_t row) -> double {
      if (model_.init == InitScheme::kGpt2) {
        return t.role == TensorRole::kResidualOut ? std0 / std::sqrt(2.0 * L) : std0;
      }
      if (t.role == TensorRole::kEmbedding) return std0;
      const double fan_out = static_cast<double>(shape[0]);
      const double fan_in = static_cast<double>(cols);
      const bool is_qkv = t.name.find("attn.qkv") != std::string::npos;
      if (is_qkv) {  // q, k, v are three (C, C) matrices
        const double c = fan_in;
        const double xavier = std::sqrt(2.0 / (c + c));
        const bool is_v = row >= static_cast<size_t>(2 * model_.d_model);
        return is_v ? beta * xavier : xavier;
      }
      return beta * std::sqrt(2.0 / (fan_in + fan_out));
    };
    size_t whole = 1;
    for (int64_t d : shape) whole *= static_cast<size_t>(d);
    const size_t rows = whole / cols;
    std::vector<double> stds(rows);
    for (size_t row = 0; row < rows; ++row) stds[row] = row_std(row);
    if (t.split_dim < 0) {
      backend_->fill_normal_rows(w, rows, cols, stds.data(), seed, stream);
      continue;
    }
    std::vector<float> values(whole), slice(t.numel);
    random_normal_rows(values.data(), rows, cols, stds.data(), seed, stream);
    copy_to_shard(t, tp_, values.data(), slice.data());
    upload(static_cast<int>(ti), ParamField::kMaster, slice.data());
  }
  sync_low_precision();
}

void ParamStore::sync_low_precision() {
  if (precision_ == Precision::kFp32) return;
  for (auto& u : units_) backend_->cast_from_fp32(u.lp.data(), work_dtype(), u.master.data(), u.numel);
}

void ParamStore::zero_grads() {
  for (auto& u : units_) u.grad.zero();
}

float* ParamStore::field(int t, ParamField f) const {
  const ParamUnit& u = units_[tensors_[t].unit];
  const DeviceArray<float>* a = &u.master;
  switch (f) {
    case ParamField::kMaster: a = &u.master; break;
    case ParamField::kGrad: a = &u.grad; break;
    case ParamField::kExpAvg: a = &u.m; break;
    case ParamField::kExpAvgSq: a = &u.v; break;
  }
  return const_cast<float*>(a->data()) + tensors_[t].offset;
}

const float* ParamStore::host_view(int t, ParamField f, std::vector<float>* scratch) const {
  const float* p = field(t, f);
  if (backend_->host_addressable()) return p;
  scratch->resize(tensors_[t].numel);
  backend_->copy_to_host(scratch->data(), p, tensors_[t].numel * sizeof(float));
  return scratch->data();
}

void ParamStore::upload(int t, ParamField f, const float* src) {
  backend_->copy_to_device(field(t, f), src, tensors_[t].numel * sizeof(float));
}

size_t ParamStore::num_params() const {
  size_t n = 0;
  for (const auto& t : tensors_) n += t.numel;
  return n;
}

size_t ParamStore::padded_numel() const {
  size_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

size_t ParamStore::state_bytes() const {
  size_t n = 0;
  for (const auto& u : units_) n += u.master.bytes() + u.grad.bytes() + u.m.bytes() + u.v.bytes() + u.lp.bytes();
  return n;
}

namespace {
// Calls fn(whole_offset, slice_offset, count) for every contiguous run of the slice.
template <class Fn>
void for_each_run(const ParamTensor& t, TpShard s, Fn fn) {
  if (t.split_dim < 0 || s.size == 1) {
    fn(size_t{0}, size_t{0}, t.numel);
    return;
  }
  const size_t grows = static_cast<size_t>(t.global_shape[0]);
  const size_t whole_cols = t.global_shape.size() > 1 ? static_cast<size_t>(t.global_shape[1]) : 1;
  if (t.split_dim == 0) {  // rows: each of split_parts parts split over the ranks
    const size_t part_rows = grows / static_cast<size_t>(t.split_parts);
    const size_t mine = part_rows / static_cast<size_t>(s.size);
    for (size_t p = 0; p < static_cast<size_t>(t.split_parts); ++p) {
      fn((p * part_rows + static_cast<size_t>(s.rank) * mine) * whole_cols, p * mine * whole_cols,
         mine * whole_cols);
    }
    return;
  }
  const size_t mine = whole_cols / static_cast<size_t>(s.size);  // columns
  for (size_t r = 0; r < grows; ++r) {
    fn(r * whole_cols + static_cast<size_t>(s.rank) * mine, r * mine, mine);
  }
}
}  // namespace

void copy_to_shard(const ParamTensor& t, TpShard shard, const float* whole, float* slice) {
  for_each_run(t, shard, [&](size_t w, size_t l, size_t n) {
    std::copy(whole + w, whole + w + n, slice + l);
  });
}

void copy_from_shard(const ParamTensor& t, TpShard shard, const float* slice, float* whole) {
  for_each_run(t, shard, [&](size_t w, size_t l, size_t n) {
    std::copy(slice + l, slice + l + n, whole + w);
  });
}

void copy_between_shards(const ParamTensor& from_t, TpShard from, const float* src,
                         const ParamTensor& to_t, TpShard to, float* dst) {
  struct Run {
    size_t whole, local, n;
  };
  auto runs = [](const ParamTensor& t, TpShard s) {
    std::vector<Run> out;
    for_each_run(t, s, [&](size_t w, size_t l, size_t n) { out.push_back({w, l, n}); });
    return out;  // ascending in `whole` (for_each_run walks the tensor in order)
  };
  const std::vector<Run> a = runs(from_t, from), b = runs(to_t, to);
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const size_t lo = std::max(a[i].whole, b[j].whole);
    const size_t hi = std::min(a[i].whole + a[i].n, b[j].whole + b[j].n);
    if (lo < hi) {
      std::copy(src + a[i].local + (lo - a[i].whole), src + a[i].local + (hi - a[i].whole),
                dst + b[j].local + (lo - b[j].whole));
    }
    if (a[i].whole + a[i].n <= b[j].whole + b[j].n) {
      ++i;
    } else {
      ++j;
    }
  }
}

}  // namespace kiln::engine
