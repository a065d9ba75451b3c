#!/usr/bin/python3
"""The PyTorch peer of bench_train_cpu: the same GPT-2 model and full training step (forward,
backward, clip_grad_norm_, AdamW) on the CPU with torch.set_num_threads(N).

  train_cpu_torch.py [--precision fp32|bf16] [--threads N] [--steps N] [--warmup N] [sizes...]
                     [--arch gpt2|llama] [--kv-heads N] [--ffn N] [--doc-len N]
  train_cpu_torch.py --show-config     (what PyTorch runs on: version, BLAS, oneDNN, CPU capability)

fp32 runs the model in float32. bf16 runs it under torch.autocast("cpu", dtype=torch.bfloat16)
(PyTorch's mixed-precision recipe: bf16 matmuls, fp32 master weights and optimizer). Prints one JSON
line like bench_train_cpu: wall and CPU time of the median step, and "train_mib" = peak RSS minus
the RSS right after `import torch` (~230 MiB of libraries that a C++ program does not carry). The
thread settings come from torch.set_num_threads(N) and from the environment tools/bench/train_cpu
gives both implementations (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE).
"""
import argparse
import ctypes
import json
import math
import os
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def status_mib(field):
    """A field of /proc/self/status in MiB ("VmRSS", "VmHWM")."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


RSS_AFTER_IMPORT = status_mib("VmRSS")


def backend_summary():
    """One line: torch version, the BLAS library actually loaded (and OpenBLAS's core), oneDNN,
    ATen's CPU capability, the OpenMP settings."""
    cfg = torch.__config__.show()
    torch.zeros(64, 64) @ torch.zeros(64, 64)  # make sure the BLAS is loaded
    blas = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if "blas" in os.path.basename(line.split()[-1]) and ".so" in line})
    core = ""
    for path in blas:
        try:
            f = ctypes.CDLL(path).openblas_get_corename
            f.restype = ctypes.c_char_p
            core = " (OpenBLAS core " + f().decode() + ")"
            break
        except (OSError, AttributeError):
            pass
    blas_info = re.search(r"BLAS_INFO=(\w+)", cfg)
    cap = next((l.split(":", 1)[1].strip() for l in cfg.splitlines() if "CPU capability" in l), "?")
    dnnl = next((l.strip(" -") for l in cfg.splitlines() if "MKL-DNN" in l or "oneDNN" in l), "none")
    env = " ".join(f"{k}={os.environ.get(k, 'unset')}"
                   for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY"))
    return (f"pytorch {torch.__version__}: BLAS_INFO={blas_info.group(1) if blas_info else '?'} -> "
            f"{', '.join(os.path.realpath(p) for p in blas) or 'none loaded'}{core}; {dnnl}; "
            f"CPU capability {cap}; parallel backend OpenMP; {env}; import torch RSS "
            f"{RSS_AFTER_IMPORT:.0f} MiB")


class Block(nn.Module):
    """sdpa: attention through F.scaled_dot_product_attention(is_causal=True) (PyTorch >= 2.0:
    FlashAttention / memory-efficient kernels on a GPU) instead of the explicit masked softmax."""

    def __init__(self, C, NH, sdpa=False):
        super().__init__()
        self.NH = NH
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class Gpt(nn.Module):
    def __init__(self, V, C, L, NH, T, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, sdpa) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))
        # GPT-2 initialisation, as Kiln's engine.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:T, :T])
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().view(B * T, -1), targets.view(-1))


