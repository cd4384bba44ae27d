# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Runs a test function on N gloo ranks (one process each) and returns what every rank
returned; a rank that raises fails the caller with its traceback, and a run that takes longer
than its timeout is killed and fails (no test hangs)."""

import io
import os
import socket
import traceback
from datetime import timedelta

import torch
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, queue, init_timeout_s, timeout_s):
    import faulthandler

    import torch
    import torch.distributed as dist

    # a rank still running shortly before the parent gives up prints where it is
    faulthandler.dump_traceback_later(max(1, timeout_s - 5), exit=False)

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=init_timeout_s))
        result = fn(rank, world, *args)
        # as bytes: a tensor put on the queue as is would be shared memory that the parent
        # could no longer map once this process has exited
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: B902 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a peer may be gone already
                pass


def _dump_native_stacks(procs):
    """The native stacks of ranks that are still running (gdb, where installed)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("gdb") is None:
        return
    for p in procs:
        if p.is_alive():
            out = subprocess.run(["gdb", "-batch", "-p", str(p.pid), "-ex", "thread apply all bt 30"],
                                 capture_output=True, text=True, timeout=60).stdout
            frames = [line for line in out.splitlines()
                      if line.startswith(("#", "Thread")) and "futex" not in line]
            print("---- native stacks of pid %d\n%s" % (p.pid, "\n".join(frames)), file=sys.stderr)


def run_ranks(fn, world, *args, timeout_s=180, init_timeout_s=60, allow_missing=()):
    """fn(rank, world, *args) on `world` processes; returns the list of results by rank.
    Ranks in `allow_missing` may end without a result (they exit on purpose)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue, init_timeout_s, timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    import queue as q
    import time
    deadline = time.monotonic() + timeout_s
    expected = world - len(allow_missing)
    try:
        while len([r for r in results if r not in allow_missing]) < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("ranks did not finish within %d s (have %s)" % (timeout_s, sorted(results)))
            try:
                rank, ok, value = queue.get(timeout=min(left, 1.0))
            except q.Empty:
                dead = [i for i, p in enumerate(procs)
                        if not p.is_alive() and i not in results and i not in allow_missing]
                if dead and all(p.exitcode not in (0, None) for p in (procs[i] for i in dead)):
                    # give the queue a moment: a rank may have reported just before exiting
                    try:
                        rank, ok, value = queue.get(timeout=2.0)
                    except q.Empty:
                        raise RuntimeError("rank(s) %s died (exit codes %s)" % (
                            dead, [procs[i].exitcode for i in dead]))
                else:
                    continue
            if not ok:
                raise AssertionError("rank %d failed:\n%s" % (rank, value))
            results[rank] = torch.load(io.BytesIO(value))
    except TimeoutError:
        _dump_native_stacks(procs)
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [results.get(r) for r in range(world)]


def _each(rank, world, fn, arg_lists):
    return [fn(rank, world, *args) for args in arg_lists]


def run_cases(fn, world, arg_lists, timeout_s=600, **kwargs):
    """fn(rank, world, *args) for every args of arg_lists in turn, on one launch of `world`
    processes (starting the processes and importing torch costs seconds; the cases do not).
    Returns, per case, the list of results by rank."""
    arg_lists = [tuple(a) for a in arg_lists]
    per_rank = run_ranks(_each, world, fn, arg_lists, timeout_s=timeout_s, **kwargs)
    return [[per_rank[r][i] for r in range(world)] for i in range(len(arg_lists))]


class Bucket:
    """A stand-in for torch.distributed.GradBucket: what gradcomp's hooks read of one (its
    index, flat buffer, parameters and whether it is the iteration's last), so that a test can
    hand a hook chosen buckets without a DDP model."""

    def __init__(self, index, buffer, params, last=True):
        self._index, self._buffer, self._params, self._last = index, buffer, params, last

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last
