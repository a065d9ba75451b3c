// Model parameters, gradients and optimizer state in per-unit flat buffers, in the memory of one
// Runtime (engine/device/runtime.h: host memory for cpu, device memory for cuda).
//
// A "unit" is the granule the distributed engine shards, gathers and frees: the embeddings
// (wte, wpe), each transformer block, and the final LayerNorm. Each unit owns five flat buffers
// of the same padded length: fp32 master weights, fp32 gradients, AdamW first and second moments
// (fp32), and - for bf16/fp16 - the low-precision working copy that forward/backward read.
// Tensors are views at fixed, 64-byte-aligned offsets inside their unit; padding is zero and stays
// zero (its gradient is never written). Names follow "blocks.3.attn.qkv.weight"; matrices are
// (out_features, in_features) row-major, as torch.nn.Linear.
//
// Initialisation is a pure function of (seed, tensor name, element index) (engine/model/rng.h), so
// any shard of any tensor can be initialised on its own and the values do not depend on threads:
// init_values() computes any range of a unit's elements. Model states are built from a
// StateSource (the initialisation, a checkpoint, a consolidated file) read in ranges, so a rank
// that keeps only a shard of them (ZeRO, engine/parallel/zero.h) computes or reads only that shard:
// such a rank's ParamStore is made without buffers (allocate = false) and ZeroOptimizer::create
// builds what the rank holds. The buffers are reached only through the runtime: on a GPU the tensor
// views below are device pointers, and host code reads or writes them with host_view() / upload()
// (checkpoints do). Not thread-safe for concurrent mutation; the training loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "engine/config/model.h"
#include "engine/config/precision.h"
#include "engine/device/runtime.h"
#include "kernels/dtype.h"

namespace kiln::engine {

enum class TensorRole {
  kEmbedding,    // wte, wpe
  kMatrix,       // linear weights
  kResidualOut,  // linear weights that write into the residual stream (attn.proj, mlp.proj)
  kBias,
  kNormGain,
  kNormBias,
};

// This rank's place in tensor parallelism (engine/parallel/tensor_parallel.h): rank of size.
struct TpShard {
  int rank = 0;
  int size = 1;
};

// This rank's place in pipeline parallelism (engine/parallel/pipeline.h): stage rank of size holds
// blocks [first_block, end_block), the embeddings when it is the first stage (and the last too
// when the LM head is tied to them), the final norm and LM head when it is the last.
struct PpStage {
  int rank = 0;
  int size = 1;
  int64_t first_block = 0;
  int64_t end_block = -1;  // -1: to the last block
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
};

// The block boundaries of `pp` stages (pp + 1 values, 0 ... n_layers): `layers` (blocks per stage)
// when given, else contiguous runs of at least one block each that minimise the costliest stage's
// forward FLOPs per token, the LM head counting on the last stage (the embedding lookup costs
// next to nothing). Deterministic.
std::vector<int64_t> pp_stage_split(const ModelConfig& m, int64_t pp,
                                    const std::vector<int64_t>& layers = {});
// Stage `rank` of `size` from pp_stage_split.
PpStage pp_stage(const ModelConfig& m, int rank, int size, const std::vector<int64_t>& layers = {});

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;         // this rank's (the global shape split by TpShard)
  std::vector<int64_t> global_shape;  // the whole tensor's
  // Tensor parallelism: -1 replicated on every rank (norms, position embeddings, row-parallel
  // biases); 0 rows split (vocabulary, column-parallel outputs), 1 columns split (row-parallel
  // inputs). Dimension split_dim is split_parts equal parts (q, k, v: 3), each split over the
  // ranks, so a rank holds the same heads of q, k and v.
  int split_dim = -1;
  int split_parts = 1;
  // Rows of each part when the parts differ (grouped-query q, k, v: n_heads, n_kv_heads,
  // n_kv_heads heads); empty when they are split_parts equal parts.
  std::vector<int64_t> part_rows;
  int unit = 0;
  size_t offset = 0;  // elements from the start of its unit
  size_t numel = 0;
  TensorRole role = TensorRole::kMatrix;
  bool decay = true;  // AdamW weight decay applies
};

