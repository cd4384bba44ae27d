#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp's DDP hook on CUDA buckets against PyTorch's, per training step, on one GPU.

    bench/torch_cuda_hooks.py [--steps N] [--width W] [--layers L] [--json PATH]

One process, a process group of size 1 over NCCL (the exchange is then the hooks' own work:
compression, the collective call, decoding; what a step costs beyond the model), a float32 MLP of
L linear layers W x W (default 8 x 4096: 134 M parameters, DDP's default 25 MiB buckets) on a
batch of 64, SGD. Each row is a fresh DDP model with one hook, timed per step (forward,
backward with the hook, optimizer step) with torch.cuda.synchronize() around the step, median
of N steps after 5 of warm-up; every row runs in the same process, one after the other:

  ddp_allreduce       DDP's default all-reduce (no hook)
  torch_fp16          torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook
  torch_powersgd_r4   PyTorch's powerSGD_hook, rank 4, from the first step
  gradcomp_fp16       gradcomp.hook, codec fp16, feedback none (the packet path)
  gradcomp_topk       gradcomp.hook, codec topk:ratio=0.01, feedback residual

and then prints the target lines of issue 32 ("target ...: measured R, needed <= 1.00, met" or
"missed"): gradcomp_fp16 against torch_fp16, gradcomp_topk against ddp_allreduce. Without a GPU
(or without the package's CUDA part) it prints one "skipped" line and exits 0.

The figures of one GPU with a process group of size 1 say what the hooks cost on the device,
not what they save on a network: see docs/cuda.md.
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per row (default 30)")
    p.add_argument("--width", type=int, default=4096, help="MLP width (default 4096)")
    p.add_argument("--layers", type=int, default=8, help="linear layers (default 8)")
    p.add_argument("--batch", type=int, default=64, help="batch (default 64)")
    p.add_argument("--json", default=None, help="also write the rows and targets here")
    return p.parse_args(argv)


def make_model(width, layers):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*mods).cuda()


def run_row(name, args, group):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradcomp

    model = DDP(make_model(args.width, args.layers), device_ids=[0], process_group=group)
    state = None
    if name == "torch_fp16":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif name == "torch_powersgd_r4":
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                   min_compression_rate=2, use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    elif name == "gradcomp_fp16":
        state = gradcomp.GradcompState(group, codec="fp16", feedback="none", guard="off")
        model.register_comm_hook(state, gradcomp.hook)
    elif name == "gradcomp_topk":
        state = gradcomp.GradcompState(group, codec="topk:ratio=0.01", feedback="residual", guard="off")
        model.register_comm_hook(state, gradcomp.hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(args.batch, args.width, device="cuda", generator=g)
    y = torch.randint(0, 10, (args.batch,), device="cuda", generator=g)
    times = []
    for step in range(5 + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= 5:
            times.append(time.perf_counter() - t0)
    row = {"name": name, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}
    if isinstance(state, gradcomp.GradcompState):
        row["bytes_sent"] = state.last_stats["bytes_sent"]
        state.close()
    del model, opt
    torch.cuda.empty_cache()
    return row


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist

        import gradcomp
    except ImportError as e:
        print("bench/torch_cuda_hooks.py: skipped (%s)" % e)
        return 0
    if not torch.cuda.is_available() or not gradcomp.has_cuda:
        print("bench/torch_cuda_hooks.py: skipped (torch.cuda.is_available() is %s, gradcomp.has_cuda is %s)"
              % (torch.cuda.is_available(), gradcomp.has_cuda))
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    group = dist.group.WORLD
    params = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    print("bench/torch_cuda_hooks.py: %s, torch %s, gradcomp %s, MLP %d x %d (%d parameters), batch %d, "
          "%d steps per row, NCCL world 1" % (torch.cuda.get_device_name(0), torch.__version__, gradcomp.__version__,
                                             args.layers, args.width, params, args.batch, args.steps))
    rows = {}
    for name in ("ddp_allreduce", "torch_fp16", "torch_powersgd_r4", "gradcomp_fp16", "gradcomp_topk"):
        rows[name] = run_row(name, args, group)
        r = rows[name]
        print("  %-18s median %8.3f ms/step (min %8.3f)%s" % (
            name, r["median_ms"], r["min_ms"], ", %d bytes sent" % r["bytes_sent"] if "bytes_sent" in r else ""))
    targets = []
    for mine, theirs in (("gradcomp_fp16", "torch_fp16"), ("gradcomp_topk", "ddp_allreduce")):
        ratio = rows[mine]["median_ms"] / rows[theirs]["median_ms"]
        met = ratio <= 1.0
        targets.append({"what": "%s / %s per step" % (mine, theirs), "measured": ratio, "needed": 1.0, "met": met})
        print("target %s per step <= 1.00x %s: measured %.2f, needed <= 1.00, %s"
              % (mine, theirs, ratio, "met" if met else "missed"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "targets": targets, "device": torch.cuda.get_device_name(0),
                       "torch": torch.__version__}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
