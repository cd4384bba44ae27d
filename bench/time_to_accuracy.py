#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Time-to-accuracy table from training runs of examples/03_train_mlp (bench/run_time_to_accuracy.sh).

    python3 bench/time_to_accuracy.py [--rate 1gbit] [--ranks 4] NAME=DIR ...

Each DIR holds the curves.csv and summary.csv of one `gradcomp_train --out DIR` run whose curve
points scored the whole test set (`--eval-subset 0`). The row named "dense" is the reference: its
final accuracy is the level every row is timed to. For each row it prints the training time
(`train_s` of curves.csv: step time since the start, evaluation excluded, mean over ranks) at the
first curve point whose test accuracy reaches dense's final accuracy ("not reached" if none
does), the same for a second level `--tolerance` points below it (default 0.5, the accuracy
tolerance of docs/training.md's tables: test curves of this task move by a few tenths between
evaluations, so a run that ends 0.3 points below dense may never touch dense's last value), the
final accuracy, the bytes, and both times relative to dense's. Among rows named static-x*, the
one that reaches the level first (else the lower level first) is marked as the best static
factor.
"""

import argparse
import csv
import math
import sys
from pathlib import Path


def load(directory):
    with open(Path(directory) / "curves.csv", newline="") as f:
        curve = [r for r in csv.DictReader(f)]
    with open(Path(directory) / "summary.csv", newline="") as f:
        summary = next(csv.DictReader(f))
    if not curve or "train_s" not in curve[0]:
        raise SystemExit("time_to_accuracy.py: %s/curves.csv has no train_s column "
                         "(an older gradcomp_train?)" % directory)
    points = [(int(r["step"]), float(r["test_accuracy"]), float(r["train_s"])) for r in curve]
    return {"points": points, "final": float(summary["test_accuracy"]),
            "bytes": float(summary["bytes_per_worker"]), "train_s": points[-1][2],
            "factors": summary["factor_over_time"]}


def first_reaching(points, level):
    """(step, seconds) of the first point at or above level, or None."""
    for step, acc, t in points:
        if acc >= level - 1e-12:
            return step, t
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tolerance", type=float, default=0.5,
                   help="points below dense's final accuracy for the second level (default 0.5)")
    p.add_argument("runs", nargs="+", metavar="NAME=DIR")
    a = p.parse_args(argv)
    runs = {}
    for spec in a.runs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            raise SystemExit("time_to_accuracy.py: '%s' is not NAME=DIR" % spec)
        runs[name] = load(directory)
    if "dense" not in runs:
        raise SystemExit("time_to_accuracy.py: no run named 'dense' (the reference)")
    level = runs["dense"]["final"]
    low = level - a.tolerance / 100
    dense_bytes = runs["dense"]["bytes"]
    reach = {n: first_reaching(r["points"], level) for n, r in runs.items()}
    near = {n: first_reaching(r["points"], low) for n, r in runs.items()}
    statics = [n for n in runs if n.startswith("static-x")]
    best = None
    for table in (reach, near):
        hits = [n for n in statics if table[n] is not None]
        if hits:
            best = min(hits, key=lambda n: table[n][1])
            break

    def cells(hit, dense_hit):
        if hit is None:
            return "not reached", "", ""
        rel = "%.2fx" % (dense_hit[1] / hit[1]) if dense_hit is not None and hit[1] > 0 else ""
        return "%.1f s" % hit[1], str(hit[0]), rel

    print("Time to accuracy, %d ranks, network lab at %s: the level is dense's final test "
          "accuracy, %.2f %%; the second level is %.2f %% (%.2f points below)." % (
              a.ranks, a.rate, 100 * level, 100 * low, a.tolerance))
    print()
    print("| run | final accuracy | vs dense | time to %.2f %% | step | vs dense | time to %.2f %% "
          "| step | vs dense | training time | MB per worker | fewer bytes |" % (100 * level, 100 * low))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        label = name + (" (best static)" if name == best else "")
        print("| %s | %.2f %% | %+.2f | %s | %s | %s | %s | %s | %s | %.1f s | %.1f | %.1fx |" % (
            (label, 100 * r["final"], 100 * (r["final"] - level)) + cells(reach[name], reach["dense"])
            + cells(near[name], near["dense"])
            + (r["train_s"], r["bytes"] / 1e6, dense_bytes / r["bytes"] if r["bytes"] > 0 else math.inf)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
