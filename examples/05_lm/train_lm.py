#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""A byte-level language model on the King James Bible, trained by 4 CPU workers with dense DDP
and with gradcomp's low-communication methods, the same tokens for every row.

    build/venv/bin/python examples/05_lm/train_lm.py [--rows A,B,...] [--steps N] [--out DIR]
    build/venv/bin/python examples/05_lm/train_lm.py --smoke          # what scripts/demo runs
    build/venv/bin/python examples/05_lm/train_lm.py --netlab [--rate 100mbit] --rows ddp,diloco

Starts N processes (torch.multiprocessing, default 4) that form one gloo process group on
127.0.0.1 and train, once per row and each from the same seed on the same batches, a small
decoder-only transformer (pre-norm, causal attention through torch's
scaled_dot_product_attention, learned positions, tied input and output embeddings) with AdamW
under a linear warm-up and a cosine decay. Rows (--rows, default all):

  ddp          DistributedDataParallel, dense all-reduce every step (the reference)
  topk         DDP with gradcomp.hook: top-k 1 % + error feedback every step
  onebit_adam  gradcomp.OneBitAdam, the compressed Adam family, synchronous every step
  diloco       gradcomp.DiLoCo: H inner AdamW steps, outer Nesterov (lr 0.7, momentum 0.9)
  streaming    gradcomp.DiLoCo, Streaming DiLoCo: fragments on a staggered schedule, int4
               pseudo-gradients, overlapped with the inner steps
  sparseloco   gradcomp.DiLoCo, SparseLoCo: chunk-wise top-k, 2-bit values, error feedback as
               the outer momentum
  demo         gradcomp.DeMo: chunked DCT, top-k of 8 per chunk of 64, signs

The per-step rows (ddp, topk) train with AdamW by default; `--optimizer sgd` gives them
torch.optim.SGD with `--momentum` instead, and `--momentum-fold` the momentum rule for top-k
with error feedback: `documented` is docs/pytorch.md's (momentum 0, the scheduled rate times
(1 - beta^(t+1)) / (1 - beta), up to 1 / (1 - beta)), `capped` the same ramp stopped at
`--fold-cap` (3 by default). The other rows keep their own optimizers.

