# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""``python -m gradcomp.bench``: the ``gradcomp-bench`` program from Python (docs/bench.md).

Takes the same options and writes the same outputs as the C++ program, which it runs; in
addition it reads torch files: an input ending in ``.pt`` or ``.pth`` is loaded with
``torch.load(weights_only=True)`` and may hold a tensor (one gradient) or a dict of tensors
(a state dict, or gradients by parameter name: one tensor each; entries that are not floating
tensors are skipped). They are written as ``.npy`` files into a temporary capture directory
that the program reads. float32 and float16 tensors keep their type, other floating types
become float32.

The program is looked for in this order: ``$GRADCOMP_BENCH_EXE``; ``bin/gradcomp-bench`` inside
the installed package (``pip install .`` puts it there when CLI11 was found); the build tree
that holds this package (``<build>/tools/gradcomp-bench``); ``gradcomp-bench`` on ``PATH``.

Options of this entry point only (the program knows nothing of them):

- ``--torch LIST`` (default ``auto``): rows for torch's own ops, measured here on the very
  tensors the program reads (it writes them out with ``--export-inputs``) and reported next to
  the codecs' rows (``--import-rows``): ``half`` (``x.half()``, 2 bytes a value), ``bfloat16``
  (``x.bfloat16()``, 2 bytes), ``sign`` (``torch.sign(x)`` as int8, one byte a value since torch
  has no bit packing, plus a float32 scale ``x.abs().mean()``; decoded as scale * sign) and
  ``topk:ratio=R`` (``torch.topk(x.abs(), k)`` with k = max(1, floor(R n)) as gradcomp's topk
  counts it: k float32 values and the k int64 indices torch returns, 12 k bytes; decoded by
  ``index_copy_`` / ``index_add_``). ``auto``: half, bfloat16, sign and topk at every ratio of
  the run's ``topk`` codecs (1 % when there is none); ``none`` (or ``--no-torch``): no torch rows.
  Their speeds are timed like the codecs' (median of interleaved calls, at least ``--min-time``
  seconds, at each ``--threads`` count through ``torch.set_num_threads``) against torch's own
  memory passes of the same run: ``x.sum()`` for the encoder, ``out.fill_(c)`` for the decoder,
  ``acc.add_(c)`` for the decoder that adds. With ``--feedback residual`` their error feedback
  is measured as the program measures the codecs'.
- ``--device cpu|cuda`` (default cpu): ``cuda`` measures on the current CUDA device: the run's
  codecs that ``gradcomp.cuda_codecs`` carries (``gradcomp.Codec`` on CUDA tensors; the others
  are named on stderr and left out) and torch's ops on CUDA tensors, timed with CUDA events
  against torch's memory passes on the device (threads column: 1). The CPU codecs are not
  measured in that run. Without a CUDA device, or with a package built without its CUDA part,
  it prints one line and exits with status 2.

