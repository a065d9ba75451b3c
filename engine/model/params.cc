#include "engine/model/params.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/hash.h"
#include "common/tsan.h"
#include "engine/model/rng.h"

namespace kiln::engine {
namespace {
constexpr size_t kAlign = 16;  // elements (64 bytes of fp32)
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

ParamStore::ParamStore(const ModelConfig& model, Precision precision, bool decay_norms_and_biases,
                       Runtime* runtime, TpShard tp, bool allocate, PpStage pp)
    : runtime_(runtime ? runtime : &host_runtime()),
      model_(model),
      precision_(precision),
      decay_norms_and_biases_(decay_norms_and_biases),
      tp_(tp),
      pp_(pp) {
  KILN_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "ParamStore: bad TpShard");
  if (pp_.end_block < 0) pp_.end_block = model.n_layers;
  KILN_CHECK(pp_.size >= 1 && pp_.rank >= 0 && pp_.rank < pp_.size && pp_.first_block >= 0 &&
                 pp_.first_block < pp_.end_block && pp_.end_block <= model.n_layers,
             "ParamStore: bad PpStage");
  const int64_t V = model.vocab_size, C = model.d_model, T = model.seq_len;
  const int64_t hs = model.head_dim(), NH = model.n_heads, NKV = model.kv_heads();
  const int64_t F = model.ffn();
  const bool llama = model.llama(), bias = model.bias;
  // A bias that exists only with model.bias; a norm's bias only for LayerNorm (gpt2).
  auto add_bias = [&](int u, const std::string& name, int64_t n, int split_dim = -1,
                      int split_parts = 1, std::vector<int64_t> part_rows = {}) {
    return bias ? add(u, name, {n}, TensorRole::kBias, split_dim, split_parts, std::move(part_rows))
                : -1;
  };
  auto add_norm = [&](int u, const std::string& name, int* w, int* b) {
    *w = add(u, name + ".weight", {C}, TensorRole::kNormGain);
    *b = llama ? -1 : add(u, name + ".bias", {C}, TensorRole::kNormBias);
  };
  add_unit("embed");
  wte_ = add(0, "wte", {V, C}, TensorRole::kEmbedding, 0);  // vocabulary-parallel
  if (!llama) wpe_ = add(0, "wpe", {T, C}, TensorRole::kEmbedding);
  // q, k, v rows: equal parts for multi-head attention, the head counts for grouped-query.
  std::vector<int64_t> qkv_parts;
  if (NKV != NH) qkv_parts = {NH * hs, NKV * hs, NKV * hs};
  const int64_t QKV = model.qkv_width();
  const int64_t FC = llama ? 2 * F : F;  // SwiGLU: gate and up
  for (int l = 0; l < model.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    add_unit("blocks." + std::to_string(l));
    const int u = static_cast<int>(units_.size()) - 1;
    BlockTensors b;
    add_norm(u, p + "ln1", &b.ln1_w, &b.ln1_b);
    b.qkv_w = add(u, p + "attn.qkv.weight", {QKV, C}, TensorRole::kMatrix, 0, 3, qkv_parts);
    b.qkv_b = add_bias(u, p + "attn.qkv.bias", QKV, 0, 3, qkv_parts);
    b.attn_proj_w = add(u, p + "attn.proj.weight", {C, NH * hs}, TensorRole::kResidualOut, 1);
    b.attn_proj_b = add_bias(u, p + "attn.proj.bias", C);
    add_norm(u, p + "ln2", &b.ln2_w, &b.ln2_b);
    b.fc_w = add(u, p + "mlp.fc.weight", {FC, C}, TensorRole::kMatrix, 0, llama ? 2 : 1);
    b.fc_b = add_bias(u, p + "mlp.fc.bias", FC, 0, llama ? 2 : 1);
    b.fc_proj_w = add(u, p + "mlp.proj.weight", {C, F}, TensorRole::kResidualOut, 1);
    b.fc_proj_b = add_bias(u, p + "mlp.proj.bias", C);
    blocks_.push_back(b);
  }
  add_unit("final");
  const int uf = static_cast<int>(units_.size()) - 1;
  add_norm(uf, "ln_f", &lnf_w_, &lnf_b_);
  lm_head_ =
      model.tie_embeddings ? wte_ : add(uf, "lm_head.weight", {V, C}, TensorRole::kMatrix, 0);