A row whose API this gradcomp does not have is reported as "unavailable" (and the others run).
Validation loss (nats per byte and bits per character: a byte is a character, the text is
ASCII) is measured at fixed steps (--eval-every) on fixed windows of the held-out chapters,
each rank scoring its share of them with its own model; bytes sent per worker are counted by
what sends them (a counting wrapper around DDP's all-reduce hook, the gradcomp hook's totals,
the wrappers' bytes_sent). Writes OUT/results.jsonl (one JSON object per row), OUT/summary.csv,
OUT/evals.csv (one line per row and evaluation); examples/05_lm/plot.py draws them.

The corpus is prepared by examples/05_lm/corpus.py (Debian's bible-kjv-text; cached in
build/datasets/kjv). README.md beside this file has the details.
"""

import argparse
import csv
import json
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402

ROWS = ["ddp", "topk", "onebit_adam", "diloco", "streaming", "sparseloco", "demo"]
# Which gradcomp attribute each row needs (None: what gradcomp has had since the DDP hook).
NEEDS = {"ddp": None, "topk": "hook", "onebit_adam": "OneBitAdam", "diloco": "DiLoCo",
         "streaming": "DiLoCo", "sparseloco": "DiLoCo", "demo": "DeMo"}
VOCAB = 256


# ----------------------------------------------------------------------------------------------
# Model

class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """Decoder-only transformer over bytes: pre-norm blocks, causal attention, learned
    positions, the output projection tied to the token embedding."""

    def __init__(self, d, layers, heads, seq):
        super().__init__()
        if d % heads:
            raise SystemExit("train_lm.py: --d-model %d is not a multiple of --heads %d" % (d, heads))
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2's initialisation: 0.02, the residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                torch.nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln(x), self.tok.weight)


def make_model(cfg):
    torch.manual_seed(cfg["seed"])
    return TinyLM(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq"])


def count_params(cfg):
    """The model's parameter count, built on the meta device (no memory, no computation: the
    parent process stays free of torch's thread pools before it forks the workers)."""
    with torch.device("meta"):
        model = TinyLM(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq"])
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# Data and schedule

def load_tokens(path):
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)


def batch(tokens, cfg, step, rank):
    """Rank `rank`'s sequences of step `step`: the step's global batch is drawn from a generator
    seeded by (seed, step), so every row sees the same tokens whatever it does in between."""
    g = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + step)
    per, world, seq = cfg["batch"], cfg["workers"], cfg["seq"]
    starts = torch.randint(0, len(tokens) - seq - 1, (world * per,), generator=g)
    mine = starts[rank * per:(rank + 1) * per]
    rows = torch.stack([tokens[s:s + seq + 1] for s in mine.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def val_windows(tokens, cfg):
    """The validation windows: val_windows evenly spaced windows of seq + 1 bytes."""
    n, seq = cfg["val_windows"], cfg["seq"]
    span = len(tokens) - seq - 1
    starts = [round(i * span / max(1, n - 1)) for i in range(n)]
    return torch.stack([tokens[s:s + seq + 1] for s in starts]).long()


def lr_at(cfg, step):
    """Linear warm-up over warmup_frac of the steps, then a cosine down to min_lr_frac."""
    warm = max(1, round(cfg["warmup_frac"] * cfg["steps"]))
    if step < warm:
        return cfg["lr"] * (step + 1) / warm
    t = (step - warm) / max(1, cfg["steps"] - warm)
    floor = cfg["min_lr_frac"]
    return cfg["lr"] * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


FOLDS = ("none", "documented", "capped")


def fold_factor(beta, step, fold="documented", cap=3.0):
    """The factor the scheduled rate of step `step` (from 0) is multiplied by when momentum
    `beta` is folded into it: what momentum SGD moves for a constant gradient,
    (1 - beta^(step+1)) / (1 - beta) (1 at step 0, 1 / (1 - beta) in the limit) under
    `documented`; that, at most `cap`, under `capped`; 1 under `none` or when beta is 0."""
    if fold not in FOLDS:
        raise ValueError("--momentum-fold: unknown rule %r (known: %s)" % (fold, ", ".join(FOLDS)))
    if fold == "none" or beta <= 0.0:
        return 1.0
    ramp = (1.0 - beta ** (step + 1)) / (1.0 - beta)
    return min(ramp, cap) if fold == "capped" else ramp


def make_inner(params, cfg):
    """The per-step rows' optimizer: AdamW (the default), or SGD with --momentum, momentum 0
    when a fold rule carries it in the learning rate instead."""
    if cfg.get("optimizer", "adamw") == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95),
                                 weight_decay=cfg["weight_decay"])
    folded = cfg.get("momentum_fold", "none") != "none"
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=0.0 if folded else cfg["momentum"],
                           weight_decay=cfg["weight_decay"])


def ddp_formula_bytes(params, steps, world):
    """DDP's bytes per worker: the payload, 4 bytes per parameter per step, and what a ring
    all-reduce moves of it, times 2(W - 1)/W."""
    payload = 4 * params * steps
    return payload, payload * 2 * (world - 1) / world


# ----------------------------------------------------------------------------------------------
# Rows

class CountingAllReduce:
    """DDP's own all-reduce (PyTorch's allreduce_hook) with a byte counter: the payload of each
    bucket (4 bytes per fp32 element) and the ring traffic it makes, 2(W - 1)/W times that."""

    def __init__(self, group, world):
        self.group, self.world = group, world
        self.bytes_sent = 0
        self.wire_bytes = 0.0