With ``--controller`` the program runs controllers over the steps (docs/bench.md) and this entry
point only passes the options through (and the torch files converted): there are no torch rows
in a controller report.
"""

import csv
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["find_program", "main", "TorchOp", "GradcompCodec", "distortion", "measure_quality"]

_TORCH_SUFFIXES = (".pt", ".pth")


def find_program():
    """The path of the ``gradcomp-bench`` program, or ``None``."""
    env = os.environ.get("GRADCOMP_BENCH_EXE")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "bin", "gradcomp-bench"),
                 os.path.join(here, os.pardir, os.pardir, "tools", "gradcomp-bench")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    return shutil.which("gradcomp-bench")


class _InputError(Exception):
    pass


def _torch_to_capture(path, workdir):
    """Writes the floating tensors of torch file ``path`` as a capture directory; returns it."""
    import numpy as np
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad input
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _InputError(f"{path}: not a readable torch file ({first})") from e
    base = os.path.splitext(os.path.basename(path))[0]
    if isinstance(obj, torch.Tensor):
        items = [(base, obj)]
    elif isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    else:
        raise _InputError(f"{path}: holds a {type(obj).__name__}; expected a tensor or a dict of tensors")
    items = [(k, v) for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0]
    if not items:
        raise _InputError(f"{path}: no non-empty floating-point tensor in it")
    out = os.path.join(workdir, base)
    n = 1
    while os.path.exists(out):
        n += 1
        out = os.path.join(workdir, f"{base}.{n}")
    os.makedirs(os.path.join(out, "step_0"))
    with open(os.path.join(out, "index.tsv"), "w", encoding="utf-8") as index:
        index.write("# gradcomp capture v1\nstep\tname\tfile\n")
        for i, (name, t) in enumerate(items):
            t = t.detach()
            if t.dtype not in (torch.float32, torch.float16):
                t = t.to(torch.float32)
            clean = name.replace("\t", " ").replace("\n", " ")
            rel = f"step_0/t{i}.npy"
            np.save(os.path.join(out, rel), t.contiguous().numpy())
            index.write(f"0\t{clean}\t{rel}\n")
    return out


# The seed of every codec call of a measurement (tools/bench/measure.hpp's measure_seed).
MEASURE_SEED = 20261122

# Columns of the program's CSV report (tools/bench/report.hpp's csv_header).
CSV_HEADER = ("tensor,codec,n,bytes,smaller,rel_l2,cosine,unbiased,seeds,bias,bias_bound,ef_steps,ef_residual,"
              "ef_delay,threads,compress_gbps,decompress_gbps,decompress_add_gbps,read_gbps,write_gbps,update_gbps,"
              "compress_ratio,decompress_ratio,decompress_add_ratio").split(",")

_FLAGS = ("--no-timing", "--flatten", "--quiet", "-q", "--help", "-h", "--imported-only")


def _split_own_options(argv):
    """Takes ``--torch``, ``--no-torch`` and ``--device`` out of ``argv``; returns (torch, device, rest)."""
    torch_ops, device, rest = "auto", "cpu", []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name in ("--torch", "--device"):
            if not eq:
                if i + 1 >= len(argv):
                    raise _InputError(f"{name} needs a value")
                value = argv[i + 1]
                i += 1
            if name == "--torch":
                torch_ops = value
            else:
                device = value
        elif a == "--no-torch":
            torch_ops = "none"
        else:
            rest.append(a)
        i += 1
    if device not in ("cpu", "cuda"):
        raise _InputError(f"--device '{device}' is not a device (expected cpu or cuda)")
    return torch_ops, device, rest


def _fmt(v):
    """A number as the program prints it (%.6g; empty for None or NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.6g}"


# ---------------------------------------------------------------------------------------------
# What is measured: "coders", each encoding a float32 tensor into what it sends and back.


class TorchOp:
    """One of torch's own ops as a coder (``--torch``): ``encode(x)`` gives what a user would
    send, ``nbytes`` its size, ``decode`` / ``decode_add`` write or add the decoded tensor."""

    def __init__(self, spec):
        import torch

        self.torch = torch
        name, _, opts = spec.partition(":")
        self.kind = name
        self.ratio = None
        if name in ("half", "bfloat16", "sign"):
            if opts:
                raise _InputError(f"--torch '{spec}': {name} takes no options")
        elif name == "topk":
            m = re.fullmatch(r"ratio=([0-9.eE+-]+)", opts)
            ratio = float(m.group(1)) if m else float("nan")
            if not m or not (0.0 < ratio <= 1.0):
                raise _InputError(f"--torch '{spec}': topk takes ratio=R with 0 < R <= 1")
            self.ratio = ratio
        else:
            raise _InputError(f"--torch '{spec}' is not one of torch's ops (half, bfloat16, sign, topk:ratio=R)")
        self.name = "torch." + (f"topk:ratio={opts[6:]}" if name == "topk" else name)

    unbiased = False

    def k(self, n):
        """Values topk keeps of n: max(1, floor(ratio n)), as gradcomp's topk counts them."""
        return min(n, max(1, math.floor(self.ratio * n)))

    def encode(self, x, step=0):
        t = self.torch
        if self.kind == "half":
            return (x.half(),)
        if self.kind == "bfloat16":
            return (x.bfloat16(),)
        if self.kind == "sign":
            return (t.sign(x).to(t.int8), x.abs().mean())
        idx = t.topk(x.abs(), self.k(x.numel()), sorted=False).indices
        return (x[idx], idx)

    def nbytes(self, payload):
        return sum(p.numel() * p.element_size() for p in payload)

    def decode(self, payload, out, step=0):
        if self.kind in ("half", "bfloat16"):
            out.copy_(payload[0])
        elif self.kind == "sign":
            out.copy_(payload[0])
            out.mul_(payload[1])
        else:
            out.zero_()
            out.index_copy_(0, payload[1], payload[0])

    def decode_add(self, payload, acc, step=0):
        if self.kind in ("half", "bfloat16"):
            acc.add_(payload[0])
        elif self.kind == "sign":
            acc.addcmul_(payload[0], payload[1])
        else:
            acc.index_add_(0, payload[1], payload[0])


