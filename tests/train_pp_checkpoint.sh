#!/usr/bin/env bash
# Checkpoints of pipeline-parallel training under mpirun (ctest train_pp_checkpoint_*): one check
# per invocation.
#   train_pp_checkpoint.sh CHECK KILN_BINARY SOURCE_DIR WORK_DIR MPIEXEC [gpt2|llama]
# The test model has 4 blocks (PP=4: one each), 4 micro-batches per step (the pipeline's) and no
# evaluation (which does not run through a pipeline).
# CHECK:
#   resume       a PP=2 run (2 ranks) stopped at step 5 resumes on PP=2 bit for bit, and on one
#                process (PP=1) and on PP=4 (4 ranks) with the losses of steps 6-10 within 1e-5
#                relative of the uninterrupted PP=2 run's; a one-process checkpoint resumes on
#                PP=2 the same way. A PP=2 x DP=2 ZeRO-1 checkpoint (4 ranks) resumes on
#                PP=1 x TP=2 and on PP=4 (another PP, TP and DP size at once) within 1e-5 of its
#                uninterrupted run, and a PP=2 x TP=2 one (the replicated tensors checked per
#                stage) on PP=4. The first resumed step's loss is bit-identical on PP=2, one
#                process and PP=4. The checkpoints hold the stages' files as meta.json lists
#                them (pp, pp_stages), and a resume on another PP size logs how it read them.
#   consolidate  `kiln checkpoint consolidate` of the PP=2 run's step-10 checkpoint equals the
#                one-process run's at step 10 within 1e-5 (two trainings of the same weights) and
#                bit for bit the weights of the same checkpoint loaded by one process and written
#                again (lr 0, one more step); `kiln checkpoint export --format hf` of the two
#                writes the same model.safetensors and config.json.
source "$(dirname "$0")/mpi_train_common.sh"
MODEL+=(--set model.n_layers=4 --set data.grad_accum=4 --set eval.every_steps=0)
PP2=(--set parallel.pp=2)
PP4=(--set parallel.pp=4)
CK=(--set checkpoint.every_steps=5)

case "$CHECK" in
resume)
  train 2 4 ref 10 "${PP2[@]}" 2>ref.log
  train 2 4 a 5 "${CK[@]}" "${PP2[@]}" 2>a.log
  cp -r a a1
  cp -r a a4
  train 2 4 a 10 --resume "${PP2[@]}" 2>>a.log    # the same layout: bit-identical
  train 1 4 a1 10 --resume 2>>a1.log              # PP=2 checkpoint on one process
  train 4 4 a4 10 --resume "${PP4[@]}" 2>>a4.log  # PP=2 checkpoint on PP=4
  train 1 4 b 5 "${CK[@]}" 2>b.log
  train 2 4 b 10 --resume "${PP2[@]}" 2>>b.log    # one-process checkpoint on PP=2
  grep -qF "written by 2 pipeline stage(s), read into stage 0 of 4 (blocks [0, 1))" a4.log ||
    { echo "no pipeline reshard line in the PP=4 resume's log"; cat a4.log; exit 1; }
  # PP=2 x DP=2 ZeRO-1 (4 files: 2 stages x 2 partitions) at step 5, resumed on PP=1 x TP=2
  # (DP=1) and on PP=4 (DP=1); reference: the uninterrupted PP=2 x DP=2 ZeRO-1 run.
  Z=("${PP2[@]}" --set parallel.zero_stage=1)
  train 4 2 zref 10 "${Z[@]}" 2>zref.log
  train 4 2 z 5 "${CK[@]}" "${Z[@]}" 2>z.log
  cp -r z ztp
  cp -r z z4
  train 2 4 ztp 10 --resume --set parallel.tp=2 2>>ztp.log
  train 4 4 z4 10 --resume "${PP4[@]}" 2>>z4.log
  # PP=2 x TP=2 (4 files: 2 stages x 2 TP ranks; the replicated tensors checked per stage) at
  # step 5, resumed on PP=4 without TP.
  T=("${PP2[@]}" --set parallel.tp=2)
  train 4 4 tref 10 "${T[@]}" 2>tref.log
  train 4 4 t 5 "${CK[@]}" "${T[@]}" 2>t.log
  grep -q "replicated tensors identical on 2 tensor-parallel ranks" t.log ||
    { echo "no replicated-tensor check in the PP=2 x TP=2 log"; cat t.log; exit 1; }
  train 4 4 t 10 --resume "${PP4[@]}" 2>>t.log
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
import json, os
from train_compare import *

