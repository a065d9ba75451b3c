#!/usr/bin/python3
"""Token ids of `kiln tokenizer encode` equal Hugging Face tokenizers' (the npm package
`tokenizers`, a native build of the Rust library, installed by tools/hf_tokenizers/install) on a
mixed corpus: English (licence texts, the GPT-2 sample), source code (Kiln's own), Chinese (man
pages), emoji (ZWJ sequences, flags, skin tones), and invalid-looking text (U+FFFD, C0/C1 controls,
U+0085, U+FEFF, U+2028, private use, noncharacters, lone combining marks, fullwidth and Arabic
digits, the long s and the Kelvin sign that case folding maps onto ASCII), plus random strings of
all of those. For each tokenizer.json:

1. Kiln's own: `kiln tokenizer train` (kiln-v1 pre-tokenizer, written as a Split regex);
2. Llama-3 style: `kiln tokenizer train --pattern` with Llama 3's pre-tokenizer regex;
3. Qwen2 style: (2) with Qwen2's regex, an NFC normalizer, ignore_merges and a non-special added
   token;
4. Mistral-Nemo style: (2) with Tekken's regex;
5. GPT-2: tests/data/gpt2 as a tokenizer.json (ByteLevel pre-tokenizer, merges as pairs);
6. the same with add_prefix_space (decoding gives the text with a space in front);
7. Llama-3 style with an NFC normalizer and non-special added tokens carrying Hugging Face's flags
   (lstrip, rstrip, single_word, normalized true and false; ASCII, accented, CJK), on documents
   that exercise them (whitespace runs, word characters and marks beside a token, composed and
   decomposed text); decoding gives the text less the stripped whitespace, as Hugging Face's.

every document's ids are equal (documents holding a special token's text apart: Hugging Face
makes it the special id, Kiln keeps it text, checked), Hugging Face decodes Kiln's ids to the document, and
`kiln tokenizer decode` gives back every document byte for byte (decode(encode(x)) == x).
Invalid UTF-8 cannot be given to Hugging Face (its input is a string); Kiln's round trip on raw
bytes is tested in tests/dataprep/tokenizer_test.cc.

Exits 77 (skipped) when node / npm or the package are not available.
usage: tokenizer_hf_parity.py KILN_BINARY SOURCE_DIR WORK_DIR
"""
import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata

