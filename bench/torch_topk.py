#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""torch.topk next to gradcomp's exact top-k, on one thread.

    bench/torch_topk.py RESULTS.json [--threads 1] [--reps 7]

RESULTS.json is the output of gradcomp_bench_topk (--benchmark_out=..., as
bench/run_topk_vs_torch.sh writes it). For every (distribution, n, kept ratio) measured there
at the given thread count, this script draws float32 input of the same distribution and size
(normal N(0, 1), uniform U(-1, 1), laplace Laplace(0, 1); torch's own generator, fixed seed),
sets torch.set_num_threads(THREADS), and times, median of REPS calls after one warm-up:

  torch.topk(x.abs(), k)                    the issue's baseline (|x| computed, values sorted)
  torch.topk(ax, k, sorted=False)           on a precomputed ax = |x| (no abs, no sort)

with k = max(1, floor(ratio * n)), as topk_codec::ratio uses. It prints two markdown tables,
wall-clock time and the calling thread's CPU time (both sides run on one thread; on a busy
machine the CPU times are the steadier comparison): gradcomp's select and compress (median ms)
and the speed-up of each over both torch variants.

If PyTorch cannot be imported, prints one "skipped" line and exits 0.
"""

import argparse
import json
import math
import sys
import time


def median_seconds(fn, reps, warmup=1):
    """(median wall seconds, median thread CPU seconds) of `reps` calls."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    wall.sort()
    cpu.sort()
    return wall[len(wall) // 2], cpu[len(cpu) // 2]


def gradcomp_numbers(path, threads):
    """{(op, dist, ratio, n): (median wall ms, median CPU ms)} for the given thread count."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    found = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        parts = b.get("run_name", b["name"]).split("/")
        if len(parts) < 5 or parts[0] not in ("select", "compress"):
            continue
        if parts[4] != "threads:%d" % threads or not parts[2].startswith("ratio="):
            continue
        key = (parts[0], parts[1], float(parts[2][6:]), int(parts[3][2:]))
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        found[key] = (b["ms"], b["cpu_time"] * scale)
    return found


def draw(torch, dist, n, gen):
    if dist == "normal":
        return torch.randn(n, generator=gen, dtype=torch.float32)
    if dist == "uniform":
        return torch.rand(n, generator=gen, dtype=torch.float32) * 2.0 - 1.0
    if dist == "laplace":
        e = torch.empty(n, dtype=torch.float32).exponential_(1.0, generator=gen)
        s = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int8).to(torch.float32) * 2 - 1
        return e * s
    raise ValueError("unknown distribution " + dist)


def size_label(n):
    if n > 0 and n & (n - 1) == 0:
        return "2^%d" % (n.bit_length() - 1)
    return str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # ImportError, or a broken installation
        print("torch_topk.py: skipped (PyTorch cannot be imported by %s: %s)" % (sys.executable, e))
        return 0

    ours = gradcomp_numbers(args.results, args.threads)
    if not ours:
        print("torch_topk.py: no select/compress results for %d thread(s) in %s"
              % (args.threads, args.results))
        return 1
    torch.set_num_threads(args.threads)
    cases = sorted({(d, r, n) for (_, d, r, n) in ours}, key=lambda c: (c[2], c[0], -c[1]))

    rows = []
    inputs = {}
    for dist, ratio, n in cases:
        if (dist, n) not in inputs:
            inputs.clear()  # one input at a time: 2^24 floats are 64 MiB
            gen = torch.Generator().manual_seed(20261123)
            x = draw(torch, dist, n, gen)
            inputs[(dist, n)] = (x, x.abs())
        x, ax = inputs[(dist, n)]
        k = max(1, min(n, math.floor(ratio * n)))
        full = median_seconds(lambda: torch.topk(x.abs(), k), args.reps)
        bare = median_seconds(lambda: torch.topk(ax, k, sorted=False), args.reps)
        rows.append((dist, ratio, n, k, ours.get(("select", dist, ratio, n)),
                     ours.get(("compress", dist, ratio, n)), full, bare))

    def ms(v):
        return "%.2f" % v if v is not None else "—"

    def speedup(t, v):
        return "%.1f×" % (t / v) if v else "—"

    for which, label in ((0, "wall-clock"), (1, "CPU time of the calling thread")):
        print("PyTorch %s, %d thread(s), float32, %s; medians (ms) of %d torch calls and of "
              "gradcomp_bench_topk; speed-up = torch time / gradcomp time"
              % (torch.__version__, torch.get_num_threads(), label, args.reps))
        print()
        print("| n | distribution | k | gradcomp select | gradcomp compress | "
              "torch.topk(x.abs(), k) | select speed-up | compress speed-up | "
              "torch.topk(ax, k, sorted=False) | select speed-up | compress speed-up |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for dist, ratio, n, k, sel, com, full, bare in rows:
            s_ = sel[which] if sel else None
            c_ = com[which] if com else None
            tf = full[which] * 1e3
            tb = bare[which] * 1e3
            print("| %s | %s | %d (%g%%) | %s | %s | %.1f | %s | %s | %.1f | %s | %s |"
                  % (size_label(n), dist, k, ratio * 100, ms(s_), ms(c_), tf, speedup(tf, s_),
                     speedup(tf, c_), tb, speedup(tb, s_), speedup(tb, c_)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
