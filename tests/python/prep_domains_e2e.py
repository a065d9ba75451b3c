#!/usr/bin/python3
"""End to end: `kiln prep` on a mixed corpus (English prose, source code, Chinese text, licence
texts; JSONL plus a text folder) with the default domain rules and a tokenizer trained on the
kept documents, then:

1. every document lands in the domain the default rules promise (checked per document id);
2. the shards, read with Python's tarfile + numpy.load grouping members by key the WebDataset way,
   agree with manifest.json and stats.json (samples and tokens per shard and per domain,
   docs_in = docs_out + exact_dups + near_dups + rejected), keys are unique, token arrays have
   the dtype the vocabulary calls for and match `kiln tokenizer encode` of the stored text;
3. `kiln inspect OUT --verify` exits 0, and exits 3 once a shard is damaged;
4. running prep again gives byte-identical shards.

usage: prep_domains_e2e.py KILN_BINARY WORK_DIR
"""
import hashlib
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
    if not cond:
        print("FAIL " + what)
        failures.append(what)
    return cond


def run(args, stdin=b""):
    p = subprocess.run([kiln] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr


rng = random.Random(7)
WORDS = ("river village morning market garden evening children history people story letter "
         "mountain harbour winter summer teacher library window kitchen journey").split()
ZH = "我们 使用 中文 文本 训练 语言 模型 数据 处理 人工 智能 方法 研究 城市 学校 天气 朋友 历史 文化 经济".split()
expected = {}  # document id -> domain
lines = []


def add(doc_id, text, want, **fields):
    expected[doc_id] = want
    lines.append(dict(id=doc_id, text=text, **fields))


for i in range(40):  # English prose: no rule matches -> the default domain "web"
    sentences = []
    for _ in range(6):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 14))]
        sentences.append(" ".join(words).capitalize() + ".")
    add("prose-%d" % i, " ".join(sentences), "web")
for i in range(25):  # C and Python code by content -> code (rule code-content)
    if i % 2:
        body = "\n".join("    total += values[%d] * %d;" % (k, rng.randint(1, 99)) for k in range(6))
        text = "#include <stdio.h>\n\nstatic int f%d(const int* values) {\n    int total = 0;\n%s\n    return total;\n}\n" % (i, body)
    else:
        body = "\n".join("        if x > %d:\n            y += %d;" % (rng.randint(0, 9), k) for k in range(5))
        text = "def g%d(x):\n    y = 0\n    for _ in range(3) {\n%s\n    }\n    return y;\n" % (i, body)
    add("code-%d" % i, text, "code")
for i in range(30):  # Chinese -> zh (rule zh)
    text = "".join(rng.choice(ZH) for _ in range(rng.randint(20, 40))) + "。第%d段。" % i
    add("zh-%d" % i, text, "zh")
for i, title in enumerate(["GNU GENERAL PUBLIC LICENSE", "Apache License", "Mozilla Public License"]):
    add("legal-%d" % i, "        %s\n  Version %d\n\n" % (title, i + 2) +
        " ".join(rng.choice(WORDS) for _ in range(80)), "legal")
add("declared-0", "A document whose input declares its domain.", "news", domain="news")
# Exact and near duplicates of kept documents (removed, not tagged).
lines.append(dict(id="dup-exact", text=lines[0]["text"]))
lines.append(dict(id="dup-near", text=lines[1]["text"] + " Extra."))

corpus = os.path.join(work, "corpus")
os.makedirs(corpus)
with open(os.path.join(corpus, "mixed.jsonl"), "w", encoding="utf-8") as f:
    for line in lines:
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
# A text folder: ids are relative paths; file names drive the code-files / legal-files rules.
folder = os.path.join(corpus, "tree")
os.makedirs(os.path.join(folder, "src"))
os.makedirs(os.path.join(folder, "doc", "pkg"))
with open(os.path.join(folder, "src", "tiny.h"), "w") as f:
    f.write("Just words in a header file name, no symbols at all\n")
expected["src/tiny.h"] = "code"
with open(os.path.join(folder, "doc", "pkg", "copyright"), "w") as f:
    f.write("Files: *\nCopyright: someone\nLicense: permissive words here\n")
expected["doc/pkg/copyright"] = "legal"
with open(os.path.join(folder, "notes.txt"), "w") as f:
    f.write("Some plain notes about the garden and the river in winter.\n")
expected["notes.txt"] = "web"

out = os.path.join(work, "out")
prep_args = ["prep", "--input", os.path.join(corpus, "mixed.jsonl"), folder, "--output", out,
             "--set", "tokenizer.vocab_size=1024"]
rc, so, se = run(prep_args)
if not check(rc == 0, "kiln prep exits 0: %s" % se.decode(errors="replace")[-2000:]):
    sys.exit(1)

manifest = json.load(open(os.path.join(out, "manifest.json")))
stats = json.load(open(os.path.join(out, "stats.json")))
tok = manifest["tokenizer"]
check(tok["path"] == "tokenizer.json" and tok["eos_id"] == 0 and 257 < tok["vocab_size"] <= 1024,
      "manifest tokenizer entry %s" % tok)
dtype = np.uint16 if tok["vocab_size"] <= 65536 else np.uint32


