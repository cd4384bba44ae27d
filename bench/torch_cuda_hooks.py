#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp's DDP hook on CUDA buckets against PyTorch's, per training step, on one GPU.

    bench/torch_cuda_hooks.py [--steps N] [--width W] [--layers L] [--json PATH]
    bench/torch_cuda_hooks.py --smoke        # no GPU needed: every row, tiny, on the CPU

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

``--smoke`` runs every row on the CPU over gloo with a tiny model and 2 steps (gradcomp's rows
through ``gradcomp.packet_hook``, the path CUDA buckets take), so that the script is exercised
where there is no GPU (tests/python/test_packet_path.py runs it); its times are not figures, and
it prints no target lines.

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
    p.add_argument("--smoke", action="store_true", help="every row on the CPU over gloo, tiny (no figures)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.width, args.layers, args.batch = 2, 32, 2, 4
    return args


def make_model(width, layers, device):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*mods).to(device)


def run_row(name, args, group, device):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradcomp

    cuda = device.type == "cuda"
    model = DDP(make_model(args.width, args.layers, device), device_ids=[0] if cuda else None,
                process_group=group)
    # on the CPU (--smoke) gradcomp's rows take the packet path explicitly, as CUDA buckets do
    gradcomp_hook = gradcomp.hook if cuda else gradcomp.packet_hook
    state = None
    if name == "torch_fp16":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif name == "torch_powersgd_r4":
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                   min_compression_rate=2, use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    elif name == "gradcomp_fp16":
        state = gradcomp.GradcompState(group, codec="fp16", feedback="none", guard="off")
        model.register_comm_hook(state, gradcomp_hook)
    elif name == "gradcomp_topk":
        state = gradcomp.GradcompState(group, codec="topk:ratio=0.01", feedback="residual", guard="off")
        model.register_comm_hook(state, gradcomp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.batch, args.width, device=device, generator=g)
    y = torch.randint(0, 10, (args.batch,), device=device, generator=g)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times = []
    for step in range(5 + args.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sync()
        if step >= 5:
            times.append(time.perf_counter() - t0)
    row = {"name": name, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}
    if isinstance(state, gradcomp.GradcompState):
        row["bytes_sent"] = state.last_stats["bytes_sent"]
        row["iterations"] = state.iteration
        state.close()
    del model, opt
    if cuda:
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
    smoke = args.smoke
    if not smoke and (not torch.cuda.is_available() or not gradcomp.has_cuda):
        print("bench/torch_cuda_hooks.py: skipped (torch.cuda.is_available() is %s, gradcomp.has_cuda is %s)"
              % (torch.cuda.is_available(), gradcomp.has_cuda))
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    if smoke:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=0, world_size=1)
        where = "CPU (--smoke: not figures)"
    else:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
        where = torch.cuda.get_device_name(0)
    group = dist.group.WORLD
    params = sum(p.numel() for p in make_model(args.width, args.layers, "cpu").parameters())
    print("bench/torch_cuda_hooks.py: %s, torch %s, gradcomp %s, MLP %d x %d (%d parameters), batch %d, "
          "%d steps per row, %s world 1" % (where, torch.__version__, gradcomp.__version__, args.layers, args.width,
                                           params, args.batch, args.steps, dist.get_backend(group)))
    rows = {}
    for name in ("ddp_allreduce", "torch_fp16", "torch_powersgd_r4", "gradcomp_fp16", "gradcomp_topk"):
        rows[name] = run_row(name, args, group, device)
        r = rows[name]
        print("  %-18s median %8.3f ms/step (min %8.3f)%s" % (
            name, r["median_ms"], r["min_ms"], ", %d bytes sent" % r["bytes_sent"] if "bytes_sent" in r else ""))
    targets = []
    if smoke:
        dist.destroy_process_group()
        return 0
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
