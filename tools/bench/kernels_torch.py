#!/usr/bin/python3
"""PyTorch peer for tools/bench/kernels: the same ops at the same shapes, same thread count.

Prints fwd / fwd+bwd milliseconds per op (median) for fp32 and bf16, using what a PyTorch GPT-2
implementation runs on the CPU: nn.Linear, the explicit causal softmax attention
(torch 1.13 has no fused CPU attention), nn.GELU(approximate='tanh'), nn.LayerNorm,
F.cross_entropy, and the same step sum as bench_kernels (4 layers + the LM head in one piece).
usage: kernels_torch.py [--threads 2] [--B 8] [--T 256] [--C 256] [--NH 4] [--V 8192] [--L 4]
                        [--cpu-time 0|1]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for name, default in [("threads", 2), ("B", 8), ("T", 256), ("C", 256), ("NH", 4), ("V", 8192),
                      ("L", 4), ("cpu-time", 0)]:
    ap.add_argument("--" + name, type=int, default=default)
ap.add_argument("--min-seconds", type=float, default=0.3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
clock = time.process_time if a.cpu_time else time.perf_counter
B, T, C, NH, V, L = a.B, a.T, a.C, a.NH, a.V, a.L


def tm(fn):
    fn()
    samples, start = [], time.perf_counter()
    while len(samples) < 5 or time.perf_counter() - start < a.min_seconds:
        t0 = clock()
        fn()
        samples.append(clock() - t0)
        if len(samples) >= 200:
            break
    samples.sort()
    return samples[len(samples) // 2] * 1e3


print(f"pytorch {torch.__version__}: threads={a.threads} B={B} T={T} C={C} NH={NH} V={V} "
      f"layers={L}{' (process CPU time)' if a.cpu_time else ''}")
for dt in (torch.float32, torch.bfloat16):
    print(f"\n[torch {str(dt).replace('torch.', '')}]")
    step = 0.0
    for name, i, o in [("qkv", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C),
                       ("fc_proj", 4 * C, C), ("lm_head", C, V)]:
        lin = torch.nn.Linear(i, o, bias=name != "lm_head").to(dt)
        x = torch.randn(B * T, i, dtype=dt, requires_grad=True)
        g = torch.randn(B * T, o, dtype=dt)

        def fwd_bwd():
            lin(x).backward(g)

        f = tm(lambda: lin(x))
        fb = tm(fwd_bwd)
        step += fb * (1 if name == "lm_head" else L)
        print(f"{name:10s} fwd {f:9.3f} ms   bwd {fb - f:9.3f} ms")
    qkv = torch.randn(B, T, 3 * C, dtype=dt, requires_grad=True)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def attention():
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)

    def attention_fb():
        y = attention()
        y.backward(torch.ones_like(y))

    f, fb = tm(attention), tm(attention_fb)
    step += fb * L
    print(f"{'attention':10s} fwd {f:9.3f} ms   bwd {fb - f:9.3f} ms")
    x = torch.randn(B * T, C, dtype=dt, requires_grad=True)
    ln = torch.nn.LayerNorm(C).to(dt)
    f, fb = tm(lambda: ln(x)), tm(lambda: ln(x).backward(torch.ones_like(x)))
    step += fb * (2 * L + 1)
    print(f"{'layernorm':10s} fwd {f:9.3f} ms   bwd {fb - f:9.3f} ms")
    y = torch.randn(B * T, C, dtype=dt, requires_grad=True)
    f, fb = tm(lambda: x + y), tm(lambda: (x + y).backward(torch.ones_like(x)))
    step += fb * 2 * L
    print(f"{'residual':10s} fwd {f:9.3f} ms   bwd {fb - f:9.3f} ms")
    h = torch.randn(B * T, 4 * C, dtype=dt, requires_grad=True)
    gelu = torch.nn.GELU(approximate="tanh")
    f, fb = tm(lambda: gelu(h)), tm(lambda: gelu(h).backward(torch.ones_like(h)))
    step += fb * L
    print(f"{'gelu':10s} fwd {f:9.3f} ms   bwd {fb - f:9.3f} ms")
    logits = torch.randn(B * T, V, dtype=dt, requires_grad=True)
    targets = torch.randint(0, V, (B * T,))
    # fp32 loss as a GPT trainer computes it under low precision (logits.float()).
    fb = tm(lambda: F.cross_entropy(logits.float(), targets).backward())
    step += fb
    print(f"{'xent':10s} fwd+bwd {fb:9.3f} ms")
    n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    p = torch.nn.Parameter(torch.zeros(n_params))
    p.grad = torch.full((n_params,), 1e-3)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1)
    f = tm(opt.step)
    step += f
    print(f"{'adamw':10s} {f:9.3f} ms ({n_params} fp32 params)")
    print(f"step from these ops: {step:8.1f} ms -> {B * T / step * 1e3:8.0f} tokens/s")
