#!/usr/bin/python3
"""A small GPT in plain PyTorch, trained on a `kiln prep` output streamed by kiln.torch.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py OUT --run runs/torch --steps 300
    # change the domain mix while it runs (the same control file as `kiln train`):
    echo '{"weights": {"web": 0.5, "code": 0.5}}' > runs/torch/control/mixture.json
    # stop it (Ctrl-C, or a crash), then continue exactly where the last checkpoint was:
    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py OUT --run runs/torch --steps 300 --resume
    # on several processes (gloo on CPU, nccl on GPUs): each rank reads its own part of the data
    PYTHONPATH=build/python /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 \
        examples/torch_train.py OUT --run runs/torch2 --steps 300

What it shows:
- kiln.torch.Dataset in a torch DataLoader (num_workers=0: the reading, decompression and
  packing run in C++ threads); rank and world size come from torch.distributed;
- packed sequences with document boundaries: positions restart and attention stays inside each
  document (position_ids from the loader);
- live reweighting: RUN/control/mixture.json ({"weights": {...}}) is read before every step and
  applied from the next batch (rank 0 reads it and broadcasts, so all ranks agree), and
  --reweight STEP:d=w,... schedules a change;
- checkpoint and exact resume of model, optimizer and loader together: RUN/checkpoint.pt is
  written atomically every --checkpoint-every steps (and at the end) with the loader states of
  all ranks, so --resume continues with exactly the batches and losses an uninterrupted run
  would have had, also with another number of processes;
- RUN/metrics.jsonl: one line per step: step, loss, domain_loss, domain_weights, tokens,
  tokens_per_s, loader_wait_ms.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data

import kiln
import kiln.torch


class Block(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.n_heads)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, d_model, n_layers, n_heads):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, positions):
        """Logits [b, t, vocab]. Attention is causal and stays inside each document: a token
        sees the earlier tokens of its own document only (positions restart at each one)."""
        t = tokens.shape[1]
        segment = torch.cumsum(positions == 0, dim=1)  # document index within the row
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        mask = (causal & (segment[:, :, None] == segment[:, None, :]))[:, None]
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def parse_weights(text):
    weights = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        weights[name.strip()] = float(value)
    return weights


def save_atomic(obj, path):
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="the output folder of kiln prep")
    ap.add_argument("--run", required=True, help="run folder: checkpoint.pt, metrics.jsonl, control/")
    ap.add_argument("--steps", type=int, default=300, help="train until this step")
    ap.add_argument("--resume", action="store_true", help="continue from RUN/checkpoint.pt")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", help="initial domain weights d=w,... (default: token shares)")
    ap.add_argument("--reweight", action="append", default=[], metavar="STEP:d=w,...",
                    help="set the domain weights before STEP (repeatable)")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if torch.cuda.is_available() else torch.device("cpu")
    os.makedirs(os.path.join(args.run, "control"), exist_ok=True)
    manifest = json.load(open(os.path.join(args.data, "manifest.json")))
    vocab = manifest["tokenizer"]["vocab_size"]

    torch.manual_seed(args.seed)
    model = GPT(vocab, args.seq_len, args.d_model, args.layers, args.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = kiln.torch.Dataset(args.data, seq_len=args.seq_len, micro_batch=args.micro_batch,
                              seed=args.seed,
                              weights=parse_weights(args.weights) if args.weights else None)
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    schedule = {}
    for item in args.reweight:
        step, _, spec = item.partition(":")
        schedule[int(step)] = parse_weights(spec)

    step = 0
    ckpt_path = os.path.join(args.run, "checkpoint.pt")
    metrics_path = os.path.join(args.run, "metrics.jsonl")
    control_path = os.path.join(args.run, "control", "mixture.json")
    control_seen = None
    if args.resume:
        ckpt = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        # The states of every rank of the saving run: any world size continues them exactly.
        data.load_state_dict(ckpt["data"])
        step = ckpt["step"]
        control_seen = ckpt.get("control_seen")
        if rank == 0:  # drop metrics lines written after the checkpoint
            lines = open(metrics_path).readlines() if os.path.exists(metrics_path) else []
            with open(metrics_path, "w") as f:
                f.writelines(l for l in lines if json.loads(l)["step"] <= step)
        print("rank %d: resumed at step %d" % (rank, step), flush=True)
    elif rank == 0 and os.path.exists(metrics_path):
        os.remove(metrics_path)

    def checkpoint():
        states = [None] * world
        if distributed:
            dist.all_gather_object(states, data.state_dict())
        else:
            states = [data.state_dict()]
        if rank == 0:
            save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "data": states, "step": step, "control_seen": control_seen}, ckpt_path)

    domains = data.domains
    metrics = open(metrics_path, "a") if rank == 0 else None
    tokens_done, t_last = 0, time.perf_counter()
    batches = iter(torch.utils.data.DataLoader(data, batch_size=None))
    while step < args.steps:
        # Live reweighting: the control file (rank 0 reads, everyone applies) and the schedule.
        new = schedule.get(step)
        if rank == 0 and os.path.exists(control_path):
            text = open(control_path).read()
            if text != control_seen:
                control_seen = text
                new = json.loads(text)["weights"]
        if distributed:
            box = [new]
            dist.broadcast_object_list(box, src=0)
            new = box[0]
        if new is not None:
            data.set_weights(new)  # ValueError (and nothing changes) for bad weights
            if rank == 0:
                print("step %d: domain weights %s" % (step, data.weights), flush=True)

        t0 = time.perf_counter()
        batch = next(batches)
        wait_ms = (time.perf_counter() - t0) * 1e3
        tokens = batch["tokens"].to(device)
        positions = batch["position_ids"][:, :-1].to(device)
        logits = ddp(tokens[:, :-1], positions)
        per_token = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1),
                                    reduction="none").view(tokens.shape[0], -1)
        loss = per_token.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_done += tokens[:, 1:].numel() * world

        row_loss = per_token.detach().mean(dim=1)
        domain_loss = {}
        for d, name in enumerate(domains):
            sel = batch["domain"] == d
            if sel.any():
                domain_loss[name] = round(row_loss[sel].mean().item(), 6)
        if rank == 0:
            now = time.perf_counter()
            line = {"step": step, "loss": loss.item(), "domain_loss": domain_loss,
                    "domain_weights": data.weights, "tokens": tokens_done,
                    "tokens_per_s": round(tokens[:, 1:].numel() * world / max(now - t_last, 1e-9)),
                    "loader_wait_ms": round(wait_ms, 3)}
            t_last = now
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()
            if step % args.log_every == 0 or step == args.steps:
                print("step %d loss %.4f %s" % (step, line["loss"], domain_loss), flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            checkpoint()
    data.close()
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
