#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""DeMo's transform: gradcomp's ``dct_sign`` codec next to the same transform in torch ops.

    PYTHONPATH=<build>/python bench/dct_vs_torch.py [--sizes 20,24] [--chunk 64] [--k 8]
                                                     [--threads 1,all] [--reps 9]

For every size n = 2^s and thread setting, in one process per thread setting (the thread
counts are fixed before gradcomp's pool and torch's are created: ``GRADCOMP_NUM_THREADS`` and
``torch.set_num_threads``; "all" leaves both at their defaults, the machine's cores), on the
same float32 N(0, 1) tensor, it times, median of REPS rounds, each round calling the two sides
one after the other (so that a busy machine slows both alike):

  gradcomp   packet = Codec("dct_sign:chunk=C,k=K").compress(x); codec.decompress(packet, y)
  torch      the same transform with torch ops, on the CPU:
             X = x (zero-padded to whole chunks) viewed as (n/C, C); coef = X @ B.T (B the
             orthonormal DCT-II basis, C x C); idx = topk(|coef|, K, dim=1); kept = coef at idx;
             scale = mean |kept|; signs = sign(kept);                           (compress)
             S = zeros, S[idx] = scale * signs; y = (S @ B) flattened, cut to n (decompress)

and the compress and decompress halves separately (each side's compress, then its decompress
from its own compressed form). torch's side keeps its values unpacked (int64 indices, float
signs): it is the transform only, without gradcomp's bit packing. Before timing it checks that
both sides decode to the same tensor (up to float rounding: the DCT sums are evaluated in
another order; indices where coefficients tie may differ) and prints the largest difference.

Prints a markdown table: milliseconds (median wall time; for one thread also the calling
thread's CPU time, steadier on a busy machine) and the ratio torch / gradcomp (>= 1: gradcomp
at least as fast). Needs torch and the gradcomp package (the build's python/ on PYTHONPATH).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def dct_basis(C, torch):
    """The orthonormal DCT-II basis (row u = phi_u), computed in double, rounded once."""
    i = torch.arange(C, dtype=torch.float64)
    u = i.view(-1, 1)
    b = torch.cos(math.pi * (2 * i + 1) * u / (2 * C))
    b[0] *= math.sqrt(1.0 / C)
    b[1:] *= math.sqrt(2.0 / C)
    return b.to(torch.float32).contiguous()


def torch_compress(x, B, C, k, torch):
    n = x.numel()
    nc = (n + C - 1) // C
    if nc * C != n:
        x = torch.nn.functional.pad(x, (0, nc * C - n))
    coef = x.view(nc, C) @ B.T
    idx = coef.abs().topk(k, dim=1, sorted=False).indices
    kept = coef.gather(1, idx)
    scale = kept.abs().mean()
    return idx, torch.sign(kept), scale


def torch_decompress(idx, signs, scale, B, n, torch):
    nc, C = idx.shape[0], B.shape[0]
    spectrum = torch.zeros(nc, C, dtype=torch.float32)
    spectrum.scatter_(1, idx, signs * scale)
    return (spectrum @ B).view(-1)[:n]


def child(args):
    """One thread setting: times every size, prints one JSON line per size."""
    import torch

    if args.child_threads != "all":
        torch.set_num_threads(int(args.child_threads))
    import gradcomp

    C, k = args.chunk, args.k
    spec = f"dct_sign:chunk={C},k={k}"
    codec = gradcomp.Codec(spec)
    B = dct_basis(C, torch)
    gen = torch.Generator().manual_seed(1)
    for s in args.sizes:
        n = 1 << s
        x = torch.randn(n, generator=gen, dtype=torch.float32)
        y = torch.empty_like(x)
        packet = torch.empty(codec.max_compressed_bytes(x), dtype=torch.uint8)

        # Agreement: the two sides decode to the same tensor (up to rounding order).
        p = codec.compress(x, out=packet)
        codec.decompress(p, y)
        ref = torch_decompress(*torch_compress(x, B, C, k, torch), B, n, torch)
        diff = (y - ref).abs().max().item() if n else 0.0
        scale = ref.abs().max().item() if n else 0.0

        def g_c():
            return codec.compress(x, out=packet)

        def g_d(p):
            codec.decompress(p, y)

        def t_c():
            return torch_compress(x, B, C, k, torch)

        def t_d(c):
            return torch_decompress(*c, B, n, torch)

        rows = {key: ([], []) for key in ("g_all", "t_all", "g_c", "t_c", "g_d", "t_d")}

        def timed(key, fn, *a):
            w0, c0 = time.perf_counter(), time.thread_time()
            r = fn(*a)
            rows[key][0].append(time.perf_counter() - w0)
            rows[key][1].append(time.thread_time() - c0)
            return r

        def both_g():
            g_d(g_c())

        def both_t():
            t_d(t_c())

        for _ in range(2):  # warm-up (pools, allocator)
            both_g()
            both_t()
        for _ in range(args.reps):
            timed("g_all", both_g)
            timed("t_all", both_t)
            pg = timed("g_c", g_c)
            pt = timed("t_c", t_c)
            timed("g_d", g_d, pg)
            timed("t_d", t_d, pt)
        out = {"threads": args.child_threads, "n": n, "max_diff": diff, "max_abs": scale,
               "gradcomp_threads": os.environ.get("GRADCOMP_NUM_THREADS", "default"),
               "torch_threads": torch.get_num_threads()}
        for key, (wall, cpu) in rows.items():
            out[key] = (median(wall) * 1e3, median(cpu) * 1e3)
        print(json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20,24", help="log2 of the element counts (default 20,24)")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--threads", default="1,all", help="thread settings (default 1,all)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--child-threads", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.child_threads is not None:
        child(args)
        return 0

    results = []
    for t in args.threads.split(","):
        env = dict(os.environ)
        if t == "all":
            env.pop("GRADCOMP_NUM_THREADS", None)
        else:
            env["GRADCOMP_NUM_THREADS"] = t
        cmd = [sys.executable, os.path.abspath(__file__), "--sizes", ",".join(map(str, args.sizes)),
               "--chunk", str(args.chunk), "--k", str(args.k), "--reps", str(args.reps),
               "--child-threads", t]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if "No module named" in proc.stderr:
                print("skipped: torch or gradcomp cannot be imported:\n" + proc.stderr.strip().splitlines()[-1])
                return 0
            sys.stderr.write(proc.stderr)
            return proc.returncode
        results += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    print(f"dct_sign:chunk={args.chunk},k={args.k} against torch ops (median of {args.reps} rounds; "
          "ms; ratio = torch / gradcomp)\n")
    print("| threads | n | part | gradcomp ms | torch ms | ratio | gradcomp CPU ms | torch CPU ms | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for part, g, t in (("compress + decompress", "g_all", "t_all"), ("compress", "g_c", "t_c"),
                           ("decompress", "g_d", "t_d")):
            gw, gc_ = r[g]
            tw, tc = r[t]
            cpu = (f"{gc_:.2f} | {tc:.2f} | {tc / gc_:.2f}" if r["threads"] != "all" and gc_ > 0
                   else "- | - | -")
            print(f"| {r['threads']} (torch {r['torch_threads']}) | 2^{int(math.log2(r['n']))} | {part} | "
                  f"{gw:.2f} | {tw:.2f} | {tw / gw:.2f} | {cpu} |")
    print()
    for r in results:
        print(f"threads {r['threads']}, n = {r['n']}: largest |gradcomp - torch| = {r['max_diff']:.3g} "
              f"(largest |y| = {r['max_abs']:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
