#!/usr/bin/python3
"""The table of tools/bench/train_gpu: reads its JSON lines (bench_train_gpu's, then the PyTorch
runs of the same model, in that order per model; "kiln unfused" rows, the same run without the
fused kernels, among them) and prints, per model, tokens/s, MFU, the median
step, peak device memory and the speed relative to PyTorch eager and torch.compile, then Kiln's
device time per step by kernel family.

  train_gpu_report.py RESULTS.jsonl

MFU for every implementation uses Kiln's model FLOPs per token (6N + 6LdT, engine/train/mfu.h) and the
GPU's dense bf16 peak from Kiln's table (engine/train/mfu.cc): the same model, so the same FLOPs. A
PyTorch run whose parameter count differs from Kiln's is flagged (it would not be the same model).
Exits 1 when a Kiln run is missing or a PyTorch run's model differs.
"""
import json
import sys


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    groups = []  # [kiln row, [peer rows]]
    for r in rows:
        if r.get("impl") == "kiln":
            groups.append([r, []])
        elif groups:
            groups[-1][1].append(r)
    if not groups:
        print("train_gpu_report: no Kiln result in " + sys.argv[1])
        return 1
    bad = 0
    for kiln, peers in groups:
        gpu = kiln.get("gpu") or kiln.get("device")
        print(f"\n== {kiln['model']}: {kiln['params'] / 1e6:.1f}M parameters, {kiln['precision']}, "
              f"micro-batch {kiln['micro_batch']} x {kiln['seq_len']}, "
              f"recompute {kiln['recompute']}, on {gpu}")
        flops, peak = kiln["flops_per_token"], kiln.get("peak_flops")
        print(f"   model FLOPs/token {flops:.4g}; peak "
              + (f"{peak / 1e12:.0f} TFLOP/s dense bf16" if peak else "unknown (no MFU)"))
        by_impl = {}
        print(f"   {'implementation':<28} {'tokens/s':>12} {'MFU':>7} {'step ms':>9} "
              f"{'device mem MiB':>15} {'loss first/last':>17}")
        for r in [kiln] + peers:
            name = r["impl"] + (f" (torch {r['torch']})" if "torch" in r else "")
            if not r.get("available", True):
                print(f"   {name:<28} not run: {r['reason']}")
                continue
            tps = r["tokens_per_s"]
            mfu = tps * flops / peak if peak else None
            by_impl[r["impl"]] = tps
            note = ""
            if r is not kiln and r.get("params") != kiln["params"]:
                note = f"  MODEL DIFFERS: {r.get('params')} parameters"
                bad = 1
            print(f"   {name:<28} {tps:>12,.0f} {fmt(mfu and 100 * mfu, '6.1f') + ('%' if mfu else ''):>7} "
                  f"{r['step_ms']:>9.2f} {fmt(r.get('device_memory_peak_mib'), ',.0f'):>15} "
                  f"{r['loss_first']:>8.3f}/{r['loss_last']:<8.3f}{note}")
        for peer in ("kiln unfused", "pytorch eager", "pytorch compile"):
            if peer in by_impl:
                print(f"   Kiln vs {peer}: {by_impl['kiln'] / by_impl[peer]:.2f}x tokens/s")
        for r in [kiln] + peers:
            km = r.get("kernel_ms")
            if not km or not r.get("available", True):
                continue
            total = sum(km.values())
            step = r["step_ms"]
            parts = ", ".join(f"{k} {v:.2f} ms ({100 * v / step:.0f}%)"
                              for k, v in sorted(km.items(), key=lambda kv: -kv[1]))
            who = "Kiln" if r is kiln else r["impl"]
            print(f"   {who} device time per step by kernel family: {parts}; "
                  f"outside kernels {max(step - total, 0):.2f} ms ({100 * max(step - total, 0) / step:.0f}%) "
                  f"of the {step:.2f} ms step")
    if bad:
        print("train_gpu_report: a PyTorch run's model differs from Kiln's (see MODEL DIFFERS)")
    return bad


if __name__ == "__main__":
    sys.exit(main())
