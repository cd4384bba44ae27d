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
"""

import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["find_program", "main"]

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


def main(argv=None):
    """Runs ``gradcomp-bench`` with ``argv`` (default: the command line); returns its status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    program = find_program()
    if program is None:
        print("gradcomp.bench: the gradcomp-bench program was not found (set GRADCOMP_BENCH_EXE, or build the "
              "CMake target gradcomp_bench_tool, which needs CLI11: apt-get install libcli11-dev)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gradcomp-bench-") as workdir:
        args = []
        takes_value = False
        for a in argv:
            if not takes_value and not a.startswith("-") and a.lower().endswith(_TORCH_SUFFIXES):
                try:
                    a = _torch_to_capture(a, workdir)
                except _InputError as e:
                    print(f"gradcomp-bench: {e}", file=sys.stderr)
                    return 2
            # an option's value is not an input ("--json out.pt" writes there)
            takes_value = a.startswith("--") and "=" not in a and a not in (
                "--no-timing", "--flatten", "--quiet", "--help")
            args.append(a)
        return subprocess.call([program, *args])


if __name__ == "__main__":
    sys.exit(main())
