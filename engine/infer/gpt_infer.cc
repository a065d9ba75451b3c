#include "engine/infer/gpt_infer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "common/cuda_module.h"
#include "common/host_memory.h"
#include "common/text.h"
#include "engine/infer/gpt_infer_impl.h"
#include "kernels/ops.h"

namespace kiln::engine {

Result<std::unique_ptr<GptInference>> GptInference::load(ModelWeights& w, Device device) {
  KILN_ASSIGN_OR_RETURN(Runtime * rt, runtime_for(device));
  if (device == Device::kCpu) return detail::GptInferenceOn<CpuBackend>::load(w, rt);
  // The CUDA instantiation is in the module (gpt_infer_cuda.cc), loaded by runtime_for.
  auto load = cuda_module_symbol(CudaModule::kCuda, "kiln_cuda_load_inference");
  if (!load.is_ok()) return cuda_unusable(load.status().message());
  using LoadFn = Result<std::unique_ptr<GptInference>> (*)(ModelWeights*, Runtime*);
  return reinterpret_cast<LoadFn>(*load)(&w, rt);
}

void rope_rows(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs) {
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs;
  const int half = hs / 2;
  // The operator takes theta as a float.
  const double th = static_cast<double>(static_cast<float>(theta));
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int r = 0; r < n; ++r) {
    const int pos = p0 + r;
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * std::pow(th, -2.0 * i / hs);
      cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(i)] = static_cast<float>(std::sin(a));
    }
    for (int h = 0; h < NH + NKV; ++h) {
      float* x = qkv + static_cast<size_t>(r) * W + static_cast<size_t>(h) * hs;
      for (int i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[static_cast<size_t>(i)] - b * sn[static_cast<size_t>(i)];
        x[i + half] = b * cs[static_cast<size_t>(i)] + a * sn[static_cast<size_t>(i)];
      }
    }
  }
}

namespace infer {

void cached_attention_cpu(float* out, const float* rows, float* scores, int p0, int n, int NH,
                          int NKV, int hs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs;
  const float* K = rows + static_cast<size_t>(NH) * hs;
  const float* V = rows + static_cast<size_t>(NH + NKV) * hs;
  for (int i = 0; i < n; ++i) {
    const int last = p0 + i;
    const float* q = rows + static_cast<size_t>(last) * W;
    for (int h = 0; h < NH; ++h) {
      const size_t g = static_cast<size_t>(h / (NH / NKV)) * hs;
      const float* qh = q + static_cast<size_t>(h) * hs;
      float* s = scores + (static_cast<size_t>(i) * NH + h) * static_cast<size_t>(p0 + n);
      float mx = -HUGE_VALF;
      for (int j = 0; j <= last; ++j) {
        const float* kj = K + static_cast<size_t>(j) * W + g;
        float d = 0.0f;
        for (int e = 0; e < hs; ++e) d += qh[e] * scale * kj[e];
        s[j] = d;
        mx = std::max(mx, d);
      }
      float sum = 0.0f;
      for (int j = 0; j <= last; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      float* o = out + (static_cast<size_t>(i) * NH + h) * hs;
      std::fill(o, o + hs, 0.0f);
      for (int j = 0; j <= last; ++j) {
        const float* vj = V + static_cast<size_t>(j) * W + g;
        for (int e = 0; e < hs; ++e) o[e] += s[j] * vj[e];
      }
      const float inv = 1.0f / sum;
      for (int e = 0; e < hs; ++e) o[e] *= inv;
    }
  }
}

}  // namespace infer

// ---- memory ----------------------------------------------------------------------------------

uint64_t inference_memory_bytes(const ModelConfig& m, int64_t positions) {
  // (ModelConfig is within check_model_shape's bounds: these products stay far below 2^64)
  const uint64_t P = static_cast<uint64_t>(std::max<int64_t>(1, positions));
  const uint64_t C = static_cast<uint64_t>(m.d_model), V = static_cast<uint64_t>(m.vocab_size);
  const uint64_t QKV = static_cast<uint64_t>(m.qkv_width()), F = static_cast<uint64_t>(m.ffn());
  const uint64_t FC = m.llama() ? 2 * F : F, NH = static_cast<uint64_t>(m.n_heads);
  const uint64_t L = static_cast<uint64_t>(m.n_layers);
  const uint64_t weights =
      (V * C * (m.tie_embeddings ? 1 : 2) + (m.llama() ? 0 : static_cast<uint64_t>(m.seq_len) * C) +
       L * (C * QKV + C * C + C * FC + F * C + 4 * C + QKV + FC) + 2 * C) *
      4;
  const uint64_t cache = L * P * QKV * 4;
  // hidden()'s buffers for P rows (x, x2, ln, att, proj, h; qkv, fc, act, lse) and the scores of
  // a cached step; the logits (one row per step; eval's chunks are 8 MiB).
  const uint64_t acts = P * (6 * C + QKV + FC + F + NH) * 4 + NH * P * 4 * 2;
  const uint64_t logits = std::max<uint64_t>(V * 4, uint64_t{8} << 20) + V * 4;
  return weights + cache + acts + logits;
}

Status check_inference_memory(const ModelConfig& m, int64_t positions, Device device,
                              const std::string& key, uint64_t extra_bytes) {
  KILN_ASSIGN_OR_RETURN(Runtime * rt, runtime_for(device));
  uint64_t have = 0;
  std::string source;
  const DeviceMemory dm = rt->memory();
  if (dm.total > 0) {
    have = dm.total > dm.used_by_process ? dm.total - dm.used_by_process : 0;
    source = "free memory of " + rt->describe();
  } else {
    const HostMemory host = host_memory();
    if (!host.known) return Status::ok();
    have = host.available;
    source = host.source;
  }
  const uint64_t need = inference_memory_bytes(m, positions) + extra_bytes;
  if (need <= have) return Status::ok();
  return Status::config(
             fmt::format("{} positions of this model (d_model {}, {} layers, vocabulary {}) "
                         "need about {} (weights, KV cache, activations), but {} has {}: "
                         "fewer positions, or a smaller model",
                         positions, m.d_model, m.n_layers, m.vocab_size, human_bytes(need), source,
                         human_bytes(have)))
      .with_key(key);
}

// ---- sampling ---------------------------------------------------------------------------------

Status check_sampling(const SamplingOptions& s) {
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature)) {
    return Status::usage("--temperature must be >= 0");
  }
  if (s.top_k < 0) return Status::usage("--top-k must be >= 0 (0: all tokens)");
  if (!(s.top_p > 0 && s.top_p <= 1)) return Status::usage("--top-p must be in (0, 1]");
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty)) {
    return Status::usage("--repetition-penalty must be > 0");
  }
  return Status::ok();
}