  // The stage's units: its blocks, the embeddings on the first stage (and on the last when the
  // head is tied to them), the final unit on the last.
  held_.assign(units_.size(), false);
  held_[0] = pp_.first() || (pp_.last() && model.tie_embeddings);
  for (int64_t l = pp_.first_block; l < pp_.end_block; ++l)
    held_[static_cast<size_t>(1 + l)] = true;
  held_.back() = pp_.last();
  const bool low = precision != Precision::kFp32;
  for (size_t i = 0; i < units_.size(); ++i) {
    ParamUnit& u = units_[i];
    u.numel = round_up(u.numel, 64);
    if (!allocate || !held_[i]) continue;
    u.master.reset(runtime_, u.numel, u.name + ".master");
    u.grad.reset(runtime_, u.numel, u.name + ".grad");
    u.m.reset(runtime_, u.numel, u.name + ".exp_avg");
    u.v.reset(runtime_, u.numel, u.name + ".exp_avg_sq");
    if (low) u.lp.reset(runtime_, u.numel, u.name + ".working_copy");
  }
}

void ParamStore::add_unit(const std::string& name) {
  units_.emplace_back();
  units_.back().name = name;
}

int ParamStore::add(int unit, const std::string& name, std::vector<int64_t> shape, TensorRole role,
                    int split_dim, int split_parts, std::vector<int64_t> part_rows) {
  ParamTensor t;
  t.name = name;
  t.global_shape = shape;
  t.shape = std::move(shape);
  if (tp_.size > 1 && split_dim >= 0) {
    if (part_rows.empty()) {
      const int64_t parts = split_parts * tp_.size;
      KILN_CHECK(t.shape[split_dim] % parts == 0,
                 "ParamStore: " + name + " does not split over the tensor-parallel ranks");
    } else {
      KILN_CHECK(split_dim == 0 && static_cast<int>(part_rows.size()) == split_parts,
                 "ParamStore: " + name + ": unequal parts are rows");
      for (int64_t rows : part_rows) {
        KILN_CHECK(rows % tp_.size == 0,
                   "ParamStore: " + name + " does not split over the tensor-parallel ranks");
      }
    }
    t.shape[split_dim] /= tp_.size;
    t.split_dim = split_dim;
    t.split_parts = split_parts;
    t.part_rows = std::move(part_rows);
  }
  t.unit = unit;
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
  t.role = role;
  const bool is_vector =
      role == TensorRole::kBias || role == TensorRole::kNormGain || role == TensorRole::kNormBias;
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
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kBf16:
      return DType::kBF16;
    case Precision::kFp16:
      return DType::kF16;
  }
  return DType::kF32;
}

int ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

void ParamStore::init(uint64_t seed) {
  InitSource src(*this, seed);
  const Status st = fill(src);
  KILN_CHECK(st.is_ok(), "ParamStore::init: " + st.to_string());
}

