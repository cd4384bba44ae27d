# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp.OneBitAdam (python/gradcomp/onebit_adam.py), the library's calibrated 1-bit Adam
over a gloo process group: bit-identical to the C++ optimizer driven directly over the
library's in-process communicator (same parameters, same bytes per step); with the identity
codec and the same gradient on every rank, torch's Adam / AdamW within float32 rounding;
replicas identical; resume bit for bit; bad options and non-finite gradients refused."""

import io

import pytest
import torch
import torch.distributed as dist

import gradcomp
from gradcomp import _C
from ranks import run_ranks

SHAPES = [(6, 10), (10,), (3, 4, 5)]  # a matrix (6 rows), a vector, a 3-D tensor (3 rows)


def make_params(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def grads(step, rank, shapes=SHAPES, same=False):
    g = torch.Generator().manual_seed(100 * step + (0 if same else rank) + 7)
    return [torch.randn(s, generator=g) for s in shapes]


LRS = [0.01, 0.01, 0.01, 0.003, 0.003, 0.003]  # a learning-rate drop after 3 steps


def _with_optimizer(rank, world, options):
    params = make_params()
    opt = gradcomp.OneBitAdam(params, **options)
    log = []
    for step, lr in enumerate(LRS):
        opt.param_groups[0]["lr"] = lr
        for p, g in zip(params, grads(step, rank)):
            p.grad = g
        opt.step()
        log.append(([p.detach().clone() for p in params], opt.last_stats["packet_bytes"]))
    return log


@pytest.mark.parametrize("options", [
    dict(),  # the C++ defaults: onebit, sketch 64 (1024 first), sync every 4 steps
    dict(codec="int8", decay="decoupled", weight_decay=0.1, sync_first=2, sync_every=3, sketch=8,
         sketch_first=16, seed=5, beta1=0.8, eps=1e-6),
], ids=["defaults", "int8-adamw"])
def test_matches_the_cpp_optimizer_driven_directly(options):
    world = 2
    results = run_ranks(_with_optimizer, world, options)
    full = dict(_C.calibrated_onebit_adam_defaults())
    full.update(options)
    codec = full.pop("codec")
    x0 = [p.detach().reshape(-1).tolist() for p in make_params()]
    gs = [[[g.reshape(-1).tolist() for g in grads(s, r)] for s in range(len(LRS))] for r in range(world)]
    rows = [6, 0, 3]
    driven = _C._drive_calibrated_onebit_adam(codec, {k: (float(v) if k in ("lr", "beta1", "beta2", "eps", "weight_decay") else v)
                                                      for k, v in full.items()}, rows, x0, gs, LRS)
    for r in range(world):
        xs, bytes_per_step = driven[r]
        final, _ = results[r][-1]
        for got, want in zip(final, xs):
            assert torch.equal(got.reshape(-1), torch.tensor(want, dtype=torch.float32))
        assert [b for _, b in results[r]] == list(bytes_per_step)
    # replicas identical after every step
    for step in range(len(LRS)):
        for a, b in zip(results[0][step][0], results[1][step][0]):
            assert torch.equal(a, b)
    # and it moved: the parameters are not the initial ones
    assert not torch.equal(results[0][-1][0][0], make_params()[0].detach())


def _identity_adam(rank, world, decoupled):
    shapes = [(40,), (17,)]  # vectors: one second moment per element, as Adam's
    params = make_params(1, shapes)
    ref = [torch.nn.Parameter(p.detach().double().clone()) for p in params]
    kw = dict(lr=0.02, weight_decay=0.05)
    opt = gradcomp.OneBitAdam(params, codec="identity", sync_first=1000,
                              decay="decoupled" if decoupled else "l2", **kw)
    adam = (torch.optim.AdamW if decoupled else torch.optim.Adam)(ref, foreach=False, **kw)
    worst = 0.0
    for step in range(20):
        gs = grads(step, rank, shapes, same=True)  # the same gradient on every rank
        for p, q, g in zip(params, ref, gs):
            p.grad = g
            q.grad = g.double()
        opt.step()
        adam.step()
        worst = max(worst, max(float((p.detach().double() - q.detach()).abs().max()) for p, q in zip(params, ref)))
    moved = max(float((p.detach() - p0).abs().max()) for p, p0 in zip(params, make_params(1, shapes)))
    return worst, moved, [opt.calibration(p) for p in params]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
def test_identity_codec_and_equal_gradients_is_adam(world, decoupled):
    """With the identity codec the momentum's all-reduce is exact; with the same gradient on
    every rank the ranks' mean momentum and statistics are that rank's, the sketch's estimate
    of ||mean g||^2 is exact (as many buckets as elements) so rho = 1, and a vector's v synced
    every step (sync_first = 1000) is Adam's. What remains is float32 rounding against torch's
    float64 Adam: a few ulps of the step (lr = 0.02) and of x (|x| < 4) per step, under 1e-5
    in all over 20 steps."""
    for worst, moved, rhos in run_ranks(_identity_adam, world, decoupled):
        assert worst < 1e-5
        assert moved > 0.1  # control: Adam moved the parameters
        assert all(abs(r - 1.0) < 1e-6 for r in rhos)


def _resume(rank, world):
    params = make_params(2)
    opt = gradcomp.OneBitAdam(params, lr=0.01, sketch=16, sketch_first=32, sync_every=2)
    for step in range(3):
        for p, g in zip(params, grads(step, rank)):
            p.grad = g
        opt.step()
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict()}, buf)

    def run(ps, o):
        for step in range(3, 7):
            for p, g in zip(ps, grads(step, rank)):
                p.grad = g
            o.step()
        return [p.detach().clone() for p in ps]

    a = run(params, opt)
    saved = torch.load(io.BytesIO(buf.getvalue()))
    params2 = [torch.nn.Parameter(t) for t in saved["params"]]
    opt2 = gradcomp.OneBitAdam(params2, lr=0.5, sketch=16, sketch_first=32, sync_every=2)
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[0]["lr"] == 0.01
    # a state that does not fit: other options (sync_every), then FormatError, nothing changed
    params3 = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt3 = gradcomp.OneBitAdam(params3, lr=0.01, sketch=16, sketch_first=32, sync_every=2)
    bad = saved["opt"]
    bad["param_groups"][0]["sync_every"] = 3
    try:
        opt3.load_state_dict(bad)
        refused = ""
    except gradcomp.FormatError as e:
        refused = str(e)
    b = run(params2, opt2)
    return a, b, refused, opt3.param_groups[0]["sync_every"], len(opt3.state)


def test_resume_is_bit_identical():
    for a, b, refused, sync_every, states in run_ranks(_resume, 2):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
        assert "sync schedule" in refused and sync_every == 2 and states == 0


def _nonfinite(rank, world):
    params = make_params(3)
    opt = gradcomp.OneBitAdam(params)
    for p, g in zip(params, grads(0, rank)):
        p.grad = g
    opt.step()
    before = [p.detach().clone() for p in params]
    state = opt.state_dict()["state"][0]["calibrated_onebit_adam"].clone()
    if rank == 1:
        params[1].grad[3] = float("nan")
    try:
        opt.step()
        message = ""
    except gradcomp.NumericError as e:
        message = str(e)
    unchanged = all(torch.equal(p.detach(), b) for p, b in zip(params, before))
    same_state = torch.equal(opt.state_dict()["state"][0]["calibrated_onebit_adam"], state)
    # the next good step works on both ranks
    params[1].grad = grads(1, rank)[1]
    opt.step()
    return message, unchanged and same_state, [p.detach().clone() for p in params]


def test_a_nonfinite_gradient_fails_every_rank_and_changes_nothing():
    (m0, ok0, p0), (m1, ok1, p1) = run_ranks(_nonfinite, 2)
    assert "another rank" in m0 and "this rank" in m1
    assert ok0 and ok1
    for a, b in zip(p0, p1):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs,option", [
    (dict(lr=-1.0), "lr"), (dict(lr=float("inf")), "lr"), (dict(beta1=1.0), "beta1"),
    (dict(beta2=-0.5), "beta2"), (dict(eps=-1.0), "eps"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(decay="adamw"), "decay"), (dict(sync_first=0), "sync_first"), (dict(sketch=-1), "sketch"),
    (dict(sync_every=1.5), "sync_every"), (dict(seed=True), "seed"), (dict(codec="nope"), "codec"),
    (dict(codec="topk:ratio=2"), "ratio"), (dict(timeout_s=0), "timeout_s"),
])
def test_bad_options_are_refused_naming_them(kwargs, option):
    with pytest.raises(gradcomp.ConfigError, match=option):
        gradcomp.OneBitAdam([torch.nn.Parameter(torch.zeros(4))], **kwargs)


def test_bad_parameters_are_refused():
    with pytest.raises(gradcomp.ConfigError, match="float32"):
        gradcomp.OneBitAdam([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))])
    with pytest.raises(gradcomp.ConfigError, match="contiguous"):
        gradcomp.OneBitAdam([torch.nn.Parameter(torch.zeros(4, 3).t())])
    # no process group: a clear error at the first step
    p = torch.nn.Parameter(torch.zeros(4))
    opt = gradcomp.OneBitAdam([p])
    p.grad = torch.ones(4)
    with pytest.raises(gradcomp.ConfigError, match="not initialized"):
        opt.step()


def _only_lr_changes(rank, world):
    p = torch.nn.Parameter(torch.zeros(8))
    opt = gradcomp.OneBitAdam([p], lr=0.1)
    p.grad = torch.ones(8)
    opt.step()
    opt.param_groups[0]["lr"] = 0.05
    opt.step()  # fine
    opt.param_groups[0]["beta2"] = 0.9
    try:
        opt.step()
        return ""
    except gradcomp.ConfigError as e:
        return str(e)


def test_only_lr_may_change_after_the_first_step():
    (message,) = run_ranks(_only_lr_changes, 1)
    assert "beta2 changed" in message


def test_the_docs_example_runs(tmp_path):
    from test_demo import run_doc_example

    loss, sent, ratio = run_doc_example("onebit_adam", tmp_path)
    assert loss < 3.0  # the targets' variance is about 32: it learned them
    # 2177 elements in 4 tensors: onebit's 1 bit per element is the smaller part; each tensor
    # also sends a 32-byte header per packet and a 65-float sketch per step, and the statistics
    # every 4 steps (on large tensors the ratio nears docs/training.md's 30x)
    assert 3 <= ratio <= 32
