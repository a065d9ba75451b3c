#!/usr/bin/python3
"""`kiln prep --tokenizer` with tokenizers from elsewhere, as a user runs it:

1. a Hugging Face tokenizer.json (Llama-3 style: Kiln-trained merges, Llama 3's regex): the shards'
   tokens equal `kiln tokenizer encode` of each stored text, OUT/tokenizer.json is the given file
   byte for byte, manifest.json names it with its vocabulary size and end-of-text id, and
   `kiln inspect --verify` passes (as for every dataset here);
2. a SentencePiece .model (trained here with Debian's python3-sentencepiece, as Llama 2's are): the
   shards' tokens equal SentencePiece's own encoding (the Python binding, no BOS), OUT/tokenizer.model
   is the model;
3. a tokenizer.json of more than 65535 tokens: token arrays are uint32 (uint16 otherwise);
4. an unsupported tokenizer.json (WordPiece) is refused, exit 3, naming the file and the field.

usage: tokenizer_hf_prep.py KILN_BINARY WORK_DIR
"""
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

import numpy as np

kiln, work = sys.argv[1:3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def run(args, stdin=b""):
    p = subprocess.run([kiln] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr


LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
rng = random.Random(3)
WORDS = "river village morning market garden evening children history people story letter".split()
ZH = "我们 使用 中文 文本 训练 语言 模型 数据 处理".split()
corpus = os.path.join(work, "corpus.jsonl")
with open(corpus, "w", encoding="utf-8") as f:
    for i in range(60):
        if i % 3 == 0:
            text = "".join(rng.choice(ZH) for _ in range(30)) + "。第%d段 😀" % i
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(40)) + ". It's %d, DON'T 12345.\n\n  x" % i
        f.write(json.dumps({"id": "d%d" % i, "text": text}, ensure_ascii=False) + "\n")


def shard_samples(out):
    """(text, tokens array) of every sample of every shard."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    samples = []
    for sh in manifest["shards"]:
        path = os.path.join(out, sh["path"])
        data = open(path, "rb").read()
        if path.endswith(".zst"):
            data = subprocess.run(["zstd", "-dc"], input=data, stdout=subprocess.PIPE).stdout
        groups = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                groups.setdefault(key, {})[ext] = tar.extractfile(m).read()
        for key in sorted(groups):
            g = groups[key]
            samples.append((g["txt"].decode("utf-8"), np.load(io.BytesIO(g["tokens.npy"]))))
    return manifest, samples


def prep(name, tokenizer):
    out = os.path.join(work, name)
    rc, _, err = run(["prep", "--input", corpus, "--output", out, "--tokenizer", tokenizer])
    check(rc == 0, "%s: kiln prep --tokenizer exits 0 (%s)" % (name, err.decode(errors="replace").strip()[-300:]))
    rc, text, err = run(["inspect", out, "--verify"])
    check(rc == 0, "%s: kiln inspect --verify passes (%s)" % (name, (text + err).decode(errors="replace").strip()[-300:]))
    return out


def kiln_ids(tokenizer, texts):
    rc, out, _ = run(["tokenizer", "encode", "--tokenizer", tokenizer, "--jsonl"],
                     "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    return [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]


# 1. tokenizer.json with Llama 3's regex.
tok = os.path.join(work, "llama3.json")
rc, _, err = run(["tokenizer", "train", "--vocab-size", "600", "--input", corpus, "--output", tok,
                  "--pattern", LLAMA3])
check(rc == 0, "train a Llama-3-style tokenizer.json (%s)" % err.decode(errors="replace").strip())
out = prep("llama3", tok)
manifest, samples = shard_samples(out)
check(manifest["tokenizer"]["path"] == "tokenizer.json" and manifest["tokenizer"]["eos_id"] == 0,
      "llama3: manifest names tokenizer.json, eos_id 0 (%s)" % manifest["tokenizer"])
check(open(os.path.join(out, "tokenizer.json"), "rb").read() == open(tok, "rb").read(),
      "llama3: OUT/tokenizer.json is the given file byte for byte")
check(len(samples) == 60, "llama3: 60 samples (%d)" % len(samples))
want = kiln_ids(tok, [t for t, _ in samples])
check(all(a.dtype == np.dtype("<u2") for _, a in samples), "llama3: uint16 tokens (a vocabulary under 65536)")
check([a.tolist() for _, a in samples] == want, "llama3: shard tokens equal kiln tokenizer encode")

# 2. SentencePiece .model.
try:
    import sentencepiece as spm
except ImportError:
    spm = None
if check(spm is not None, "python3-sentencepiece is installed"):
    texts = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8")]
    open(os.path.join(work, "sp.txt"), "w", encoding="utf-8").write("\n".join(texts * 5))
    spm.SentencePieceTrainer.train(input=os.path.join(work, "sp.txt"), model_prefix=os.path.join(work, "sp"),
                                   vocab_size=700, hard_vocab_limit=False, model_type="bpe", byte_fallback=True,
                                   character_coverage=1.0, minloglevel=2, num_threads=1)
    model = os.path.join(work, "sp.model")
    out = prep("sentencepiece", model)
    manifest, samples = shard_samples(out)
    sp = spm.SentencePieceProcessor(model_file=model)
    check(manifest["tokenizer"]["path"] == "tokenizer.model" and
          manifest["tokenizer"]["vocab_size"] == sp.get_piece_size() and
          manifest["tokenizer"]["eos_id"] == sp.eos_id(),
          "sentencepiece: manifest names tokenizer.model, its size and eos (%s)" % manifest["tokenizer"])
    check(open(os.path.join(out, "tokenizer.model"), "rb").read() == open(model, "rb").read(),
          "sentencepiece: OUT/tokenizer.model is the model")
    check([a.tolist() for _, a in samples] == [sp.encode(t) for t, _ in samples],
          "sentencepiece: shard tokens equal SentencePiece's own encoding")
    rc, out_ids, _ = run(["tokenizer", "encode", "--tokenizer", model], "Hello 我们".encode())
    rc2, back, _ = run(["tokenizer", "decode", "--tokenizer", model], out_ids)
    check(rc == 0 and rc2 == 0 and [int(x) for x in out_ids.split()] == sp.encode("Hello 我们") and
          back.decode() == "Hello 我们", "sentencepiece: kiln tokenizer encode/decode with the .model")

# 3. More than 65535 tokens: uint32 arrays.
t = json.load(open(tok, encoding="utf-8"))
n = len(t["model"]["vocab"])
for k in range(70000 - n):
    t["added_tokens"].append({"id": n + k, "content": "<|reserved_%d|>" % k, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False, "special": True})
big = os.path.join(work, "bigtok", "tokenizer.json")
os.makedirs(os.path.dirname(big))
json.dump(t, open(big, "w", encoding="utf-8"), ensure_ascii=False)
out = prep("big", big)
manifest, samples = shard_samples(out)
check(manifest["tokenizer"]["vocab_size"] == 70000, "big: vocab_size 70000 in the manifest")
check(samples and all(a.dtype == np.dtype("<u4") for _, a in samples), "big: uint32 tokens")
check([a.tolist() for _, a in samples] == kiln_ids(big, [s for s, _ in samples]),
      "big: shard tokens equal kiln tokenizer encode")

# 4. Unsupported: refused naming the file and the field.
t = json.load(open(tok, encoding="utf-8"))
t["model"]["type"] = "WordPiece"
bad = os.path.join(work, "wordpiece.json")
json.dump(t, open(bad, "w", encoding="utf-8"))
rc, _, err = run(["prep", "--input", corpus, "--output", os.path.join(work, "bad"), "--tokenizer", bad])
check(rc == 3 and b"wordpiece.json" in err and b"model.type" in err,
      "a WordPiece tokenizer.json: prep exits 3 naming the file and model.type (%d, %s)" %
      (rc, err.decode(errors="replace").strip()[-300:]))

# 5. tokenizer.special_tokens: special-token text in documents stays text by default; "parse"
# makes it the special id, as `kiln tokenizer encode --special-tokens parse` does.
chat = os.path.join(work, "chat.jsonl")
with open(chat, "w", encoding="utf-8") as f:
    for i in range(20):
        f.write(json.dumps({"id": "c%d" % i, "text": "<|endoftext|>user: %s, number %d.<|endoftext|>" % (
            " ".join(rng.choice(WORDS) for _ in range(40)), i)}) + "\n")
for mode in ("text", "parse"):
    out = os.path.join(work, "chat_" + mode)
    rc, _, err = run(["prep", "--input", chat, "--output", out, "--tokenizer", tok,
                      "--set", "tokenizer.special_tokens=" + mode, "--set", "dedup.exact=false",
                      "--set", "dedup.near=false"])
    if not check(rc == 0, "special_tokens=%s: prep exits 0 (%s)" % (mode, err.decode(errors="replace").strip()[-300:])):
        continue
    manifest, samples = shard_samples(out)
    rc, ids_out, _ = run(["tokenizer", "encode", "--tokenizer", tok, "--jsonl", "--special-tokens", mode],
                         "".join(json.dumps({"text": t}) + "\n" for t, _ in samples).encode())
    want = [[int(x) for x in line.split()] for line in ids_out.decode().split("\n")[:-1]]
    got = [a.tolist() for _, a in samples]
    check(samples and got == want, "special_tokens=%s: shard tokens equal kiln tokenizer encode "
          "--special-tokens %s (%d samples)" % (mode, mode, len(samples)))
    eos_count = sum(a.count(0) for a in got)
    check(eos_count == (2 * len(samples) if mode == "parse" else 0),
          "special_tokens=%s: the end-of-text id %d times" % (mode, eos_count))
rc, _, err = run(["prep", "--input", chat, "--output", os.path.join(work, "chat_bad"), "--tokenizer", tok,
                  "--set", "tokenizer.special_tokens=maybe"])
check(rc == 2 and b"tokenizer.special_tokens" in err,
      "special_tokens=maybe: exit 2 naming the key (%d, %s)" % (rc, err.decode(errors="replace").strip()[-200:]))

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
