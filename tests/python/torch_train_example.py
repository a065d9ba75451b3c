#!/usr/bin/python3
"""examples/torch_train.py on a real `kiln prep` output (the default corpus, 2 MB, vocabulary 512):

1. an uninterrupted run of 80 steps, with the control file RUN/control/mixture.json present from
   the start and a scheduled reweighting at step 30: its loss falls (mean of the last 10 steps at
   least 1.0 nat under the first step's), the weights reach the batches (after step 30 only the
   two weighted domains appear in domain_loss; before it, the control file's three);
2. the same run stopped after 35 steps and resumed with --resume to step 80: every step's loss
   (and per-domain loss) equals the uninterrupted run's exactly, so model, optimizer and loader
   were restored together.

usage: torch_train_example.py KILN_BINARY SOURCE_DIR WORK_DIR   (PYTHONPATH=build/python)
"""
import json
import os
import shutil
import subprocess
import sys

KILN, SRC, WORK = sys.argv[1:4]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
failures = []


def check(cond, what):
    if not cond:
        print("FAIL " + what)
        failures.append(what)


subprocess.run([os.path.join(SRC, "tools", "default_corpus"), os.path.join(WORK, "corpus"),
                "--max-mb", "2"], check=True, stdout=subprocess.DEVNULL)
data = os.path.join(WORK, "data")
subprocess.run([KILN, "prep", "--input", os.path.join(WORK, "corpus"), "--output", data,
                "--threads", "2", "--set", "tokenizer.vocab_size=512"], check=True,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def train(run, steps, resume=False):
    os.makedirs(os.path.join(run, "control"), exist_ok=True)
    with open(os.path.join(run, "control", "mixture.json"), "w") as f:
        json.dump({"weights": {"code": 1, "web": 1, "zh": 1}}, f)
    cmd = ["/usr/bin/python3", os.path.join(SRC, "examples", "torch_train.py"), data, "--run", run,
           "--steps", str(steps), "--checkpoint-every", "20", "--log-every", "20",
           "--reweight", "30:code=1,web=3"] + (["--resume"] if resume else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout[-1500:])
    check(p.returncode == 0, "%s exits 0" % " ".join(cmd))
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


whole = train(os.path.join(WORK, "whole"), 80)
check([m["step"] for m in whole] == list(range(1, 81)), "80 metrics lines, steps 1..80")
first, last = whole[0]["loss"], sum(m["loss"] for m in whole[-10:]) / 10
print("loss %.3f -> %.3f (mean of the last 10 steps)" % (first, last))
check(last <= first - 1.0, "loss falls by at least 1.0: %.3f -> %.3f" % (first, last))
early = set().union(*(m["domain_loss"] for m in whole[:30]))
late = set().union(*(m["domain_loss"] for m in whole[30:]))
check(early == {"code", "web", "zh"}, "control-file weights in steps 1..30: %s" % sorted(early))
check(late == {"code", "web"}, "scheduled weights from step 31: %s" % sorted(late))
check(abs(whole[-1]["domain_weights"]["web"] - 0.75) < 1e-12, "weights recorded in metrics")

run = os.path.join(WORK, "resumed")
head = train(run, 35)
tail = train(run, 80, resume=True)
check(len(head) == 35 and len(tail) == 80, "metrics kept up to the checkpoint, then continued")
for a, b in zip(whole, tail):
    if (a["loss"], a["domain_loss"]) != (b["loss"], b["domain_loss"]):
        check(False, "step %d: resumed loss %r differs from %r" % (a["step"], b["loss"], a["loss"]))
        break
sys.exit(1 if failures else 0)