namespace {
// The initial standard deviation of a tensor's rows: rows >= split get `hi`, the others `lo`
// (DeepNet's q/k/v: v is scaled differently).
struct RowStd {
  double lo = 0, hi = 0;
  size_t split = 0;
  double at(size_t row) const { return row >= split ? hi : lo; }
};

RowStd row_std(const ModelConfig& m, const ParamTensor& t) {
  const double L = static_cast<double>(m.n_layers);
  const double std0 = m.init_std;
  // DeepNet (Wang et al. 2022) decoder init: Xavier-normal, with gain beta = (8N)^(-1/4) on the
  // value projection, attention output and both MLP matrices (N = layers).
  const double beta = std::pow(8.0 * L, -0.25);
  const std::vector<int64_t>& shape = t.global_shape;  // the whole tensor's
  const size_t cols = static_cast<size_t>(shape.back());
  RowStd r;
  if (m.init == InitScheme::kGpt2) {
    r.lo = t.role == TensorRole::kResidualOut ? std0 / std::sqrt(2.0 * L) : std0;
  } else if (t.role == TensorRole::kEmbedding) {
    r.lo = std0;
  } else if (t.name.find("attn.qkv") != std::string::npos) {  // q, k, v: (C, C) matrices
    const double c = static_cast<double>(cols);               // (k, v: (kv heads x hs, C))
    const double xavier = std::sqrt(2.0 / (c + c));
    r.lo = xavier;
    r.hi = beta * xavier;
    r.split = static_cast<size_t>((m.n_heads + m.kv_heads()) * m.head_dim());  // v's first row
    return r;
  } else {
    const double fan_out = static_cast<double>(shape[0]);
    const double fan_in = static_cast<double>(cols);
    r.lo = beta * std::sqrt(2.0 / (fan_in + fan_out));
  }
  r.hi = r.lo;
  r.split = SIZE_MAX;
  return r;
}
}  // namespace

void ParamStore::init_values(uint64_t seed, int unit, size_t begin, size_t n, float* dst) const {
  std::fill(dst, dst + n, 0.0f);
  const size_t end = begin + n;
  for (int ti : units_[unit].tensors) {
    const ParamTensor& t = tensors_[ti];
    const size_t a = std::max(begin, t.offset), b = std::min(end, t.offset + t.numel);
    if (a >= b) continue;
    float* out = dst + (a - begin);
    if (t.role == TensorRole::kBias || t.role == TensorRole::kNormBias) continue;  // zeros
    if (t.role == TensorRole::kNormGain) {
      std::fill(out, out + (b - a), 1.0f);
      continue;
    }
    // Element g of the whole tensor (row g / cols) is std(row) * N(0,1)(seed, stream, g), as
    // random_normal_rows computes it: a slice or range gets its elements' values.
    const uint64_t stream = xxh3_64(t.name);
    const size_t cols = static_cast<size_t>(t.global_shape.back());
    const RowStd rs = row_std(model_, t);
    const size_t la = a - t.offset, lb = b - t.offset;  // slice elements wanted
    // The wanted runs of the slice, cut into pieces of at most 4096 elements, in parallel.
    struct Piece {
      size_t whole, out, count;
    };
    std::vector<Piece> pieces;
    for_each_slice_run(t, tp_, [&](size_t whole, size_t local, size_t count) {
      const size_t lo = std::max(local, la), hi = std::min(local + count, lb);
      for (size_t p = lo; p < hi; p += 4096) {
        pieces.push_back({whole + (p - local), p - la, std::min<size_t>(4096, hi - p)});
      }
    });
    const tsan::ForkJoin fork_join;
    tbb::parallel_for(tbb::blocked_range<size_t>(0, pieces.size()),
                      fork_join.task([&](const tbb::blocked_range<size_t>& r) {
                        for (size_t k = r.begin(); k != r.end(); ++k) {
                          const Piece& pc = pieces[k];
                          for (size_t i = 0; i < pc.count; ++i) {
                            const size_t g = pc.whole + i;
                            out[pc.out + i] = static_cast<float>(rs.at(g / cols) *
                                                                 random_normal(seed, stream, g));
                          }
                        }
                      }));
    fork_join.join();
  }
}

Status InitSource::read(int unit, ParamField f, size_t begin, size_t n, float* dst) {
  if (f == ParamField::kMaster) {
    params_.init_values(seed_, unit, begin, n, dst);
  } else {
    std::fill(dst, dst + n, 0.0f);
  }
  return Status::ok();
}

