// Inference with a trained GPT-2 or Llama: the forward pass with a KV cache (`kiln generate`),
// token log-likelihoods (`kiln eval`), and sampling. Token ids in and out; text is the caller's
// (tools/kiln/cmd_generate.cc, cmd_eval.cc tokenize).
//
// The weights are read once from any source (engine/checkpoint/hf.h ModelWeights: a checkpoint
// of any layout, a consolidated file, a Hugging Face directory) into one fp32 copy in the
// device's memory, one tensor at a time (no optimizer state, no gradients). The forward is one
// template over the kernel backend (engine/infer/gpt_infer_impl.h; kernels/ops.h kiln::CpuBackend
// / kiln::CudaBackend): encoder, layernorm / rmsnorm, matmul, GELU / SwiGLU, residual, attention
// / grouped-query attention, RoPE, cross-entropy, the same operators training runs. Two pieces
// are this file's own, per backend (engine/infer/infer_kernels.h): attention of query rows
// against the cache (query head h reading key/value head h / (NH / NKV), the arithmetic of the
// attention operators' softmax without the blocking) and RoPE at positions after the prompt
// (rope_rows below); prefilling a prompt runs the operators themselves. No document mask. A cached
// forward of tokens one at a time gives the logits of the full forward within fp32 round-off
// (tested: tests/engine/infer/gpt_infer_test.cc), so greedy decoding with the cache equals argmax
// of the full forward at every step.
//
// Devices: cpu (host memory, the CPU kernels on the process's oneTBB threads) and cuda (device
// memory, the CUDA kernels; the CUDA instantiation lives in the module libkiln_cuda.so,
// engine/infer/gpt_infer_cuda.cc, loaded on first use). Logits come back to the host each step
// (V floats) for sampling there. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint/hf.h"
#include "engine/device/runtime.h"

namespace kiln::engine {

// RoPE (rotate-half) of the q and k heads of n rows of a fused qkv ((NH + 2 NKV) hs wide, host
// memory) at positions p0 .. p0 + n - 1: the arithmetic of the rope_forward operator
// (kernels/ops.h; angles in fp64 from theta as a float, rounded to fp32), which takes positions
// from a document-start layout (pos = t - doc_start[b,t], 0 <= doc_start <= t) and so cannot be
// told a cache position. Used for tokens after the prompt; tested equal to the operator at the
// same positions. (The CUDA twin: engine/infer/infer_kernels.h.)
void rope_rows(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs);

class GptInference {
 public:
  // Reads every tensor of `w` (w.source) into the memory of `device`. cuda where no GPU is
  // usable (or the build has no CUDA): kUnimplemented naming the key `device` and why.
  static Result<std::unique_ptr<GptInference>> load(ModelWeights& w, Device device = Device::kCpu);
  virtual ~GptInference() = default;
  const ModelConfig& model() const { return m_; }
  virtual Device device() const = 0;

  // The fused q|k|v rows of the positions run so far (per layer, (seq_len, (NH + 2 NKV) hs), q
  // and k rotated for llama), in the device's memory: the keys and values attention reads.
  struct Cache {
    std::vector<DeviceArray<float>> rows;
    int64_t len = 0;
    int64_t capacity = 0;  // positions it holds
  };
  // A cache of `positions` positions (1 .. seq_len; generate() sizes it by the prompt and the
  // tokens asked for, not the model's context: 16M positions of a small model are 12 GiB).
  virtual Cache new_cache(int64_t positions) = 0;
  Cache new_cache() { return new_cache(m_.seq_len); }
  // Runs tokens[0, n) (host) at positions cache->len .. cache->len + n - 1 (at most its
  // capacity), appending their rows; logits (V, host) of the last of them into `logits`.
  virtual void step(const int32_t* tokens, int n, Cache* cache, float* logits) = 0;
  // The full forward of tokens[0, n) (n <= seq_len) without a cache: logits (n, V, host).
  virtual void forward_full(const int32_t* tokens, int n, float* logits) = 0;
  // nll[i] = -log p(tokens[i + 1] | tokens[0..i]) for i in [0, n - 1) (natural log, host), by a
  // full forward (n <= seq_len + 1); the logits are made in chunks of rows.
  virtual void token_nll(const int32_t* tokens, int n, float* nll) = 0;

 protected:
  GptInference() = default;
  ModelConfig m_;
};

// How the next token is chosen from the logits, in Hugging Face's order: repetition penalty
// (CTRL: a seen token's logit divided by it when positive, multiplied when negative), then
// temperature, top-k, top-p (nucleus), then a draw. temperature 0: greedy (argmax; ties to the
// lowest id), the other settings but the penalty then do not matter.
struct SamplingOptions {
  double temperature = 1.0;
  int64_t top_k = 0;   // 0: all
  double top_p = 1.0;  // 1: all
  double repetition_penalty = 1.0;
  uint64_t seed = 0;
};
Status check_sampling(const SamplingOptions& s);  // kUsage naming the flag

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& s);
  // The next token from logits (V values; modified), `history` the ids so far (prompt included).
  int32_t next(float* logits, int64_t V, const std::vector<int32_t>& history);

 private:
  SamplingOptions s_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

struct GenerateOptions {
  int64_t max_tokens = 64;
  SamplingOptions sampling;
  int64_t eos_id = -1;    // stop after it (it is passed to on_token); -1: none
  bool use_cache = true;  // false: a full forward per token (for checking the cache)
};
struct GenerateStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  std::string stop;  // "eos", "max_tokens", "context" (seq_len reached)
};
// The bytes GptInference::load and a generate() of `positions` positions (prompt and new tokens,
// at most seq_len) take on the device: the fp32 weights, the KV cache, the activations and
// logits of a prompt of that length (an estimate, from the same sizes the code allocates).
uint64_t inference_memory_bytes(const ModelConfig& model, int64_t positions);
// kConfig naming `key` (the flag that sets the positions, e.g. --max-tokens) when that estimate
// is over what `device` can have (host: common/host_memory.h; a GPU: its free memory), with the
// figures; ok when nothing can be measured. Before anything large is allocated.
// extra_bytes: more the caller will allocate (kiln generate --logits: the full forward's).
Status check_inference_memory(const ModelConfig& model, int64_t positions, Device device,
                              const std::string& key, uint64_t extra_bytes = 0);

// Generates after `prompt` (non-empty, at most seq_len tokens), calling on_token for each new id
// as it is made.
Status generate(GptInference& model, const std::vector<int32_t>& prompt,
                const GenerateOptions& options, const std::function<void(int32_t)>& on_token,
                GenerateStats* stats = nullptr);

}  // namespace kiln::engine