def counting_allreduce(counter, bucket):
    """The DDP communication hook of the ddp row (its state: a CountingAllReduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    b = bucket.buffer()
    n = b.numel() * b.element_size()
    counter.bytes_sent += n
    counter.wire_bytes += n * 2 * (counter.world - 1) / counter.world
    return default_hooks.allreduce_hook(counter.group, bucket)


class Row:
    """One row's training objects: model, optimizer(s) and how it counts bytes."""

    def __init__(self, name, cfg, rank):
        gradcomp = None if name == "ddp" else __import__("gradcomp")
        self.name, self.cfg = name, cfg
        self.model = make_model(cfg)
        self.state = None  # a GradcompState, for report_loss
        self.wrapper = None  # a DiLoCo, stepped after the inner optimizer
        self.counter = None
        self.wire = 0.0  # modeled ring traffic, summed over the steps (after_step)
        self.wire_steps = 0
        self.options = {}
        self.fold = "none"  # the momentum rule of a per-step row under --optimizer sgd
        adamw = dict(lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"])
        world = cfg["workers"]
        if name in ("ddp", "topk"):
            from torch.nn.parallel import DistributedDataParallel

            self.net = DistributedDataParallel(self.model)
            if name == "ddp":
                self.counter = CountingAllReduce(dist.group.WORLD, world)
                self.net.register_comm_hook(self.counter, counting_allreduce)
            else:
                self.options = dict(codec="topk:ratio=%g" % cfg["topk_ratio"], feedback="residual",
                                    seed=cfg["seed"], start_iter=0, batch_size=cfg["batch"])
                self.state = gradcomp.GradcompState(**self.options)
                self.net.register_comm_hook(self.state, gradcomp.hook)
            self.opt = make_inner(self.model.parameters(), cfg)
            self.fold = cfg.get("momentum_fold", "none")
            return
        self.net = self.model
        if name == "onebit_adam":
            # AdamW's settings under OneBitAdam's names; its other options at their defaults
            self.options = dict(lr=cfg["lr"], beta1=0.9, beta2=0.95,
                                weight_decay=cfg["weight_decay"], decay="decoupled")
            self.opt = gradcomp.OneBitAdam(self.model.parameters(), **self.options)
        elif name == "demo":
            # the paper's chunk 64 and k 8; its decoupled weight decay scaled like AdamW's
            self.options = dict(lr=cfg["demo_lr"], chunk=64, topk=8,
                                weight_decay=cfg["weight_decay"])
            self.opt = gradcomp.DeMo(self.model.parameters(), **self.options)
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), **adamw)
            h = cfg["sync_every"]
            if name == "diloco":
                self.options = dict(sync_every=h, outer="nesterov", outer_lr=0.7,
                                    outer_momentum=0.9, codec="identity")
            elif name == "streaming":
                self.options = dict(sync_every=h, outer="nesterov", outer_lr=0.7,
                                    outer_momentum=0.9, codec="int4",
                                    fragments=cfg["fragments"], overlap=cfg["overlap"])
            elif name == "sparseloco":
                self.options = dict(sync_every=h, outer="sparseloco", outer_lr=1.0,
                                    outer_momentum=0.95,
                                    codec="chunk_topk:chunk=%d,k=%d,values=int2" % (
                                        cfg["sparse_chunk"], cfg["sparse_k"]))
            else:
                raise SystemExit("train_lm.py: unknown row %r" % name)
            self.wrapper = gradcomp.DiLoCo(self.model, self.opt, **self.options)

    def set_lr(self, lr, scale, step=0):
        factor = fold_factor(self.cfg["momentum"], step, self.fold, self.cfg["fold_cap"]) \
            if self.fold != "none" else 1.0
        for group in self.opt.param_groups:
            group["lr"] = lr * scale * factor

    def step(self):
        self.opt.step()
        if self.wrapper is not None:
            self.wrapper.step()

    def bytes_sent(self):
        """(payload bytes, ring traffic bytes or None) this worker has sent so far."""
        if self.counter is not None:
            return self.counter.bytes_sent, self.counter.wire_bytes
        if self.state is not None:
            return self.state.totals["bytes_sent"], self.wire
        owner = self.wrapper if self.wrapper is not None else self.opt
        wire = getattr(owner, "wire_bytes", None)
        if wire is None and self.wire_steps:
            wire = self.wire
        return int(owner.bytes_sent), (float(wire) if wire is not None else None)

    def after_step(self):
        """Adds this step's ring traffic: the gradcomp hook's and OneBitAdam's modeled
        `wire_bytes`; for an all-gather that reports only what it receives (DeMo), that: a ring
        all-gather forwards as many bytes as each rank receives."""
        if self.state is not None:
            self.state.wait()
            self.wire += float(self.state.last_stats.get("wire_bytes", float("nan")))
            return
        stats = getattr(self.wrapper if self.wrapper is not None else self.opt, "last_stats", None)
        if isinstance(stats, dict):
            for key in ("wire_bytes", "received_bytes"):
                if key in stats:
                    self.wire += float(stats[key])
                    self.wire_steps += 1
                    break

    def close(self):
        if self.state is not None:
            self.state.close()
        for obj in (self.wrapper, self.opt):
            close = getattr(obj, "close", None)
            if callable(close):
                close()