Sampler::Sampler(const SamplingOptions& s) : s_(s), rng_(s.seed) {}

int32_t Sampler::next(float* logits, int64_t V, const std::vector<int32_t>& history) {
  if (s_.repetition_penalty != 1.0) {
    std::vector<bool> seen(static_cast<size_t>(V), false);
    for (int32_t id : history) {
      if (id < 0 || id >= V || seen[static_cast<size_t>(id)]) continue;
      seen[static_cast<size_t>(id)] = true;
      float& x = logits[id];
      x = x > 0 ? static_cast<float>(x / s_.repetition_penalty)
                : static_cast<float>(x * s_.repetition_penalty);
    }
  }
  if (s_.temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  // Candidates by logit, highest first (ties: lower id first).
  order_.resize(static_cast<size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  const size_t k =
      s_.top_k > 0 ? std::min<size_t>(static_cast<size_t>(s_.top_k), order_.size()) : order_.size();
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(),
                    by_logit);
  order_.resize(k);
  probs_.resize(k);
  const double top = logits[order_[0]] / s_.temperature;
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    probs_[i] = std::exp(logits[order_[i]] / s_.temperature - top);
    sum += probs_[i];
  }
  size_t keep = k;
  if (s_.top_p < 1.0) {  // the smallest prefix whose mass reaches top_p (at least one token)
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += probs_[i] / sum;
      if (cum >= s_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += probs_[i];
  }
  // A uniform draw in [0, sum) from 53 random bits (the same sequence on every platform).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (u < cum) return order_[i];
  }
  return order_[keep - 1];
}

Status generate(GptInference& model, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                const std::function<void(int32_t)>& on_token, GenerateStats* stats) {
  KILN_RETURN_IF_ERROR(check_sampling(o.sampling));
  const ModelConfig& m = model.model();
  if (prompt.empty()) return Status::usage("the prompt has no tokens");
  if (static_cast<int64_t>(prompt.size()) > m.seq_len) {
    return Status::usage("the prompt has " + std::to_string(prompt.size()) +
                         " tokens, more than the model's context of " + std::to_string(m.seq_len));
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= m.vocab_size) {
      return Status::usage("token id " + std::to_string(id) + " is outside the vocabulary of " +
                           std::to_string(m.vocab_size));
    }
  }
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  Sampler sampler(o.sampling);
  std::vector<int32_t> ids = prompt;
  std::vector<float> logits(static_cast<size_t>(m.vocab_size));
  std::vector<float> full;
  GptInference::Cache cache;
  // The positions this call can reach: the prompt, then one per new token but the last.
  const int64_t positions = std::min<int64_t>(
      m.seq_len, static_cast<int64_t>(prompt.size()) + std::max<int64_t>(0, o.max_tokens));
  if (o.use_cache) cache = model.new_cache(positions);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  auto forward = [&](bool first) {
    if (o.use_cache) {
      if (first) {
        model.step(ids.data(), static_cast<int>(ids.size()), &cache, logits.data());
      } else {
        model.step(ids.data() + ids.size() - 1, 1, &cache, logits.data());
      }
    } else {
      full.resize(ids.size() * static_cast<size_t>(m.vocab_size));
      model.forward_full(ids.data(), static_cast<int>(ids.size()), full.data());
      std::copy(full.end() - m.vocab_size, full.end(), logits.begin());
    }
  };
  forward(true);
  st.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  st.stop = "max_tokens";
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    if (i > 0) {
      if (static_cast<int64_t>(ids.size()) > m.seq_len) {
        st.stop = "context";
        break;
      }
      forward(false);
    }
    const int32_t next = sampler.next(logits.data(), m.vocab_size, ids);
    ids.push_back(next);
    ++st.new_tokens;
    on_token(next);
    if (o.eos_id >= 0 && next == o.eos_id) {
      st.stop = "eos";
      break;
    }
  }
  st.decode_s = std::chrono::duration<double>(clock::now() - t0).count();
  if (stats) *stats = st;
  return Status::ok();
}

}  // namespace kiln::engine
