#!/usr/bin/python3
"""An independent Llama in PyTorch, written from Hugging Face's published modelling code
(transformers/models/llama/modeling_llama.py: LlamaForCausalLM - LlamaRMSNorm, rotary embedding
with rotate_half and inv_freq = 1 / theta^(arange(0, d, 2) / d), separate q_proj/k_proj/v_proj/
o_proj with repeat_kv for grouped-query attention, eager attention with a causal mask, LlamaMLP
down_proj(silu(gate_proj(x)) * up_proj(x)), an untied or tied lm_head) - not from Kiln's code.
Used by tests/hf_models.sh (ctest hf_models_torch_llama). Plain causal attention over each row:
no document mask (the Kiln side of the comparison runs with model.doc_mask false).
  hf_llama.py make DIR --vocab V --hidden C --layers L --heads H --kv-heads K --ffn F
                        --positions T --seed S [--tied]
      writes a randomly initialised Llama as a Hugging Face directory (config.json,
      model.safetensors with transformers' names, rotary_emb.inv_freq buffers as older files
      carry them)
  hf_llama.py logits DIR --ids "1 2 3" -o FILE.npy   the logits (tokens x vocab), fp32
  hf_llama.py loss DIR --batch FILE                   mean next-token loss of the rows
  hf_llama.py greedy DIR --ids "1 2 3" --n N           N greedy tokens (full forward each)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import np, torch, read_safetensors, write_safetensors, ids_arg  # noqa: E402


def load_dir(d):
    """config.json and every tensor (model.safetensors or its shards), without the 'model.'
    prefix."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["model_type"] == "llama", cfg["model_type"]
    assert cfg.get("hidden_act", "silu") == "silu"
    assert cfg.get("rope_scaling") is None
    files = ["model.safetensors"]
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    sd = {}
    for f in files:
        t, meta = read_safetensors(os.path.join(d, f))
        assert meta.get("format") == "pt", f"{f}: metadata format {meta}"
        for k, v in t.items():
            sd[k[len("model."):] if k.startswith("model.") else k] = torch.from_numpy(v)
    return cfg, sd


# ---- the model, after transformers' modeling_llama.py ---------------------------------------

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Llama:
    def __init__(self, cfg, sd):
        self.cfg, self.sd = cfg, sd
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.nh
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = cfg.get("rope_theta", 10000.0)
        # LlamaRotaryEmbedding (default rope type): inv_freq in fp32
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        self.bias = cfg.get("attention_bias", False)

    def rms(self, x, w):  # LlamaRMSNorm
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + self.eps))

    def lin(self, x, p):
        return torch.nn.functional.linear(x, self.sd[p + ".weight"], self.sd.get(p + ".bias"))

    def rope(self, pos):
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def attn(self, x, l, cos, sin):
        p = f"layers.{l}.self_attn."
        B, T, _ = x.shape
        q = self.lin(x, p + "q_proj").view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.lin(x, p + "k_proj").view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.lin(x, p + "v_proj").view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # repeat_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * self.hd ** -0.5
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        w = w.masked_fill(~causal, torch.finfo(w.dtype).min)
        w = torch.softmax(w, dim=-1, dtype=torch.float32)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.lin(o, p + "o_proj")

    def mlp(self, x, l):
        p = f"layers.{l}.mlp."
        return self.lin(torch.nn.functional.silu(self.lin(x, p + "gate_proj")) *
                        self.lin(x, p + "up_proj"), p + "down_proj")

    def forward(self, ids):  # ids (B, T)
        B, T = ids.shape
        cos, sin = self.rope(torch.arange(T))
        x = self.sd["embed_tokens.weight"][ids]
        for l in range(self.cfg["num_hidden_layers"]):
            x = x + self.attn(self.rms(x, self.sd[f"layers.{l}.input_layernorm.weight"]), l, cos, sin)
            x = x + self.mlp(self.rms(x, self.sd[f"layers.{l}.post_attention_layernorm.weight"]), l)
        x = self.rms(x, self.sd["norm.weight"])
        tied = self.cfg.get("tie_word_embeddings", False)
        head = self.sd["embed_tokens.weight"] if tied else self.sd["lm_head.weight"]
        return x @ head.T


