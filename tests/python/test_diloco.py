# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp.DiLoCo on 2 gloo processes: identical replicas after a sync, H = 1 averaging with
the identity codec equal to averaging the weights every step, DiLoCo's Nesterov outer step
against a reference written here, state_dict resume bit for bit, a failed sync that changes
nothing, refused options, and the docs/pytorch.md example run as written."""

import functools
import io
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import gradcomp
from ranks import run_cases, run_ranks

ROOT = os.environ.get("GRADCOMP_SOURCE_DIR",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def inner_step(model, opt, rank, step):
    x, y = batch(rank, step)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def _replicas(rank, world):
    model = make_model(seed=rank)  # different on purpose: DiLoCo broadcasts rank 0's
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    d = gradcomp.DiLoCo(model, opt, sync_every=3, outer="nesterov", codec="int8", feedback="residual")
    start = params(model)
    out = {"start": start, "stats": []}
    for t in range(1, 8):
        inner_step(model, opt, rank, t)
        out["stats"].append(d.step())
        if t == 6:
            out["after_sync"] = params(model)
            out["sync"] = d.synchronized_parameters()
        if t == 7:
            out["after_local"] = params(model)
    out["bytes_sent"] = d.bytes_sent
    return out


def _average_h1(rank, world):
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = gradcomp.DiLoCo(model, opt, sync_every=1, outer="average")
    worst = 0.0
    for t in range(1, 6):
        inner_step(model, opt, rank, t)
        mean = []
        for p in model.parameters():  # the synchronous mean of the weights, as DDP-free averaging
            q = p.detach().clone()
            dist.all_reduce(q)
            mean.append(q / world)
        d.step()
        for p, m in zip(model.parameters(), mean):
            worst = max(worst, (p.detach() - m).abs().max().item() / (m.abs().max().item() + 1.0))
    return worst, params(model)


def _nesterov_reference(rank, world):
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = gradcomp.DiLoCo(model, opt, sync_every=2, outer="nesterov")
    sync = params(model)
    u = [torch.zeros_like(s) for s in sync]
    exact = True
    for t in range(1, 9):
        inner_step(model, opt, rank, t)
        if t % 2 == 0:  # the reference: mean pseudo-gradient, then torch's Nesterov SGD rule
            want = []
            for i, p in enumerate(model.parameters()):
                deltas = [torch.empty_like(p) for _ in range(world)]
                dist.all_gather(deltas, sync[i] - p.detach())
                total = deltas[0].clone()
                for x in deltas[1:]:
                    total = total + x
                m = total * (1.0 / world)
                u[i] = 0.9 * u[i] + m
                sync[i] = sync[i] - 0.7 * (m + 0.9 * u[i])
                want.append(sync[i])
        d.step()
        if t % 2 == 0:
            exact = exact and all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), want))
    return exact


def _resume(rank, world, options):
    def build():
        model = make_model(seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return model, opt, gradcomp.DiLoCo(model, opt, **options)

    model, opt, d = build()
    for t in range(1, 11):
        inner_step(model, opt, rank, t)
        d.step()
    straight = params(model)

    model, opt, d = build()
    for t in range(1, 6):
        inner_step(model, opt, rank, t)
        d.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "diloco": d.state_dict()}, buf)
    model, opt, d = build()
    saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    model.load_state_dict(saved["model"])
    d.load_state_dict(saved["diloco"])
    assert d.steps == 5
    for t in range(6, 11):
        inner_step(model, opt, rank, t)
        d.step()
    return all(torch.equal(a, b) for a, b in zip(straight, params(model)))


def _failed_sync(rank, world):
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = gradcomp.DiLoCo(model, opt, sync_every=2, outer="sparseloco",
                        codec="chunk_topk:chunk=64,k=4,values=int2")
    for t in range(1, 4):
        inner_step(model, opt, rank, t)
        d.step()
    inner_step(model, opt, rank, 4)
    if rank == 1:
        with torch.no_grad():
            next(model.parameters())[0, 3] = float("nan")
    before_w = params(model)
    before_s = d.state_dict()["local_update"]
    kind = None
    try:
        d.step()
    except gradcomp.NumericError as e:
        kind = "numeric" if "tensor 0" in str(e) else "numeric?"
    except gradcomp.CommError:
        kind = "comm"
    same_w = all(torch.equal(a, b) or (torch.isnan(a).any() and torch.equal(a.nan_to_num(), b.nan_to_num()))
                 for a, b in zip(before_w, params(model)))
    return kind, same_w, d.state_dict()["local_update"] == before_s, d.steps


CASES = [("replicas", ()), ("average", ()), ("nesterov", ()), ("failed", ()),
         ("resume", (dict(sync_every=3, outer="nesterov", codec="int8:bucket=64", feedback="residual"),)),
         ("resume", (dict(sync_every=2, outer="sparseloco", codec="chunk_topk:chunk=64,k=4,values=int2"),)),
         ("resume", (dict(sync_every=4, fragments=2, overlap=1, codec="int4", outer="nesterov"),))]
_FNS = {"replicas": _replicas, "average": _average_h1, "nesterov": _nesterov_reference,
        "failed": _failed_sync, "resume": _resume}


def _case(rank, world, name, args):
    return _FNS[name](rank, world, *args)


@functools.cache
def _results():
    return run_cases(_case, 2, [(name, args) for name, args in CASES])


def test_replicas_start_identical_and_are_identical_after_a_sync():
    a, b = _results()[0]
    assert all(torch.equal(x, y) for x, y in zip(a["start"], b["start"]))
    assert all(torch.equal(x, y) for x, y in zip(a["after_sync"], b["after_sync"]))
    assert all(torch.equal(x, y) for x, y in zip(a["after_sync"], a["sync"]))
    assert not all(torch.equal(x, y) for x, y in zip(a["after_local"], b["after_local"]))
    assert [s["synced"] for s in a["stats"]] == [False, False, True, False, False, True, False]
    assert a["bytes_sent"] > 0 and a["bytes_sent"] == sum(s["packet_bytes"] for s in a["stats"])


def test_identity_average_every_step_equals_averaging_the_weights():
    (worst_a, pa), (worst_b, pb) = _results()[1]
    # theta - mean(theta - w) against mean(w): float32 rounding only
    assert worst_a < 1e-6 and worst_b < 1e-6
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


def test_nesterov_outer_step_matches_the_reference_bit_for_bit():
    assert all(_results()[2])


def test_failed_sync_changes_nothing_on_any_rank():
    (k0, w0, s0, t0), (k1, w1, s1, t1) = _results()[3]
    assert (k0, k1) == ("comm", "numeric")
    assert w0 and w1 and s0 and s1
    assert t0 == t1 == 3


@pytest.mark.parametrize("case", [4, 5, 6], ids=["nesterov-int8", "sparseloco", "streaming"])
def test_state_dict_resume_is_bit_identical(case):
    assert all(_results()[case])


def test_bad_options_are_refused_naming_the_option():
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = [(dict(outer="adam"), "outer"), (dict(sync_every=0), "sync_every"),
           (dict(sync_every=4, fragments=5), "fragments"), (dict(sync_every=4, overlap=4), "overlap"),
           (dict(codec="int9"), "codec"), (dict(outer="sparseloco", feedback="residual"), "feedback"),
           (dict(outer="average", outer_momentum=0.9), "outer_momentum"), (dict(outer_lr=-1.0), "outer_lr"),
           (dict(mix=2.0), "mix"), (dict(sync_every=-3), "sync_every")]
    for kwargs, name in bad:
        with pytest.raises(gradcomp.ConfigError, match="'%s'" % name):
            gradcomp.DiLoCo(model, opt, **kwargs)
    with pytest.raises(gradcomp.ConfigError, match="float32"):
        gradcomp.DiLoCo(make_model(0).double(), opt)
    with pytest.raises(gradcomp.FormatError):
        gradcomp.DiLoCo.load_state_dict(object.__new__(gradcomp.DiLoCo), {"version": 99})


def _doc_block():
    text = open(os.path.join(ROOT, "docs", "pytorch.md"), encoding="utf-8").read()
    m = re.search(r"<!-- python-example: diloco -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/pytorch.md has no diloco example"
    return m.group(1)


def test_docs_example_runs(tmp_path):
    code = _doc_block()
    assert "gradcomp.DiLoCo(" in code and "torchrun --standalone --nproc_per_node 2 this.py" in code
    script = tmp_path / "diloco_example.py"
    script.write_text(code)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"loss (\S+) -> (\S+), (\d+) syncs, (\d+) bytes sent, (\d+)x fewer than DDP", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m.group(2)) < float(m.group(1))  # it learned
    assert int(m.group(5)) >= 100                  # sync every 30 steps with 4-bit values
