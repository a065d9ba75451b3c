"""Comparisons shared by the mpirun training checks (tests/train_mpi.sh, tests/train_tp.sh).

Each check runs `kiln train` several ways in its work directory, then a short Python snippet
(run with PYTHONPATH=tests/python and /usr/bin/python3, for numpy) that imports this module:

    from train_compare import *
    compare("DP=2 vs one process", "one", "dp2")        # losses and final parameters
    check_comm("dp2", plan_row("plan.json", tp=1, dp=2))  # bytes per step == kiln plan
    finish()                                              # exit 1 when any check failed

A run is a run directory (metrics.jsonl, checkpoints/); its final parameters are read from
RUN.safetensors when the check consolidated the run's last checkpoint there (sharded
checkpoints), else from the checkpoint's model.safetensors (replicated ones).
"""
import json
import os
import re
import struct
import sys

import numpy as np

OK = True


def check(label, cond):
    """Records one check; prints the label when it failed."""
    global OK
    if not cond:
        print(f"FAILED: {label}")
    OK = OK and bool(cond)
    return bool(cond)


def finish():
    sys.exit(0 if OK else 1)


def metrics(run):
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl")]


def losses(run):
    return {r["step"]: r["loss"] for r in metrics(run)}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(meta["shape"])
    return out


def tensors(run, step=None):
    """Final parameters of a run (see the module comment), or of a .safetensors path."""
    if run.endswith(".safetensors"):
        return read_safetensors(run)
    if os.path.exists(f"{run}.safetensors"):
        return read_safetensors(f"{run}.safetensors")
    ck = open(f"{run}/checkpoints/latest").read().strip() if step is None else f"step-{step:08d}"
    return read_safetensors(f"{run}/checkpoints/{ck}/model.safetensors")


def max_param_diff(ta, tb, label=""):
    check(f"{label}: the same tensors and shapes",
          ta.keys() == tb.keys() and all(ta[k].shape == tb[k].shape for k in ta))
    return max(float(np.max(np.abs(ta[k] - tb[k]))) for k in ta)


def compare(label, ra, rb, tol=1e-5, steps=None, params=True, grad_norm=False, fell=False):
    """Losses of rb vs ra (relative, over `steps`, default every step of ra) and final
    parameters (absolute, element-wise) within tol; with fell, rb's last loss must be below its
    first (a comparison of training, not of two idle runs)."""
    a, b = losses(ra), losses(rb)
    steps = list(steps) if steps is not None else sorted(a)
    check(f"{label}: steps {sorted(b)} cover {steps}", all(s in b for s in steps))
    steps = [s for s in steps if s in b]
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
    text = f"{label}: steps {steps[0]}-{steps[-1]}, worst relative loss difference {worst:.2e}"
    good = worst <= tol
    if grad_norm:
        ga = {r["step"]: r["grad_norm"] for r in metrics(ra)}
        gb = {r["step"]: r["grad_norm"] for r in metrics(rb)}
        gn = max(abs(ga[s] - gb[s]) / abs(ga[s]) for s in steps)
        text += f", grad norm {gn:.2e}"
    adiff = 0.0
    if params:
        adiff = max_param_diff(tensors(ra), tensors(rb), label)
        text += f"; final parameters, largest element difference {adiff:.2e}"
        good = good and adiff <= tol
    same = worst == 0 and adiff == 0
    print(f"{text} (limit {tol:g}){' - bit-identical' if same else ''}")
    check(label, good)
    if fell:
        check(f"{label}: the loss fell", b[max(b)] < b[min(b)])
    return worst, adiff


def plan_row(path, tp, dp, zero=0, ac="none", pp=1, schedule="1f1b"):
    rows = [p for p in json.load(open(path)) if p["tp"] == tp and p["dp"] == dp
            and p["zero_stage"] == zero and p["activation_checkpointing"] == ac
            and p.get("pp", 1) == pp and (pp == 1 or p["pp_schedule"] == schedule)]
    check(f"kiln plan {path} has tp {tp} pp {pp} dp {dp} ZeRO-{zero} {ac}", len(rows) == 1)
    return rows[0]


def check_comm(run, row, label=None, colls=None):
    """Every step's bytes per collective == the plan row's, within 1%. Returns the last step's."""
    label = label or run
    out = {}
    for coll, want in row["comm_bytes_per_step"].items():
        if colls is not None and coll not in colls:
            continue
        got = [r["comm_bytes"].get(coll, 0) for r in metrics(run)]
        print(f"{label}: {coll} {got[-1]} bytes per step, kiln plan {want} (limit 1%)")
        check(f"{label} {coll}", all(abs(g - want) <= 0.01 * want for g in got))
        out[coll] = got[-1]
    return out


def model_states(log):
    """The model-state bytes rank 0 logged (ZeRO: 'model states on rank 0: N bytes')."""
    return int(re.search(r"model states on rank 0: (\d+) bytes", open(log).read()).group(1))


def planned_states(row):
    b = row["bytes_per_rank"]
    return b["params"] + b["grads"] + b["optimizer"]


def buffer_peak(log):
    return max(int(x) for x in re.findall(r"peaked at (\d+) bytes", open(log).read()))
