#!/usr/bin/python3
"""GPT-2's reference BPE encoder (the algorithm of OpenAI's gpt-2 src/encoder.py, MIT): the
`regex` pre-tokenizer pattern, byte-to-unicode mapping, and the greedy lowest-rank merge loop with a
per-word cache. The peer of Kiln's tokenizer in tools/bench/prep.

usage: gpt2_reference_encode.py GPT2_DIR INPUT.txt IDS_OUT
Writes the ids (space-separated) to IDS_OUT and prints "encode_seconds WALL CPU" (encoding only,
after loading the vocabulary).
"""
import json
import sys
import time

import regex as re


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class Encoder:
    def __init__(self, encoder, merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.cache = {}
        self.pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids


def main():
    gpt2_dir, input_path, ids_out = sys.argv[1:4]
    encoder = json.load(open(gpt2_dir + "/vocab.json", encoding="utf-8"))
    lines = open(gpt2_dir + "/merges.txt", encoding="utf-8").read().split("\n")[1:-1]
    merges = [tuple(line.split()) for line in lines]
    enc = Encoder(encoder, merges)
    text = open(input_path, "rb").read().decode("utf-8")
    t0, c0 = time.perf_counter(), time.process_time()
    ids = enc.encode(text)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    with open(ids_out, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    print("encode_seconds %.6f %.6f" % (seconds, cpu))


if __name__ == "__main__":
    main()