class LlamaBlock(nn.Module):
    """RMSNorm, grouped-query attention with rotary positions (rotate-half), SwiGLU, no biases;
    the attention mask is causal or block-causal (documents), as bench_train_cpu --arch llama."""

    def __init__(self, C, NH, NKV, Fh):
        super().__init__()
        self.NH, self.NKV, self.Fh = NH, NKV, Fh
        hs = C // NH
        self.w1 = nn.Parameter(torch.ones(C))
        self.w2 = nn.Parameter(torch.ones(C))
        self.qkv = nn.Linear(C, (NH + 2 * NKV) * hs, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.fc = nn.Linear(C, 2 * Fh, bias=False)
        self.fc_proj = nn.Linear(Fh, C, bias=False)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        NH, NKV = self.NH, self.NKV
        hs = C // NH
        q, k, v = self.qkv(self.rms(x, self.w1)).split([NH * hs, NKV * hs, NKV * hs], dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NKV, hs).transpose(1, 2)
        v = v.view(B, T, NKV, hs).transpose(1, 2)

        def rot(t):
            h = t.shape[-1] // 2
            return t * cos + torch.cat((-t[..., h:], t[..., :h]), dim=-1) * sin
        q, k = rot(q), rot(k)
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        gate, up = self.fc(self.rms(x, self.w2)).split(self.Fh, dim=2)
        return x + self.fc_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, V, C, L, NH, NKV, Fh, T, doc_len=0, theta=10000.0):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, NH, NKV, Fh) for _ in range(L)])
        self.wf = nn.Parameter(torch.ones(C))
        self.lm_head = nn.Linear(C, V, bias=False)
        t = torch.arange(T)
        start = t // doc_len * doc_len if doc_len > 0 else torch.zeros_like(t)
        # mask[i, j]: j may not be seen by i (after it, or before its document).
        self.register_buffer("mask", (t[None, :] > t[:, None]) | (t[None, :] < start[:, None]))
        hs = C // NH
        inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
        ang = (t - start).to(torch.float64)[:, None] * inv
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos().float())
        self.register_buffer("sin", emb.sin().float())
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, self.mask, self.cos, self.sin)
        logits = self.lm_head(LlamaBlock.rms(x, self.wf))
        return F.cross_entropy(logits.float().view(B * T, -1), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--ffn", type=int, default=0)
    ap.add_argument("--doc-len", type=int, default=0)
    ap.add_argument("--show-config", action="store_true")
    a = ap.parse_args()
    if a.show_config:
        print(backend_summary())
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.arch == "llama":
        ffn = a.ffn or (2 * 4 * a.d_model // 3 + 255) // 256 * 256
        model = Llama(a.vocab, a.d_model, a.layers, a.heads, a.kv_heads or a.heads, ffn, a.seq,
                      a.doc_len)
    else:
        model = Gpt(a.vocab, a.d_model, a.layers, a.heads, a.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95))
    B, T = a.micro_batch, a.seq
    times, cpu_times, losses = [], [], []
    for s in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (B, T))
        tgt = torch.randint(0, a.vocab, (B, T))
        c0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, tgt)
        else:
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t1 = time.perf_counter()
        c1 = time.process_time()
        losses.append(float(loss))
        if s >= a.warmup:
            times.append((t1 - t0) * 1e3)
            cpu_times.append((c1 - c0) * 1e3)

    def median(v):  # the median step, as bench_train_cpu
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    step_ms = median(times)
    peak = status_mib("VmHWM")
    print(json.dumps({"impl": "pytorch " + torch.__version__, "precision": a.precision,
                      "arch": a.arch, "doc_mask": a.arch == "llama" and a.doc_len > 0,
                      "doc_len": a.doc_len,
                      "recompute": "none", "threads": a.threads, "steps": a.steps,
                      "warmup": a.warmup, "tokens_per_s": round(B * T / (step_ms / 1e3), 1),
                      "step_ms": round(step_ms, 2), "step_ms_min": round(min(times), 2),
                      "cpu_ms": round(median(cpu_times), 2),
                      "rss_start_mib": round(RSS_AFTER_IMPORT, 1), "peak_rss_mib": round(peak, 1),
                      "train_mib": round(peak - RSS_AFTER_IMPORT, 1),
                      "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}))


if __name__ == "__main__":
    main()
