#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Table and plot of train_lm.py's results: validation loss against bytes sent and wall time.

    python3 examples/05_lm/plot.py DIR [DIR...] [--out DIR] [--png FILE]

Reads DIR/results.jsonl of one or more runs of train_lm.py (a row that appears in several runs:
the last one given wins), prints a Markdown table (final validation loss in nats per byte and
bits per character, the gap to the ddp row, MB sent per worker, x fewer bytes than ddp, wall
time, status) and writes OUT/lm-ROW.dat (one line per evaluation), OUT/lm.gp (a gnuplot
script) and, when gnuplot is installed, the PNG it draws: validation loss against MB sent
(log scale) and against wall time. Plain Python and gnuplot, no matplotlib (the project's
environment has none); OUT defaults to the first DIR.
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path


def load(dirs):
    rows, meta = {}, None
    for d in dirs:
        path = Path(d) / "results.jsonl"
        if not path.exists():
            raise SystemExit("plot.py: %s not found (run train_lm.py --out %s first)" % (path, d))
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["row"]] = r
                if r.get("evals"):
                    meta = r.get("meta", meta)
    return rows, meta


def table(rows):
    ref = rows.get("ddp") if rows.get("ddp", {}).get("evals") else None
    out = ["| row | final val. loss (nats/byte) | bits/char | gap to ddp | MB sent / worker | "
           "x fewer bytes | wall s | status |", "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if not r.get("evals"):
            out.append("| %s | - | - | - | - | - | - | %s |" % (name, r["status"]))
            continue
        f = r["evals"][-1]
        gap = fewer = "-"
        if ref is not None and r["status"] == "ok":  # a stopped row ended at fewer tokens
            rf = ref["evals"][-1]
            gap = "%+.4f (%+.2f %%)" % (f["val_nats"] - rf["val_nats"],
                                       100 * (f["val_nats"] - rf["val_nats"]) / rf["val_nats"])
            fewer = "%.0f" % (ref["bytes_sent"] / r["bytes_sent"]) if r["bytes_sent"] else "inf"
        at = "" if r["status"] == "ok" else " (step %d)" % f["step"]
        # a stopped row's status without the guard's full message (results.jsonl has it)
        status = r["status"].split(" (")[0]
        out.append("| %s | %.4f%s | %.3f | %s | %.3f | %s | %.0f | %s |" % (
            name, f["val_nats"], at, f["val_bpc"], gap, r["bytes_sent"] / 1e6, fewer,
            r["wall_s"], status))
    return "\n".join(out)


def write_plot(rows, out, png, title):
    out.mkdir(parents=True, exist_ok=True)
    plotted = []
    for name, r in rows.items():
        if not r.get("evals"):
            continue
        with open(out / ("lm-%s.dat" % name), "w") as f:
            f.write("# step tokens val_nats val_bpc MB_sent wall_s\n")
            for e in r["evals"]:
                if math.isfinite(e["val_nats"]):
                    f.write("%d %d %.6f %.6f %.6f %.3f\n" % (
                        e["step"], e["tokens"], e["val_nats"], e["val_bpc"],
                        e["bytes_sent"] / 1e6, e["wall_s"]))
        plotted.append(name)
    if not plotted:
        raise SystemExit("plot.py: no row with evaluations to plot")

    def series(col):
        return ", \\\n     ".join(
            "'%s' using %s with linespoints title '%s'" % (out / ("lm-%s.dat" % n), col, n)
            for n in plotted)

    gp = out / "lm.gp"
    gp.write_text("\n".join([
        "set terminal pngcairo size 1300,520 font ',10' noenhanced",  # row names keep their _
        "set output '%s'" % png,
        "set multiplot layout 1,2 title \"%s\"" % title.replace('"', "'"),
        "set grid",
        "set key top right",
        "set ylabel 'validation loss (nats per byte)'",
        "set xlabel 'MB sent per worker (log scale)'",
        "set logscale x",
        # step 0 has sent nothing: it has no place on a log axis
        "plot " + series("($5 > 0 ? $5 : 1/0):3"),
        "unset logscale x",
        "set xlabel 'wall time of training (s)'",
        "plot " + series("6:3"),
        "unset multiplot",
        ""]))
    if shutil.which("gnuplot") is None:
        print("plot.py: gnuplot not found; %s written, no PNG" % gp, file=sys.stderr)
        return None
    subprocess.run(["gnuplot", str(gp)], check=True)
    return png


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="+", help="train_lm.py output directories")
    p.add_argument("--out", default=None, help="where the .dat and .gp files go (first DIR)")
    p.add_argument("--png", default=None, help="the PNG (OUT/lm.png)")
    args = p.parse_args(argv)
    rows, meta = load(args.dirs)
    out = Path(args.out or args.dirs[0])
    png = Path(args.png) if args.png else out / "lm.png"
    title = "train_lm.py"
    if meta:
        c = meta["config"]
        title = ("byte-level LM, %.1f M parameters, %d workers, %d steps x %d tokens" % (
            meta["params"] / 1e6, c["workers"], c["steps"], meta["tokens_per_step"]))
        if meta.get("netlab_rate"):
            title += ", netlab %s" % meta["netlab_rate"]
    print(table(rows))
    drawn = write_plot(rows, out, png, title)
    if drawn:
        print("plot.py: %s" % drawn, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
