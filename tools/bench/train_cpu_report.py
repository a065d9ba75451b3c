#!/usr/bin/python3
"""Summarises tools/bench/train_cpu's JSON lines: speed vs PyTorch and memory per recompute mode."""
import json
import statistics
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]


def median_tps(impl_prefix, prec, recompute="none"):
    v = [r["tokens_per_s"] for r in rows
         if r["impl"].startswith(impl_prefix) and r["precision"] == prec and r["recompute"] == recompute]
    return statistics.median(v) if v else float("nan"), len(v)


torch_version = next((r["impl"] for r in rows if r["impl"].startswith("pytorch")), "pytorch")
print("## train_cpu: full training step (fwd, bwd, clip, AdamW), vocab 8192, d 256, 4 layers, "
      "4 heads, seq 256, micro-batch 8")
print(f"{'':6} {'kiln tok/s':>12} {torch_version + ' tok/s':>26} {'kiln / torch':>13}")
t32, _ = median_tps("pytorch", "fp32")
for prec in ("fp32", "bf16"):
    k, n = median_tps("kiln", prec)
    t, _ = median_tps("pytorch", prec)
    print(f"{prec:6} {k:12.0f} {t:26.0f} {k / t:12.2f}x   (median of {n} runs)")
kb, _ = median_tps("kiln", "bf16")
print(f"kiln bf16 vs PyTorch fp32: {kb / t32:.2f}x")
print()
print("peak memory per activation-checkpointing setting (process peak RSS; activations = kept +"
      " recompute buffers)")
print(f"{'':6} {'recompute':>10} {'tok/s':>8} {'peak RSS MiB':>13} {'activations MiB':>16}")
for prec in ("fp32", "bf16"):
    for rc in ("none", "selective", "full"):
        mem = [x for x in rows if x["impl"].startswith("kiln") and x["precision"] == prec
               and x["recompute"] == rc]
        if not mem:
            continue
        last = mem[-1]  # the memory runs come last
        print(f"{prec:6} {rc:>10} {last['tokens_per_s']:8.0f} {last['peak_rss_mib']:13.1f} "
              f"{last['activation_mib']:16.1f}")
pt = [r for r in rows if r["impl"].startswith("pytorch")]
for prec in ("fp32", "bf16"):
    m = [r["peak_rss_mib"] for r in pt if r["precision"] == prec]
    if m:
        print(f"{prec:6} {'pytorch':>10} {'':8} {statistics.median(m):13.1f} {'(autograd)':>16}")