struct ParamUnit {
  std::string name;          // "embed", "blocks.3", "final"
  std::vector<int> tensors;  // indices into ParamStore::tensors()
  size_t numel = 0;          // padded length of every buffer below
  DeviceArray<float> master;
  DeviceArray<float> grad;
  DeviceArray<float> m;
  DeviceArray<float> v;
  DeviceArray<uint16_t> lp;  // bf16/fp16 bits; empty in fp32
};

// Indices of one block's tensors; -1 for a tensor the architecture does not have (llama: the
// norms' biases, and every bias with model.bias false). mlp.fc is (ffn, C) for gpt2 and
// (2 ffn, C), the SwiGLU gate then up rows, for llama.
struct BlockTensors {
  int ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w,
      fc_proj_b;
};

enum class ParamField { kMaster, kGrad, kExpAvg, kExpAvgSq };

class ParamStore;

// True when a model's tensors split over `tp` tensor-parallel ranks: query and key/value heads,
// MLP units and vocabulary rows in equal parts.
inline bool splits_over_tp(const ModelConfig& m, int64_t tp) {
  return tp >= 1 && m.n_heads % tp == 0 && m.kv_heads() % tp == 0 && m.ffn() % tp == 0 &&
         m.vocab_size % tp == 0;
}

// Where model states come from when they are built (start-up, resume): fp32 values of one field
// (kMaster, kExpAvg, kExpAvgSq) of a unit's flat elements, in ranges.
class StateSource {
 public:
  virtual ~StateSource() = default;
  // dst[0, n) (host memory) = field f of unit `unit`'s elements [begin, begin + n) (within the
  // unit's padded numel; padding is zero).
  virtual Status read(int unit, ParamField f, size_t begin, size_t n, float* dst) = 0;
  // True when the AdamW moments are zero (a fresh start): they are not read.
  virtual bool zero_moments() const { return false; }
};

// The initialisation as a source: ParamStore::init_values, moments zero.
class InitSource final : public StateSource {
 public:
  InitSource(const ParamStore& params, uint64_t seed) : params_(params), seed_(seed) {}
  Status read(int unit, ParamField f, size_t begin, size_t n, float* dst) override;
  bool zero_moments() const override { return true; }

 private:
  const ParamStore& params_;
  uint64_t seed_;
};

// Elements a state is read in at most at once (the host staging bound while building model
// states: 4 MiB of fp32).
inline constexpr size_t kStateChunk = size_t{1} << 20;

// dst (be's memory)[0, n) = field f of unit's elements [begin, begin + n) from src, in chunks of
// kStateChunk elements (straight into dst when be's memory is the host's, else through *staging).
Status read_state(StateSource& src, Runtime& rt, int unit, ParamField f, size_t begin, size_t n,
                  float* dst, std::vector<float>* staging);

class ParamStore {
 public:
  // runtime nullptr: the host runtime.
  // tp: the tensor-parallel slice this store holds (every tensor whole by default).
  // allocate false: the layout only (tensors, units and their lengths), no buffer (ZeRO builds
  // the ones a rank keeps, engine/parallel/zero.h; a checkpoint reader uses another TP rank's
  // layout).
  // pp: the pipeline stage this store is for; units of other stages keep their layout (tensors,
  // lengths) but never get buffers, and every loop over buffers skips them (holds()).
  ParamStore(const ModelConfig& model, Precision precision, bool decay_norms_and_biases = false,
             Runtime* runtime = nullptr, TpShard tp = {}, bool allocate = true, PpStage pp = {});

  // GPT-2 or DeepNet-style initialisation of the master weights (zeroes grads and moments, then
  // refreshes the low-precision copy): fill(InitSource(*this, seed)).
  void init(uint64_t seed);
  // The initial master weights of unit `unit`'s elements [begin, begin + n) into dst (host
  // memory; padding zero): element i of a tensor gets the value of its element in the whole
  // tensor, whatever the TP slice, shard, range or thread count.
  void init_values(uint64_t seed, int unit, size_t begin, size_t n, float* dst) const;
  // Every unit's master weights and moments from src (allocated buffers), gradients zero, the
  // low-precision copy refreshed.
  Status fill(StateSource& src);
  // Refreshes every unit's low-precision copy from its master weights (round to nearest even).
  void sync_low_precision();
  void zero_grads();

