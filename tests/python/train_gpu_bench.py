#!/usr/bin/python3
"""tools/bench/train_gpu's harness on the CPU (the GPU run is tools/gpu_check --bench's): the
tiny config through bench_train_gpu --device cpu, then PyTorch (Debian's python3-torch) on the
same model and batch, then the report. Checks that both sides ran the same model (parameter
count), that both start from a GPT-2 initialisation (first loss near ln V), that torch.compile is
run or reported as unavailable with the reason, and that the report flags a PyTorch model that
differs.

  train_gpu_bench.py SOURCE_DIR BENCH_BIN_DIR WORK_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

import torch

src, bench_bin, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
results = os.path.join(work, "results.jsonl")
env = dict(os.environ, KILN_BENCH_BIN=bench_bin, KILN_TORCH_PYTHON="/usr/bin/python3")
run = subprocess.run(
    [os.path.join(src, "tools/bench/train_gpu"), "--device", "cpu",
     "--configs", "configs/train/tiny.yaml:2", "--steps", "2", "--warmup", "1",
     "--torch-modes", "eager compile", "--out", results],
    cwd=src, env=env, capture_output=True, text=True, timeout=600)
print(run.stdout)
print(run.stderr, file=sys.stderr)
assert run.returncode == 0, f"train_gpu exited {run.returncode}"

rows = [json.loads(l) for l in open(results)]
assert [r["impl"] for r in rows] == ["kiln", "pytorch eager", "pytorch compile"], rows
kiln, eager, comp = rows
assert kiln["device"] == "cpu" and kiln["micro_batch"] == 2 and kiln["seq_len"] == 128, kiln
assert kiln["tokens_per_s"] > 0 and kiln["step_ms"] > 0, kiln
assert kiln["mfu"] is None and kiln["kernel_ms"] is None, kiln  # no GPU: no peak, no kernel split
assert kiln["params"] > 1_000_000, kiln
assert eager["available"] and eager["params"] == kiln["params"], (eager, kiln)
assert eager["micro_batch"] == 2 and eager["seq_len"] == 128, eager
ln_v = math.log(kiln["vocab"])
for r in (kiln, eager):
    assert abs(r["loss_first"] - ln_v) < 0.5, (r["impl"], r["loss_first"], ln_v)
if hasattr(torch, "compile"):
    assert comp["available"] and comp["params"] == kiln["params"], comp
else:
    assert not comp["available"] and "torch.compile" in comp["reason"], comp

out = run.stdout
assert "== configs/train/tiny.yaml" in out or "tiny.yaml" in out, out
assert "Kiln vs pytorch eager:" in out, out
for name in ("kiln", "pytorch eager"):
    assert any(line.strip().startswith(name) for line in out.splitlines()), (name, out)

# The report refuses to compare different models.
bad = os.path.join(work, "bad.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps(kiln) + "\n" + json.dumps(dict(eager, params=eager["params"] + 1)) + "\n")
rep = subprocess.run(["/usr/bin/python3", os.path.join(src, "tools/bench/train_gpu_report.py"), bad],
                     capture_output=True, text=True)
assert rep.returncode == 1 and "MODEL DIFFERS" in rep.stdout, rep.stdout
print("train_gpu_bench: OK")