def evaluate(model, windows, rank, world):
    """The mean loss in nats per token over every window, each rank scoring windows r, r+W, ...
    with its own model (the sum is all-reduced: not counted as training bytes)."""
    mine = windows[rank::world]
    model.eval()
    with torch.no_grad():
        logits = model(mine[:, :-1])
        total = F.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1),
                                reduction="sum").double()
    model.train()
    t = torch.stack([total, torch.tensor(float(mine[:, 1:].numel()), dtype=torch.float64)])
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def train_row(name, cfg, rank, train_tokens, windows):
    world = cfg["workers"]
    row = Row(name, cfg, rank)
    evals, losses = [], []
    wall = 0.0
    scale = cfg["demo_lr"] / cfg["lr"] if name == "demo" and cfg["lr"] else 1.0
    status = "ok"
    tokens_per_step = cfg["batch"] * cfg["seq"] * world

    def record(step):
        nats = evaluate(row.model, windows, rank, world)
        sent, wire = row.bytes_sent()
        evals.append({"step": step, "tokens": step * tokens_per_step, "val_nats": nats,
                      "val_bpc": nats / math.log(2), "bytes_sent": sent, "wire_bytes": wire,
                      "wall_s": wall})
        if rank == 0 and cfg.get("progress"):
            print("train_lm.py: %s step %d: validation %.4f nats/byte, %.3f MB sent, %.1f s"
                  % (name, step, nats, sent / 1e6, wall), file=sys.stderr, flush=True)
        return nats

    record(0)
    step = 0
    try:
        for step in range(cfg["steps"]):
            start = time.perf_counter()
            row.set_lr(lr_at(cfg, step), scale, step)
            x, y = batch(train_tokens, cfg, step, rank)
            loss = F.cross_entropy(row.net(x).reshape(-1, VOCAB), y.reshape(-1))
            if row.state is not None:
                row.state.report_loss(loss)
            row.opt.zero_grad(set_to_none=True)
            loss.backward()
            row.step()
            row.after_step()
            wall += time.perf_counter() - start
            losses.append(loss.item())
            done = step + 1
            if done % cfg["eval_every"] == 0 or done == cfg["steps"]:
                nats = record(done)
                bad = torch.tensor([0.0 if math.isfinite(nats) else 1.0])
                dist.all_reduce(bad)
                if bad.item() > 0:
                    status = "diverged (validation loss not finite at step %d)" % done
                    break
    except Exception as e:  # noqa: BLE001 - a row that stops keeps what it measured
        what = str(e)
        if "divergence guard" not in what:
            raise
        # gradcomp's guard raises on every rank at the same step (it decides on all-reduced
        # norms), so every rank ends the row here and the next row starts together
        status = "diverged: stopped by gradcomp's divergence guard at step %d (%s)" % (
            step, what[what.index("divergence guard"):][:160])
    try:
        sent, wire = row.bytes_sent()  # before close(): a closed GradcompState has no totals
    finally:
        row.close()
    return {"row": name, "status": status, "options": {k: str(v) for k, v in row.options.items()},
            "evals": evals, "train_loss": losses, "bytes_sent": sent, "wire_bytes": wire,
            "wall_s": wall, "steps": len(losses)}


