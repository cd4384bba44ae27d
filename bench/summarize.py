#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Turns the JSON of gradcomp_bench_codecs into markdown tables (standard library only).

    bench/summarize.py RESULTS.json [--sizes 24] [--threads 1]

Prints, from the `median` aggregate of each benchmark (the median over repetitions of each
repetition's median call time):

1. codec | n | threads | compress GB/s | ratio to read | decompress GB/s | ratio to write | B/elem
2. the same for decompress_add against the update (y += c) baseline;
3. the baselines themselves;
4. at the largest size on the fewest threads: each ratio next to a computed traffic bound (a
   guide; the verdicts are those of item 5);
5. issue 17's quantizer targets at the largest size on the fewest threads: compress against
   the read kernel and against the traffic kernel that moves exactly the codec's bytes with
   streaming stores (`ratio_traffic`), decompress against the write kernel and its traffic
   kernel, with one line `target compress/SPEC: ...` and `target decompress/SPEC: ...` per codec
   (met at 0.8 of read / write, or 0.9 of the traffic kernel);
6. error feedback with each codec (ef: fused where the codec can; ef_3pass: the three passes),
   against read and against y += x (axpy, the traffic error feedback cannot avoid), with one
   line `target ef/SPEC: measured X, needed Y, met|missed` per codec (0.7 of read; 0.5 for
   top-k).

The traffic bound is what a codec would reach if it did no work besides moving its bytes, with
reads and writes not overlapping: compress reads 4 B and writes B (the packet's bytes per
element), so at most 1 / (1 + (B / 4) * (read GB/s / write GB/s)) of the read baseline;
decompress reads B and writes 4 B, so at most 1 / (1 + (B / 4) * (write GB/s / read GB/s)) of
the write baseline. It is a rough guide, not a law: hardware overlaps some reads and writes.

GB/s is input bytes (n * 4) per second for every operation, decompression included.
"""

import argparse
import json
import sys
from collections import defaultdict


def parse_name(name):
    """'compress/qsgd:levels=7/n:1024/threads:1/...' -> ('compress', 'qsgd:levels=7', 1024, 1)."""
    parts = name.split("/")
    if len(parts) < 4 or not parts[2].startswith("n:") or not parts[3].startswith("threads:"):
        return None
    return parts[0], parts[1], int(parts[2][2:]), int(parts[3][8:])


def size_label(n):
    if n > 0 and n & (n - 1) == 0:
        return "2^%d" % (n.bit_length() - 1)
    return str(n)


def fmt(value, digits=2):
    if value is None:
        return "—"
    if value >= 100:
        return "%.0f" % value
    if value >= 10:
        return "%.1f" % value
    return "%.*f" % (digits, value)


def scope(n, t):
    """'n = 2^24, 1 thread': the scope of the tables at one size and thread count."""
    return "n = %s, %d thread%s" % (size_label(n), t, "" if t == 1 else "s")


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = {}  # (op, spec, n, threads) -> benchmark entry
    order = []  # specs in the order the program ran them
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        key = parse_name(b.get("run_name", b["name"]))
        if key is None:
            continue
        if b.get("error_occurred"):
            b = dict(b, error=b.get("error_message", "error"))
        # Keep the median aggregate when present; a run without repetitions has only iterations.
        if key in rows and rows[key].get("run_type") == "aggregate":
            continue
        rows[key] = b
        if key[0] != "baseline" and key[1] not in order:
            order.append(key[1])
    return data.get("context", {}), rows, order


def counter(rows, key, name="GB/s"):
    b = rows.get(key)
    if b is None or "error" in b:
        return None
    return b.get(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="output of gradcomp_bench_codecs --benchmark_out=FILE")
    ap.add_argument("--sizes", type=int, nargs="*", help="log2 sizes to show (default: all)")
    ap.add_argument("--threads", type=int, nargs="*", help="thread counts to show (default: all)")
    args = ap.parse_args()

    context, rows, order = load(args.json)
    sizes = sorted({k[2] for k in rows})
    threads = sorted({k[3] for k in rows})
    if args.sizes:
        sizes = [n for n in sizes if n.bit_length() - 1 in args.sizes]
    if args.threads:
        threads = [t for t in threads if t in args.threads]
    if not sizes or not threads:
        sys.exit("summarize.py: no benchmark rows match")

    out = []
    host = context.get("host_name", "?")
    cpus = context.get("num_cpus", "?")
    load_avg = context.get("load_avg")
    load_txt = ", load average at start " + " ".join("%.2f" % x for x in load_avg) if load_avg else ""
    out.append("<!-- %s, %s CPUs%s, %s, gradcomp %s, isa %s -->"
               % (host, cpus, load_txt, context.get("date", "?"),
                  context.get("gradcomp_version", "?"), context.get("gradcomp_isa", "?")))
    out.append("")

    out.append("| codec | n | threads | compress GB/s | ratio to read | decompress GB/s "
               "| ratio to write | B/elem |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in order:
        for n in sizes:
            for t in threads:
                c, d = ("compress", spec, n, t), ("decompress", spec, n, t)
                if c not in rows and d not in rows:
                    continue
                out.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                    spec, size_label(n), t,
                    fmt(counter(rows, c, "GB/s")), fmt(counter(rows, c, "ratio")),
                    fmt(counter(rows, d, "GB/s")), fmt(counter(rows, d, "ratio")),
                    fmt(counter(rows, c, "B/elem"), 3)))
    out.append("")

    out.append("| codec | n | threads | decompress_add GB/s | ratio to update |")
    out.append("|---|---:|---:|---:|---:|")
    for spec in order:
        for n in sizes:
            for t in threads:
                a = ("decompress_add", spec, n, t)
                if a in rows:
                    out.append("| %s | %s | %d | %s | %s |" % (
                        spec, size_label(n), t, fmt(counter(rows, a, "GB/s")),
                        fmt(counter(rows, a, "ratio"))))
    out.append("")

    out.append("| baseline | n | threads | GB/s |")
    out.append("|---|---:|---:|---:|")
    for kind in ("read", "write", "update", "axpy"):
        for n in sizes:
            for t in threads:
                key = ("baseline", kind, n, t)
                if key in rows:
                    out.append("| %s | %s | %d | %s |" % (kind, size_label(n), t,
                                                          fmt(counter(rows, key, "GB/s"))))
    out.append("")

    n = max(sizes)
    t = min(threads)
    read = counter(rows, ("baseline", "read", n, t))
    write = counter(rows, ("baseline", "write", n, t))
    out.append("| codec (%s) | compress ratio | traffic bound | decompress ratio "
               "| traffic bound |" % scope(n, t))
    out.append("|---|---:|---:|---:|---:|")
    for spec in order:
        rc = counter(rows, ("compress", spec, n, t), "ratio")
        rd = counter(rows, ("decompress", spec, n, t), "ratio")
        b = counter(rows, ("compress", spec, n, t), "B/elem")
        if rc is None or rd is None or b is None:
            continue
        bc = bd = None
        if read and write:
            bc = 1.0 / (1.0 + b / 4.0 * read / write)
            bd = 1.0 / (1.0 + b / 4.0 * write / read)
        out.append("| %s | %s | %s | %s | %s |" % (spec, fmt(rc), fmt(bc), fmt(rd), fmt(bd)))

    out.append("")
    out.append("| codec (%s) | compress × read | × traffic kernel "
               "| decompress × write | × traffic kernel |" % scope(n, t))
    out.append("|---|---:|---:|---:|---:|")
    quant_targets = []
    for spec in order:
        c, d = ("compress", spec, n, t), ("decompress", spec, n, t)
        if c not in rows or d not in rows:
            continue
        vals = [counter(rows, c, "ratio"), counter(rows, c, "ratio_traffic"),
                counter(rows, d, "ratio"), counter(rows, d, "ratio_traffic")]
        out.append("| %s | %s | %s | %s | %s |" % (spec, fmt(vals[0]), fmt(vals[1]), fmt(vals[2]),
                                                    fmt(vals[3])))
        for name, base, r_base, r_traffic in (("compress", "read", vals[0], vals[1]),
                                              ("decompress", "write", vals[2], vals[3])):
            if r_base is None:
                continue
            ok = r_base >= 0.8 or (r_traffic is not None and r_traffic >= 0.9)
            quant_targets.append(
                "target %s/%s: measured %.3f x %s, %s x traffic kernel, needed 0.8 x %s or 0.9 x "
                "traffic kernel, %s" % (name, spec, r_base, base,
                                        "%.3f" % r_traffic if r_traffic is not None else "—", base,
                                        "met" if ok else "missed"))
    out.append("")
    out.extend(quant_targets)

    ef_specs = [spec for spec in order if ("ef", spec, n, t) in rows]
    if ef_specs:
        out.append("")
        out.append("| error feedback (%s) | ef GB/s | ratio to read | ratio to axpy "
                   "| 3-pass GB/s | fused / 3-pass |" % scope(n, t))
        out.append("|---|---:|---:|---:|---:|---:|")
        targets = []
        for spec in ef_specs:
            f, r = ("ef", spec, n, t), ("ef_3pass", spec, n, t)
            gf, g3 = counter(rows, f, "GB/s"), counter(rows, r, "GB/s")
            ratio = counter(rows, f, "ratio")
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                spec, fmt(gf), fmt(ratio), fmt(counter(rows, f, "ratio_axpy")), fmt(g3),
                fmt(gf / g3 if gf and g3 else None)))
            need = 0.5 if spec.startswith("topk") else 0.7
            if ratio is not None:
                targets.append("target ef/%s: measured %.3f, needed %.2f, %s"
                               % (spec, ratio, need, "met" if ratio >= need else "missed"))
        out.append("")
        out.extend(targets)
    print("\n".join(out))


if __name__ == "__main__":
    main()
