#!/usr/bin/python3
"""Two processes under torch.distributed (gloo) read disjoint data through kiln.torch.

Run by the test suite as
    /usr/bin/python3 kiln_torch_dist.py KILN_BINARY FIXTURE_BINARY WORK_DIR
which starts itself again under
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 \
        --master_port FREE_PORT --redirects 1 --tee 1 kiln_torch_dist.py ...
(127.0.0.1 and a free port rather than --standalone: the c10d rendezvous of --standalone resolves
"localhost" and the machine's host name, which a minimal root without /etc/hosts cannot; Debian's
torch 1.13 on Python 3.11 needs --redirects 1 --tee 1 in the launcher).
Each process takes its rank and world size from torch.distributed (not from arguments), reads
60 steps with sample ids, and the results are gathered on rank 0, which checks:
- each rank's sequences are exactly `kiln stream --world 2 --rank R`'s (ids, domains, order);
- within every epoch of every domain, no document is read by both ranks (pieces by
  (domain epoch, document)), and the two ranks together read each document of epoch 0 completely.
Any failure exits non-zero (torch.distributed.run then does too).
"""
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.utils.data

import kiln
import kiln.torch

KILN, FIXTURE, WORK = sys.argv[1:4]
DATA = os.path.join(WORK, "data")
STEPS = 120


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        subprocess.run([FIXTURE, DATA], check=True)
    dist.barrier()

    # Rank and world come from torch.distributed, in kiln.Loader and in kiln.torch.Dataset.
    loader = kiln.Loader(DATA, seq_len=16, micro_batch=4, seed=21, sample_ids=True)
    data = kiln.torch.Dataset(DATA, seq_len=16, micro_batch=4, seed=21)
    assert (loader.rank, loader.world) == (rank, world), (loader.rank, loader.world)
    assert (data.loader.rank, data.loader.world) == (rank, world)
    rows, pieces = [], []
    for step, item in enumerate(torch.utils.data.DataLoader(data, batch_size=None)):
        b = next(loader)
        assert torch.equal(item["tokens"], torch.from_numpy(b.tokens.astype("int64"))), step
        for r in range(b.micro_batch):
            rows.append((b.step, loader.domains[b.domain[r]], b.samples[r]))
            for (_, _, epoch, off, length, _), doc_id in zip(b.pieces[r], b.samples[r]):
                pieces.append((doc_id, epoch, off, length))
        if step + 1 == STEPS:
            break
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rows": rows, "pieces": pieces})
    failures = []
    if rank == 0:
        truth = json.load(open(os.path.join(DATA, "truth.json")))
        for r in range(world):
            p = subprocess.run([KILN, "stream", DATA, "--world", str(world), "--rank", str(r),
                                "--steps", str(STEPS), "--seq-len", "16",
                                "--micro-batch", "4", "--seed", "21"],
                               stdout=subprocess.PIPE, check=True, text=True)
            want = [(j["step"], j["domain"], j["samples"]) for j in map(json.loads, p.stdout.splitlines())]
            got = [tuple(x) for x in gathered[r]["rows"]]
            if got != want:
                failures.append("rank %d differs from kiln stream --rank %d" % (r, r))
        owners = {}  # (doc, epoch) -> ranks
        epoch0 = {}  # doc -> [(off, length)]
        for r in range(world):
            for doc_id, epoch, off, length in gathered[r]["pieces"]:
                owners.setdefault((doc_id, epoch), set()).add(r)
                if epoch == 0:
                    epoch0.setdefault(doc_id, []).append((off, length))
        shared = [k for k, v in owners.items() if len(v) > 1]
        if shared:
            failures.append("documents read by both ranks: %s" % shared[:5])
        # 120 steps x 4 rows x 17 tokens x 2 ranks cover epoch 0 of both domains (~5,300
        # tokens; each of the 8 partitions reads its own part, at its own pace): every epoch-0
        # document complete, each token once.
        complete = 0
        for doc_id, got in epoch0.items():
            at = 0
            for off, length in sorted(got):
                if off != at:
                    failures.append("%s: epoch-0 tokens repeated or skipped: %s" % (doc_id, got))
                    break
                at = off + length
            complete += at == len(truth[doc_id]) + 1
        if complete != len(truth):
            failures.append("only %d of %d documents complete in epoch 0" % (complete, len(truth)))
        print("rank 0: %d rows per rank match kiln stream, %d (document, epoch) pairs, "
              "none shared, %d documents complete in epoch 0" %
              (len(gathered[0]["rows"]), len(owners), complete))
    flags = [None] * world
    dist.all_gather_object(flags, failures)
    dist.destroy_process_group()
    if rank == 0:
        for f in flags[0][:20]:
            print("FAIL " + f)
    sys.exit(1 if flags[0] else 0)


def launch():
    """Not under torch.distributed.run yet: start two ranks of this script under it."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                              "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                              "--master_port", str(port), "--redirects", "1", "--tee", "1",
                              os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:
        main()
    else:
        launch()