Status read_state(StateSource& src, Runtime& rt, int unit, ParamField f, size_t begin, size_t n,
                  float* dst, std::vector<float>* staging) {
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(kStateChunk, n - done);
    if (rt.host_addressable()) {
      KILN_RETURN_IF_ERROR(src.read(unit, f, begin + done, k, dst + done));
    } else {
      staging->resize(std::min(kStateChunk, n));
      KILN_RETURN_IF_ERROR(src.read(unit, f, begin + done, k, staging->data()));
      rt.copy_to_device(dst + done, staging->data(), k * sizeof(float));
    }
    done += k;
  }
  return Status::ok();
}

Status ParamStore::fill(StateSource& src) {
  std::vector<float> staging;
  for (size_t i = 0; i < units_.size(); ++i) {
    ParamUnit& u = units_[i];
    if (!held_[i]) continue;
    KILN_CHECK(!u.master.empty(), "ParamStore::fill: the store has no buffers");
    const int ui = static_cast<int>(i);
    KILN_RETURN_IF_ERROR(
        read_state(src, *runtime_, ui, ParamField::kMaster, 0, u.numel, u.master.data(), &staging));
    if (src.zero_moments()) {
      u.m.zero();
      u.v.zero();
    } else {
      KILN_RETURN_IF_ERROR(
          read_state(src, *runtime_, ui, ParamField::kExpAvg, 0, u.numel, u.m.data(), &staging));
      KILN_RETURN_IF_ERROR(
          read_state(src, *runtime_, ui, ParamField::kExpAvgSq, 0, u.numel, u.v.data(), &staging));
    }
    u.grad.zero();
  }
  sync_low_precision();
  return Status::ok();
}

void ParamStore::sync_low_precision() {
  if (precision_ == Precision::kFp32) return;
  for (size_t i = 0; i < units_.size(); ++i) {
    ParamUnit& u = units_[i];
    if (held_[i] && !u.lp.empty())
      runtime_->cast_from_fp32(u.lp.data(), work_dtype(), u.master.data(), u.numel);
  }
}

void ParamStore::zero_grads() {
  for (auto& u : units_) u.grad.zero();
}

float* ParamStore::field(int t, ParamField f) const {
  const ParamUnit& u = units_[tensors_[t].unit];
  const DeviceArray<float>* a = &u.master;
  switch (f) {
    case ParamField::kMaster:
      a = &u.master;
      break;
    case ParamField::kGrad:
      a = &u.grad;
      break;
    case ParamField::kExpAvg:
      a = &u.m;
      break;
    case ParamField::kExpAvgSq:
      a = &u.v;
      break;
  }
  return const_cast<float*>(a->data()) + tensors_[t].offset;
}

const float* ParamStore::host_view(int t, ParamField f, std::vector<float>* scratch) const {
  const float* p = field(t, f);
  if (runtime_->host_addressable()) return p;
  scratch->resize(tensors_[t].numel);
  runtime_->copy_to_host(scratch->data(), p, tensors_[t].numel * sizeof(float));
  return scratch->data();
}

void ParamStore::upload(int t, ParamField f, const float* src) {
  runtime_->copy_to_device(field(t, f), src, tensors_[t].numel * sizeof(float));
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
  for (const auto& u : units_)
    n += u.master.bytes() + u.grad.bytes() + u.m.bytes() + u.v.bytes() + u.lp.bytes();
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
    size_t whole_row = 0, local_row = 0;
    for (size_t p = 0; p < static_cast<size_t>(t.split_parts); ++p) {
      const size_t part_rows = t.part_rows.empty() ? grows / static_cast<size_t>(t.split_parts)
                                                   : static_cast<size_t>(t.part_rows[p]);
      const size_t mine = part_rows / static_cast<size_t>(s.size);
      fn((whole_row + static_cast<size_t>(s.rank) * mine) * whole_cols, local_row * whole_cols,
         mine * whole_cols);
      whole_row += part_rows;
      local_row += mine;
    }
    return;
  }
  const size_t mine = whole_cols / static_cast<size_t>(s.size);  // columns
  for (size_t r = 0; r < grows; ++r) {
    fn(r * whole_cols + static_cast<size_t>(s.rank) * mine, r * mine, mine);
  }
}
}  // namespace