def read_shard(path):
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        data = subprocess.run(["zstd", "-dc"], input=data, stdout=subprocess.PIPE, check=True).stdout
    samples = []  # WebDataset grouping: consecutive members sharing the key before the first dot
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            base = os.path.basename(m.name)
            key, ext = base.split(".", 1)
            if not samples or samples[-1]["__key__"] != key:
                samples.append({"__key__": key})
            samples[-1][ext] = tar.extractfile(m).read()
    return samples


seen_keys, seen_ids = set(), {}
per_domain = {}
texts_to_encode = []
for shard in manifest["shards"]:
    path = os.path.join(out, shard["path"])
    check(shard["path"].startswith("shards/%s/%s-" % (shard["domain"], shard["domain"])),
          "shard path %s" % shard["path"])
    samples = read_shard(path)
    tokens = 0
    for s in samples:
        check(set(s) == {"__key__", "txt", "json", "tokens.npy"}, "members of %s: %s" % (s["__key__"], sorted(s)))
        check(s["__key__"] not in seen_keys, "key %s unique" % s["__key__"])
        seen_keys.add(s["__key__"])
        meta = json.loads(s["json"])
        arr = np.load(io.BytesIO(s["tokens.npy"]))
        check(arr.dtype == dtype and arr.ndim == 1, "token dtype %s" % arr.dtype)
        check(meta["tokens"] == len(arr), "json tokens == npy length for %s" % meta["id"])
        check(meta["domain"] == shard["domain"], "json domain == shard domain for %s" % meta["id"])
        seen_ids[str(meta["id"])] = shard["domain"]
        tokens += len(arr)
        if len(texts_to_encode) < 12 or meta["id"] in ("zh-3", "code-3", "src/tiny.h"):
            texts_to_encode.append((s["txt"], arr))
    check(len(samples) == shard["samples"], "samples of %s: %d vs manifest %d" % (shard["path"], len(samples), shard["samples"]))
    check(tokens == shard["tokens"], "tokens of %s" % shard["path"])
    d = per_domain.setdefault(shard["domain"], [0, 0, 0])
    d[0] += len(samples)
    d[1] += tokens
    d[2] += 1

# 1. every document is where the default rules put it
for doc_id, domain in expected.items():
    check(seen_ids.get(doc_id) == domain, "document %s in domain %s (found %s)" % (doc_id, domain, seen_ids.get(doc_id)))
check("dup-exact" not in seen_ids and "dup-near" not in seen_ids, "duplicates removed")
check(len(seen_ids) == len(expected), "documents out: %d, expected %d" % (len(seen_ids), len(expected)))

# 2. manifest, stats and shards agree
for name, (samples, tokens, shards) in per_domain.items():
    md = manifest["domains"].get(name, {})
    sd = stats["domains"].get(name, {})
    check(md.get("samples") == samples and md.get("tokens") == tokens and md.get("shards") == shards,
          "manifest domain %s" % name)
    check(sd.get("docs") == samples and sd.get("tokens") == tokens, "stats domain %s" % name)
check(set(manifest["domains"]) == set(per_domain) == set(stats["domains"]), "same domains everywhere")
check(stats["docs_in"] == stats["docs_out"] + stats["exact_dups"] + stats["near_dups"] + stats["rejected"],
      "docs_in = docs_out + exact_dups + near_dups + rejected")
check(stats["docs_out"] == len(seen_ids), "stats docs_out")
check(stats["exact_dups"] >= 1 and stats["near_dups"] >= 1, "dedup counted")
check(stats["domains"]["zh"]["domain_by"] == {"rule:zh": 30}, "zh assigned by rule:zh: %s" % stats["domains"]["zh"]["domain_by"])
tokfile = os.path.join(out, "tokenizer.json")
for text, arr in texts_to_encode:
    rc, ids, _ = run(["tokenizer", "encode", "--tokenizer", tokfile], text)
    check(rc == 0 and [int(x) for x in ids.split()] == arr.tolist(), "tokens == kiln tokenizer encode(txt)")

# 3. inspect --verify
rc, so, se = run(["inspect", out, "--verify", "--sample", "3"])
check(rc == 0, "kiln inspect --verify exits 0:\n%s%s" % (so.decode(errors="replace"), se.decode(errors="replace")))
check(b"sample 3/3" in so and b"balanced" in so, "inspect prints samples and the balance")

# 4. rerun: byte-identical shards
out2 = os.path.join(work, "out2")
rc, _, se = run(prep_args[:5] + [out2] + prep_args[6:])
check(rc == 0, "second prep exits 0")
for shard in manifest["shards"]:
    a = hashlib.sha256(open(os.path.join(out, shard["path"]), "rb").read()).hexdigest()
    b = hashlib.sha256(open(os.path.join(out2, shard["path"]), "rb").read()).hexdigest()
    check(a == b, "byte-identical rerun: %s" % shard["path"])
check(open(os.path.join(out, "tokenizer.json"), "rb").read() == open(os.path.join(out2, "tokenizer.json"), "rb").read(),
      "byte-identical tokenizer")

# damage one shard: inspect --verify must fail with exit 3
victim = os.path.join(out2, manifest["shards"][0]["path"])
data = bytearray(open(victim, "rb").read())
data[len(data) // 2] ^= 0xFF
open(victim, "wb").write(bytes(data))
rc, so, _ = run(["inspect", out2, "--verify"])
check(rc == 3, "inspect --verify exits 3 on a damaged shard (got %d)" % rc)

print("%d document(s), %d domain(s), %d failure(s)" % (len(seen_ids), len(per_domain), len(failures)))
sys.exit(1 if failures else 0)
