// Hugging Face model directories, both ways: `kiln checkpoint export --format hf` writes one
// (export_hf) and `model.init_from=DIR`, `kiln generate DIR`, `kiln eval DIR` read one (HfSource).
//
// A directory holds
//   config.json              model_type and the architecture's fields (GPT-2: n_embd, n_layer,
//                            n_head, n_positions, vocab_size, layer_norm_epsilon,
//                            activation_function, ...), torch_dtype, bos/eos ids
//   model.safetensors        the weights under Hugging Face's names, or shards
//                            model-NNNNN-of-NNNNN.safetensors with model.safetensors.index.json
//                            ({"metadata": {"total_size"}, "weight_map": {name: file}}) past a
//                            size limit
//   generation_config.json   bos/eos ids
//   tokenizer files          (engine/checkpoint/hf_tokenizer.h)
//
// Names and layouts come from one table per architecture (kGpt2Names in hf.cc: Kiln's name
// pattern, Hugging Face's, and whether the stored matrix is transposed); a new architecture is a
// new table and its config fields. GPT-2 (transformers' GPT2LMHeadModel): every linear layer is a
// Conv1D whose weight is [in, out], the transpose of Kiln's (out, in); c_attn is Kiln's fused
// qkv (q, k, v blocks of n_embd rows, heads in order inside each); the LM head is tied to wte and
// not stored. GELU is the tanh approximation ("gelu_new"), LayerNorm eps 1e-5. Llama
// (transformers' LlamaForCausalLM, kLlamaNames): (out, in) weights as Kiln's, nothing transposed;
// Kiln's fused attn.qkv is q_proj, k_proj, v_proj stacked by rows (unequal under grouped-query
// attention, already in rotate-half order) and mlp.fc is gate_proj, up_proj (HfPart below).
//
// Export streams: one tensor (or one chunk of a tensor) at a time is read from the checkpoint
// (any layout: CheckpointReader reads the byte ranges of the shard files that hold it) and
// appended to the output file, so host memory holds at most the largest matrix twice, whatever
// the model's size. The output bytes depend only on the weights, dtype and shard limit: a
// checkpoint written by any layout and its consolidated file export the same bytes.
//
// Import reads only what a rank keeps: HfSource is a StateSource (engine/model/params.h) whose
// reads of a unit's elements read only the rows and columns of this rank's tensor-parallel slice
// (and, under ZeRO, only its shard's ranges) from the safetensors files, converting F32, BF16 or
// F16 to fp32. What Kiln's model cannot represent is refused naming the file and the field.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/model.h"
#include "engine/config/precision.h"
#include "engine/model/params.h"