def worker(rank, cfg, rows, port, queue):
    torch.set_num_threads(cfg["threads"])
    os.environ["GRADCOMP_NUM_THREADS"] = str(cfg["threads"])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg["workers"],
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    try:
        data = Path(cfg["data"])
        train_tokens = load_tokens(data / "train.bin")
        windows = val_windows(load_tokens(data / "val.bin"), cfg)
        for name in rows:
            try:
                result = train_row(name, cfg, rank, train_tokens, windows)
            except Exception as e:  # noqa: BLE001 - reported as the row's status
                result = {"row": name, "status": "failed: %s: %s" % (type(e).__name__, e),
                          "traceback": traceback.format_exc()}
            if rank == 0:
                queue.put(("row", result))
            dist.barrier()
    except BaseException:  # noqa: B902 - to the parent
        queue.put(("error", "rank %d: %s" % (rank, traceback.format_exc())))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, rows, on_row):
    """Runs `rows` on cfg["workers"] processes; calls on_row(result) as each row finishes."""
    # fork where there is one: the workers inherit the imported torch instead of importing it
    # again (seconds each on a loaded machine); the parent has run no torch computation.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, cfg, rows, port, queue), daemon=True)
             for r in range(cfg["workers"])]
    for p in procs:
        p.start()
    got = 0
    deadline = time.monotonic() + cfg["timeout_s"] * (len(rows) + 1)
    error = None
    while got < len(rows) and error is None:
        if not queue.empty():
            kind, item = queue.get()
            if kind == "row":
                got += 1
                on_row(item)
            else:
                error = item
        elif time.monotonic() > deadline or all(not p.is_alive() for p in procs):
            error = "the workers stopped or timed out after %d of %d rows" % (got, len(rows))
        else:
            time.sleep(0.05)
    for p in procs:
        p.join(timeout=30 if error is None else 1)
        if p.is_alive():
            p.kill()
    if error is not None:
        raise SystemExit("train_lm.py: %s" % error)


# ----------------------------------------------------------------------------------------------
# Driver

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (%(default)s)")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny model and 40 steps per row (about a minute for every row): scripts/demo")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=None, help="steps (300; smoke 40)")
    p.add_argument("--batch", type=int, default=None, help="sequences per worker per step (8; smoke 4)")
    p.add_argument("--seq", type=int, default=None, help="context in bytes (128; smoke 64)")
    p.add_argument("--d-model", type=int, default=None, help="width (256; smoke 64)")
    p.add_argument("--layers", type=int, default=None, help="blocks (6; smoke 2)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (4; smoke 2)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's peak learning rate")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="the per-step rows' (ddp, topk) optimizer (%(default)s); "
                        "--lr is its peak rate")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="SGD's momentum under --optimizer sgd (%(default)s)")
    p.add_argument("--momentum-fold", choices=FOLDS, default="none",
                   help="under --optimizer sgd: none (SGD's own momentum), documented (momentum 0, "
                        "the rate ramped by (1 - beta^(t+1)) / (1 - beta)), capped (that ramp at "
                        "most --fold-cap)")
    p.add_argument("--fold-cap", type=float, default=3.0,
                   help="the largest ramp factor of --momentum-fold capped (%(default)s)")
    p.add_argument("--demo-lr", type=float, default=None,
                   help="DeMo's peak learning rate (its update is a sign: default 3e-4)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-frac", type=float, default=0.05)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (30; smoke 10)")
    p.add_argument("--val-windows", type=int, default=None, help="validation windows (64; smoke 16)")
    p.add_argument("--sync-every", type=int, default=None, help="DiLoCo's H (30; smoke 10)")
    p.add_argument("--fragments", type=int, default=3, help="Streaming DiLoCo's fragments")
    p.add_argument("--overlap", type=int, default=1, help="Streaming DiLoCo's overlap (inner steps)")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--sparse-chunk", type=int, default=4096)
    p.add_argument("--sparse-k", type=int, default=96, help="SparseLoCo's k per chunk (96/4096: 2.3 %%)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quiet", action="store_true", help="no line per evaluation")
    p.add_argument("--timeout-s", type=float, default=1800.0,
                   help="gloo's timeout, and the parent's per row")
    p.add_argument("--data", default=None, help="corpus directory (corpus.py's; build/datasets/kjv)")
    p.add_argument("--out", default=None, help="output directory (build/lm; smoke build/lm-smoke)")
    p.add_argument("--netlab", action="store_true",
                   help="run inside bench/netlab.sh --rate RATE (a shaped loopback; needs root)")
    p.add_argument("--rate", default="100mbit", help="the network lab's rate (%(default)s)")
    args = p.parse_args(argv)
    smoke = args.smoke
    defaults = dict(steps=(40, 300), batch=(4, 8), seq=(64, 128), d_model=(64, 256),
                    layers=(2, 6), heads=(2, 4), eval_every=(10, 30), val_windows=(16, 64),
                    sync_every=(10, 30))
    for k, (small, full) in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, small if smoke else full)
    if args.demo_lr is None:
        args.demo_lr = 3e-4
    if args.out is None:
        args.out = str(ROOT / "build" / ("lm-smoke" if smoke else "lm"))
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error("--rows: unknown row(s) %s (known: %s)" % (", ".join(unknown), ", ".join(ROWS)))
    args.row_list = rows
    for k in ("workers", "steps", "batch", "seq", "d_model", "layers", "heads", "eval_every",
              "val_windows", "sync_every", "threads"):
        if getattr(args, k) < 1:
            p.error("--%s must be at least 1" % k.replace("_", "-"))
    if args.optimizer != "sgd" and args.momentum_fold != "none":
        p.error("--momentum-fold %s needs --optimizer sgd (AdamW has its own momentum)"
                % args.momentum_fold)
    if not 0.0 <= args.momentum < 1.0:
        p.error("--momentum must be in [0, 1), not %g" % args.momentum)
    if not args.fold_cap >= 1.0:
        p.error("--fold-cap must be at least 1, not %g" % args.fold_cap)
    return args


