#!/usr/bin/python3
"""An independent GPT-2 in PyTorch, written from Hugging Face's published modelling code
(transformers/models/gpt2/modeling_gpt2.py: GPT2LMHeadModel with Conv1D layers, fused c_attn,
"gelu_new", eager attention with a causal mask, tied LM head) - not from Kiln's code - and the
safetensors / config.json files of a Hugging Face model directory. Used by tests/hf_models.sh
(ctest hf_models_*) to check Kiln's export, import, generation and speed against it.

  hf_gpt2.py make DIR --vocab V --embd C --layers L --heads H --positions T --seed S
      writes a randomly initialised GPT-2 as a Hugging Face directory (config.json,
      model.safetensors with transformers' names and layouts, attention-mask buffers and a tied
      lm_head.weight as some files carry them)
  hf_gpt2.py logits DIR --ids "1 2 3" -o FILE.npy        the logits (tokens x vocab), fp32
  hf_gpt2.py loss DIR --batch FILE                        mean next-token loss of the rows (one
                                                          line of T+1 ids each)
  hf_gpt2.py greedy DIR --ids "1 2 3" --n N                N greedy tokens (full forward each)
  hf_gpt2.py bench DIR --ids ... --n N --threads K        eager generation tokens/s (KV cache)
"""
import argparse
import json
import math
import os
import struct
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as e:  # fail, do not skip
    print(f"FAIL: cannot import torch/numpy ({e}); run with /usr/bin/python3 (tools/setup)",
          file=sys.stderr)
    sys.exit(1)

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        if e["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype=ST_DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).copy()
    return out, header.get("__metadata__", {})


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        b = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_dir(d):
    """config.json and every tensor of model.safetensors (or its shards), names without the
    'transformer.' prefix."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["model_type"] == "gpt2", cfg["model_type"]
    assert cfg.get("activation_function", "gelu_new") == "gelu_new"
    files = ["model.safetensors"]
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    sd = {}
    for f in files:
        t, meta = read_safetensors(os.path.join(d, f))
        assert meta.get("format") == "pt", f"{f}: metadata format {meta}"  # transformers checks it
        for k, v in t.items():
            sd[k[len("transformer."):] if k.startswith("transformer.") else k] = torch.from_numpy(v)
    return cfg, sd


# ---- the model, after transformers' modeling_gpt2.py ----------------------------------------

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):  # transformers.pytorch_utils.Conv1D: weight [nx, nf]
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[1])


class GPT2:
    def __init__(self, cfg, sd):
        self.cfg, self.sd = cfg, sd
        self.nh = cfg["n_head"]
        self.eps = cfg.get("layer_norm_epsilon", 1e-5)

    def ln(self, x, p):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), self.sd[p + ".weight"],
                                              self.sd[p + ".bias"], self.eps)

    def attn(self, x, l, past=None):
        sd, p = self.sd, f"h.{l}.attn."
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = conv1d(x, sd[p + "c_attn.weight"], sd[p + "c_attn.bias"]).split(C, dim=2)
        split = lambda t: t.view(B, T, self.nh, hs).permute(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        if past is not None:
            if past[l] is not None:
                k = torch.cat([past[l][0], k], dim=2)
                v = torch.cat([past[l][1], v], dim=2)
            past[l] = (k, v)
        S = k.shape[2]
        w = torch.matmul(q, k.transpose(-1, -2)) / (hs ** 0.5)  # scale_attn_weights
        causal = torch.tril(torch.ones(S, S, dtype=torch.bool))[S - T:S, :S]
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        w = torch.softmax(w, dim=-1)
        o = torch.matmul(w, v).permute(0, 2, 1, 3).reshape(B, T, C)
        return conv1d(o, sd[p + "c_proj.weight"], sd[p + "c_proj.bias"])

    def mlp(self, x, l):
        sd, p = self.sd, f"h.{l}.mlp."
        h = gelu_new(conv1d(x, sd[p + "c_fc.weight"], sd[p + "c_fc.bias"]))
        return conv1d(h, sd[p + "c_proj.weight"], sd[p + "c_proj.bias"])

    def forward(self, ids, past=None, start=0):  # ids (B, T)
        B, T = ids.shape
        pos = torch.arange(start, start + T)
        x = self.sd["wte.weight"][ids] + self.sd["wpe.weight"][pos]
        for l in range(self.cfg["n_layer"]):
            x = x + self.attn(self.ln(x, f"h.{l}.ln_1"), l, past)
            x = x + self.mlp(self.ln(x, f"h.{l}.ln_2"), l)
        x = self.ln(x, "ln_f")
        head = self.sd.get("lm_head.weight", self.sd["wte.weight"])  # tied
        return x @ head.T


def ids_arg(text):
    return [int(t) for t in text.split()]


def cmd_make(a):
    torch.manual_seed(a.seed)
    C, L, V, T = a.embd, a.layers, a.vocab, a.positions
    std = a.std
    t = {"transformer.wte.weight": torch.randn(V, C) * std,
         "transformer.wpe.weight": torch.randn(T, C) * std}
    for l in range(L):
        p = f"transformer.h.{l}."
        t[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C)
        t[p + "ln_1.bias"] = 0.1 * torch.randn(C)
        t[p + "attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)  # the mask buffer
        t[p + "attn.c_attn.weight"] = torch.randn(C, 3 * C) * std
        t[p + "attn.c_attn.bias"] = 0.1 * torch.randn(3 * C)
        t[p + "attn.c_proj.weight"] = torch.randn(C, C) * std
        t[p + "attn.c_proj.bias"] = 0.1 * torch.randn(C)
        t[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C)
        t[p + "ln_2.bias"] = 0.1 * torch.randn(C)
        t[p + "mlp.c_fc.weight"] = torch.randn(C, 4 * C) * std
        t[p + "mlp.c_fc.bias"] = 0.1 * torch.randn(4 * C)
        t[p + "mlp.c_proj.weight"] = torch.randn(4 * C, C) * std
        t[p + "mlp.c_proj.bias"] = 0.1 * torch.randn(C)
    t["transformer.ln_f.weight"] = 1 + 0.1 * torch.randn(C)
    t["transformer.ln_f.bias"] = 0.1 * torch.randn(C)
    t["lm_head.weight"] = t["transformer.wte.weight"]  # tied, stored as some files do
    os.makedirs(a.dir, exist_ok=True)
    write_safetensors(os.path.join(a.dir, "model.safetensors"),
                      {k: v.numpy() for k, v in t.items()}, {"format": "pt"})
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_positions": T, "n_ctx": T, "n_embd": C, "n_layer": L, "n_head": a.heads,
           "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "bos_token_id": V - 1,
           "eos_token_id": V - 1, "torch_dtype": "float32", "tie_word_embeddings": True}
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=2)


def cmd_logits(a):
    cfg, sd = load_dir(a.dir)
    with torch.no_grad():
        lg = GPT2(cfg, sd).forward(torch.tensor([ids_arg(a.ids)]))[0]
    np.save(a.o, lg.numpy().astype(np.float32))


def cmd_loss(a):
    cfg, sd = load_dir(a.dir)
    rows = torch.tensor([ids_arg(l) for l in open(a.batch) if l.strip()])
    with torch.no_grad():
        lg = GPT2(cfg, sd).forward(rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), rows[:, 1:].reshape(-1))
    print(json.dumps({"loss": loss.item()}))


def cmd_greedy(a):
    cfg, sd = load_dir(a.dir)
    m = GPT2(cfg, sd)
    ids = ids_arg(a.ids)
    out = []
    with torch.no_grad():
        for _ in range(a.n):
            lg = m.forward(torch.tensor([ids]))[0, -1]
            nxt = int(torch.argmax(lg))
            out.append(nxt)
            ids.append(nxt)
    print(" ".join(map(str, out)))


def cmd_bench(a):
    torch.set_num_threads(a.threads)
    cfg, sd = load_dir(a.dir)
    m = GPT2(cfg, sd)
    ids = ids_arg(a.ids)
    with torch.no_grad():
        past = [None] * cfg["n_layer"]
        t0 = time.perf_counter()
        lg = m.forward(torch.tensor([ids]), past, 0)[0, -1]
        t1 = time.perf_counter()
        pos = len(ids)
        for i in range(a.n):
            nxt = int(torch.argmax(lg))
            if i == a.n - 1:
                break
            lg = m.forward(torch.tensor([[nxt]]), past, pos)[0, -1]
            pos += 1
        t2 = time.perf_counter()
    print(json.dumps({"prompt_tokens": len(ids), "prefill_s": t1 - t0, "new_tokens": a.n,
                      "tokens_per_s": (a.n - 1) / (t2 - t1), "threads": a.threads}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("dir")
    for k, d in (("vocab", 96), ("embd", 32), ("layers", 2), ("heads", 4), ("positions", 16),
                 ("seed", 1)):
        p.add_argument("--" + k, type=int, default=d)
    p.add_argument("--std", type=float, default=0.2)
    p = sub.add_parser("logits")
    p.add_argument("dir"); p.add_argument("--ids", required=True); p.add_argument("-o", required=True)
    p = sub.add_parser("loss")
    p.add_argument("dir"); p.add_argument("--batch", required=True)
    p = sub.add_parser("greedy")
    p.add_argument("dir"); p.add_argument("--ids", required=True); p.add_argument("--n", type=int, default=8)
    p = sub.add_parser("bench")
    p.add_argument("dir"); p.add_argument("--ids", required=True); p.add_argument("--n", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(getattr(a, "threads", 1))
    {"make": cmd_make, "logits": cmd_logits, "loss": cmd_loss, "greedy": cmd_greedy,
     "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    main()
