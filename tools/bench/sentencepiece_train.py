#!/usr/bin/python3
"""SentencePiece BPE training, the peer of Kiln's tokenizer training in tools/bench/tokenizer.

usage: sentencepiece_train.py TRAIN.txt HELDOUT.txt VOCAB_SIZE THREADS MODEL_PREFIX
TRAIN.txt is the training sample (SentencePiece reads one sentence per line); HELDOUT.txt is
encoded with the trained model, line by line. Prints
  train_seconds WALL CPU        (the SentencePieceTrainer.train call only)
  heldout BYTES TOKENS          (TOKENS counts one token per line break: SentencePiece never
                                 sees the newlines, a byte-level tokenizer must encode them)
Settings: model_type=bpe, byte_fallback (so, like a byte-level BPE, any text encodes and the 256
byte pieces are part of the vocabulary), every sentence used (input_sentence_size=0), no line
dropped for length, text kept as is (identity normalisation, extra whitespace kept).
Needs Debian's python3-sentencepiece (tools/setup installs it).
"""
import resource
import sys
import time

import sentencepiece as spm


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    train, heldout, vocab_size, threads, prefix = sys.argv[1:6]
    t0, c0 = time.perf_counter(), cpu_seconds()
    spm.SentencePieceTrainer.train(
        input=train, model_prefix=prefix, model_type="bpe", vocab_size=int(vocab_size),
        num_threads=int(threads), byte_fallback=True, input_sentence_size=0,
        max_sentence_length=1 << 20, normalization_rule_name="identity",
        remove_extra_whitespaces=False, minloglevel=2)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    print("train_seconds %.3f %.3f" % (wall, cpu))
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    with open(heldout, "rb") as f:
        data = f.read()
    lines = data.decode("utf-8", errors="replace").split("\n")
    tokens = sum(len(ids) for ids in sp.encode(lines)) + (len(lines) - 1)
    print("heldout %d %d" % (len(data), tokens))


if __name__ == "__main__":
    main()
