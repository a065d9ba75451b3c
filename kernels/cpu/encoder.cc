// Token + position embedding, forward and deterministic backward, and its vocabulary-parallel
// form (a rank's rows of the embedding).
#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using detail::parallel_chunks;

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const int32_t* doc_start, const Same<T>* wte,
                     const Same<T>* wpe, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  parallel_chunks(rows, 64, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const int t = static_cast<int>(r % T_) - (doc_start ? doc_start[r] : 0);
      int32_t tok = tokens[r];
      KILN_CHECK(tok >= 0, "encoder_forward: negative token id");
      KILN_CHECK(t >= 0, "encoder_forward: a document start after its token");
      const T* a = wte + static_cast<size_t>(tok) * C;
      T* o = out + r * C;
      if (!wpe) {  // no position table (rotary models): the token embedding itself
        std::copy(a, a + C, o);
        continue;
      }
      const T* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = from_float<T>(to_float(a[c]) + to_float(p[c]));
    }
  });
}

template <typename T>
void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens,
                      const int32_t* doc_start, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  // dwte: each task owns a slice of channels and walks all positions in order, so every sum has
  // the same order whatever the thread count, and there are no races between tokens that repeat.
  if (dwte != nullptr) {
    const size_t kCols = 64;
    parallel_chunks(static_cast<size_t>(C), kCols, [&](size_t cb, size_t ce) {
      for (size_t r = 0; r < rows; ++r) {
        float* g = dwte + static_cast<size_t>(tokens[r]) * C;
        const T* d = dout + r * C;
        for (size_t c = cb; c < ce; ++c) g[c] += to_float(d[c]);
      }
    });
  }
  if (dwpe != nullptr && doc_start != nullptr) {
    // Positions restart at document starts, so a position's rows are scattered: as dwte, each
    // task owns a slice of channels and walks the rows in order.
    const size_t kCols = 64;
    parallel_chunks(static_cast<size_t>(C), kCols, [&](size_t cb, size_t ce) {
      for (size_t r = 0; r < rows; ++r) {
        const size_t t = r % static_cast<size_t>(T_) - static_cast<size_t>(doc_start[r]);
        float* g = dwpe + t * C;
        const T* d = dout + r * C;
        for (size_t c = cb; c < ce; ++c) g[c] += to_float(d[c]);
      }
    });
  } else if (dwpe != nullptr) {
    parallel_chunks(static_cast<size_t>(T_), 8, [&](size_t tb, size_t te) {
      for (size_t t = tb; t < te; ++t) {
        float* g = dwpe + t * C;
        for (int b = 0; b < B; ++b) {
          const T* d = dout + (static_cast<size_t>(b) * T_ + t) * C;
          for (int c = 0; c < C; ++c) g[c] += to_float(d[c]);
        }
      }
    });
  }
}

template <typename T>
void tp_embedding_forward(float* out, const int32_t* tokens, const int32_t* doc_start,
                          const T* wte_local, const T* wpe, int B, int T_, int C, int v0,
                          int V_local) {
  const size_t rows = static_cast<size_t>(B) * T_, cols = static_cast<size_t>(C);
  parallel_chunks(rows, 64, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const int32_t tok = tokens[r];
      KILN_CHECK(tok >= 0, "tp_embedding_forward: negative token id");
      float* o = out + r * cols;
      if (tok >= v0 && tok - v0 < V_local) {
        const T* a = wte_local + static_cast<size_t>(tok - v0) * cols;
        for (size_t c = 0; c < cols; ++c) o[c] = to_float(a[c]);
      } else {
        for (size_t c = 0; c < cols; ++c) o[c] = 0.0f;
      }
      if (wpe) {
        const size_t t = r % static_cast<size_t>(T_) - (doc_start ? doc_start[r] : 0);
        const T* p = wpe + t * cols;
        for (size_t c = 0; c < cols; ++c) o[c] += to_float(p[c]);
      }
    }
  });
}

template <typename T>
void tp_embedding_backward_wte(float* dwte_local, const T* dout, const int32_t* tokens, int B,
                               int T_, int C, int v0, int V_local) {
  const size_t rows = static_cast<size_t>(B) * T_;
  // As encoder_backward: each task owns a slice of channels and walks the rows in order.
  parallel_chunks(static_cast<size_t>(C), 64, [&](size_t cb, size_t ce) {
    for (size_t r = 0; r < rows; ++r) {
      const int32_t tok = tokens[r];
      if (tok < v0 || tok - v0 >= V_local) continue;
      float* g = dwte_local + static_cast<size_t>(tok - v0) * C;
      const T* d = dout + r * C;
      for (size_t c = cb; c < ce; ++c) g[c] += to_float(d[c]);
    }
  });
}

#define KILN_INSTANTIATE(T)                                                                        \
  template void encoder_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int,    \
                                   int, int);                                                      \
  template void encoder_backward<T>(float*, float*, const T*, const int32_t*, const int32_t*, int, \
                                    int, int);                                                     \
  template void tp_embedding_forward<T>(float*, const int32_t*, const int32_t*, const T*,          \
                                        const T*, int, int, int, int, int);                        \
  template void tp_embedding_backward_wte<T>(float*, const T*, const int32_t*, int, int, int, int, \
                                             int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