class GradcompCodec:
    """A gradcomp codec (``gradcomp.Codec``) as a coder: on CUDA tensors, the library's CUDA codecs."""

    unbiased = False  # not known from Python: the bias columns stay empty for these rows

    def __init__(self, spec, device):
        from . import _C

        self.name = f"{spec} @{device}"
        self.codec = _C.Codec(spec)
        self.packet = None

    def encode(self, x, step=0):
        import torch

        need = self.codec.max_compressed_bytes(x)
        if self.packet is None or self.packet.numel() < need:
            self.packet = x.new_empty(need, dtype=torch.uint8)
        return (self.codec.compress(x, out=self.packet, seed=MEASURE_SEED, step=step),)

    def nbytes(self, payload):
        return payload[0].numel()

    def decode(self, payload, out, step=0):
        self.codec.decompress(payload[0], out, seed=MEASURE_SEED, step=step)

    def decode_add(self, payload, acc, step=0):
        self.codec.decompress_add(payload[0], acc, 1.0, seed=MEASURE_SEED, step=step)


def distortion(x, d):
    """Relative L2 error and cosine similarity of ``d`` against ``x`` in double (measure.hpp's ``distort``)."""
    xd, dd = x.double(), d.double()
    xx, ddn, xy = float(xd.dot(xd)), float(dd.dot(dd)), float(xd.dot(dd))
    ee = float((dd - xd).dot(dd - xd))
    rel = math.sqrt(ee / xx) if xx > 0 else (math.inf if ee > 0 else 0.0)
    if xx > 0 and ddn > 0:
        cos = xy / math.sqrt(xx * ddn)
    else:
        cos = 1.0 if xx == 0 and ddn == 0 else 0.0
    return rel, cos


def _norm_sq(v):
    v = v.double()
    return float(v.dot(v))


def measure_quality(coder, name, steps, feedback):
    """Bytes, distortion and (``feedback``) error feedback of ``coder`` on a tensor's steps, as
    tools/bench/measure.hpp measures a codec: the last step for size and distortion; with
    feedback, p = g + e, d = D(C(p)), e = p - d over all steps."""
    x = steps[-1]
    payload = coder.encode(x, 0)
    d = x.new_zeros(x.shape)
    coder.decode(payload, d, 0)
    n = x.numel()
    nbytes = coder.nbytes(payload)
    rel, cos = distortion(x, d)
    row = {"tensor": name, "codec": coder.name, "n": n, "bytes": nbytes, "smaller": 4.0 * n / nbytes,
           "rel_l2": rel, "cosine": cos, "unbiased": 0, "seeds": 0, "bias": None, "bias_bound": None,
           "ef_steps": 0, "ef_residual": None, "ef_delay": None}
    if feedback:
        e = x.new_zeros(x.shape)
        residual, sent = 0.0, 0.0
        for k, g in enumerate(steps):
            p = e + g
            d = x.new_zeros(x.shape)
            coder.decode(coder.encode(p, k), d, k)
            e = p - d
            residual += _norm_sq(e)
            sent += _norm_sq(d)
        gg = _norm_sq(steps[-1])
        row["ef_steps"] = len(steps)
        row["ef_residual"] = math.sqrt(_norm_sq(e) / gg) if gg > 0 else math.sqrt(_norm_sq(e))
        row["ef_delay"] = residual / sent if sent > 0 else math.inf
    return row


