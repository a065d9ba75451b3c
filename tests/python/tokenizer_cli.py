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
check(t["format"] == "kiln-tokenizer/1" and t["eos_id"] == 0 and t["special_tokens"] == {"<|endoftext|>": 0},
      "tokenizer file: format, eos_id, special tokens")
check(len(t["vocab"]) == t["vocab_size"] <= 300 and len(t["merges"]) == t["vocab_size"] - 257,
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

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