  Runtime& runtime() const { return *runtime_; }
  const ModelConfig& model() const { return model_; }
  TpShard tp_shard() const { return tp_; }
  PpStage pp_stage() const { return pp_; }
  // Whether unit `unit` belongs to this store's pipeline stage (always without pipelining).
  bool holds(int unit) const { return held_[static_cast<size_t>(unit)]; }
  Precision precision() const { return precision_; }
  DType work_dtype() const;
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  std::vector<ParamUnit>& units() { return units_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  int find(const std::string& name) const;  // -1 when absent

  // Tensor views.
  float* master(int t) { return units_[tensors_[t].unit].master.data() + tensors_[t].offset; }
  float* grad(int t) { return units_[tensors_[t].unit].grad.data() + tensors_[t].offset; }
  float* exp_avg(int t) { return units_[tensors_[t].unit].m.data() + tensors_[t].offset; }
  float* exp_avg_sq(int t) { return units_[tensors_[t].unit].v.data() + tensors_[t].offset; }
  const float* master(int t) const {
    return units_[tensors_[t].unit].master.data() + tensors_[t].offset;
  }
  const float* grad(int t) const {
    return units_[tensors_[t].unit].grad.data() + tensors_[t].offset;
  }
  const float* exp_avg(int t) const {
    return units_[tensors_[t].unit].m.data() + tensors_[t].offset;
  }
  const float* exp_avg_sq(int t) const {
    return units_[tensors_[t].unit].v.data() + tensors_[t].offset;
  }
  // Tensor t's field readable on the host: the buffer itself when the runtime's memory is host
  // memory, else a copy made into *scratch (valid until scratch changes).
  const float* host_view(int t, ParamField f, std::vector<float>* scratch) const;
  // Writes tensor t's field from numel host values.
  void upload(int t, ParamField f, const float* src);
  // The working (forward/backward) copy in storage type T; T must match work_dtype().
  template <typename T>
  T* work(int t);
  // The low-precision working copy of tensor t as raw bf16/fp16 bits (nullptr in fp32).
  void* work_bytes(int t) {
    ParamUnit& u = units_[tensors_[t].unit];
    return u.lp.empty() ? nullptr : u.lp.data() + tensors_[t].offset;
  }

  int wte() const { return wte_; }
  int wpe() const { return wpe_; }  // -1 without learned positions (llama)
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }  // -1 for RMSNorm (llama)
  // The LM head's weight: wte() when the embeddings are tied, else lm_head.weight (V, C), in the
  // "final" unit with the last norm.
  int lm_head() const { return lm_head_; }
  const BlockTensors& block(int l) const { return blocks_[l]; }

  size_t num_params() const;    // unpadded
  size_t padded_numel() const;  // all units
  size_t state_bytes() const;   // all buffers of all units

 private:
  void add_unit(const std::string& name);
  int add(int unit, const std::string& name, std::vector<int64_t> shape, TensorRole role,
          int split_dim = -1, int split_parts = 1, std::vector<int64_t> part_rows = {});
  float* field(int t, ParamField f) const;
  Runtime* runtime_;
  ModelConfig model_;
  Precision precision_;
  bool decay_norms_and_biases_;
  TpShard tp_;
  PpStage pp_;
  std::vector<bool> held_;  // per unit: holds()
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  std::vector<BlockTensors> blocks_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
};

template <typename T>
T* ParamStore::work(int t) {
  KILN_CHECK(dtype_of<T>() == work_dtype(), "ParamStore::work with the wrong dtype");
  ParamUnit& u = units_[tensors_[t].unit];
  if constexpr (std::is_same_v<T, float>) {
    return u.master.data() + tensors_[t].offset;
  } else {
    return reinterpret_cast<T*>(u.lp.data()) + tensors_[t].offset;
  }
}

// Copies between a whole tensor (global_shape, host memory) and rank `shard`'s slice of it.
void copy_to_shard(const ParamTensor& t, TpShard shard, const float* whole, float* slice);
void copy_from_shard(const ParamTensor& t, TpShard shard, const float* slice, float* whole);
// The contiguous runs of a TP slice in its whole tensor, in order: fn(whole_offset, slice_offset,
// count) (one run when the tensor is replicated or tp is 1).
void for_each_slice_run(const ParamTensor& t, TpShard shard,
                        const std::function<void(size_t, size_t, size_t)>& fn);

}  // namespace kiln::engine