for name, ref, run, tol in (("PP=2 -> PP=2", "ref", "a", 0.0),
                            ("PP=2 -> one process", "ref", "a1", 1e-5),
                            ("PP=2 -> PP=4", "ref", "a4", 1e-5),
                            ("one process -> PP=2", "ref", "b", 1e-5),
                            ("PP=2 x DP=2 ZeRO-1 -> PP=1 x TP=2", "zref", "ztp", 1e-5),
                            ("PP=2 x DP=2 ZeRO-1 -> PP=4", "zref", "z4", 1e-5),
                            ("PP=2 x TP=2 -> PP=4", "tref", "t", 1e-5)):
    compare(f"resume {name}", ref, run, tol=tol, steps=range(6, 11), params=False)
# The first resumed step's loss is the loaded weights' forward pass: the same bits whichever
# pipeline split read the PP=2 checkpoint (the state itself, apart from later steps' sums).
for run in ("a1", "a4"):
    compare(f"step 6 after resuming PP=2 on {run}", "a", run, tol=0.0, steps=[6], params=False)

def stage_files(run, step, dp, tp=1):
    ck = f"{run}/checkpoints/step-{step:08d}"
    meta = json.load(open(f"{ck}/meta.json"))
    state = json.load(open(f"{ck}/state.json"))
    files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
    want = [f"shard-pp{s:05d}-of-00002-tp{t:05d}-of-{tp:05d}-dp{r:05d}-of-{dp:05d}.safetensors"
            for s in range(2) for t in range(tp) for r in range(dp)]
    stages = meta["pp_stages"]
    blocks = [b for st in stages for b in range(st["blocks"][0], st["blocks"][1])]
    print(f"{run} step {step}: {files}; stages {[st['blocks'] for st in stages]}, "
          f"units {[st['units'] for st in stages]}")
    check(f"{run}: format 2.1 with 2 stages", meta["format"] == "kiln-checkpoint/2.1"
          and state["format"] == "kiln-checkpoint/2.1" and meta["pp"] == 2 and len(stages) == 2)
    check(f"{run}: one file per stage and partition", files == want == meta["files"]
          and sorted(state["files"]) == want)
    check(f"{run}: the stages hold blocks 0-3 once each", blocks == [0, 1, 2, 3])
    check(f"{run}: embeddings on the first stage, the final unit on the last",
          stages[0]["units"][0] == "embed" and stages[1]["units"][-1] == "final"
          and all(u["stage"] == (0 if u["name"] == "embed" else 1 if u["name"] == "final"
                                 else next(i for i, st in enumerate(stages)
                                           if u["name"] in st["units"]))
                  for u in meta["units"]))

stage_files("a", 5, 1)
stage_files("z", 5, 2)
stage_files("t", 5, 1, 2)
finish()
PY
  ;;
consolidate)
  train 1 4 one 10 2>one.log
  train 2 4 pp 10 "${PP2[@]}" 2>pp.log
  cp -r pp again
  # One process loads the PP=2 checkpoint and writes it again after a step of lr 0 (the weights
  # unchanged: every update is lr times something finite).
  train 1 4 again 11 --resume --set optimizer.lr=0 2>again.log
  "$KILN" checkpoint consolidate pp/checkpoints/step-00000010 -o pp.safetensors >/dev/null
  "$KILN" checkpoint consolidate again/checkpoints/step-00000011 -o again.safetensors >/dev/null
  "$KILN" checkpoint consolidate one/checkpoints/step-00000010 -o one.safetensors >/dev/null
  "$KILN" checkpoint export pp/checkpoints/step-00000010 --format hf -o pp_hf 2>/dev/null
  "$KILN" checkpoint export again/checkpoints/step-00000011 --format hf -o again_hf 2>/dev/null
  for f in model.safetensors config.json; do
    cmp pp_hf/$f again_hf/$f || { echo "export of the PP=2 checkpoint: $f differs"; exit 1; }
  done
  echo "export --format hf of the PP=2 checkpoint == of its one-process copy (model.safetensors, config.json)"
  PYTHONPATH="$SRC/tests/python" /usr/bin/python3 - <<'PY'
from train_compare import *

pp, again, one = tensors("pp.safetensors"), tensors("again.safetensors"), tensors("one.safetensors")
d = max_param_diff(pp, again, "PP=2 checkpoint vs its one-process copy")
print(f"consolidate: PP=2 checkpoint vs the same weights written by one process: largest "
      f"difference {d:.2e} (limit 0)")
check("consolidate of a PP=2 checkpoint == of the same weights without pipelining", d == 0)
compare("PP=2 vs one process", "one", "pp", tol=1e-5)
finish()
PY
  ;;
*)
  echo "unknown check $CHECK"
  exit 2
  ;;
esac
rm -rf "$WORK"