namespace kiln::engine {

// One row of an architecture's name table: '#' stands for the layer index.
struct HfNameRule {
  const char* kiln;
  const char* hf;
  bool transpose;  // Hugging Face stores the matrix transposed ([in, out])
};

// The Hugging Face name of Kiln tensor `kiln_name` (GPT-2), and whether it is stored transposed.
// kNotFound when the table has no rule for it.
Result<std::string> hf_tensor_name(const std::string& kiln_name, bool* transpose);

// One Hugging Face tensor that holds all or part of a Kiln tensor: Kiln's elements
// [first, first + numel) in row-major order (a block of whole rows), stored under `name` with
// `shape` (transposed when `transpose`: GPT-2's Conv1D). GPT-2 maps every tensor to one; Llama
// stores Kiln's fused attn.qkv as q_proj, k_proj, v_proj and mlp.fc as gate_proj, up_proj.
struct HfPart {
  std::string name;
  bool transpose = false;
  size_t first = 0, numel = 0;
  std::vector<int64_t> shape;
};
Result<std::vector<HfPart>> hf_tensor_parts(const ModelConfig& m, const ParamTensor& t);

// What config.json says beside the model's shape.
struct HfModelInfo {
  int64_t bos_id = -1, eos_id = -1;  // -1: none
  std::string torch_dtype;           // "float32", "bfloat16", "float16"
};

// The model shape of a Hugging Face directory's config.json, checked field by field against what
// Kiln's GPT-2 represents (model_type, activation_function, layer_norm_epsilon, n_inner,
// tie_word_embeddings, cross-attention, attention scaling variants) or its Llama (hidden_act,
// head_dim, num_key_value_heads, attention_bias = mlp_bias; rope_scaling, sliding windows, MoE
// fields refused): a kConfig error naming the file and the field otherwise. *info (optional)
// receives the ids and dtype.
Result<ModelConfig> read_hf_config(const std::string& dir, HfModelInfo* info = nullptr);

// True when `path` is a directory holding config.json (a Hugging Face model directory), or
// Meta's original Llama layout (params.json / consolidated.00.pth, no config.json), which
// HfSource::open then refuses (refuse_meta_layout): model.init_from's user gets that message.
bool is_hf_dir(const std::string& path);
// A usage error naming dir/params.json (prefixed with `key` when given) when `dir` is Meta's
// original Llama layout: interleaved RoPE rows, to be converted with transformers'
// convert_llama_weights_to_hf.py first (docs/MODELS.md "Interleaved RoPE"); ok otherwise.
Status refuse_meta_layout(const std::string& dir, const std::string& key);

// A Hugging Face directory opened for reading Kiln model states in ranges (the master weights;
// moments zero). Not thread-safe.
class HfSource final : public StateSource {
 public:
  // Checks config.json against params' model (key: the config key that named the directory,
  // e.g. "model.init_from", named in errors) and every tensor's presence, dtype and shape before
  // anything is read. params must outlive the source.
  static Result<std::unique_ptr<HfSource>> open(const std::string& dir, const ParamStore& params,
                                                const std::string& key);
  ~HfSource() override;
  Status read(int unit, ParamField f, size_t begin, size_t n, float* dst) override;
  bool zero_moments() const override { return true; }
  uint64_t bytes_read() const;

 private:
  HfSource();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Model weights to read from: a checkpoint step directory (any layout), a run directory (its
// latest checkpoint), a consolidated safetensors file, or a Hugging Face directory.
struct ModelWeights {
  ModelConfig model;
  Precision precision = Precision::kFp32;  // the run's (fp32 for files without one)
  std::unique_ptr<ParamStore> layout;      // whole tensors (tp 1), no buffers
  std::unique_ptr<StateSource> source;     // reads layout's units
  std::string kind;                        // "checkpoint", "consolidated", "hf"
  std::string path;                        // what was opened (the step directory for a run)
  int64_t step = -1;                       // -1 when unknown
  std::string tokenizer;                   // a tokenizer file found beside it, or ""
  int64_t eos_id = -1;                     // the tokenizer's / config.json's, -1 unknown
  std::string device;                      // the run's config.yaml `device` ("" when none)
};
Result<ModelWeights> open_model_weights(const std::string& path);

// Reads whole tensor `t` of w.layout (fp32, host) elements [first, first + n) into dst.
Status read_tensor(ModelWeights& w, int t, size_t first, size_t n, float* dst);

struct HfExportOptions {
  std::string output;                            // the directory to write
  std::string dtype = "fp32";                    // fp32 | bf16
  uint64_t max_shard_bytes = uint64_t{5} << 30;  // one file up to this many tensor bytes
  std::string tokenizer;                         // "": the one found beside the checkpoint
  bool overwrite = false;                        // replace an existing non-empty directory
};
struct HfExportReport {
  size_t tensors = 0;
  size_t files = 0;
  uint64_t bytes = 0;
  bool tokenizer = false;
  std::string tokenizer_path;
};
// Writes the Hugging Face directory of the weights at `source` (open_model_weights' forms). The
// directory is built under a temporary name and renamed when complete. `tokenizer` (optional)
// writes the tokenizer files into the directory it is given (kNotFound: there is none; the export
// goes on without them).
using HfTokenizerWriter = std::function<Status(const std::string& dir, const ModelWeights& w)>;
Status export_hf(const std::string& source, const HfExportOptions& options,
                 HfExportReport* report = nullptr, const HfTokenizerWriter& tokenizer = {});

}  // namespace kiln::engine