def cmd_make(a):
    torch.manual_seed(a.seed)
    C, L, V, F, H, K = a.hidden, a.layers, a.vocab, a.ffn, a.heads, a.kv_heads
    hd = C // H
    std = a.std
    t = {"model.embed_tokens.weight": torch.randn(V, C) * std}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
        t[p + "self_attn.q_proj.weight"] = torch.randn(H * hd, C) * std
        t[p + "self_attn.k_proj.weight"] = torch.randn(K * hd, C) * std
        t[p + "self_attn.v_proj.weight"] = torch.randn(K * hd, C) * std
        t[p + "self_attn.o_proj.weight"] = torch.randn(C, H * hd) * std
        t[p + "self_attn.rotary_emb.inv_freq"] = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C)
        t[p + "mlp.gate_proj.weight"] = torch.randn(F, C) * std
        t[p + "mlp.up_proj.weight"] = torch.randn(F, C) * std
        t[p + "mlp.down_proj.weight"] = torch.randn(C, F) * std
    t["model.norm.weight"] = 1 + 0.1 * torch.randn(C)
    t["lm_head.weight"] = t["model.embed_tokens.weight"] if a.tied else torch.randn(V, C) * std
    os.makedirs(a.dir, exist_ok=True)
    write_safetensors(os.path.join(a.dir, "model.safetensors"),
                      {k: v.numpy() for k, v in t.items()}, {"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": K, "hidden_act": "silu",
           "max_position_embeddings": a.positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
           "attention_dropout": 0.0, "pretraining_tp": 1, "tie_word_embeddings": a.tied,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=2)


def cmd_make_streamed(a):
    """The same names and config as make, written tensor by tensor in 64 MiB chunks from numpy's
    generator (norm gains 1): a model of billions of parameters without holding it in memory
    (tools/bench/hf_models llama1b)."""
    C, L, V, F, H, K = a.hidden, a.layers, a.vocab, a.ffn, a.heads, a.kv_heads
    hd = C // H
    shapes = {"model.embed_tokens.weight": (V, C)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (C,),
                       p + "self_attn.q_proj.weight": (H * hd, C),
                       p + "self_attn.k_proj.weight": (K * hd, C),
                       p + "self_attn.v_proj.weight": (K * hd, C),
                       p + "self_attn.o_proj.weight": (C, H * hd),
                       p + "post_attention_layernorm.weight": (C,),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F)})
    shapes["model.norm.weight"] = (C,)
    if not a.tied:
        shapes["lm_head.weight"] = (V, C)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for n, sh in shapes.items():
        b = 4 * int(np.prod(sh))
        header[n] = {"dtype": "F32", "shape": list(sh), "data_offsets": [off, off + b]}
        off += b
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(a.dir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.dir, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for n, sh in shapes.items():
            total = int(np.prod(sh))
            for at in range(0, total, 1 << 24):
                k = min(1 << 24, total - at)
                if len(sh) == 1:
                    f.write(np.ones(k, dtype=np.float32).tobytes())
                else:
                    f.write((rng.standard_normal(k, dtype=np.float32) * np.float32(a.std)).tobytes())
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": K, "hidden_act": "silu",
           "max_position_embeddings": a.positions, "rms_norm_eps": 1e-5,
           "rope_theta": a.rope_theta, "rope_scaling": None, "attention_bias": False,
           "mlp_bias": False, "tie_word_embeddings": a.tied, "torch_dtype": "float32"}
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=2)


def cmd_logits(a):
    cfg, sd = load_dir(a.dir)
    with torch.no_grad():
        lg = Llama(cfg, sd).forward(torch.tensor([ids_arg(a.ids)]))[0]
    np.save(a.o, lg.numpy().astype(np.float32))


def cmd_loss(a):
    cfg, sd = load_dir(a.dir)
    rows = torch.tensor([ids_arg(l) for l in open(a.batch) if l.strip()])
    with torch.no_grad():
        lg = Llama(cfg, sd).forward(rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), rows[:, 1:].reshape(-1))
    print(json.dumps({"loss": loss.item()}))


def cmd_greedy(a):
    cfg, sd = load_dir(a.dir)
    m = Llama(cfg, sd)
    ids = ids_arg(a.ids)
    out = []
    with torch.no_grad():
        for _ in range(a.n):
            nxt = int(torch.argmax(m.forward(torch.tensor([ids]))[0, -1]))
            out.append(nxt)
            ids.append(nxt)
    print(" ".join(map(str, out)))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("dir")
    for k, d in (("vocab", 96), ("hidden", 32), ("layers", 2), ("heads", 4), ("kv-heads", 2),
                 ("ffn", 48), ("positions", 16), ("seed", 1)):
        p.add_argument("--" + k, type=int, default=d)
    p.add_argument("--std", type=float, default=0.3)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--stream", action="store_true", help="write chunk by chunk (numpy generator)")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p = sub.add_parser("logits")
    p.add_argument("dir"); p.add_argument("--ids", required=True); p.add_argument("-o", required=True)
    p = sub.add_parser("loss")
    p.add_argument("dir"); p.add_argument("--batch", required=True)
    p = sub.add_parser("greedy")
    p.add_argument("dir"); p.add_argument("--ids", required=True); p.add_argument("--n", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "make" and a.stream:
        return cmd_make_streamed(a)
    {"make": cmd_make, "logits": cmd_logits, "loss": cmd_loss, "greedy": cmd_greedy}[a.cmd](a)


if __name__ == "__main__":
    main()
