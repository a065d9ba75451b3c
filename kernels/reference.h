// Slow, obvious reference implementations of the operators in kernels/ops.h, for tests.
//
// Same names, argument order and semantics as kiln::cpu (backward ops accumulate with +=), but
// templated on one real type R used for storage and arithmetic: instantiate with double for
// finite-difference gradient checks and as the ground truth the fast kernels are compared to.
// Single-threaded, naive loops, no blocking, the textbook formulas. Attention materialises the
// full (T,T) probability matrix; backward recomputes it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace kiln::ref {

template <typename R>
void encoder_forward(R* out, const int32_t* tokens, const int32_t* doc_start, const R* wte,
                     const R* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const R* a = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      const int pos = t - (doc_start ? doc_start[b * T + t] : 0);
      const R* p = wpe + static_cast<size_t>(pos) * C;
      R* o = out + (static_cast<size_t>(b) * T + t) * C;
      for (int c = 0; c < C; ++c) o[c] = a[c] + p[c];
    }
}

template <typename R>
void encoder_backward(R* dwte, R* dwpe, const R* dout, const int32_t* tokens,
                      const int32_t* doc_start, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const R* d = dout + (static_cast<size_t>(b) * T + t) * C;
      const int pos = t - (doc_start ? doc_start[b * T + t] : 0);
      for (int c = 0; c < C; ++c) {
        if (dwte) dwte[static_cast<size_t>(tokens[b * T + t]) * C + c] += d[c];
        if (dwpe) dwpe[static_cast<size_t>(pos) * C + c] += d[c];
      }
    }
}

template <typename R>
void layernorm_forward(R* out, R* mean, R* rstd, const R* inp, const R* weight, const R* bias,
                       int B, int T, int C) {
  const R eps = static_cast<R>(1e-5);
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r) {
    const R* x = inp + r * C;
    R m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    R v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    R s = 1 / std::sqrt(v + eps);
    for (int c = 0; c < C; ++c) out[r * C + c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = s;
  }
}

template <typename R>
void layernorm_backward(R* dinp, R* dweight, R* dbias, const R* dout, const R* inp,
                        const R* weight, const R* mean, const R* rstd, int B, int T, int C) {
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r) {
    const R* x = inp + r * C;
    const R* dy = dout + r * C;
    R dnorm_mean = 0, dnorm_xhat_mean = 0;
    for (int c = 0; c < C; ++c) {
      R xhat = (x[c] - mean[r]) * rstd[r];
      R dnorm = dy[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_xhat_mean /= C;
    for (int c = 0; c < C; ++c) {
      R xhat = (x[c] - mean[r]) * rstd[r];
      R dnorm = dy[c] * weight[c];
      if (dweight) dweight[c] += dy[c] * xhat;
      if (dbias) dbias[c] += dy[c];
      if (dinp) dinp[r * C + c] += (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * rstd[r];
    }
  }
}

template <typename R>
void matmul_forward(R* out, const R* inp, const R* weight, const R* bias, int B, int T, int C,
                    int OC) {
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r)
    for (int o = 0; o < OC; ++o) {
      R acc = bias ? bias[o] : 0;
      for (int c = 0; c < C; ++c) acc += inp[r * C + c] * weight[static_cast<size_t>(o) * C + c];
      out[r * OC + o] = acc;
    }
}

template <typename R>
void matmul_backward(R* dinp, R* dweight, R* dbias, const R* dout, const R* inp, const R* weight,
                     int B, int T, int C, int OC) {
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r)
    for (int o = 0; o < OC; ++o) {
      const R d = dout[r * OC + o];
      if (dbias) dbias[o] += d;
      for (int c = 0; c < C; ++c) {
        if (dinp) dinp[r * C + c] += d * weight[static_cast<size_t>(o) * C + c];
        if (dweight) dweight[static_cast<size_t>(o) * C + c] += d * inp[r * C + c];
      }
    }
}