def config(args):
    keys = ("workers", "steps", "batch", "seq", "d_model", "layers", "heads", "lr", "demo_lr",
            "weight_decay", "warmup_frac", "min_lr_frac", "eval_every", "val_windows",
            "sync_every", "fragments", "overlap", "topk_ratio", "sparse_chunk", "sparse_k",
            "threads", "seed", "timeout_s", "optimizer", "momentum", "momentum_fold", "fold_cap")
    cfg = {k: getattr(args, k) for k in keys}
    cfg["progress"] = not args.quiet
    return cfg


def inner_name(args):
    """The per-step rows' optimizer, in words, for the log line."""
    if args.optimizer == "adamw":
        return "AdamW"
    if args.momentum_fold == "none":
        return "SGD momentum %g" % args.momentum
    if args.momentum_fold == "documented":
        return "SGD, momentum %g folded into the rate" % args.momentum
    return "SGD, momentum %g folded into the rate, ramp capped at %g" % (
        args.momentum, args.fold_cap)


def availability(rows):
    """{row: None if it can run, else why not}."""
    try:
        import gradcomp
    except ImportError as e:
        return {r: None if r == "ddp" else "unavailable: cannot import gradcomp (%s)" % e
                for r in rows}
    out = {}
    for r in rows:
        need = NEEDS[r]
        out[r] = None if need is None or hasattr(gradcomp, need) else (
            "unavailable: this gradcomp has no %s" % need)
    return out


def summarise(results, cfg, params):
    """Rows of the summary table, with the gap to ddp and x fewer bytes."""
    ref = next((r for r in results if r["row"] == "ddp" and r["status"] == "ok"), None)
    table = []
    for r in results:
        line = {"row": r["row"], "status": r["status"]}
        if r.get("evals"):
            final = r["evals"][-1]
            line.update(val_nats=final["val_nats"], val_bpc=final["val_bpc"],
                        bytes_sent=r["bytes_sent"], wire_bytes=r["wire_bytes"],
                        wall_s=r["wall_s"], steps=r["steps"],
                        tokens=final["tokens"])
            if ref is not None and r["status"] == "ok":
                rf = ref["evals"][-1]
                line["gap_nats"] = final["val_nats"] - rf["val_nats"]
                line["gap_pct"] = 100 * line["gap_nats"] / rf["val_nats"]
                line["fewer_bytes"] = (ref["bytes_sent"] / r["bytes_sent"]
                                       if r["bytes_sent"] else float("inf"))
        table.append(line)
    return table


def fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec % v


