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

with k = max(1, floor(ratio * n)), as topk_codec::ratio uses. It prints one markdown table:
gradcomp's select and compress (median ms) and the speed-up of each over both torch variants.

If PyTorch cannot be imported, prints one "skipped" line and exits 0.
"""

import argparse
import json
import math
import sys
import time


def median_seconds(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def gradcomp_numbers(path, threads):
    """{(op, dist, ratio, n): median ms} for the given thread count."""
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
        found[key] = b["ms"]
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

    print("PyTorch %s, %d thread(s), float32; times are medians of %d calls (ms); "
          "speed-up = torch time / gradcomp time"
          % (torch.__version__, torch.get_num_threads(), args.reps))
    print()
    print("| n | distribution | k | gradcomp select | gradcomp compress | "
          "torch.topk(x.abs(), k) | select speed-up | compress speed-up | "
          "torch.topk(ax, k, sorted=False) | select speed-up | compress speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    inputs = {}
    for dist, ratio, n in cases:
        if (dist, n) not in inputs:
            inputs.clear()  # one input at a time: 2^24 floats are 64 MiB
            gen = torch.Generator().manual_seed(20261123)
            x = draw(torch, dist, n, gen)
            inputs[(dist, n)] = (x, x.abs())
        x, ax = inputs[(dist, n)]
        k = max(1, min(n, math.floor(ratio * n)))
        t_full = median_seconds(lambda: torch.topk(x.abs(), k), args.reps) * 1e3
        t_bare = median_seconds(lambda: torch.topk(ax, k, sorted=False), args.reps) * 1e3
        sel = ours.get(("select", dist, ratio, n))
        com = ours.get(("compress", dist, ratio, n))

        def ms(v):
            return "%.2f" % v if v is not None else "—"

        def ratio_of(t, v):
            return "%.1f×" % (t / v) if v else "—"

        print("| %s | %s | %d (%g%%) | %s | %s | %.1f | %s | %s | %.1f | %s | %s |"
              % (size_label(n), dist, k, ratio * 100, ms(sel), ms(com), t_full,
                 ratio_of(t_full, sel), ratio_of(t_full, com), t_bare,
                 ratio_of(t_bare, sel), ratio_of(t_bare, com)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
