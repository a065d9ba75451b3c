#!/usr/bin/python3
"""Seeds of the fuzz targets added for issue 39 (hf_config, hf_weights, sentencepiece_model,
filter_yaml) under fuzz/corpus/<target>/. make_seeds.py runs it last; it also runs alone
(/usr/bin/python3 fuzz/make_seeds_issue39.py) and then only rewrites these four folders.
Needs Debian's python3-sentencepiece for the .model seeds (skipped without it)."""
import json, os, shutil, struct, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


for t in ("hf_config", "hf_weights", "sentencepiece_model", "filter_yaml"):
    shutil.rmtree(os.path.join(OUT, t), ignore_errors=True)

# hf_config: what `kiln checkpoint export` writes (GPT-2, Llama) and near misses.
gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
        "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256,
        "torch_dtype": "float32"}
llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
         "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
         "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
         "torch_dtype": "bfloat16"}
put("hf_config", "gpt2", json.dumps(gpt2))
put("hf_config", "llama", json.dumps(llama))
for name, edit in [("n_embd_2_40", {"n_embd": 1 << 40}), ("n_inner_huge", {"n_inner": 1 << 62}),
                   ("n_head_float", {"n_head": 1.5}), ("vocab_past_64_bits", {"vocab_size": 1e30}),
                   ("eos_outside", {"eos_token_id": 99999999})]:
    put("hf_config", name, json.dumps({**gpt2, **edit}))
for name, edit in [("max_positions_16m", {"max_position_embeddings": 16777216}),
                   ("kv_heads_zero", {"num_key_value_heads": 0}),
                   ("rope_scaling", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
                   ("eps_nan", {"rms_norm_eps": "nan"})]:
    put("hf_config", name, json.dumps({**llama, **edit}))

# hf_weights: byte 0 (0 gpt2, 1 llama), the index text, "\n#kiln-fuzz-shard\n", the shard.
DT = {"F32": ("<f", 4), "F16": ("<e", 2)}


def shard(tensors, dtype="F32", override=None):
    """safetensors bytes of [(name, shape)] with values 0.01 * i, every tensor in `dtype`."""
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        dt = (override or {}).get(name, dtype)
        if dt == "BF16":
            vals = b"".join(struct.pack("<f", 0.01 * i)[2:] for i in range(n))
        elif dt == "U8":
            vals = bytes(n)
        else:
            fmt, _ = DT[dt]
            vals = b"".join(struct.pack(fmt, 0.01 * i) for i in range(n))
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(vals)]}
        data += vals
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


G = [("transformer.wte.weight", [8, 4]), ("transformer.wpe.weight", [4, 4]),
     ("transformer.h.0.ln_1.weight", [4]), ("transformer.h.0.ln_1.bias", [4]),
     ("transformer.h.0.attn.c_attn.weight", [4, 12]), ("transformer.h.0.attn.c_attn.bias", [12]),
     ("transformer.h.0.attn.c_proj.weight", [4, 4]), ("transformer.h.0.attn.c_proj.bias", [4]),
     ("transformer.h.0.ln_2.weight", [4]), ("transformer.h.0.ln_2.bias", [4]),
     ("transformer.h.0.mlp.c_fc.weight", [4, 16]), ("transformer.h.0.mlp.c_fc.bias", [16]),
     ("transformer.h.0.mlp.c_proj.weight", [16, 4]), ("transformer.h.0.mlp.c_proj.bias", [4]),
     ("transformer.ln_f.weight", [4]), ("transformer.ln_f.bias", [4])]
L = [("model.embed_tokens.weight", [8, 4]), ("model.layers.0.input_layernorm.weight", [4]),
     ("model.layers.0.self_attn.q_proj.weight", [4, 4]),
     ("model.layers.0.self_attn.k_proj.weight", [4, 4]),
     ("model.layers.0.self_attn.v_proj.weight", [4, 4]),
     ("model.layers.0.self_attn.o_proj.weight", [4, 4]),
     ("model.layers.0.post_attention_layernorm.weight", [4]),
     ("model.layers.0.mlp.gate_proj.weight", [8, 4]), ("model.layers.0.mlp.up_proj.weight", [8, 4]),
     ("model.layers.0.mlp.down_proj.weight", [4, 8]), ("model.norm.weight", [4]),
     ("lm_head.weight", [8, 4])]
