#!/usr/bin/python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (checked in; rerun after a format change).

Usage: /usr/bin/python3 fuzz/make_seeds.py KILN_BINARY
Seeds are small valid inputs of each format (the GPT-2 test data, files `kiln` itself writes) and
a few near misses. libFuzzer grows its own corpus from them in build-fuzz/corpus/<target>/
(tools/fuzz), outside the repository; findings are copied here by hand as regression inputs."""
import gzip, json, os, shutil, struct, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
KILN = os.path.abspath(sys.argv[1])
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def zstd(data):
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=data, stdout=subprocess.PIPE,
                          check=True).stdout


def kiln(*args, **kw):
    return subprocess.run([KILN, *args], check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, **kw).stdout


shutil.rmtree(OUT, ignore_errors=True)
tmp = tempfile.mkdtemp(prefix="kiln-seeds-")
lines = [
    '{"text": "Hello world", "id": "a1", "domain": "web", "meta": {"lang": "en"}}',
    '{"text": "caf\\u00e9 \\ud83d\\ude00", "id": 42, "source": "s", "url": "http://x"}',
    '{"text": "unpaired \\ud800 surrogate", "id": 1.5}',
    '{"text": "  ", "id": null}',
    '{"text": 3}',
    '[1, 2, 3]',
    '{"text": "x", "extra": [1, {"a": [true, null]}], "domain": "bad domain"}',
]
jsonl = ("\n".join(lines) + "\n").encode()

# jsonl_reader: byte 0 compression (0 plain, 1 gzip, 2 zstd), byte 1 line limit exponent.
put("jsonl_reader", "plain", b"\x00\x06" + jsonl)
put("jsonl_reader", "plain_crlf_no_final_newline", b"\x00\x02" + b"a\r\nbb\r\n" + b"x" * 70 + b"\nlast")
put("jsonl_reader", "gzip", b"\x01\x06" + gzip.compress(jsonl, mtime=0))
put("jsonl_reader", "gzip_two_members", b"\x01\x06" + gzip.compress(b"one\n", mtime=0) + gzip.compress(b"two\n", mtime=0))
put("jsonl_reader", "gzip_truncated", b"\x01\x06" + gzip.compress(jsonl, mtime=0)[:-9])
put("jsonl_reader", "zstd", b"\x02\x06" + zstd(jsonl))
put("jsonl_reader", "zstd_two_frames", b"\x02\x06" + zstd(b"one\n") + zstd(b"two\n"))
put("jsonl_reader", "zstd_truncated", b"\x02\x06" + zstd(jsonl)[:-5])

# doc_parser: one line each.
for i, line in enumerate(lines):
    put("doc_parser", f"line{i}", line)
put("doc_parser", "invalid_utf8", b'{"text": "bad \xff\xfe bytes \xe2\x82", "id": "u"}')
put("doc_parser", "deep", '{"text": "x", "meta": ' + "[" * 300 + "]" * 300 + "}")

# token_ids
put("token_ids", "ids", "0 1 2 255 256 299\n")
put("token_ids", "spaces", "  7\t8\n\n9  ")
put("token_ids", "bad", "1 2 x3")
put("token_ids", "big", "4294967295 4294967296")

# npy: what Kiln writes (numpy.save layout) and other writers' layouts.
def npy(descr, shape, data, version=(1, 0), pad_to=64):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    hl = 2 if version[0] == 1 else 4
    total = 6 + 2 + hl + len(d) + 1
    d += " " * ((pad_to - total % pad_to) % pad_to) + "\n"
    head = b"\x93NUMPY" + bytes(version) + (struct.pack("<H", len(d)) if hl == 2 else struct.pack("<I", len(d)))
    return head + d.encode() + data
put("npy", "u2", npy("<u2", "(3,)", struct.pack("<3H", 1, 2, 65535)))
put("npy", "u4", npy("<u4", "(2,)", struct.pack("<2I", 7, 70000)))
put("npy", "v2", npy("<u2", "(1,)", struct.pack("<H", 5), version=(2, 0)))
put("npy", "empty", npy("<u4", "(0,)", b""))
put("npy", "two_d", npy("<u2", "(1, 1)", b"\x00\x00"))
put("npy", "short_data", npy("<u4", "(4,)", b"\x00" * 6))

# safetensors
def st(tensors, meta=None):
    header, blob, off = {}, b"", 0
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blob += data
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob
put("safetensors", "two", st([("w", "F32", [2, 2], b"\x00" * 16), ("b", "BF16", [3], b"\x01" * 6)], {"step": "3"}))
put("safetensors", "scalar_and_empty", st([("s", "I64", [], b"\x02" * 8), ("e", "U8", [0], b"")]))
put("safetensors", "bad_offsets", st([("w", "F16", [4], b"\x00" * 6)]))

# mixture control
put("mixture_control", "ok", '{"weights": {"web": 0.7, "code": 0.3}}')
put("mixture_control", "zero", '{"weights": {"web": 0, "books": 1e-3}}')
put("mixture_control", "bad", '{"weights": {"web": -1, "x": "y"}}')
put("mixture_control", "unknown", '{"weights": {"nope": 1}}')

# train_config: the shipped configs, one with --set lines.
for name in sorted(os.listdir(os.path.join(SRC, "configs/train"))):
    with open(os.path.join(SRC, "configs/train", name), "rb") as f:
        put("train_config", name, f.read())
with open(os.path.join(SRC, "configs/train/tiny.yaml"), "rb") as f:
    tiny = f.read()
put("train_config", "tiny_with_sets", tiny + b"\n#kiln-fuzz-sets\nmodel.n_layers=1\nrun.steps=3\ndata.mixture.web=0.5\n")
put("train_config", "anchors", b"model: &m {d_model: 8}\nparallel: *m\n")

# Kiln's own files: a tiny dataset and its tokenizer.
corpus = os.path.join(tmp, "c.jsonl")
with open(corpus, "w") as f:
    for d in range(40):
        f.write(json.dumps({"id": f"d{d}", "domain": "web" if d % 2 else "code",
                            "text": f"document {d} " + "the quick brown fox jumps " * (d % 5 + 1)}) + "\n")
data = os.path.join(tmp, "data")
kiln("prep", "--input", corpus, "--output", data, "--vocab-size", "300", "--threads", "1",
     "--shard-samples", "6")
with open(os.path.join(data, "manifest.json"), "rb") as f:
    manifest = f.read()
put("manifest", "prep_output", manifest)
m = json.loads(manifest)
m["shards"][0]["split"] = "val"
put("manifest", "val_split_mismatch", json.dumps(m))
put("manifest", "empty", '{"format": "kiln-shards/1", "tokenizer": {"path": "", "vocab_size": 0, "eos_id": -1}, "domains": {}, "shards": []}')
with open(os.path.join(data, "tokenizer.json"), "rb") as f:
    tok = f.read()
put("tokenizer_json", "trained", tok)
shards = sorted(os.path.join(r, n) for r, _, ns in os.walk(os.path.join(data, "shards")) for n in ns)
for i, s in enumerate(shards[:2]):
    with open(s, "rb") as f:
        z = f.read()
    put("shard_reader", f"zst{i}", b"\x01" + z)
    raw = subprocess.run(["zstd", "-q", "-d", "-c"], input=z, stdout=subprocess.PIPE, check=True).stdout
    put("shard_reader", f"tar{i}", b"\x00" + raw)
    put("shard_reader", f"tar{i}_truncated", b"\x00" + raw[: len(raw) // 2])

# gpt2_vocab_merges: a small pair written by kiln, and the GPT-2 test files' first merges.
pair = os.path.join(tmp, "pair")
os.makedirs(pair)
kiln("tokenizer", "train", "--vocab-size", "280", "--input", corpus, "--output", os.path.join(pair, "t.json"))
with open(os.path.join(pair, "t.json")) as f:
    t = json.load(f)
vocab = json.dumps(t["vocab"], ensure_ascii=False)
merges = "#version: 0.2\n" + "\n".join(t["merges"]) + "\n"
put("gpt2_vocab_merges", "kiln_pair", (vocab + "\n#kiln-fuzz-merges\n" + merges).encode())
with open(os.path.join(SRC, "tests/data/gpt2/merges.txt"), encoding="utf-8") as f:
    gm = f.read().splitlines()[:200]
put("gpt2_vocab_merges", "gpt2_merges_only", (vocab + "\n#kiln-fuzz-merges\n" + "\n".join(gm) + "\n").encode())
shutil.rmtree(tmp)
for target in sorted(os.listdir(OUT)):
    print(target, len(os.listdir(os.path.join(OUT, target))), "seeds")
exec(open(os.path.join(HERE, "make_seeds_issue39.py")).read())