kiln, src, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
hf_dir = os.path.join(src, "tools", "hf_tokenizers")
if subprocess.run([os.path.join(hf_dir, "install")]).returncode != 0:
    print("SKIP: Hugging Face tokenizers (npm) not available")
    sys.exit(77)

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
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
NEMO = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"""
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# ---- the corpus ------------------------------------------------------------------------------
rng = random.Random(31)
docs = []
sample = open(os.path.join(src, "tests", "data", "gpt2", "sample.txt"), encoding="utf-8").read()
docs += [p for p in sample.split("\n\n") if p]
for lic in ("GPL-3", "Apache-2.0", "MPL-2.0", "BSD"):
    path = os.path.join("/usr/share/common-licenses", lic)
    if os.path.exists(path):
        text = open(path, encoding="utf-8", errors="replace").read()
        docs += [text[i:i + 3000] for i in range(0, min(len(text), 30000), 3000)]
for path in sorted(glob.glob(os.path.join(src, "dataprep", "tokenizer", "*.cc")))[:6]:
    text = open(path, encoding="utf-8").read()
    docs += [text[i:i + 4000] for i in range(0, min(len(text), 16000), 4000)]
for path in sorted(glob.glob("/usr/share/man/zh_CN/man1/*.gz"))[:40]:
    text = gzip.open(path).read().decode("utf-8", errors="replace")
    docs.append(text[:5000])
docs += [
    "我们使用深度学习训练语言模型。GPU训练好了！東京は日本の首都です。한국어 텍스트도 있습니다.",
    "Family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin 👍🏽👋🏿, keycap 1️⃣, 😀😃😄 emoji runs 🔥🔥🔥",
    "\ufffd\ufffd replacement, \x00\x01\x1b[0m controls \x7f\x80\x9f C1, NEL\x85x, BOM\ufeffy, LS\u2028PS\u2029",
    "private \ue000\uf8ff, nonchar \uffff\ufffe \U0010ffff, lone marks \u0301\u0308a\u0301, \u3099\u309b",
    "digits 1234567 ١٢٣٤٥ １２３４ Ⅻ ½ ² and ſ long s, it'ſ, \u212a Kelvin, DON'T 'S 'll 'Re 'VE",
    "whitespace \n\n   \t  \r\n\r\n\u3000\u3000x\u00a0\u00a0y\u2003z   \n",
    "code:\n\tif (x->y != NULL) { return a[i++] << 2; }  // comment\n    def f(x): return x**2\n",
    "URL https://example.com/a?b=c&d=e#f and e-mail someone@example.org, path C:\\Users\\x",
    "",
    " ",
    "'",
]
pool = ([chr(c) for c in range(0x20, 0x7f)] + list("  \n\n\t\r'sStTlLdDmMreREvV") +
        ["\u0085", "\u00a0", "\u1680", "\u2000", "\u2028", "\u202f", "\u3000", "\ufeff", "\u200b",
         "\u0301", "\u3099", "\u30fb", "\u30fc", "\u3005", "\u017f", "\u212a", "\u0660", "\uff11",
         "\u2162", "\u00bd", "\ufffd", "\ue000", "\u200d", "😀", "👍", "🇫"] +
        [chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(40)] +
        [chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(10)] +
        [chr(rng.randint(0x3040, 0x30FF)) for _ in range(10)] +
        [chr(rng.randint(0x0400, 0x04FF)) for _ in range(10)] +
        [chr(rng.randint(0x20000, 0x2A6DF)) for _ in range(5)])
for _ in range(400):
    docs.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 80))))

docs_path = os.path.join(work, "docs.jsonl")
with open(docs_path, "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
train_path = os.path.join(work, "train.jsonl")
with open(train_path, "w", encoding="utf-8") as f:
    for d in docs[: len(docs) * 2 // 3]:
        f.write(json.dumps({"text": d}) + "\n")
print("corpus: %d documents, %d characters" % (len(docs), sum(len(d) for d in docs)))

# ---- the tokenizers --------------------------------------------------------------------------
tokenizers = {}


def train(name, extra):
    path = os.path.join(work, name, "tokenizer.json")
    os.makedirs(os.path.dirname(path))
    rc, _, err = run(["tokenizer", "train", "--vocab-size", "3000", "--input", train_path,
                      "--output", path] + extra)
    check(rc == 0, "train %s (%s)" % (name, err.decode(errors="replace").strip()[-300:]))
    tokenizers[name] = path
    return path


train("kiln", [])
llama3 = train("llama3", ["--pattern", LLAMA3])


def variant(name, edit):
    t = json.load(open(llama3, encoding="utf-8"))
    edit(t)
    path = os.path.join(work, name, "tokenizer.json")
    os.makedirs(os.path.dirname(path))
    json.dump(t, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    tokenizers[name] = path


def qwen2(t):
    t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2
    t["normalizer"] = {"type": "NFC"}
    t["model"]["ignore_merges"] = True
    n = len(t["model"]["vocab"])
    t["added_tokens"].append({"id": n, "content": "<tool_call>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": False})
    t["model"]["vocab"]["<tool_call>"] = n


variant("qwen2", qwen2)


# Added tokens with Hugging Face's flags (lstrip, rstrip, single_word, normalized) under an NFC
# normalizer: whitespace taken into the token, matches beside word characters dropped, tokens
# matched in the raw text (normalized false) before those matched in the normalised text.
FLAGGED = [("<mask>", dict(lstrip=True, single_word=True, normalized=False)),
           ("[SEP]", dict(rstrip=True, normalized=False)),
           ("ony", dict(single_word=True, normalized=True)),
           ("<tab>", dict(lstrip=True, rstrip=True, single_word=True, normalized=True)),
           ("Cafe\u0301", dict(normalized=True)),
           ("e\u0301x", dict(normalized=False)),
           ("<m", dict(normalized=True)),
           ("日本", dict(single_word=True, normalized=False))]


def added_flags(t):
    t["normalizer"] = {"type": "NFC"}
    n = len(t["model"]["vocab"])
    for k, (content, flags) in enumerate(FLAGGED):
        a = {"id": n + k, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False}
        a.update(flags)
        t["added_tokens"].append(a)


variant("added_flags", added_flags)
variant("nemo", lambda t: t["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=NEMO))
gpt2 = os.path.join(src, "tests", "data", "gpt2")
vocab = json.load(open(os.path.join(gpt2, "vocab.json"), encoding="utf-8"))
merges = [l.split(" ") for l in open(os.path.join(gpt2, "merges.txt"), encoding="utf-8").read().split("\n")[1:] if l]
os.makedirs(os.path.join(work, "gpt2"))
tokenizers["gpt2"] = os.path.join(work, "gpt2", "tokenizer.json")
json.dump({"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": True, "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                     "vocab": vocab, "merges": merges}},
          open(tokenizers["gpt2"], "w", encoding="utf-8"), ensure_ascii=False)
# GPT-2 with add_prefix_space (RoBERTa style): a space before each text that lacks one.
t = json.load(open(tokenizers["gpt2"], encoding="utf-8"))
t["pre_tokenizer"]["add_prefix_space"] = True
os.makedirs(os.path.join(work, "gpt2_prefix"))
tokenizers["gpt2_prefix"] = os.path.join(work, "gpt2_prefix", "tokenizer.json")
json.dump(t, open(tokenizers["gpt2_prefix"], "w", encoding="utf-8"), ensure_ascii=False)
# Documents that hold the added token, for the Qwen2 style.
extra_docs = ["call <tool_call>{\"name\": 1}<tool_call> done", "<tool_call><tool_call>x"]
flag_docs = ["Hi <mask> there\t<mask>\t<mask>\u2000 end", "x<mask>y [SEP]   next [SEP]\n\nz [SEP]",
             "<mask>, <mask>- \u25cc\u0330<mask> Anthony ony ony_ ony1 (ony) \u24b6ony ony",
             "a <tab> b\t<tab>\tc a<tab>b <tab>", "  <mask>  [SEP]", "[SEP]<mask> [SEP] <mask>",
             "Caf\u00e9 Cafe\u0301 cafe\u0301 e\u0301x ex \u00e9x <mask <m<mask>",
             "日本語 日本 中日本 日本_ 日本。", "ony\u00a0ony\u3000<tab>\u3000ony", "\u0301ony ony\u0301"]

# ---- compare ---------------------------------------------------------------------------------
for name, path in tokenizers.items():
    these = docs + (extra_docs if name == "qwen2" else []) + (flag_docs if name == "added_flags" else [])
    dpath = os.path.join(work, name, "docs.jsonl")
    with open(dpath, "w", encoding="utf-8") as f:
        for d in these:
            f.write(json.dumps({"text": d}) + "\n")
    rc, out, err = run(["tokenizer", "encode", "--tokenizer", path, "--jsonl"], open(dpath, "rb").read())
    if not check(rc == 0, "%s: kiln encodes (%s)" % (name, err.decode(errors="replace").strip()[-300:])):
        continue
    kiln_ids = [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]
    hf_out = os.path.join(work, name, "hf.jsonl")
    p = subprocess.run(["node", os.path.join(hf_dir, "encode.js"), "ids", path, dpath, hf_out],
                       stderr=subprocess.PIPE)
    if not check(p.returncode == 0, "%s: Hugging Face loads and encodes (%s)" %
                 (name, p.stderr.decode(errors="replace").strip()[-300:])):
        continue
    hf = [json.loads(l) for l in open(hf_out, encoding="utf-8")]
    check(len(kiln_ids) == len(hf) == len(these), "%s: one line per document" % name)
    # Hugging Face turns special-token text inside a document into the special id; Kiln keeps it
    # text (a document cannot inject an end-of-text): such documents are compared apart.
    tj = json.load(open(path, encoding="utf-8"))
    specials = {a["content"]: a["id"] for a in tj["added_tokens"] if a.get("special")}
    with_special = [i for i in range(len(these)) if any(sp in these[i] for sp in specials)]
    check(all(not set(kiln_ids[i]) & set(specials.values()) for i in with_special),
          "%s: special-token text inside %d document(s) stays text in Kiln" % (name, len(with_special)))
    bad = [i for i in range(len(these)) if kiln_ids[i] != hf[i]["ids"] and i not in with_special]
    for i in bad[:3]:
        print("  doc %d %r\n    kiln %s\n    hf   %s" % (i, these[i][:200], kiln_ids[i][:40], hf[i]["ids"][:40]))
    ntok = sum(len(x) for x in kiln_ids)
    check(not bad, "%s: ids equal Hugging Face's on all %d documents without special-token text "
          "(%d tokens; %d differ)" % (name, len(these) - len(with_special), ntok, len(bad)))
    # With an NFC normalizer, decomposed text comes back composed; with add_prefix_space, with a
    # space in front.
    wants = [unicodedata.normalize("NFC", d) if name == "qwen2" else d for d in these]
    if name == "added_flags":
        # Every flag document but the last holds an added token (the last: "ony" beside combining
        # marks, word characters, so single_word drops both).
        held = [any(i >= len(tj["model"]["vocab"]) for i in kiln_ids[len(docs) + k])
                for k in range(len(flag_docs))]
        check(held == [True] * (len(flag_docs) - 1) + [False], "added_flags: added tokens where expected %s" % held)
        # Stripped whitespace is gone: Kiln decodes as Hugging Face does, but where Hugging Face
        # runs a non-ASCII added token's text through the ByteLevel decoder (mojibake: Kiln gives
        # the text): those documents are left out of the decode checks.
        mangled = {a["id"] for a in tj["added_tokens"] if not a["content"].isascii()}
        keep = [i for i in range(len(these)) if not set(kiln_ids[i]) & mangled]
        check(len(keep) < len(these), "added_flags: some documents hold a non-ASCII added token")
        these, hf, kiln_ids = [these[i] for i in keep], [hf[i] for i in keep], [kiln_ids[i] for i in keep]
        wants = [h["decoded"] for h in hf]
    if name == "gpt2_prefix":
        wants = [" " + d if d and not d.startswith(" ") else d for d in these]
    undec = [i for i in range(len(these)) if hf[i]["decoded"] != wants[i] and i not in with_special]
    check(not undec, "%s: Hugging Face decodes every document back (%d do not)" % (name, len(undec)))
    # decode(encode(x)) == x through Kiln: all documents' ids in one line decode to all the text.
    rc, back, err = run(["tokenizer", "decode", "--tokenizer", path],
                        " ".join(str(i) for ids in kiln_ids for i in ids).encode())
    check(rc == 0 and back == "".join(wants).encode("utf-8"), "%s: kiln decode(encode(x)) == x" % name)

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