def print_table(table, file=sys.stdout):
    head = "%-12s %9s %7s %10s %12s %9s %9s  %s" % (
        "row", "val nats", "bpc", "gap", "MB/worker", "x fewer", "wall s", "status")
    print(head, file=file)
    for t in table:
        print("%-12s %9s %7s %10s %12s %9s %9s  %s" % (
            t["row"], fmt(t.get("val_nats"), "%.4f"), fmt(t.get("val_bpc"), "%.3f"),
            fmt(t.get("gap_pct"), "%+.2f %%"), fmt(t.get("bytes_sent") and t["bytes_sent"] / 1e6, "%.3f"),
            fmt(t.get("fewer_bytes"), "%.0fx"), fmt(t.get("wall_s"), "%.1f"), t["status"]),
            file=file, flush=True)


def write_outputs(out, results, table, meta):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(dict(r, meta=meta)) + "\n")
    cols = ["row", "status", "val_nats", "val_bpc", "gap_nats", "gap_pct", "bytes_sent",
            "wire_bytes", "fewer_bytes", "wall_s", "steps", "tokens"]
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for t in table:
            w.writerow(t)
    with open(out / "evals.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "step", "tokens", "val_nats", "val_bpc", "bytes_sent", "wire_bytes",
                    "wall_s"])
        for r in results:
            for e in r.get("evals", []):
                w.writerow([r["row"], e["step"], e["tokens"], e["val_nats"], e["val_bpc"],
                            e["bytes_sent"], e["wire_bytes"], e["wall_s"]])


def run(args):
    """Trains every row of args.row_list; returns (results, table, meta)."""
    data = Path(args.data) if args.data else corpus.prepare()[0]
    cfg = config(args)
    cfg["data"] = str(data)
    params = count_params(cfg)
    payload, ring = ddp_formula_bytes(params, args.steps, args.workers)
    meta = {"config": cfg, "params": params, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "tokens_per_step": args.batch * args.seq * args.workers,
            "netlab_rate": os.environ.get("GRADCOMP_NETLAB_RATE"),
            "ddp_formula": {"payload": payload, "ring": ring}}
    print("train_lm.py: %d workers (gloo, %d thread(s) each), transformer d=%d x %d layers, "
          "%d heads, context %d: %.2f M parameters; %d steps of %d tokens (%d per worker), "
          "%s lr %g; data %s" % (
              args.workers, args.threads, args.d_model, args.layers, args.heads, args.seq,
              params / 1e6, args.steps, meta["tokens_per_step"], args.batch * args.seq,
              inner_name(args), args.lr, data), file=sys.stderr, flush=True)
    avail = availability(args.row_list)
    runnable = [r for r in args.row_list if avail[r] is None]
    results = {r: {"row": r, "status": avail[r]} for r in args.row_list if avail[r]}
    out = Path(args.out)

    def on_row(result):
        results[result["row"]] = result
        print("train_lm.py: %s: %s%s" % (
            result["row"], result["status"],
            "" if not result.get("evals") else ", validation %.4f nats/byte, %.3f MB sent, %.1f s"
            % (result["evals"][-1]["val_nats"], result["bytes_sent"] / 1e6, result["wall_s"])),
            file=sys.stderr, flush=True)
        done = [results[r] for r in args.row_list if r in results]
        write_outputs(out, done, summarise(done, cfg, params), meta)

    if runnable:
        launch(cfg, runnable, on_row)
    ordered = [results[r] for r in args.row_list]
    table = summarise(ordered, cfg, params)
    write_outputs(out, ordered, table, meta)
    return ordered, table, meta


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.netlab and "GRADCOMP_NETLAB_RATE" not in os.environ:
        rest = [a for a in argv if a != "--netlab"]
        if "--out" not in rest:
            rest += ["--out", str(ROOT / "build" / ("lm-netlab-%s" % args.rate))]
        cmd = [str(ROOT / "bench" / "netlab.sh"), "--rate", args.rate, "--",
               sys.executable, str(Path(__file__).resolve()), "--netlab"] + rest
        return subprocess.call(cmd)
    started = time.perf_counter()
    _, table, _ = run(args)
    print_table(table)
    print("train_lm.py: %.1f s; results in %s (plot: examples/05_lm/plot.py %s)" % (
        time.perf_counter() - started, args.out, args.out), file=sys.stderr)
    failed = [t["row"] for t in table if t["status"].startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
