"""`kiln tokenizer` as a user runs it: GPT-2 ids on the fixed sample (computed independently by the
gpt-3-encoder JS package, tests/data/gpt2/sample.ids), decode(encode(x)) == x through the CLI,
training a tokenizer from files and using it, and the exit codes of bad input.

usage: tokenizer_cli.py KILN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

kiln, src, work = sys.argv[1:4]
gpt2 = os.path.join(src, "tests", "data", "gpt2")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, stdin=b""):
    p = subprocess.run([kiln] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr


sample = open(os.path.join(gpt2, "sample.txt"), "rb").read()
expected = open(os.path.join(gpt2, "sample.ids")).read().split()
vm = ["--vocab", os.path.join(gpt2, "vocab.json"), "--merges", os.path.join(gpt2, "merges.txt")]

rc, out, err = run(["tokenizer", "encode"] + vm, sample)
check(rc == 0, "encode exits 0 (%s)" % err.decode(errors="replace").strip())
lines = out.decode().split("\n")
check(len(lines) == 2 and lines[1] == "", "encode prints one line")
check(lines[0].split() == expected, "GPT-2 ids equal the independent JS encoder's (%d tokens)" % len(expected))

rc, out, _ = run(["tokenizer", "decode", "--tokenizer", os.path.join(gpt2, "vocab.json")],
                 " ".join(expected).encode())
check(rc == 0 and out == sample, "decode gives the sample back byte for byte")

# Train on a small mixed corpus given as a folder of text files plus a JSONL file.
corpus = os.path.join(work, "corpus")
os.makedirs(corpus)
with open(os.path.join(corpus, "a.txt"), "w") as f:
    f.write("the quick brown fox jumps over the lazy dog\n" * 50)
with open(os.path.join(corpus, "b.jsonl"), "w") as f:
    for i in range(50):
        f.write(json.dumps({"text": "我们使用深度学习训练语言模型。第%d行" % i}, ensure_ascii=False) + "\n")
    f.write("not json\n")
tok = os.path.join(work, "tok.json")
rc, out, err = run(["tokenizer", "train", "--vocab-size", "300", "--input", corpus, "--output", tok])
check(rc == 0, "train exits 0 (%s)" % err.decode(errors="replace").strip())
check(b"trained" in out, "train reports what it did")
t = json.load(open(tok))
check(t["model"]["type"] == "BPE" and
      [(a["id"], a["content"], a["special"]) for a in t["added_tokens"]] == [(0, "<|endoftext|>", True)],
      "tokenizer file: Hugging Face tokenizer.json, <|endoftext|> special at id 0")
check(t["pre_tokenizer"]["pretokenizers"][0]["type"] == "Split" and
      t["pre_tokenizer"]["pretokenizers"][1]["type"] == "ByteLevel",
      "tokenizer file: kiln-v1 as a Split regex, then ByteLevel")
vocab_size = len(t["model"]["vocab"])
check(vocab_size <= 300 and len(t["model"]["merges"]) == vocab_size - 257,
      "tokenizer file: vocab and merges sizes agree")

texts = ["the lazy dog", "深度学习", "mixed 中文 and English 😀\n\ttabs", "\u0301\u0000\x1b[0m", ""]
for text in texts:
    rc, out, _ = run(["tokenizer", "encode", "--tokenizer", tok], text.encode())
    rc2, back, _ = run(["tokenizer", "decode", "--tokenizer", tok], out)
    check(rc == 0 and rc2 == 0 and back == text.encode(), "round trip through the CLI: %r" % text)
rc, out, _ = run(["tokenizer", "encode", "--tokenizer", tok], b" the lazy dog")
check(len(out.split()) <= 6, "trained merges apply (%s)" % out.decode().strip())

# Errors: usage 2, data 3.
check(run(["tokenizer", "encode"])[0] == 2, "encode without a tokenizer exits 2")
check(run(["tokenizer", "train", "--vocab-size", "100", "--input", corpus, "--output", tok])[0] == 2,
      "vocab size below 257 exits 2")
check(run(["tokenizer", "train", "--vocab-size", "300", "--input", os.path.join(work, "missing"),
           "--output", tok])[0] == 2, "missing input exits 2")
check(run(["tokenizer", "decode", "--tokenizer", tok], b"1 2 999999")[0] == 3, "out-of-range id exits 3")
check(run(["tokenizer", "decode", "--tokenizer", tok], b"1 x")[0] == 3, "non-numeric id exits 3")
bad = os.path.join(work, "bad.json")
open(bad, "w").write('{"format": "kiln-tokenizer/1", "vocab": 3}')
check(run(["tokenizer", "encode", "--tokenizer", bad], b"x")[0] == 3, "malformed tokenizer file exits 3")
# An unsupported tokenizer.json: refused naming the file and the field.
t["model"]["type"] = "WordPiece"
open(bad, "w").write(json.dumps(t))
rc, _, err = run(["tokenizer", "encode", "--tokenizer", bad], b"x")
check(rc == 3 and b"bad.json" in err and b"model.type" in err and b"WordPiece" in err,
      "a WordPiece tokenizer.json exits 3 naming the file and model.type (%s)" % err.decode().strip())

# --jsonl: one line of ids per JSON line, equal to encoding each text alone.
docs = ["the lazy dog", "深度学习\n", "a\u0000b"]
rc, out, _ = run(["tokenizer", "encode", "--tokenizer", tok, "--jsonl"],
                 "".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
alone = [run(["tokenizer", "encode", "--tokenizer", tok], d.encode())[1].decode() for d in docs]
check(rc == 0 and out.decode() == "".join(alone), "--jsonl equals encoding each text alone")
check(run(["tokenizer", "encode", "--tokenizer", tok, "--jsonl"], b"nope\n")[0] == 3,
      "--jsonl with a line that is not JSON exits 3")

# Kiln's older kiln-tokenizer/1 file is still read (written here by hand: 256 bytes, one merge).
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
spell = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {"<|endoftext|>": 0}
for b in range(256):
    vocab[spell[b]] = b + 1
vocab[spell[ord("a")] + spell[ord("b")]] = 257
old = {"format": "kiln-tokenizer/1", "type": "byte-bpe", "pretokenizer": {"type": "kiln-v1", "cjk_chunk": 0},
       "vocab_size": 258, "eos_id": 0, "special_tokens": {"<|endoftext|>": 0}, "vocab": vocab,
       "merges": [spell[ord("a")] + " " + spell[ord("b")]]}
old_path = os.path.join(work, "old.json")
json.dump(old, open(old_path, "w"), ensure_ascii=False)
rc, out, err = run(["tokenizer", "encode", "--tokenizer", old_path], b"abc ab")
check(rc == 0 and out.split() == [b"257", b"100", b"33", b"257"],
      "an older kiln-tokenizer/1 file still encodes (%s%s)" % (out.decode().strip(), err.decode().strip()))

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
