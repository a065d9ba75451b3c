#!/usr/bin/python3
"""Summarises tools/bench/train_cpu's JSON lines: speed against PyTorch (wall and CPU time, per
thread count) from the speed runs only, and memory per activation-checkpointing setting from the
separate memory runs."""
import argparse
import json
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("--speed", required=True)
ap.add_argument("--memory", required=True)
ap.add_argument("--machine", default="")
ap.add_argument("--peer", default="")
ap.add_argument("--end", default="")
ap.add_argument("--failed", default="")
a = ap.parse_args()
speed = [json.loads(l) for l in open(a.speed) if l.strip()]
memory = [json.loads(l) for l in open(a.memory) if l.strip()]


def pick(rows, impl, prec, threads=None, recompute="none"):
    return [r for r in rows if r["impl"].startswith(impl) and r["precision"] == prec
            and r["recompute"] == recompute and (threads is None or r["threads"] == threads)]


def med(rows, key):
    return statistics.median(r[key] for r in rows) if rows else float("nan")


torch_version = next((r["impl"] for r in speed if r["impl"].startswith("pytorch")), "pytorch")
print("train_cpu: full training step (fwd, bwd, clip, AdamW), vocab 8192, d 256, 4 layers, "
      "4 heads, seq 256, micro-batch 8 (2048 tokens)")
print(a.machine)
print("peer: " + a.peer)
print()
print("speed: median over rounds of each process's median step (10 steps after 3 warm-up); kiln and "
      "torch alternate in every round")
print(f"{'':4} {'threads':>7} {'kiln tok/s':>11} {'torch tok/s':>12} {'wall ratio':>11}"
      f" {'kiln cpu ms':>12} {'torch cpu ms':>13} {'cpu ratio':>10} {'runs':>5}")
threads = sorted({r["threads"] for r in speed})
for prec in ("fp32", "bf16"):
    for n in threads:
        k, t = pick(speed, "kiln", prec, n), pick(speed, "pytorch", prec, n)
        if not k or not t:
            continue
        kt, tt = med(k, "tokens_per_s"), med(t, "tokens_per_s")
        kc, tc = med(k, "cpu_ms"), med(t, "cpu_ms")
        print(f"{prec:4} {n:7d} {kt:11.0f} {tt:12.0f} {kt / tt:10.2f}x {kc:12.1f} {tc:13.1f}"
              f" {tc / kc:9.2f}x {len(k):2d}/{len(t)}")
print("(wall ratio: kiln tok/s / torch tok/s; cpu ratio: torch CPU ms per step / kiln CPU ms per "
      "step, all threads of the process)")
for n in threads:
    if not pick(speed, "kiln", "bf16", n) or not pick(speed, "kiln", "fp32", n):
        continue
    kb, kf = med(pick(speed, "kiln", "bf16", n), "tokens_per_s"), med(pick(speed, "kiln", "fp32", n), "tokens_per_s")
    tf = med(pick(speed, "pytorch", "fp32", n), "tokens_per_s")
    print(f"{n} thread(s): kiln bf16 vs kiln fp32 {kb / kf:.2f}x; kiln bf16 vs PyTorch fp32 {kb / tf:.2f}x")
print()
print("memory: one process per row, 5 steps after 1 warm-up; train = peak RSS - RSS at start "
      "(PyTorch: after `import torch`)")
print(f"{'':4} {'recompute':>10} {'peak RSS':>9} {'start':>7} {'train':>7} {'activations':>12}"
      f" {'(planned)':>10}   MiB")
for prec in ("fp32", "bf16"):
    for rc in ("none", "selective", "full"):
        for r in pick(memory, "kiln", prec, recompute=rc):
            print(f"{prec:4} {rc:>10} {r['peak_rss_mib']:9.1f} {r['rss_start_mib']:7.1f}"
                  f" {r['train_mib']:7.1f} {r['activation_mib_measured']:12.1f}"
                  f" {r['activation_mib_planned']:10.1f}")
    for r in pick(memory, "pytorch", prec):
        k = pick(memory, "kiln", prec, recompute="none")
        ratio = f"   torch / kiln (none): {r['train_mib'] / k[0]['train_mib']:.2f}x" if k else ""
        print(f"{prec:4} {'pytorch':>10} {r['peak_rss_mib']:9.1f} {r['rss_start_mib']:7.1f}"
              f" {r['train_mib']:7.1f} {'(autograd)':>12} {'':10}{ratio}")
print("(activations: measured peak RSS growth over the first forward+backward, once weights, "
      "gradients and optimizer state are resident; planned: the engine's own count)")
failed = [l.rstrip() for l in open(a.failed)] if a.failed else []
if failed:
    print(f"{len(failed)} process(es) failed; their rows are missing:")
    for l in failed:
        print("  " + l)
if a.end:
    print(a.end)
