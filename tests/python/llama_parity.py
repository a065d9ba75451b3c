#!/usr/bin/python3
"""PyTorch parity test of Kiln's llama architecture (run by ctest as `llama_parity`).

tests/engine/engine_parity_dump.cc (argument `llama`) writes, per precision, a Llama-style model's
initial fp32 weights - grouped-query attention (4 query heads, 2 key/value heads), untied
embeddings, no biases - a packed batch with document starts (model.doc_mask on), its loss and the
gradient of every parameter, and the losses of ten AdamW steps with clipping. This script builds
the same model in plain PyTorch from the published equations - RMSNorm (Zhang & Sennrich 2019),
rotary embeddings in the rotate-half layout of Hugging Face's Llama (Su et al. 2021), SwiGLU
(Shazeer 2020), grouped-query attention (Ainslie et al. 2023: key/value head g serves query heads
g*r .. g*r + r - 1), with a block-causal document mask and positions that restart at each
document start - and compares:

  * loss, per-token losses, every gradient and ten AdamW steps, fp32 / bf16 / fp16, with the
    tolerances of tests/python/engine_parity.py (the same reasoning: fp32 summation order only;
    bf16/fp16 runs round at the same points as the engine, so what remains is a unit roundoff u
    here and there - see TOL there);
  * fp32: the packed row's per-token losses against each document computed on its own (a separate
    sequence, positions from 0, no mask): equal within fp32 rounding (1e-5), so no token sees
    another document and positions do restart.

The rotary angles are computed in fp64 and rounded to fp32, as the engine does (Hugging Face
computes them in fp32; at these positions the two differ by less than 1e-6). Exits non-zero on
any mismatch or when torch/numpy are missing (tools/setup installs them).
"""
import argparse
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_parity import TOL, make_round, make_weight_round, read_safetensors  # noqa: E402