// Naive causal attention; lse (B,NH,T) nullable.
template <typename R>
void attention_forward(R* out, R* lse, const R* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const R scale = 1 / std::sqrt(static_cast<R>(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
  std::vector<R> p(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const R* q = qkv + (static_cast<size_t>(b) * T + i) * C3 + h * hs;
        R mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * C3 + C + h * hs;
          R s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        R sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        R* o = out + (static_cast<size_t>(b) * T + i) * C + h * hs;
        for (int d = 0; d < hs; ++d) o[d] = 0;
        for (int j = 0; j <= i; ++j) {
          const R* v = qkv + (static_cast<size_t>(b) * T + j) * C3 + 2 * C + h * hs;
          const R w = std::exp(p[j] - mx) / sum;
          for (int d = 0; d < hs; ++d) o[d] += w * v[d];
        }
        if (lse) lse[(static_cast<size_t>(b) * NH + h) * T + i] = mx + std::log(sum);
      }
}

// Naive attention backward through the explicit softmax (recomputes the probabilities).
template <typename R>
void attention_backward(R* dqkv, const R* dout, const R* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const R scale = 1 / std::sqrt(static_cast<R>(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
  std::vector<R> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const R* q = qkv + (static_cast<size_t>(b) * T + i) * C3 + h * hs;
        R* dq = dqkv + (static_cast<size_t>(b) * T + i) * C3 + h * hs;
        const R* dO = dout + (static_cast<size_t>(b) * T + i) * C + h * hs;
        R mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * C3 + C + h * hs;
          R s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        R sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        for (int j = 0; j <= i; ++j) p[j] = std::exp(p[j] - mx) / sum;
        // out_i = sum_j p_j v_j  ->  dv_j += p_j dO ; dp_j = dO . v_j
        for (int j = 0; j <= i; ++j) {
          const R* v = qkv + (static_cast<size_t>(b) * T + j) * C3 + 2 * C + h * hs;
          R* dv = dqkv + (static_cast<size_t>(b) * T + j) * C3 + 2 * C + h * hs;
          R s = 0;
          for (int d = 0; d < hs; ++d) {
            dv[d] += p[j] * dO[d];
            s += dO[d] * v[d];
          }
          dp[j] = s;
        }
        // softmax backward: ds_j = p_j (dp_j - sum_k p_k dp_k)
        R pdp = 0;
        for (int j = 0; j <= i; ++j) pdp += p[j] * dp[j];
        for (int j = 0; j <= i; ++j) {
          const R ds = p[j] * (dp[j] - pdp) * scale;
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * C3 + C + h * hs;
          R* dk = dqkv + (static_cast<size_t>(b) * T + j) * C3 + C + h * hs;
          for (int d = 0; d < hs; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
}

// Naive grouped-query attention with an optional document mask (kernels/operators.inc
// attention_gqa_forward): query t of row b sees keys doc_start[b,t] .. t.
template <typename R>
void attention_gqa_forward(R* out, R* lse, const R* qkv, const int32_t* doc_start, int B, int T,
                           int NH, int NKV, int hs) {
  const R scale = 1 / std::sqrt(static_cast<R>(hs));
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs, OC = static_cast<size_t>(NH) * hs;
  std::vector<R> p(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const int g = h / (NH / NKV);
        const int j0 = doc_start ? doc_start[b * T + i] : 0;
        const R* q = qkv + (static_cast<size_t>(b) * T + i) * W + h * hs;
        R mx = -INFINITY;
        for (int j = j0; j <= i; ++j) {
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * W + (NH + g) * hs;
          R s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        R sum = 0;
        for (int j = j0; j <= i; ++j) sum += std::exp(p[j] - mx);
        R* o = out + (static_cast<size_t>(b) * T + i) * OC + h * hs;
        for (int d = 0; d < hs; ++d) o[d] = 0;
        for (int j = j0; j <= i; ++j) {
          const R* v = qkv + (static_cast<size_t>(b) * T + j) * W + (NH + NKV + g) * hs;
          const R w = std::exp(p[j] - mx) / sum;
          for (int d = 0; d < hs; ++d) o[d] += w * v[d];
        }
        if (lse) lse[(static_cast<size_t>(b) * NH + h) * T + i] = mx + std::log(sum);
      }
}

template <typename R>
void attention_gqa_backward(R* dqkv, const R* dout, const R* qkv, const int32_t* doc_start, int B,
                            int T, int NH, int NKV, int hs) {
  const R scale = 1 / std::sqrt(static_cast<R>(hs));
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs, OC = static_cast<size_t>(NH) * hs;
  std::vector<R> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const int g = h / (NH / NKV);
        const int j0 = doc_start ? doc_start[b * T + i] : 0;
        const size_t ko = static_cast<size_t>(NH + g) * hs,
                     vo = static_cast<size_t>(NH + NKV + g) * hs;
        const R* q = qkv + (static_cast<size_t>(b) * T + i) * W + h * hs;
        R* dq = dqkv + (static_cast<size_t>(b) * T + i) * W + h * hs;
        const R* dO = dout + (static_cast<size_t>(b) * T + i) * OC + h * hs;
        R mx = -INFINITY;
        for (int j = j0; j <= i; ++j) {
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * W + ko;
          R s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        R sum = 0;
        for (int j = j0; j <= i; ++j) sum += std::exp(p[j] - mx);
        for (int j = j0; j <= i; ++j) p[j] = std::exp(p[j] - mx) / sum;
        R pdp = 0;
        for (int j = j0; j <= i; ++j) {
          const R* v = qkv + (static_cast<size_t>(b) * T + j) * W + vo;
          R* dv = dqkv + (static_cast<size_t>(b) * T + j) * W + vo;
          R s = 0;
          for (int d = 0; d < hs; ++d) {
            dv[d] += p[j] * dO[d];
            s += dO[d] * v[d];
          }
          dp[j] = s;
          pdp += p[j] * s;
        }
        for (int j = j0; j <= i; ++j) {
          const R ds = p[j] * (dp[j] - pdp) * scale;
          const R* k = qkv + (static_cast<size_t>(b) * T + j) * W + ko;
          R* dk = dqkv + (static_cast<size_t>(b) * T + j) * W + ko;
          for (int d = 0; d < hs; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
}

// RoPE, rotate-half layout, in place on the q and k heads (inverse: the backward).
template <typename R>
void rope_apply(R* qkv, const int32_t* doc_start, double theta, int B, int T, int NH, int NKV,
                int hs, bool inverse) {
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs;
  const int half = hs / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int pos = t - (doc_start ? doc_start[b * T + t] : 0);
      for (int h = 0; h < NH + NKV; ++h) {
        R* x = qkv + (static_cast<size_t>(b) * T + t) * W + static_cast<size_t>(h) * hs;
        for (int i = 0; i < half; ++i) {
          const double a = pos * std::pow(theta, -2.0 * i / hs);
          const R c = static_cast<R>(std::cos(a)),
                  s = static_cast<R>(inverse ? -std::sin(a) : std::sin(a));
          const R x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c - x2 * s;
          x[i + half] = x2 * c + x1 * s;
        }
      }
    }
}
template <typename R>
void rope_forward(R* qkv, const int32_t* doc_start, double theta, int B, int T, int NH, int NKV,
                  int hs) {
  rope_apply(qkv, doc_start, theta, B, T, NH, NKV, hs, false);
}
template <typename R>
void rope_backward(R* dqkv, const int32_t* doc_start, double theta, int B, int T, int NH, int NKV,
                   int hs) {
  rope_apply(dqkv, doc_start, theta, B, T, NH, NKV, hs, true);
}

template <typename R>
void rmsnorm_forward(R* out, R* rstd, const R* inp, const R* weight, double eps, int B, int T,
                     int C) {
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r) {
    const R* x = inp + r * C;
    R ms = 0;
    for (int c = 0; c < C; ++c) ms += x[c] * x[c];
    const R s = 1 / std::sqrt(ms / C + static_cast<R>(eps));
    for (int c = 0; c < C; ++c) out[r * C + c] = x[c] * s * weight[c];
    if (rstd) rstd[r] = s;
  }
}

template <typename R>
void rmsnorm_backward(R* dinp, R* dweight, const R* dout, const R* inp, const R* weight,
                      const R* rstd, int B, int T, int C) {
  for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r) {
    const R* x = inp + r * C;
    const R* dy = dout + r * C;
    R dot = 0;  // sum_c dy_c w_c x_c
    for (int c = 0; c < C; ++c) dot += dy[c] * weight[c] * x[c];
    const R s = rstd[r];
    for (int c = 0; c < C; ++c) {
      if (dweight) dweight[c] += dy[c] * x[c] * s;
      if (dinp) dinp[r * C + c] += s * dy[c] * weight[c] - s * s * s * x[c] * dot / C;
    }
  }
}

template <typename R>
void swiglu_forward(R* out, const R* inp, size_t rows, int F) {
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < F; ++c) {
      const R g = inp[r * 2 * F + c], u = inp[r * 2 * F + F + c];
      out[r * F + c] = g / (1 + std::exp(-g)) * u;
    }
}

template <typename R>
void swiglu_backward(R* dinp, const R* inp, const R* dout, size_t rows, int F) {
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < F; ++c) {
      const R g = inp[r * 2 * F + c], u = inp[r * 2 * F + F + c];
      const R sig = 1 / (1 + std::exp(-g));
      dinp[r * 2 * F + c] += dout[r * F + c] * u * (sig + g * sig * (1 - sig));
      dinp[r * 2 * F + F + c] += dout[r * F + c] * g * sig;
    }
}

template <typename R>
R gelu(R x) {
  const R k = std::sqrt(static_cast<R>(2) / static_cast<R>(M_PI));
  return static_cast<R>(0.5) * x * (1 + std::tanh(k * (x + static_cast<R>(0.044715) * x * x * x)));
}

template <typename R>
void gelu_forward(R* out, const R* inp, size_t N) {
  for (size_t i = 0; i < N; ++i) out[i] = gelu(inp[i]);
}

template <typename R>
void gelu_backward(R* dinp, const R* inp, const R* dout, size_t N) {
  const R k = std::sqrt(static_cast<R>(2) / static_cast<R>(M_PI));
  const R a = static_cast<R>(0.044715);
  for (size_t i = 0; i < N; ++i) {
    const R x = inp[i];
    const R t = std::tanh(k * (x + a * x * x * x));
    const R grad = static_cast<R>(0.5) * (1 + t) +
                   static_cast<R>(0.5) * x * (1 - t * t) * k * (1 + 3 * a * x * x);
    dinp[i] += grad * dout[i];
  }
}

template <typename R>
void residual_forward(R* out, const R* inp1, const R* inp2, size_t N) {
  for (size_t i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

template <typename R>
void residual_backward(R* dinp1, R* dinp2, const R* dout, size_t N) {
  for (size_t i = 0; i < N; ++i) {
    if (dinp1) dinp1[i] += dout[i];
    if (dinp2) dinp2[i] += dout[i];
  }
}

template <typename R>
void crossentropy_forward_backward(R* dlogits, R* losses, const R* logits, const int32_t* targets,
                                   R dloss, int BT, int V, int Vp) {
  for (int r = 0; r < BT; ++r) {
    const R* x = logits + static_cast<size_t>(r) * Vp;
    R* g = dlogits ? dlogits + static_cast<size_t>(r) * Vp : nullptr;
    if (targets[r] < 0) {
      losses[r] = 0;
      if (g)
        for (int c = 0; c < Vp; ++c) g[c] = 0;
      continue;
    }
    R mx = -INFINITY;
    for (int c = 0; c < V; ++c) mx = std::max(mx, x[c]);
    R sum = 0;
    for (int c = 0; c < V; ++c) sum += std::exp(x[c] - mx);
    losses[r] = std::log(sum) + mx - x[targets[r]];
    if (g) {
      for (int c = 0; c < V; ++c)
        g[c] = dloss * (std::exp(x[c] - mx) / sum - (c == targets[r] ? 1 : 0));
      for (int c = V; c < Vp; ++c) g[c] = 0;
    }
  }
}

// AdamW in R arithmetic (the textbook form; see AdamWParams).
template <typename R>
void adamw_update(R* params, R* m, R* v, const R* grads, size_t n, const AdamWParams& hp) {
  const R bc1 = 1 - std::pow(static_cast<R>(hp.beta1), static_cast<R>(hp.step));
  const R bc2 = 1 - std::pow(static_cast<R>(hp.beta2), static_cast<R>(hp.step));
  for (size_t i = 0; i < n; ++i) {
    const R g = grads[i] * static_cast<R>(hp.grad_scale);
    m[i] = static_cast<R>(hp.beta1) * m[i] + (1 - static_cast<R>(hp.beta1)) * g;
    v[i] = static_cast<R>(hp.beta2) * v[i] + (1 - static_cast<R>(hp.beta2)) * g * g;
    const R mhat = m[i] / bc1;
    const R vhat = v[i] / bc2;
    params[i] -= static_cast<R>(hp.lr) *
                 (mhat / (std::sqrt(vhat) + static_cast<R>(hp.eps)) +
                  static_cast<R>(hp.weight_decay) * params[i]);
  }
}

// Exact value of a bf16 / fp16 bit pattern from its fields (independent of kernels/dtype.h).
inline double bf16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
  double v;
  if (exp == 0xff) v = mant ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -126 - 7);
  else v = std::ldexp(128 + mant, exp - 127 - 7);
  return sign ? -v : v;
}
inline double fp16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = mant ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -14 - 10);
  else v = std::ldexp(1024 + mant, exp - 15 - 10);
  return sign ? -v : v;
}

// Round-to-nearest-even by search over representable values: the non-negative finite values of a
// 16-bit format are monotonic in their bit patterns, so find the neighbours of |x| by binary
// search and pick the nearer (ties: even pattern). Overflow follows IEEE: |x| at or beyond the
// midpoint between the largest finite value and the next power-of-two step rounds to inf.
// NaN input returns the canonical quiet NaN pattern with x's sign (callers compare NaN-ness).
template <double (*Value)(uint16_t)>
uint16_t round_nearest_even(double x, uint16_t max_finite, uint16_t inf_bits, double overflow_at) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | static_cast<uint16_t>(inf_bits | (inf_bits == 0x7f80 ? 0x40 : 0x200));
  double a = std::fabs(x);
  if (a >= overflow_at) return sign | inf_bits;
  uint16_t lo = 0, hi = max_finite;  // find the largest pattern with value <= a
  if (a >= Value(max_finite)) return sign | max_finite;
  while (hi - lo > 1) {
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (Value(mid) <= a) lo = mid;
    else hi = mid;
  }
  // Value(lo) <= a < Value(hi), hi = lo + 1
  double dlo = a - Value(lo), dhi = Value(hi) - a;
  uint16_t r = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
  return sign | r;
}
inline uint16_t float_to_bf16_bits(float x) {
  // Largest finite bf16 0x7f7f = (2 - 2^-7) 2^127; overflow at (2 - 2^-8) 2^127.
  return round_nearest_even<bf16_value>(x, 0x7f7f, 0x7f80, std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
}
inline uint16_t float_to_fp16_bits(float x) {
  return round_nearest_even<fp16_value>(x, 0x7bff, 0x7c00, 65520.0);
}

}  // namespace kiln::ref
