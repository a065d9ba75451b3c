#!/usr/bin/python3
"""Hostile tokenizer files and texts through `kiln tokenizer encode` (issue 39): each ends in
bounded time with a clear result.

1. A Split pattern with catastrophic backtracking ((a+)+$ on 3 KB of 'a' then '!'): exit 3, the
   message names the pattern and says why (PCRE2's match limit), well within the time limit.
2. A 10 MB added token ('q' * 10M) on 1 MiB of 'q' (with a short added token matching all over it): the ids
   are right (the short token 262,144 times, the long one never) and it ends in seconds (one
   Aho-Corasick automaton; the per-position comparison took 23 s).
3. A SentencePiece .model (trained here by the SentencePiece library, nmt_nfkc normalization)
   whose precompiled charsmap has 4 bytes changed: exit 3 naming the charsmap (the library itself
   crashes on it); the intact model still encodes, with the library's ids.
4. A protobuf length past the end of the model: exit 3 naming the field.
5. --special-tokens with a bad value: exit 2 naming the flag.

usage: tokenizer_hardening.py KILN_BINARY WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import time

kiln, work = sys.argv[1:3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def run(args, stdin=b"", timeout=120):
    t0 = time.monotonic()
    p = subprocess.run([kiln] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace"), time.monotonic() - t0


# A small byte-level tokenizer to edit.
corpus = os.path.join(work, "corpus.txt")
with open(corpus, "w") as f:
    f.write("the quick brown fox jumps over the lazy dog aaaa bbbb\n" * 200)
base_path = os.path.join(work, "base.json")
rc, _, err, _ = run(["tokenizer", "train", "--vocab-size", "300", "--input", corpus, "--output",
                     base_path, "--pattern", r"\p{L}+|\s+|[^\s\p{L}]+"])
check(rc == 0, "train a tokenizer (%s)" % err.strip()[-200:])
base = json.load(open(base_path, encoding="utf-8"))

# 1. catastrophic backtracking
t = json.loads(json.dumps(base))
t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+$"
path = os.path.join(work, "backtrack.json")
json.dump(t, open(path, "w"))
rc, _, err, secs = run(["tokenizer", "encode", "--tokenizer", path], b"a" * 3000 + b"!")
check(rc == 3 and "(a+)+$" in err and "backtracking" in err,
      "(a+)+$ on 3 KB: exit %d in %.2f s, %r" % (rc, secs, err.strip()[-300:]))
rc, out, err, _ = run(["tokenizer", "encode", "--tokenizer", path], b"aaa bbb")
check(rc == 0 and out.strip(), "the same pattern on ordinary text encodes")

# 2. a 10 MB added token on 1 MiB of text
t = json.loads(json.dumps(base))
n = len(t["model"]["vocab"])
t["added_tokens"] += [{"id": n, "content": "q" * (10 << 20), "single_word": False, "lstrip": False,
                       "rstrip": False, "normalized": False, "special": False},
                      {"id": n + 1, "content": "qqqq", "single_word": False, "lstrip": False,
                       "rstrip": False, "normalized": False, "special": False}]
path = os.path.join(work, "long_added.json")
json.dump(t, open(path, "w"))
rc, out, err, secs = run(["tokenizer", "encode", "--tokenizer", path], b"q" * (1 << 20))
ids = [int(x) for x in out.split()] if rc == 0 else []
check(rc == 0 and ids == [n + 1] * (1 << 18),
      "10 MB added token on 1 MiB: exit %d in %.2f s, %d ids (the 4-byte token %d times)" %
      (rc, secs, len(ids), ids.count(n + 1)))
rc, out, err, secs = run(["tokenizer", "encode", "--tokenizer", path],
                         b"x" + b"q" * (10 << 20) + b"qqqqy")
ids = [int(x) for x in out.split()] if rc == 0 else []
check(rc == 0 and ids.count(n) == 1 and ids.count(n + 1) == 1,
      "the 10 MB token found in a 10 MB text: exit %d in %.2f s" % (rc, secs))

# 3. a SentencePiece model with a corrupt charsmap
try:
    import sentencepiece as spm
except ImportError:
    spm = None
if check(spm is not None, "the SentencePiece Python binding (python3-sentencepiece) is there"):
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(work, "sp"),
                                   vocab_size=60, model_type="bpe",
                                   normalization_rule_name="nmt_nfkc", minloglevel=2)
    model = open(os.path.join(work, "sp.model"), "rb").read()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "sp.model"))
    text = "the quick ｆｏｘ jumps"
    rc, out, err, _ = run(["tokenizer", "encode", "--tokenizer", os.path.join(work, "sp.model")],
                          text.encode())
    check(rc == 0 and [int(x) for x in out.split()] == sp.encode(text),
          "the intact model gives the library's ids")
    # The charsmap: the bytes field 2 of NormalizerSpec (field 3); its trie starts after 4 bytes.
    # The charsmap: bytes field 2 of NormalizerSpec (ModelProto field 3), read off the wire.
    def varint(b, i):
        v = shift = 0
        while True:
            v |= (b[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not b[i - 1] & 0x80:
                return v, i

    def fields(b):
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            wire = key & 7
            if wire == 0:
                _, i = varint(b, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                n_, i = varint(b, i)
                yield key >> 3, i, b[i:i + n_]
                i += n_

    spec_at, spec = next((i, v) for f, i, v in fields(model) if f == 3)
    blob_at, blob = next((i, v) for f, i, v in fields(spec) if f == 2)
    at = spec_at + blob_at
    check(len(blob) > 1000 and at > 0, "the model holds a %d-byte charsmap" % len(blob))
    trie_size = struct.unpack("<I", blob[:4])[0]
    root = struct.unpack("<I", blob[4:8])[0]
    child_ef = ((root >> 10) << ((root & (1 << 9)) >> 6)) ^ 0xEF  # darts-clone: offset ^ label
    for name, offset, value in [("root unit", 4, b"\xff\xff\xff\x7f"),
                                ("unit of the byte 0xEF (the first of 'ｆ')", 4 + 4 * child_ef,
                                 struct.pack("<I", 0x7FFFFC00 | 0xEF)),
                                ("the trie size", 0, struct.pack("<I", len(blob) * 2))]:
        bad = bytearray(model)
        bad[at + offset:at + offset + 4] = value
        path = os.path.join(work, "corrupt.model")
        open(path, "wb").write(bytes(bad))
        rc, _, err, secs = run(["tokenizer", "encode", "--tokenizer", path], text.encode())
        check(rc == 3 and "charsmap" in err,
              "charsmap with its %s changed: exit %d in %.2f s, %r" % (name, rc, secs, err.strip()[-200:]))
    # 4. a length past the end
    bad = bytearray(model[:len(model) // 2])
    path = os.path.join(work, "truncated.model")
    open(path, "wb").write(bytes(bad))
    rc, _, err, _ = run(["tokenizer", "encode", "--tokenizer", path], text.encode())
    check(rc == 3 and "SentencePiece model" in err, "a truncated model: exit %d, %r" % (rc, err.strip()[-200:]))

# 5. usage
rc, _, err, _ = run(["tokenizer", "encode", "--tokenizer", base_path, "--special-tokens", "maybe"])
check(rc == 2 and "--special-tokens" in err, "--special-tokens maybe: exit %d, %r" % (rc, err.strip()))

sys.exit(1 if failures else 0)