SEP = b"\n#kiln-fuzz-shard\n"
for dt in ("F32", "F16", "BF16"):
    put("hf_weights", f"gpt2_{dt}", b"\x00" + SEP + shard(G, dt))
    put("hf_weights", f"llama_{dt}", b"\x01" + SEP + shard(L, dt))
put("hf_weights", "gpt2_tied_head", b"\x00" + SEP + shard(G + [("lm_head.weight", [8, 4])]))
put("hf_weights", "gpt2_u8_head", b"\x00" + SEP + shard(G + [("lm_head.weight", [8, 4])],
                                                         override={"lm_head.weight": "U8"}))
put("hf_weights", "llama_u8_head", b"\x01" + SEP + shard(L, override={"lm_head.weight": "U8"}))
index = json.dumps({"metadata": {"total_size": 0}, "weight_map": {n: "a.safetensors" for n, _ in G}})
put("hf_weights", "gpt2_index", b"\x00" + index.encode() + SEP + shard(G))
index = json.dumps({"metadata": {}, "weight_map": {n: "a.safetensors" for n, _ in L}})
put("hf_weights", "llama_index", b"\x01" + index.encode() + SEP + shard(L, "BF16"))
bad = json.dumps({"weight_map": {**{n: "a.safetensors" for n, _ in G}, "x": "../b"}})
put("hf_weights", "index_escapes", b"\x00" + bad.encode() + SEP + shard(G))

# sentencepiece_model: a small unigram and a BPE model trained on the GPT-2 sample text
# (with and without byte fallback), their normalizer charsmap included.
try:
    import io
    import sentencepiece as spm
    sample = os.path.join(SRC, "tests/data/gpt2/sample.txt")
    # (the identity normalizer keeps a model a few KiB; nmt_nfkc's charsmap is ~240 KiB)
    for name, kw in [("unigram", dict(model_type="unigram", vocab_size=400,
                                      normalization_rule_name="identity")),
                     ("bpe_byte_fallback", dict(model_type="bpe", vocab_size=500, byte_fallback=True,
                                                normalization_rule_name="identity")),
                     ("unigram_nfkc", dict(model_type="unigram", vocab_size=400))]:
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(input=sample, model_writer=buf, minloglevel=2,
                                       hard_vocab_limit=False, **kw)
        put("sentencepiece_model", name, buf.getvalue())
except ImportError:
    print("make_seeds_issue39: no python3-sentencepiece, sentencepiece_model has no seeds")

# filter_yaml: the documented chains and near misses (no file-backed filters: their files are
# the fuzzer's to guess).
for name, text in [
        ("defaults", "[{name: gopher_quality}, {name: c4, min_words_per_line: 3}]"),
        ("chain", "- {name: c4}\n- {name: pii}\n- {name: gopher_repetition}\n"
                  "- {name: gopher_quality}\n- {name: fineweb}\n- {name: length, min_chars: 10}\n"),
        ("url_words", "[{name: url, words: [casino, lottery]}]"),
        ("regex", "[{name: regex, strip_lines: ['^Contact'], drop: ['lorem\\\\s+ipsum']}]"),
        ("bad_key", "[{name: c4, min_words_per_line: -3}]"),
        ("unknown", "[{name: nosuch}]"),
        ("empty", "[]")]:
    put("filter_yaml", name, text)

for t in ("hf_config", "hf_weights", "sentencepiece_model", "filter_yaml"):
    d = os.path.join(OUT, t)
    print(t, len(os.listdir(d)) if os.path.isdir(d) else 0, "seeds")
