# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Captures gradients of the language-model example (examples/05_lm) for gradcomp-bench.

Builds the example's byte-level transformer at its full size (width 256, 6 blocks, 4 heads,
context 128: 4.8 M parameters, the same initialisation and seed as train_lm.py), trains it in
this one process with AdamW under the example's warm-up and cosine schedule of a --schedule-step
run, on the sequences that rank 0 of a --workers-process run of train_lm.py draws at each step
(train_lm.batch: the same tokens), for --warmup steps, then records --steps more with
gradcomp.capture into --out. What is recorded is one worker's gradient of --batch sequences,
before any averaging: what that worker would compress. The weights are those of this one-process
training, not of the --workers-process average (with --workers 1 it follows the example's ddp row
on one worker: the same model, batches, schedule and optimizer).

    python bench/capture_lm.py --out build/lm-grads
    gradcomp-bench build/lm-grads --flatten --threads 1

The corpus comes from examples/05_lm/corpus.py (cached in build/datasets/kjv; --data names
another copy).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "05_lm"))
import corpus  # noqa: E402
import train_lm  # noqa: E402

import gradcomp  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="capture directory to write")
    ap.add_argument("--warmup", type=int, default=200, help="training steps before the capture (%(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="steps captured (%(default)s)")
    ap.add_argument("--schedule-steps", type=int, default=300,
                    help="length of the run whose learning-rate schedule is followed (%(default)s, train_lm.py's)")
    ap.add_argument("--workers", type=int, default=4, help="workers of the run whose rank 0 is followed (%(default)s)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (%(default)s, train_lm.py's per worker)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (%(default)s)")
    ap.add_argument("--data", default=None, help="corpus directory (corpus.py's; build/datasets/kjv)")
    args = ap.parse_args(argv)
    for k in ("warmup", "schedule_steps", "workers", "batch", "seq", "d_model", "layers", "heads", "threads"):
        if getattr(args, k) < (0 if k == "warmup" else 1):
            ap.error("--%s must be at least %d" % (k.replace("_", "-"), 0 if k == "warmup" else 1))
    if args.steps < 1:
        ap.error("--steps must be at least 1")

    torch.set_num_threads(args.threads)
    data = Path(args.data) if args.data else corpus.prepare()[0]
    tokens = train_lm.load_tokens(data / "train.bin")
    cfg = dict(seed=1, workers=args.workers, batch=args.batch, seq=args.seq, d_model=args.d_model,
               layers=args.layers, heads=args.heads, lr=1e-3, weight_decay=0.1, warmup_frac=0.05,
               min_lr_frac=0.1, steps=args.schedule_steps)
    model = train_lm.make_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                            weight_decay=cfg["weight_decay"])
    cap = None
    start = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            cap = gradcomp.capture(model, steps=args.steps, out=args.out)
        for group in opt.param_groups:
            group["lr"] = train_lm.lr_at(cfg, step)
        x, y = train_lm.batch(tokens, cfg, step, 0)
        loss = F.cross_entropy(model(x).reshape(-1, train_lm.VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step >= args.warmup:
            print(f"step {step} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    cap.close()
    print(f"captured {cap.recorded} steps of {sum(p.numel() for p in model.parameters())} gradient values "
          f"(steps {args.warmup}-{args.warmup + args.steps - 1}) into {args.out}")


if __name__ == "__main__":
    main()
