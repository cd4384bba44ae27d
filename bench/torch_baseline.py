#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""PyTorch reference points for gradcomp's codec benchmark, on one thread at 2^24 elements.

    bench/torch_baseline.py [RESULTS.json]

Times, on float32 N(0, 1) input of 2^24 elements with torch.set_num_threads(1):
  x.sum()                          (PyTorch's own streaming read)
  x.half() into a preallocated     out16.copy_(x)
  x.bfloat16() into a preallocated outbf.copy_(x)
  torch.sign(x, out=preallocated)  (float32 signs, not bit-packed)
and prints GB/s (input bytes n * 4 / median time) next to gradcomp's numbers for the same
work, taken from RESULTS.json (gradcomp_bench_codecs --benchmark_out=..., e.g. the
build/bench/codecs.json that bench/run_codecs.sh writes) when given, with their ratio, and one
line per counterpart: "target torch/OP: measured R, needed 1.00, met|missed" (issue 17: gradcomp
at least as fast as PyTorch on each).

Preallocated outputs are used because a library that reuses its buffers should be compared
with them; allocating variants also pay page faults on a fresh 32-64 MiB tensor.
If PyTorch cannot be imported, prints one "skipped" line and exits 0 (it is not installed by
any gradcomp script).
"""

import json
import sys
import time

N = 1 << 24


def median_seconds(fn, reps=15, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def gradcomp_numbers(path):
    """{(op, spec): GB/s} at n = 2^24 on one thread, from the median aggregates."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    found = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        parts = b.get("run_name", b["name"]).split("/")
        if len(parts) < 4 or parts[2] != "n:%d" % N or parts[3] != "threads:1":
            continue
        if "GB/s" in b:
            found[(parts[0], parts[1])] = b["GB/s"]
    return found


def main():
    try:
        import torch
    except Exception as e:  # ImportError, or a broken installation
        print("torch_baseline.py: skipped (PyTorch cannot be imported: %s)" % e)
        return 0

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20261122)
    x = torch.randn(N, generator=gen, dtype=torch.float32)
    out16 = torch.empty(N, dtype=torch.float16)
    outbf = torch.empty(N, dtype=torch.bfloat16)
    signs = torch.empty(N, dtype=torch.float32)
    for t in (out16, outbf, signs):
        t.zero_()  # fault the pages in before timing

    ours = gradcomp_numbers(sys.argv[1]) if len(sys.argv) > 1 else {}
    cases = [
        ("x.sum()", lambda: x.sum(), ("baseline", "read")),
        ("x.half() into preallocated", lambda: out16.copy_(x), ("compress", "fp16")),
        ("x.bfloat16() into preallocated", lambda: outbf.copy_(x), ("compress", "bf16")),
        ("torch.sign(x, out=...)", lambda: torch.sign(x, out=signs),
         ("compress", "onebit:scaling=none")),
    ]
    print("PyTorch %s, 1 thread, n = 2^24 float32; GB/s = n * 4 / median time" % torch.__version__)
    print()
    print("| operation | PyTorch GB/s | gradcomp counterpart | gradcomp GB/s | gradcomp / PyTorch |")
    print("|---|---:|---|---:|---:|")
    targets = []
    for label, fn, counterpart in cases:
        gbs = N * 4 / median_seconds(fn) / 1e9
        theirs = ours.get(counterpart)
        ratio = theirs / gbs if theirs is not None and gbs > 0 else None
        print("| %s | %.2f | %s %s | %s | %s |" % (
            label, gbs, counterpart[0], counterpart[1],
            "%.2f" % theirs if theirs is not None else "—",
            "%.2f" % ratio if ratio is not None else "—"))
        if ratio is not None:
            targets.append("target torch/%s %s: measured %.2f, needed 1.00, %s" % (
                counterpart[0], counterpart[1], ratio, "met" if ratio >= 1.0 else "missed"))
    if targets:
        print()
        for t in targets:
            print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
