// Internal to engine/infer/: the two pieces of the inference forward that are not operators of
// the kernel API (kernels/ops.h), per backend, selected by InferKernels<K> (gpt_infer_impl.h).
//   cached_attention  query rows against the KV cache: out (n, NH hs) for the queries of cache
//                     rows p0 .. p0 + n - 1, query i attending to rows 0 .. p0 + i (causal). rows
//                     is the layer's cache (seq_len, (NH + 2 NKV) hs) of fused q|k|v rows; query
//                     head h reads key/value head h / (NH / NKV). Per head: scores q.k * (1 /
//                     sqrt(hs)) (the scale on q's elements, as the attention operators), max,
//                     exp, sum, then the weighted sum of values divided by the sum. scores:
//                     scratch in the same memory, n * NH * (p0 + n) floats.
//   rope_rows         RoPE at positions p0 .. p0 + n - 1 of n fused rows (gpt_infer.h).
// The CPU versions are host loops (gpt_infer.cc); the CUDA versions (infer_kernels.cu) are the
// same arithmetic, one thread block per (query row, head), on the CUDA backend's current stream,
// compiled only into libkiln_cuda.so.
#pragma once

namespace kiln::engine::infer {

void cached_attention_cpu(float* out, const float* rows, float* scores, int p0, int n, int NH,
                          int NKV, int hs);

void cached_attention_cuda(float* out, const float* rows, float* scores, int p0, int n, int NH,
                           int NKV, int hs);
void rope_rows_cuda(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs);

}  // namespace kiln::engine::infer
