# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""A frozen peer (alive, stopped with SIGSTOP, its connections open) must not keep the other
rank alive: the hook's step raises at timeout_s, and the process, which then ends as a script
does (a barrier, destroy_process_group(), exit), is gone within timeout_s and a few seconds,
although the process group was made with a 120 s timeout. Before the hook bounded the group's
timeout by timeout_s, gloo's operation stayed blocked on the frozen peer until the group's
timeout, and the barrier with it (torch 2.14.1: exit at the group's timeout)."""

import os
import re
import signal
import subprocess
import sys
import time

from ranks import free_port, run_ranks

TIMEOUT_S = 4.0
GROUP_TIMEOUT_S = 120

SCRIPT = r"""
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import gradcomp

rank, port, timeout_s, group_timeout_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=group_timeout_s))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
state = gradcomp.GradcompState(codec="topk:ratio=0.01", timeout_s=timeout_s)
model.register_comm_hook(state, gradcomp.hook)
opt = torch.optim.SGD(model.parameters(), lr=0.05)

def step(s):
    g = torch.Generator().manual_seed(1000 * s + rank)
    x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

for s in range(3):
    step(s)
if rank == 1:
    print("freezing", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen: alive, its sockets open, never answering
    time.sleep(3600)
start = time.time()
print("step start %.3f" % start, flush=True)
try:
    step(3)
    print("no error", flush=True)
except RuntimeError as e:
    print("raised after %.2f s: %s" % (time.time() - start, str(e).splitlines()[0][:300]), flush=True)
# a script's usual end: wait for the other ranks, then leave
b = time.time()
try:
    dist.barrier()
    print("barrier passed", flush=True)
except RuntimeError as e:
    print("barrier raised after %.2f s: %s" % (time.time() - b, str(e).splitlines()[0][:200]), flush=True)
dist.destroy_process_group()
print("destroyed after %.2f s" % (time.time() - start), flush=True)
"""


def test_frozen_peer_lets_the_survivor_exit(tmp_path):
    script = tmp_path / "frozen.py"
    script.write_text(SCRIPT)
    port = str(free_port())
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(TIMEOUT_S), str(GROUP_TIMEOUT_S)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(2)]
    try:
        try:
            out0, _ = procs[0].communicate(timeout=GROUP_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            procs[0].kill()
            out0, _ = procs[0].communicate()
            raise AssertionError("the survivor did not exit:\n" + out0)
        exited = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # SIGKILL ends a stopped process too
            p.wait()
    out1 = procs[1].stdout.read()
    assert "freezing" in out1, out1
    assert procs[0].returncode == 0, out0
    m = re.search(r"step start (\S+)", out0)
    assert m, out0
    took = exited - float(m.group(1))
    # the step fails on the survivor at timeout_s with gradcomp's CommError ...
    r = re.search(r"raised after (\S+) s: (.*)", out0)
    assert r, out0
    assert float(r.group(1)) < TIMEOUT_S + 3, out0
    assert "gradcomp" in r.group(2), out0
    # ... and the process is gone a few seconds later, not at the group's 120 s timeout
    # the script's barrier fails at once (the group's timeout is timeout_s now) ...
    b = re.search(r"barrier raised after (\S+) s", out0)
    assert b and float(b.group(1)) < TIMEOUT_S + 3, out0
    assert took < TIMEOUT_S + 15, "exited %.1f s after the step started:\n%s" % (took, out0)


def _group_timeout(rank, world):
    import torch
    import torch.distributed as dist

    import gradcomp
    pg = dist.distributed_c10d._get_default_group()

    def current():
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    before = current()
    a = gradcomp.GradcompState(codec="fp16", timeout_s=7.5)
    lowered = current()
    b = gradcomp.GradcompState(codec="fp16", timeout_s=100)  # longer: the group keeps 7.5 s
    kept = current()
    a.close()
    b.close()
    return before, lowered, kept


def test_the_group_timeout_is_bounded_by_timeout_s():
    for before, lowered, kept in run_ranks(_group_timeout, 2, init_timeout_s=60):
        assert before == 60
        assert lowered == 7.5
        assert kept == 7.5
