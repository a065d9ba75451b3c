#include "engine/infer/gpt_infer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"

namespace kiln::engine {

Result<std::unique_ptr<GptInference>> GptInference::load(ModelWeights& w) {
  std::unique_ptr<GptInference> g(new GptInference());
  g->m_ = w.model;
  const ParamStore& layout = *w.layout;
  g->w_.resize(layout.tensors().size());
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    g->w_[i].resize(layout.tensors()[i].numel);
    KILN_RETURN_IF_ERROR(read_tensor(w, static_cast<int>(i), 0, g->w_[i].size(), g->w_[i].data()));
  }
  for (int l = 0; l < w.model.n_layers; ++l) g->blocks_.push_back(layout.block(l));
  g->wte_ = layout.wte();
  g->wpe_ = layout.wpe();
  g->lnf_w_ = layout.lnf_w();
  g->lnf_b_ = layout.lnf_b();
  g->head_ = layout.lm_head();
  return g;
}

GptInference::Cache GptInference::new_cache() const {
  Cache c;
  const size_t per = static_cast<size_t>(m_.seq_len * m_.kv_heads() * m_.head_dim());
  c.k.assign(static_cast<size_t>(m_.n_layers), std::vector<float>(per));
  c.v.assign(static_cast<size_t>(m_.n_layers), std::vector<float>(per));
  return c;
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

namespace {

// out (NH hs) = softmax(q k_j^T / sqrt(hs) for j <= last) v per head: one query against the
// cached keys and values of positions [0, last] (rows of NKV hs; query head h reads key/value
// head h / (NH / NKV)).
void cached_attention(float* out, const float* q, const float* K, const float* V, int last, int NH,
                      int NKV, int hs, std::vector<float>* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t KW = static_cast<size_t>(NKV) * hs;
  scores->resize(static_cast<size_t>(last) + 1);
  float* s = scores->data();
  for (int h = 0; h < NH; ++h) {
    const size_t g = static_cast<size_t>(h / (NH / NKV)) * hs;
    const float* qh = q + static_cast<size_t>(h) * hs;
    float mx = -HUGE_VALF;
    for (int j = 0; j <= last; ++j) {
      const float* kj = K + static_cast<size_t>(j) * KW + g;
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
    float* o = out + static_cast<size_t>(h) * hs;
    std::fill(o, o + hs, 0.0f);
    for (int j = 0; j <= last; ++j) {
      const float* vj = V + static_cast<size_t>(j) * KW + g;
      for (int e = 0; e < hs; ++e) o[e] += s[j] * vj[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < hs; ++e) o[e] *= inv;
  }
}

}  // namespace

void GptInference::hidden(const int32_t* tokens, int n, Cache* cache, float* out) {
  const int C = static_cast<int>(m_.d_model), NH = static_cast<int>(m_.n_heads);
  const int NKV = static_cast<int>(m_.kv_heads()), hs = static_cast<int>(m_.head_dim());
  const int QKV = static_cast<int>(m_.qkv_width()), KW = NKV * hs;
  const int F = static_cast<int>(m_.ffn()), FC = m_.llama() ? 2 * F : F;
  const bool llama = m_.llama();
  const int p0 = cache ? static_cast<int>(cache->len) : 0;
  KILN_CHECK(n > 0 && p0 + n <= m_.seq_len, "GptInference: positions past seq_len");
  const size_t nc = static_cast<size_t>(n) * C, nn = static_cast<size_t>(n);
  for (auto* b : {&x_, &x2_, &ln_, &att_, &proj_}) b->resize(nc);
  qkv_.resize(nn * QKV);
  fc_.resize(nn * FC);
  gelu_.resize(nn * F);
  lse_.resize(static_cast<size_t>(NH) * n);
  cpu::encoder_forward(x_.data(), tokens, nullptr, t(wte_),
                       llama ? nullptr : t(wpe_) + static_cast<size_t>(p0) * C, 1, n, C);
  const float eps = m_.norm_eps;
  // Norm: LayerNorm (gpt2) or RMSNorm (llama).
  auto norm = [&](float* y, const float* x, int w, int b) {
    if (llama) {
      cpu::rmsnorm_forward(y, nullptr, x, t(w), eps, 1, n, C);
    } else {
      cpu::layernorm_forward(y, nullptr, nullptr, x, t(w), t(b), 1, n, C);
    }
  };
  std::vector<float> scores;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const BlockTensors& b = blocks_[l];
    norm(ln_.data(), x_.data(), b.ln1_w, b.ln1_b);
    cpu::matmul_forward(qkv_.data(), ln_.data(), t(b.qkv_w), tb(b.qkv_b), 1, n, C, QKV);
    if (llama) {  // rotate q and k at their positions before k is cached
      if (p0 == 0) {
        cpu::rope_forward(qkv_.data(), nullptr, static_cast<float>(m_.rope_theta), 1, n, NH, NKV,
                          hs);
      } else {
        rope_rows(qkv_.data(), n, p0, m_.rope_theta, NH, NKV, hs);
      }
    }
    if (cache) {
      for (int i = 0; i < n; ++i) {
        const float* row = qkv_.data() + static_cast<size_t>(i) * QKV;
        const size_t at = static_cast<size_t>(p0 + i) * KW;
        std::copy(row + NH * hs, row + NH * hs + KW, cache->k[l].data() + at);
        std::copy(row + NH * hs + KW, row + NH * hs + 2 * KW, cache->v[l].data() + at);
      }
    }
    if (p0 == 0) {  // the prompt (or a full forward): the training kernel
      if (llama) {
        cpu::attention_gqa_forward(att_.data(), lse_.data(), qkv_.data(), nullptr, 1, n, NH, NKV,
                                   hs);
      } else {
        cpu::attention_forward(att_.data(), lse_.data(), qkv_.data(), 1, n, C, NH);
      }
    } else {
      for (int i = 0; i < n; ++i) {
        cached_attention(att_.data() + static_cast<size_t>(i) * C,
                         qkv_.data() + static_cast<size_t>(i) * QKV, cache->k[l].data(),
                         cache->v[l].data(), p0 + i, NH, NKV, hs, &scores);
      }
    }
    cpu::matmul_forward(proj_.data(), att_.data(), t(b.attn_proj_w), tb(b.attn_proj_b), 1, n, C, C);
    cpu::residual_forward(x2_.data(), x_.data(), proj_.data(), nc);
    norm(ln_.data(), x2_.data(), b.ln2_w, b.ln2_b);
    cpu::matmul_forward(fc_.data(), ln_.data(), t(b.fc_w), tb(b.fc_b), 1, n, C, FC);
    if (llama) {
      cpu::swiglu_forward(gelu_.data(), fc_.data(), nn, F);
    } else {
      cpu::gelu_forward(gelu_.data(), fc_.data(), nn * F);
    }
    cpu::matmul_forward(proj_.data(), gelu_.data(), t(b.fc_proj_w), tb(b.fc_proj_b), 1, n, F, C);
    cpu::residual_forward(x_.data(), x2_.data(), proj_.data(), nc);
  }
  if (cache) cache->len += n;
  norm(out, x_.data(), lnf_w_, lnf_b_);
}

void GptInference::step(const int32_t* tokens, int n, Cache* cache, float* logits) {
  const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
  std::vector<float> h(static_cast<size_t>(n) * C);
  hidden(tokens, n, cache, h.data());
  cpu::matmul_forward(logits, h.data() + static_cast<size_t>(n - 1) * C, t(head_), nullptr, 1, 1, C,
                      V);
}

void GptInference::forward_full(const int32_t* tokens, int n, float* logits) {
  const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
  std::vector<float> h(static_cast<size_t>(n) * C);
  hidden(tokens, n, nullptr, h.data());
  cpu::matmul_forward(logits, h.data(), t(head_), nullptr, 1, n, C, V);
}

void GptInference::token_nll(const int32_t* tokens, int n, float* nll) {
  if (n < 2) return;
  const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
  const int rows = n - 1;
  std::vector<float> h(static_cast<size_t>(rows) * C);
  hidden(tokens, rows, nullptr, h.data());
  // The LM head and the cross-entropy in chunks of rows (about 8 MiB of logits each).
  const int chunk = std::max(1, static_cast<int>((size_t{8} << 20) / (sizeof(float) * V)));
  std::vector<float> logits(static_cast<size_t>(std::min(chunk, rows)) * V);
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int k = std::min(chunk, rows - r0);
    cpu::matmul_forward(logits.data(), h.data() + static_cast<size_t>(r0) * C, t(head_), nullptr, 1,
                        k, C, V);
    cpu::crossentropy_forward_backward<float>(nullptr, nll + r0, logits.data(), tokens + r0 + 1,
                                              1.0f, k, V, V);
  }
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
  if (o.use_cache) cache = model.new_cache();
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