class _CpuClock:
    def time(self, fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


class _CudaClock:
    """Times a call with CUDA events on the current stream (seconds)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def time(self, fn):
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


def time_pair(call, base, clock, min_time, min_reps=3):
    """Median seconds of ``call`` and of ``base`` run after each call (measure.hpp's time_pair)."""
    call()
    base()
    tc, tb, spent = [], [], 0.0
    while len(tc) < min_reps or spent < min_time:
        a = clock.time(call)
        tc.append(a)
        tb.append(clock.time(base))
        spent += a
        if len(tc) >= 100000:
            break
    return statistics.median(tc), statistics.median(tb)


def measure_speed(coder, x, clock, min_time):
    """(compress, decompress, decompress_add, read, write, update) seconds of ``coder`` on ``x``,
    each against torch's memory pass of the same kind: x.sum(), out.fill_(0.5), acc.add_(1e-3)."""
    out = x.new_empty(x.shape)
    acc = x.new_zeros(x.shape)
    payload = coder.encode(x, 3)
    c, r = time_pair(lambda: coder.encode(x, 3), lambda: x.sum(), clock, min_time)
    d, w = time_pair(lambda: coder.decode(payload, out, 3), lambda: out.fill_(0.5), clock, min_time)
    a, u = time_pair(lambda: coder.decode_add(payload, acc, 3), lambda: acc.add_(1e-3), clock, min_time)
    return c, d, a, r, w, u


def csv_lines(row, speeds):
    """The program's CSV lines of one row (one per speed; one with empty speed fields without)."""
    head = [row["tensor"], row["codec"], str(row["n"]), str(row["bytes"]), _fmt(row["smaller"]),
            _fmt(row["rel_l2"]), _fmt(row["cosine"]), str(row["unbiased"]), str(row["seeds"]),
            _fmt(row["bias"]), _fmt(row["bias_bound"]), str(row["ef_steps"]), _fmt(row["ef_residual"]),
            _fmt(row["ef_delay"])]
    if not speeds:
        return [head + [""] * 10]
    n = row["n"]

    def gbps(t):
        return 4.0 * n / t / 1e9 if t > 0 else 0.0

    def ratio(t, b):
        return b / t if t > 0 else 0.0

    lines = []
    for threads, (c, d, a, r, w, u) in speeds:
        lines.append(head + [str(threads), _fmt(gbps(c)), _fmt(gbps(d)), _fmt(gbps(a)), _fmt(gbps(r)),
                             _fmt(gbps(w)), _fmt(gbps(u)), _fmt(ratio(c, r)), _fmt(ratio(d, w)), _fmt(ratio(a, u))])
    return lines


# ---------------------------------------------------------------------------------------------
# The inputs and settings the program exported (--export-inputs).


def read_export(d):
    """(settings, tensors) of an --export-inputs directory: settings as a dict (codec: a list),
    tensors as a list of (name, [float32 numpy array per step])."""
    import numpy as np

    settings = {"codec": []}
    with open(os.path.join(d, "settings.tsv"), encoding="utf-8") as f:
        for line in f.read().splitlines():
            key, _, value = line.partition("\t")
            if key == "codec":
                settings["codec"].append(value)
            else:
                settings[key] = value
    tensors, where = [], {}
    with open(os.path.join(d, "index.tsv"), encoding="utf-8") as f:
        lines = f.read().splitlines()[2:]
    for line in lines:
        step, name, rel = line.split("\t")
        if name not in where:
            where[name] = len(tensors)
            tensors.append((name, {}))
        tensors[where[name]][1][int(step)] = np.load(os.path.join(d, rel))
    return settings, [(name, [steps[k] for k in sorted(steps)]) for name, steps in tensors]


def torch_op_specs(choice, codec_specs):
    """The torch ops of ``--torch choice`` for a run of ``codec_specs``."""
    if choice == "none":
        return []
    if choice != "auto":
        return [s for s in choice.split(",") if s]
    ratios = []
    for spec in codec_specs:
        m = re.fullmatch(r"topk:(?:.*,)?ratio=([0-9.eE+-]+)(?:,.*)?", spec)
        if m and m.group(1) not in ratios:
            ratios.append(m.group(1))
    return ["half", "bfloat16", "sign"] + [f"topk:ratio={r}" for r in (ratios or ["0.01"])]


def measure_rows(coders, tensors, settings, device):
    """CSV lines of every coder on every tensor (the program's columns)."""
    import torch

    feedback = settings.get("feedback") == "1"
    timing = settings.get("timing") == "1"
    min_time = float(settings.get("min_time", "0.2"))
    threads = [int(t) for t in settings.get("threads", "1").split(",") if t]
    lines = []
    saved_threads = torch.get_num_threads()
    try:
        for name, steps in tensors:
            steps_t = [torch.from_numpy(s).to(device) for s in steps]
            for coder in coders:
                row = measure_quality(coder, name, steps_t, feedback)
                speeds = []
                if timing:
                    if device == "cuda":
                        speeds.append((1, measure_speed(coder, steps_t[-1], _CudaClock(), min_time)))
                    else:
                        for t in threads:
                            torch.set_num_threads(t)
                            speeds.append((t, measure_speed(coder, steps_t[-1], _CpuClock(), min_time)))
                        torch.set_num_threads(saved_threads)
                lines.extend(csv_lines(row, speeds))
    finally:
        torch.set_num_threads(saved_threads)
    return lines


def _cuda_check():
    """None when --device cuda can run here, else the reason."""
    import torch

    from . import _C

    if not torch.cuda.is_available():
        return "--device cuda: no CUDA device is available (torch.cuda.is_available() is False)"
    if not _C.has_cuda:
        return ("--device cuda: this gradcomp package was built without its CUDA part (gradcomp.has_cuda is "
                "False); rebuild it with nvcc and a CUDA build of torch")
    return None


def _convert_torch_files(argv, workdir):
    args = []
    takes_value = False
    for a in argv:
        if not takes_value and not a.startswith("-") and a.lower().endswith(_TORCH_SUFFIXES):
            a = _torch_to_capture(a, workdir)
        # an option's value is not an input ("--json out.pt" writes there)
        takes_value = a.startswith("--") and "=" not in a and a not in _FLAGS
        args.append(a)
    return args


def main(argv=None):
    """Runs ``gradcomp-bench`` with ``argv`` (default: the command line) and torch's rows; returns its status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    program = find_program()
    if program is None:
        print("gradcomp.bench: the gradcomp-bench program was not found (set GRADCOMP_BENCH_EXE, or build the "
              "CMake target gradcomp_bench_tool, which needs CLI11: apt-get install libcli11-dev)", file=sys.stderr)
        return 2
    try:
        torch_choice, device, argv = _split_own_options(argv)
    except _InputError as e:
        print(f"gradcomp-bench: {e}", file=sys.stderr)
        return 2
    if any(a in ("--help", "-h") for a in argv):
        status = subprocess.call([program, *argv])
        sys.stdout.flush()
        print("\npython -m gradcomp.bench also takes (docs/bench.md):\n"
              "  --torch LIST        torch's own ops next to the codecs: half, bfloat16, sign, topk:ratio=R; "
              "auto (default), none\n"
              "  --no-torch          the same as --torch none\n"
              "  --device cpu|cuda   cuda: the CUDA codecs and torch's CUDA ops (CUDA events)\n"
              "  and .pt/.pth files (a tensor or a dict of tensors) as inputs")
        return status
    if device == "cuda":
        why = _cuda_check()
        if why is not None:
            print(f"gradcomp-bench: {why}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="gradcomp-bench-") as workdir:
        try:
            args = _convert_torch_files(argv, workdir)
        except _InputError as e:
            print(f"gradcomp-bench: {e}", file=sys.stderr)
            return 2
        controllers = any(a == "--controller" or a.startswith("--controller=") for a in args)
        if controllers and device == "cuda":
            print("gradcomp-bench: --controller runs the CPU pipeline; it does not take --device cuda", file=sys.stderr)
            return 2
        if (device == "cpu" and torch_choice == "none") or controllers:
            return subprocess.call([program, *args])
        # The program reads and checks the inputs and options, and writes out the tensors as
        # it will measure them; torch's rows (and, on CUDA, every row) are measured here on
        # those and handed back to it for the report.
        export = os.path.join(workdir, "inputs")
        status = subprocess.call([program, *args, "--export-inputs", export])
        if status != 0:
            return status
        settings, tensors = read_export(export)
        try:
            coders = [TorchOp(s) for s in torch_op_specs(torch_choice, settings["codec"])]
        except _InputError as e:
            print(f"gradcomp-bench: {e}", file=sys.stderr)
            return 2
        if device == "cuda":
            from . import _C

            carried = {c.strip() for c in _C.cuda_codecs.split(",")}
            gc_coders, left_out = [], []
            for spec in settings["codec"]:
                (gc_coders if spec.partition(":")[0] in carried else left_out).append(spec)
            if left_out:
                print("gradcomp-bench: not measured on CUDA (gradcomp.cuda_codecs does not carry them): "
                      + ", ".join(left_out), file=sys.stderr)
            coders = [GradcompCodec(s, "cuda") for s in gc_coders] + coders
            for c in coders:
                if isinstance(c, TorchOp):
                    c.name += " @cuda"
        try:
            lines = measure_rows(coders, tensors, settings, device)
        except Exception as e:  # noqa: BLE001 - a failure while measuring: one line, status 1
            print(f"gradcomp-bench: error: {e}", file=sys.stderr)
            return 1
        rows_csv = os.path.join(workdir, "rows.csv")
        with open(rows_csv, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(CSV_HEADER)
            w.writerows(lines)
        extra = ["--import-rows", rows_csv] + (["--imported-only"] if device == "cuda" else [])
        return subprocess.call([program, *args, *extra])


if __name__ == "__main__":
    sys.exit(main())