void for_each_slice_run(const ParamTensor& t, TpShard shard,
                        const std::function<void(size_t, size_t, size_t)>& fn) {
  for_each_run(t, shard, fn);
}

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

}  // namespace kiln::engine

namespace kiln::engine {

std::vector<int64_t> pp_stage_split(const ModelConfig& m, int64_t pp,
                                    const std::vector<int64_t>& layers) {
  const int64_t L = m.n_layers;
  KILN_CHECK(pp >= 1 && pp <= L, "pp_stage_split: every stage needs a block");
  std::vector<int64_t> bounds{0};
  if (!layers.empty()) {
    KILN_CHECK(static_cast<int64_t>(layers.size()) == pp, "pp_stage_split: pp entries expected");
    for (int64_t n : layers) bounds.push_back(bounds.back() + n);
    KILN_CHECK(bounds.back() == L, "pp_stage_split: the entries must sum to n_layers");
    return bounds;
  }
  // Forward FLOPs per token: a block's four matrix products and its attention (causal: half of
  // the T x T scores, for QK^T and AV), the LM head's product on the last stage.
  const double C = static_cast<double>(m.d_model), T = static_cast<double>(m.seq_len);
  const double CA = static_cast<double>(m.n_heads * m.head_dim());
  const double F = static_cast<double>(m.ffn()), FC = m.llama() ? 2 * F : F;
  const double block =
      2 * (C * static_cast<double>(m.qkv_width()) + CA * C + C * FC + F * C) + 2 * T * CA;
  const double head = 2 * C * static_cast<double>(m.vocab_size);
  // The split of the dynamic program "best[s][l] = min over k of max(best[s - 1][k], cost of
  // stage s holding blocks [k, l))" with the earliest k winning ties, in O(pp log L) instead of
  // its O(pp L^2) (which hung on 65,536 blocks): blocks cost the same, so without the head
  // best[s][k] = ceil(k / s) x block (the products computed as the program does, so the result is
  // the same to the bit), nondecreasing in k, while the stage's own cost falls as k grows. The
  // minimum of their maximum is at the crossing, found by bisection, and only the cuts on the way
  // back from L are needed.
  auto before = [&](int64_t s, int64_t k) {  // best[s][k], s < pp
    if (s == 0) return k == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return static_cast<double>((k + s - 1) / s) * block;
  };
  bounds.assign(static_cast<size_t>(pp + 1), L);
  int64_t l = L;
  for (int64_t s = pp; s >= 1; --s) {
    const double extra = s == pp ? head : 0.0;
    auto stage = [&](int64_t k) { return static_cast<double>(l - k) * block + extra; };
    // k in [s - 1, l - 1]; the first k whose best[s - 1][k] >= stage(k) (hi = l: none).
    int64_t lo = s - 1, hi = l;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (before(s - 1, mid) >= stage(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int64_t k0 = lo;
    int64_t k = k0;
    if (k0 > s - 1 && (k0 == l || stage(k0 - 1) <= before(s - 1, k0))) {
      // The minimum is on the falling side, stage(k0 - 1): its earliest k (stage is
      // nonincreasing in k there, so the first k with stage(k) <= that value).
      const double v = stage(k0 - 1);
      int64_t a = s - 1, b = k0 - 1;
      while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (stage(mid) <= v) {
          b = mid;
        } else {
          a = mid + 1;
        }
      }
      k = a;
    }
    bounds[static_cast<size_t>(s - 1)] = k;
    l = k;
  }
  return bounds;
}

PpStage pp_stage(const ModelConfig& m, int rank, int size, const std::vector<int64_t>& layers) {
  const std::vector<int64_t> b = pp_stage_split(m, size, layers);
  return PpStage{rank, size, b[static_cast<size_t>(rank)], b[static_cast<size_t>(rank) + 1]};
}

}  // namespace kiln::engine
