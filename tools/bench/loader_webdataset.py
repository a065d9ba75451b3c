#!/usr/bin/python3
"""The WebDataset peer of tools/bench/loader: WebDataset's own pipeline (the unmodified source,
webdataset 1.0.2 from github.com/webdataset/webdataset, on PYTHONPATH) reading the same
`kiln prep` shards the Kiln loader reads and packing their tokens the way the Kiln loader does:
each document's `.tokens.npy`, then eos, cut into rows of seq_len + 1 uint32 tokens,
micro_batch rows per batch.

WebDataset reads `.tar.zst` through its `pipe:` URLs (`pipe:zstd -q -dc SHARD`, how its docs
open compressed shards it cannot decompress itself); the npy members are decoded by its default
decoder (numpy.load) for the .tokens.npy members only. No shuffle buffer (its fastest configuration: the comparison favours it).

usage: loader_webdataset.py DATASET_DIR [--seq-len T] [--micro-batch B] [--domain NAME]
prints one JSON line {"tokens", "batches", "wall_s", "cpu_s"}: cpu_s counts this process and the
zstd children it spawned (user + system), from before the first shard to the last batch.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

try:
    import webdataset as wds
except ImportError:
    print(json.dumps({"error": "webdataset is not importable (PYTHONPATH=<webdataset>/src)"}))
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    a = ap.parse_args()
    with open(os.path.join(a.dataset, "manifest.json")) as f:
        m = json.load(f)
    eos = int(m["tokenizer"]["eos_id"])
    shards = [s for s in m["shards"] if s.get("split", "train") != "val"]
    urls = []
    for s in shards:
        path = os.path.join(a.dataset, s["path"])
        urls.append(f"pipe:zstd -q -dc '{path}'" if path.endswith(".zst") else path)
    width = a.seq_len + 1
    need = a.micro_batch * width

    t0, c0 = time.monotonic(), os.times()
    # Only the tokens are decoded (the .txt and .json members are read but left as bytes).
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    ds = ds.decode(only=["tokens.npy"]).to_tuple("tokens.npy")
    pending, have = [], 0
    tokens = batches = 0
    eos_arr = np.array([eos], dtype=np.uint32)
    for (doc,) in ds:
        pending.append(doc.astype(np.uint32, copy=False))
        pending.append(eos_arr)
        have += doc.size + 1
        while have >= need:
            flat = np.concatenate(pending)
            batch = flat[:need].reshape(a.micro_batch, width)
            rest = flat[need:]
            pending, have = ([rest] if rest.size else []), rest.size
            tokens += batch.size
            batches += 1
    wall = time.monotonic() - t0
    c1 = os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) + (
        c1.children_system - c0.children_system)
    print(json.dumps({"tokens": tokens, "batches": batches, "wall_s": wall, "cpu_s": cpu}))


if __name__ == "__main__":
    main()