import numpy as np  # noqa: E402  (engine_parity exits when these are missing)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(pos, hs, theta):
    """cos, sin of shape (B, T, hs) for integer positions (B, T), rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = pos.to(torch.float64)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.float32), emb.sin().to(torch.float32)


class Llama:
    def __init__(self, params, cfg, prec):
        self.cfg = cfg
        self.p = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in params.items()}
        self.Q = make_round(prec)
        self.W = make_weight_round(prec)

    def loss(self, inputs, targets, doc_start=None, scale=1.0):
        """Mean loss, per-token losses, scaled loss. doc_start (B, T): each token's document start
        (None: one document per row)."""
        Q, W, c = self.Q, self.W, self.cfg
        B, T = inputs.shape
        C, NH, NKV, L = c["d_model"], c["n_heads"], c["n_kv_heads"], c["n_layers"]
        hs, Fh, eps = C // NH, c["ffn_hidden"], c["norm_eps"]
        if doc_start is None:
            doc_start = torch.zeros(B, T, dtype=torch.int64)
        t = torch.arange(T)
        pos = t[None, :] - doc_start
        # allowed[b, i, j]: j <= i and j in i's document.
        allowed = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= doc_start[:, :, None])
        cos, sin = rope_cos_sin(pos, hs, c["rope_theta"])
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        w = {k: W(v) for k, v in self.p.items()}
        x = Q(w["wte"][inputs])
        for l in range(L):
            b = f"blocks.{l}."
            h1 = Q(rms_norm(x, w[b + "ln1.weight"], eps))
            qkv = Q(F.linear(h1, w[b + "attn.qkv.weight"]))
            q, k, v = qkv.split([NH * hs, NKV * hs, NKV * hs], dim=2)
            q = q.view(B, T, NH, hs).transpose(1, 2)
            k = k.view(B, T, NKV, hs).transpose(1, 2)
            v = v.view(B, T, NKV, hs).transpose(1, 2)
            q = Q(q * cos + rotate_half(q) * sin)
            k = Q(k * cos + rotate_half(k) * sin)
            rep = NH // NKV
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)
            y = Q((att @ v).transpose(1, 2).contiguous().view(B, T, C))
            proj = Q(F.linear(y, w[b + "attn.proj.weight"]))
            res2 = Q(x + proj)
            h2 = Q(rms_norm(res2, w[b + "ln2.weight"], eps))
            gate, up = Q(F.linear(h2, w[b + "mlp.fc.weight"])).split([Fh, Fh], dim=2)
            act = Q(F.silu(gate) * up)
            mp = Q(F.linear(act, w[b + "mlp.proj.weight"]))
            x = Q(res2 + mp)
        hf = Q(rms_norm(x, w["ln_f.weight"], eps))
        logits = Q(hf @ w["lm_head.weight"].t())
        per_token = F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1), reduction="none")
        loss = per_token.mean()
        return loss, per_token.view(B, T), loss * scale


def rel(a, b):
    return float(torch.linalg.vector_norm(a - b) / max(torch.linalg.vector_norm(b), 1e-30))


def check_precision(work, prec):
    d = os.path.join(work, prec)
    params, meta = read_safetensors(os.path.join(d, "params.safetensors"))
    batch, _ = read_safetensors(os.path.join(d, "batch.safetensors"))
    grads, gmeta = read_safetensors(os.path.join(d, "grads.safetensors"))
    steps, smeta = read_safetensors(os.path.join(d, "steps.safetensors"))
    failures = []
    if meta.get("arch") != "llama":
        return [f"the dump is arch {meta.get('arch')}, not llama"]
    cfg = {k: int(meta[k]) for k in ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len",
                                      "n_kv_heads", "ffn_hidden")}
    cfg["rope_theta"] = float(meta["rope_theta"])
    cfg["norm_eps"] = float(meta["norm_eps"])
    expected = {"wte", "ln_f.weight", "lm_head.weight"}
    for l in range(cfg["n_layers"]):
        expected |= {f"blocks.{l}.{n}" for n in ("ln1.weight", "attn.qkv.weight", "attn.proj.weight",
                                                  "ln2.weight", "mlp.fc.weight", "mlp.proj.weight")}
    if set(params) != expected:
        return [f"parameter names differ from a Llama's: {sorted(set(params) ^ expected)}"]
    scale = float(gmeta["loss_scale"])
    tol = TOL[prec]
    inputs = torch.tensor(batch["inputs"].astype(np.int64))
    targets = torch.tensor(batch["targets"].astype(np.int64))
    doc_start = torch.tensor(batch["doc_start"].astype(np.int64))
    ndocs = int((doc_start == torch.arange(inputs.shape[1])[None, :]).sum())
    if ndocs <= inputs.shape[0]:
        failures.append("the batch has no packed documents: the mask would go untested")

    model = Llama(params, cfg, prec)
    loss, per_token, scaled = model.loss(inputs, targets, doc_start, scale)
    scaled.backward()
    kiln_loss = float(grads["__loss__"][0])
    dl = abs(kiln_loss - float(loss))
    print(f"[llama {prec}] loss kiln {kiln_loss:.8f} torch {float(loss):.8f} |d| {dl:.2e} "
          f"(tol {tol['loss']:.0e}); {ndocs} documents in {inputs.shape[0]} rows")
    if not dl <= tol["loss"]:
        failures.append(f"loss differs by {dl:.3e}")
    tok = float(np.max(np.abs(grads["__losses__"] - per_token.detach().numpy())))
    if not tok <= 10 * tol["loss"]:
        failures.append(f"per-token losses differ by up to {tok:.3e}")

    # Without the mask the model is a different function: the test can tell them apart.
    unmasked, _, _ = Llama(params, cfg, prec).loss(inputs, targets, None)
    print(f"[llama {prec}]   for scale: the same batch without the document mask: loss "
          f"{float(unmasked):.6f} (|d| {abs(float(unmasked) - kiln_loss):.2e})")
    if abs(float(unmasked) - kiln_loss) <= 10 * tol["loss"]:
        failures.append("the unmasked loss is as close as the masked one: the mask is not tested")

    worst_rel, worst_max = 0.0, 0.0
    for name in params:
        g_t = model.p[name].grad / scale
        g_k = torch.tensor(grads[name])
        r = rel(g_k, g_t)
        mx = float((g_k - g_t).abs().max() / max(float(g_t.abs().max()), 1e-30))
        worst_rel, worst_max = max(worst_rel, r), max(worst_max, mx)
        if not (r <= tol["grad_rel"] and mx <= tol["grad_max"]):
            failures.append(f"gradient of {name}: ||d||/||g|| {r:.3e}, max|d|/max|g| {mx:.3e}")
    print(f"[llama {prec}] gradients of {len(params)} tensors: worst ||d||/||g|| {worst_rel:.2e} "
          f"(tol {tol['grad_rel']:.0e}), worst max|d|/max|g| {worst_max:.2e} (tol {tol['grad_max']:.0e})")

    if prec == "fp32":
        # Each document on its own: a row of its tokens, positions from 0, no mask.
        sep = Llama(params, cfg, "fp32")
        worst = 0.0
        T = inputs.shape[1]
        for b in range(inputs.shape[0]):
            starts = sorted(set(int(s) for s in doc_start[b]))
            for i, s in enumerate(starts):
                e = starts[i + 1] if i + 1 < len(starts) else T
                _, pt, _ = sep.loss(inputs[b:b + 1, s:e], targets[b:b + 1, s:e])
                worst = max(worst, float(np.max(np.abs(grads["__losses__"][b, s:e] - pt.detach().numpy()[0]))))
        print(f"[llama {prec}] packed rows vs each document alone: worst per-token loss |d| {worst:.2e} (tol 1e-5)")
        if not worst <= 1e-5:
            failures.append(f"packed per-token losses differ from the documents alone by {worst:.3e}")

    model = Llama(params, cfg, prec)
    decay = [t for n, t in model.p.items() if t.dim() >= 2]
    no_decay = [t for n, t in model.p.items() if t.dim() < 2]
    wd = float(smeta["weight_decay"])
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(smeta["lr"]), betas=(float(smeta["beta1"]), float(smeta["beta2"])),
                            eps=float(smeta["eps"]))
    clip = float(smeta["clip_grad"])
    worst_step, clipped = 0.0, 0
    for k in range(10):
        opt.zero_grad()
        l, _, s = model.loss(inputs, targets, doc_start, scale)
        s.backward()
        for t in model.p.values():
            t.grad /= scale
        norm = float(torch.nn.utils.clip_grad_norm_(list(model.p.values()), clip))
        clipped += norm > clip
        opt.step()
        d = abs(float(l) - float(steps["loss"][k]))
        worst_step = max(worst_step, d)
        if not d <= tol["steps"]:
            failures.append(f"AdamW step {k + 1}: loss kiln {steps['loss'][k]:.7f} torch {float(l):.7f}")
        dn = abs(norm - float(steps["grad_norm"][k])) / norm
        if not dn <= max(10 * tol["grad_rel"], 1e-4):
            failures.append(f"AdamW step {k + 1}: grad norm kiln {steps['grad_norm'][k]:.6f} torch {norm:.6f}")
    print(f"[llama {prec}] 10 AdamW steps (clip {clip}, clipped {clipped}/10): losses "
          f"{steps['loss'][0]:.5f} -> {steps['loss'][9]:.5f}, worst |d| {worst_step:.2e} (tol {tol['steps']:.0e})")
    if clipped == 0:
        failures.append("clipping never engaged: the test would not check it")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="path of the engine_parity_dump program")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--precisions", default="fp32,bf16,fp16")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    os.makedirs(args.work, exist_ok=True)
    all_failures = []
    for prec in args.precisions.split(","):
        r = subprocess.run([args.dump, args.work, prec, "llama"])
        if r.returncode != 0:
            all_failures.append(f"{prec}: engine_parity_dump exited {r.returncode}")
            continue
        all_failures += [f"{prec}: {f}" for f in check_precision(args.work, prec)]
    if all_failures:
        print("FAIL:\n  " + "\n  ".join(all_failures))
        sys.exit(1)
    print("PASS: the llama engine matches PyTorch")


if __name__ == "__main__":
    main()
