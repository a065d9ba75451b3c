#!/usr/bin/python3
"""The PyTorch peer of bench_train_gpu: the same GPT-2 model (tools/bench/train_cpu_torch.py's,
attention through F.scaled_dot_product_attention where PyTorch has it) and the same full training
step (zero grads, forward + backward, clip_grad_norm_, AdamW) on the same batch shape.

  train_gpu_torch.py --mode eager|compile --device cuda|cpu --precision bf16|fp32
                     --vocab V --d-model C --layers L --heads H --seq T --micro-batch B
                     [--steps N] [--warmup N]

bf16 is PyTorch's mixed-precision recipe: fp32 parameters and optimizer, the forward under
torch.autocast(bfloat16) (Kiln keeps fp32 masters and a bf16 working copy: the same arithmetic,
different memory). AdamW is the fused CUDA kernel where PyTorch has one (foreach otherwise).
--mode compile wraps the model in torch.compile (default inductor); its warm-up steps include
the compilation. Prints one JSON line: impl, available (false with a reason when this PyTorch
cannot run the mode: torch.compile needs PyTorch >= 2.0), tokens_per_s, step_ms (median),
device_memory_peak_mib (the driver's used memory at its highest, sampled after each step, as
bench_train_gpu does; null on the CPU), allocated_peak_mib (torch.cuda.max_memory_allocated),
params (the tied embedding counted once), loss_first, loss_last.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_cpu_torch import Gpt, Llama  # noqa: E402  (the CPU benchmark's models: one definition)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--ffn", type=int, default=0)
    ap.add_argument("--doc-len", type=int, default=0, help="llama: documents of this many tokens")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    a = ap.parse_args()
    impl = f"pytorch {a.mode}"
    base = {"impl": impl, "torch": torch.__version__, "device": a.device, "precision": a.precision}

    def unavailable(reason):
        print(json.dumps({**base, "available": False, "reason": reason}))

    if a.device == "cuda" and not torch.cuda.is_available():
        return unavailable("torch.cuda.is_available() is False")
    if a.mode == "compile" and not hasattr(torch, "compile"):
        return unavailable(f"PyTorch {torch.__version__} has no torch.compile (needs >= 2.0)")
    sdpa = hasattr(F, "scaled_dot_product_attention")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    if a.arch == "llama":  # explicit (block-causal) masked softmax: no SDPA
        ffn = a.ffn or (2 * 4 * a.d_model // 3 + 255) // 256 * 256
        model = Llama(a.vocab, a.d_model, a.layers, a.heads, a.kv_heads or a.heads, ffn, a.seq,
                      a.doc_len).to(dev)
        sdpa = False
    else:
        model = Gpt(a.vocab, a.d_model, a.layers, a.heads, a.seq, sdpa=sdpa).to(dev)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt_kw = {"lr": 3e-4, "betas": (0.9, 0.95)}
    fused = False
    if a.device == "cuda":
        try:
            opt = torch.optim.AdamW(groups, fused=True, **opt_kw)
            fused = True
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW(groups, **opt_kw)
    else:
        opt = torch.optim.AdamW(groups, **opt_kw)
    step_model = torch.compile(model) if a.mode == "compile" else model
    B, T = a.micro_batch, a.seq
    cuda = a.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def used_mib():
        if not cuda:
            return None
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20

    gen = torch.Generator().manual_seed(1)
    times, losses, mem_peak = [], [], 0.0
    for s in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (B, T), generator=gen).to(dev)
        tgt = torch.randint(0, a.vocab, (B, T), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16":
            with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
                loss = step_model(idx, tgt)
        else:
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        t1 = time.perf_counter()
        losses.append(float(loss))
        if cuda:
            mem_peak = max(mem_peak, used_mib())
        if s >= a.warmup:
            times.append((t1 - t0) * 1e3)
    step_ms = median(times)
    print(json.dumps({
        **base, "available": True, "sdpa": sdpa, "fused_adamw": fused,
        "micro_batch": B, "seq_len": T, "params": params, "steps": a.steps, "warmup": a.warmup,
        "step_ms": round(step_ms, 3), "step_ms_min": round(min(times), 3),
        "tokens_per_s": round(B * T / (step_ms / 1e3), 1),
        "device_memory_peak_mib": round(mem_peak, 1) if cuda else None,
        "allocated_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}))


if __name__ == "__main__":
    main()
