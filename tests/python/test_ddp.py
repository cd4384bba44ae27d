# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The DDP hook on 2 and 4 gloo processes: agreement with DDP's own all-reduce, every codec
kind against a reference computed here, error-feedback conservation, the same controller
decisions on every rank, checkpoint and resume, and failures that raise instead of hanging."""

import functools
import io
import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
from ranks import run_cases, run_ranks


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(model, steps, rank, first_step=0, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(first_step, first_step + steps):
        x, y = batch(rank, s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---------------------------------------------------------------------------------------------
# identity codec == DDP's default all-reduce, bit for bit

def _identity_vs_default(rank, world, feedback):
    ref = DDP(make_model(), bucket_cap_mb=0.05)
    train(ref, 6, rank)
    mine = DDP(make_model(), bucket_cap_mb=0.05)
    state = gradcomp.GradcompState(codec="identity", feedback=feedback)
    mine.register_comm_hook(state, gradcomp.hook)
    train(mine, 6, rank)
    return torch.equal(params(ref), params(mine)), state.totals["iterations"], state.last_stats["bytes_sent"]


@pytest.mark.parametrize("world", [2, 4])
def test_identity_bit_identical_to_ddp_allreduce(world):
    # identity without feedback is no compression: DDP's bucket all-reduced as DDP does
    for same, iterations, sent in run_ranks(_identity_vs_default, world, "none"):
        assert same
        assert iterations == 6
        assert sent > 0


def test_identity_through_the_pipeline_bit_identical_on_two_ranks():
    # with (zero) error feedback the identity codec goes through the whole pipeline: packets,
    # messages, average. Two ranks' sums do not depend on order and halving is exact, so the
    # result is still DDP's, bit for bit.
    for same, iterations, sent in run_ranks(_identity_vs_default, 2, "residual"):
        assert same
        assert iterations == 6


# ---------------------------------------------------------------------------------------------
# every codec kind against a reference computed in Python (the engine driven directly: one
# "bucket" of n elements per step, the gradients of every rank known to every rank)

N = 6000


def grad(rank, step, n=N):
    g = torch.Generator().manual_seed(77 + 31 * rank + 1000 * step)
    return torch.randn(n, generator=g)


def run_steps(state, rank, steps, n=N, shape=None):
    outs = []
    for s in range(steps):
        buf = grad(rank, s, n)
        views, shapes = ([], []) if shape is None else ([buf], [shape])
        fut = state._engine.submit(0, buf, views, shapes, [], True)
        outs.append(fut.wait().clone())
    return outs


def _codec_kind(rank, world, spec, feedback, two_way):
    state = gradcomp.GradcompState(codec=spec, feedback=feedback, two_way=two_way, seed=11, start_iter=0)
    shape = (100, 60) if spec.startswith("powersgd") else None
    return run_steps(state, rank, 3, shape=shape), state.last_stats


KINDS = [
    ("fp16", "none", False),            # summable
    ("randomk:ratio=0.02", "none", False),  # shared support
    ("topk:ratio=0.02", "none", False),     # gather
    ("powersgd:rank=3", "residual", False),  # low rank
    ("fp16", "none", True),             # two-way
    ("topk:ratio=0.05", "none", True),  # two-way, sparse
]


@functools.cache
def _codec_kind_results(world):
    # every kind on one launch of the ranks; each test below checks its own
    return run_cases(_codec_kind, world, KINDS)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("spec,feedback,two_way", KINDS)
def test_codec_kinds_against_reference(world, spec, feedback, two_way):
    results = _codec_kind_results(world)[KINDS.index((spec, feedback, two_way))]
    outs0 = results[0][0]
    if spec.startswith("powersgd"):
        codec = gradcomp.Codec(spec)
        psgd_ref = []
        for s in range(len(outs0)):
            ms = (sum(grad(r, s) for r in range(world)) / world).reshape(100, 60)
            packet = codec.compress(ms, seed=11, step=s)
            psgd_ref.append(codec.decompress(packet, torch.empty(100, 60)).reshape(-1))
    for outs, _ in results[1:]:  # every rank ends with the same average
        for a, b in zip(outs0, outs):
            assert torch.equal(a, b)
    for step, out in enumerate(outs0):
        grads = [grad(r, step) for r in range(world)]
        mean = sum(grads) / world
        if spec == "fp16" and not two_way:
            # the f16 packets are summed in float32 and rounded once per peer, then averaged:
            # within world roundings of 2^-11 of the running sums
            bound = world * 2.0 ** -11 * sum(g.abs() for g in grads) / world + 1e-6
            assert ((out - mean).abs() <= bound).all()
        elif spec.startswith("randomk"):
            # every rank keeps the same coordinates (shared seed), each with its mean value,
            # scaled for unbiasedness as a single rank's packet is
            codec = gradcomp.Codec(spec)
            ref = torch.zeros(N)
            for r in range(world):
                codec.decompress_add(codec.compress(grads[r], seed=11, step=step), ref, alpha=1.0 / world,
                                     seed=11, step=step)
            support = out != 0
            assert torch.equal(support, ref != 0)
            assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7)
        elif spec.startswith("topk") and not two_way:
            # the mean of every rank's top-k packet (each rank seeds seed + rank)
            codec = gradcomp.Codec(spec)
            ref = torch.zeros(N)
            for r in range(world):
                codec.decompress_add(codec.compress(grads[r], seed=11 + r, step=step), ref, alpha=1.0 / world)
            assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7)
        elif spec.startswith("powersgd"):
            # PowerSGD is linear in the matrix given Q, and its error feedback is too: the
            # distributed result is single-process PowerSGD (with its error feedback) of the
            # mean gradient, started from the same Q (shared seed)
            assert torch.allclose(out, psgd_ref[step], rtol=1e-4, atol=2e-5)
        elif two_way and spec == "fp16":
            # workers send f16 shards, the owner sums and sends f16 back: two roundings
            bound = 4 * 2.0 ** -11 * (sum(g.abs() for g in grads) / world) + 1e-6
            assert ((out - mean).abs() <= bound).all()
        elif two_way:
            # sparse two-way: what comes back is the owner's top-k of the sum of the workers'
            # top-k packets; its coordinates are a subset of the union of the workers' and it
            # moves the mean in the right direction
            assert (out != 0).sum() <= int(0.05 * N) * world + world
            assert float((out * mean).sum()) > 0


@pytest.mark.parametrize("world", [2, 4])
def test_powersgd_reports_its_real_factor(world):
    # rank 3 of a 100 x 60 gradient sends P (100 x 3) and Q (60 x 3) in float32: about 12x
    # fewer bytes than the 6000 floats; the statistics said 1.0 (PowerSGD has no bits per
    # element)
    results = _codec_kind_results(world)[KINDS.index(("powersgd:rank=3", "residual", False))]
    for _, stats in results:
        assert stats["sent"] != "dense"
        assert stats["factor"] == pytest.approx(N * 4 / stats["bytes_sent"], rel=1e-12)
        assert 10 < stats["factor"] < N * 4 / ((100 + 60) * 3 * 4) + 1e-9


# ---------------------------------------------------------------------------------------------
# error feedback conserves mass: sum of what was delivered + mean residual == sum of gradients

def _conservation(rank, world):
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", feedback="residual", start_iter=0)
    outs = run_steps(state, rank, 5)
    (tid,) = state._engine.tensor_ids()
    residual = torch.tensor(state._engine.feedback_state(tid))
    gathered = [torch.empty_like(residual) for _ in range(world)]
    dist.all_gather(gathered, residual)
    return outs, gathered


@pytest.mark.parametrize("world", [2, 4])
def test_error_feedback_conserves_mass(world):
    outs, residuals = run_ranks(_conservation, world)[0]
    delivered = sum(outs)
    total = sum(sum(grad(r, s) for s in range(5)) for r in range(world)) / world
    mean_residual = sum(residuals) / world
    assert torch.allclose(delivered + mean_residual, total, rtol=0, atol=2e-5)
    assert float(mean_residual.norm()) > 0.1 * float(total.norm())  # residuals are real


# ---------------------------------------------------------------------------------------------
# controller decisions agree across ranks

def _controller(rank, world):
    model = DDP(make_model(), bucket_cap_mb=0.05)
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", feedback="residual",
                                   controller="gravac:theta_min=2,theta_max=200,epsilon=0.3",
                                   measured_timing=False, batch_size=16)
    model.register_comm_hook(state, gradcomp.hook)
    factors = []
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(12):
        train(model, 1, rank, first_step=s, opt=opt)
        factors.append(state.last_stats["factor"])
    return factors


@pytest.mark.parametrize("world", [2, 4])
def test_controller_decisions_agree(world):
    results = run_ranks(_controller, world)
    assert all(r == results[0] for r in results)
    assert len(set(results[0][1:])) >= 1 and results[0][-1] > 1.0


# ---------------------------------------------------------------------------------------------
# checkpoint and resume: bit-identical to an uninterrupted run; picklable state

def _resume(rank, world, options):
    def fresh():
        model = DDP(make_model(), bucket_cap_mb=0.05)
        state = gradcomp.GradcompState(**options)
        model.register_comm_hook(state, gradcomp.hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, state, opt

    model, state, opt = fresh()
    train(model, 8, rank, opt=opt)
    straight = params(model)

    model, state, opt = fresh()
    train(model, 4, rank, opt=opt)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf)
    pickled = pickle.dumps(state)
    buf.seek(0)
    saved = torch.load(buf)

    model, state, opt = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    assert state.iteration == 4
    train(model, 4, rank, first_step=4, opt=opt)
    resumed = params(model)

    unpickled = pickle.loads(pickled)
    assert unpickled.iteration == 4 and unpickled.options == state.options
    return torch.equal(straight, resumed)


RESUME = [
    dict(codec="topk:ratio=0.01", feedback="residual"),
    dict(codec="onebit", feedback="ef21"),
    dict(codec="powersgd:rank=2", feedback="residual", start_iter=2),
    dict(codec="topk:ratio=0.01", feedback="residual", controller="gravac:theta_min=2,theta_max=200",
         measured_timing=False, batch_size=16),
    dict(codec="topk:ratio=0.01", feedback="residual",
         controller="ef_window:min=2,max=200,window=2,max_delay=0.5"),
    dict(codec="topk:ratio=0.05", feedback="residual", two_way=True),
]


@functools.cache
def _resume_results():
    return run_cases(_resume, 2, [(options,) for options in RESUME])


@pytest.mark.parametrize("case", range(len(RESUME)),
                         ids=[o["codec"] + ("+" + o.get("controller", "")[:6]) for o in RESUME])
def test_checkpoint_resume_bit_identical(case):
    assert all(_resume_results()[case])


def _mismatched_state(rank, world):
    a = gradcomp.GradcompState(codec="topk:ratio=0.01")
    b = gradcomp.GradcompState(codec="fp16")
    with pytest.raises(gradcomp.FormatError):
        b.load_state_dict(a.state_dict())
    with pytest.raises(gradcomp.FormatError):
        b.load_state_dict({"version": 1, "options": b.options, "engine": b"GCDHjunk"})
    return True


def test_mismatched_state_raises():
    assert all(run_ranks(_mismatched_state, 2))


# ---------------------------------------------------------------------------------------------
# DDP's bucket rebuild after the first iteration, and 16-bit gradients

def _rebuild(rank, world, start_iter):
    model = DDP(make_model(), bucket_cap_mb=0.02)
    state = gradcomp.GradcompState(codec="topk:ratio=0.05", feedback="residual", start_iter=start_iter)
    model.register_comm_hook(state, gradcomp.hook)
    train(model, 5, rank)
    p = params(model)
    gathered = [torch.empty_like(p) for _ in range(world)]
    dist.all_gather(gathered, p)
    return all(torch.equal(gathered[0], g) for g in gathered), state.totals


@pytest.mark.parametrize("start_iter", [0, 1])
def test_bucket_rebuild(start_iter):
    for same, totals in run_ranks(_rebuild, 2, start_iter):
        assert same  # replicas stay identical
        assert totals["iterations"] == 5
        # state is per parameter: DDP's rebuilt buckets find it
        assert totals["layout_changes"] == 0


def _16bit_buckets(rank, world, dtype):
    # (a 16-bit model cannot run DDP on CPU with PyTorch 1.13: no half matmul on CPU, no
    # bfloat16 broadcast in gloo; the engine takes such buckets all the same)
    state = gradcomp.GradcompState(codec="topk:ratio=0.05", feedback="residual")
    outs = []
    for s in range(3):
        buf = grad(rank, s).to(dtype)
        outs.append(state._engine.submit(0, buf, [], [], [], True).wait().clone())
    return outs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_buckets(dtype):
    a, b = run_ranks(_16bit_buckets, 2, dtype)
    for x, y in zip(a, b):
        assert x.dtype == dtype and torch.equal(x, y) and bool((x != 0).any())


# ---------------------------------------------------------------------------------------------
# failures: bad specs, and a rank that disappears mid-step

def _bad_specs(rank, world):
    with pytest.raises(gradcomp.ConfigError, match="unknown codec"):
        gradcomp.GradcompState(codec="nope")
    with pytest.raises(gradcomp.ConfigError, match="unknown error feedback"):
        gradcomp.GradcompState(feedback="sometimes")
    with pytest.raises(gradcomp.ConfigError):
        gradcomp.GradcompState(codec="fp16", controller="gravac")
    with pytest.raises(gradcomp.ConfigError, match="unknown options"):
        gradcomp.GradcompState(codek="fp16")
    with pytest.raises(gradcomp.ConfigError, match="unknown guard"):
        gradcomp.GradcompState(guard="panic")
    return True


def test_bad_spec_raises():
    assert all(run_ranks(_bad_specs, 2))


def _nan_step(rank, world):
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", start_iter=0)
    good = grad(rank, 0)
    bad = grad(rank, 1)
    if rank == 1:
        bad[5] = float("nan")
    state._engine.submit(0, good, [], [], [], True).wait()
    before = list(state._engine.feedback_state(state._engine.tensor_ids()[0]))
    with pytest.raises(RuntimeError, match="gradcomp"):
        state._engine.submit(0, bad, [], [], [], True).wait()
    after = list(state._engine.feedback_state(state._engine.tensor_ids()[0]))
    # the failed step left the state as it was, and the next step works on every rank
    state._engine.submit(0, grad(rank, 2), [], [], [], True).wait()
    return before == after


def test_nan_fails_the_step_on_every_rank():
    assert all(run_ranks(_nan_step, 2))


def _guard_policies(rank, world):
    # skip: a NaN on rank 1 comes back as zeros on every rank, with the state as it was
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", start_iter=0, guard="skip")
    state.report_loss(torch.tensor(2.0 + rank))
    state._engine.submit(0, grad(rank, 0), [], [], [], True).wait()
    assert state.last_stats["guard"] == "none" and state.last_stats["loss"] == 2.5
    before = list(state._engine.feedback_state(state._engine.tensor_ids()[0]))
    bad = grad(rank, 1)
    if rank == 1:
        bad[5] = float("inf")
    state._engine.submit(0, bad, [], [], [], True).wait()
    assert state.last_stats["guard"] == "skipped" and bool((bad == 0).all())
    assert list(state._engine.feedback_state(state._engine.tensor_ids()[0])) == before
    # raise (the default): the same message on every rank, naming the guard
    loud = gradcomp.GradcompState(codec="topk:ratio=0.01", start_iter=0)
    bad = grad(rank, 1)
    if rank == 0:
        bad[3] = float("nan")
    with pytest.raises(RuntimeError, match="divergence guard: step 0: the gradient norm is nan.*not finite"):
        loud._engine.submit(0, bad, [], [], [], True).wait()
    return True


def test_guard_policies_in_the_hook():
    assert all(run_ranks(_guard_policies, 2))


def _peer_exits(rank, world):
    model = DDP(make_model(), bucket_cap_mb=0.05)
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", timeout_s=20)
    model.register_comm_hook(state, gradcomp.hook)
    train(model, 2, rank)
    if rank == world - 1:
        os._exit(0)  # gone mid-training, without a word
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        train(model, 1, rank, first_step=2)
    took = time.monotonic() - start
    return took, str(err.value)


def test_peer_exit_raises_instead_of_hanging():
    results = run_ranks(_peer_exits, 2, allow_missing=(1,), timeout_s=120)
    took, message = results[0]
    assert took < 30
    # gradcomp's message, naming the exchange and carrying gloo's reason
    assert "gradcomp: c10d" in message and "failed" in message


# ---------------------------------------------------------------------------------------------
# close(): the worker thread stops, later use raises; the exit handler closes open states

def _threads():
    return len(os.listdir("/proc/self/task"))


def _close(rank, world):
    model = DDP(make_model())
    state = gradcomp.GradcompState(codec="topk:ratio=0.05", feedback="residual")
    model.register_comm_hook(state, gradcomp.hook)
    train(model, 2, rank)
    before = _threads()
    state.close()
    after = _threads()
    state.close()  # idempotent
    with pytest.raises(gradcomp.ConfigError, match="closed"):
        state.totals
    with pytest.raises(RuntimeError, match="closed"):
        train(model, 1, rank, first_step=2)
    # what the atexit handler runs closes every state still open
    other = gradcomp.GradcompState(codec="fp16", feedback="none")
    assert other in gradcomp.ddp._open_states
    gradcomp.ddp._close_open_states()
    assert len(gradcomp.ddp._open_states) == 0
    with pytest.raises(gradcomp.ConfigError, match="closed"):
        other.iteration
    return before - after


def test_close_stops_the_worker():
    assert run_ranks(_close, 2) == [1, 1]


# ---------------------------------------------------------------------------------------------
# torch 2.x process groups: the default group, dist.group.WORLD and a new group work; a backend
# object (since torch 2.0 a Backend behind a ProcessGroup) and other objects are a ConfigError

def _process_groups(rank, world):
    sums = []
    for group in (None, dist.group.WORLD, dist.new_group(list(range(world)))):
        model = DDP(make_model(), process_group=group, bucket_cap_mb=0.05)
        state = gradcomp.GradcompState(process_group=group, codec="fp16", feedback="none")
        model.register_comm_hook(state, gradcomp.hook)
        train(model, 2, rank)
        state.close()
        sums.append(float(params(model).double().sum()))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    with pytest.raises(gradcomp.ConfigError, match="backend object.*pass the process group"):
        gradcomp.GradcompState(process_group=backend)
    with pytest.raises(gradcomp.ConfigError, match="backend object"):
        gradcomp.Communicator(backend)
    with pytest.raises(gradcomp.ConfigError, match="must be a torch.distributed.ProcessGroup"):
        gradcomp.GradcompState(process_group="world")
    return sums


def test_process_groups_and_backends():
    a, b = run_ranks(_process_groups, 2)
    # every rank holds the same replica, and the three ways to name the group train alike
    assert a == b and a[0] == a[1] == a[2]


def test_uninitialized_default_group_is_a_config_error():
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(gradcomp.ConfigError, match="not initialized"):
        gradcomp.GradcompState(codec="fp16")
