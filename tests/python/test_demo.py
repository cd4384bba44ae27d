# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp.DeMo (python/gradcomp/demo.py): against a plain reference written here with torch
ops in float64 (chunked orthonormal DCT-II, top-k per chunk, signs with one scale, momentum
subtraction, sign of the ranks' mean), on one process and on 2 gloo ranks; replicas identical
after every step; the bytes of a step equal the packets'; resume bit for bit; bad options."""

import io
import math

import pytest
import torch
import torch.distributed as dist

import gradcomp
from ranks import run_ranks


def dct_basis(C):
    """The orthonormal DCT-II basis (row u = phi_u), in float64."""
    i = torch.arange(C, dtype=torch.float64)
    u = i[:, None]
    b = torch.cos(math.pi * (2 * i[None, :] + 1) * u / (2 * C)) * math.sqrt(2.0 / C)
    b[0] = math.sqrt(1.0 / C)
    return b


def reference_extract(m, chunk, k):
    """What DeMo's codec extracts from the flat momentum m (float64): every chunk (the last
    zero-padded) to DCT-II coefficients, the k largest |c| of each kept as sign(c) * s with s the
    mean |c| of all kept ones, back through the inverse transform, cut to len(m)."""
    n = m.numel()
    nc = (n + chunk - 1) // chunk
    x = torch.zeros(nc * chunk, dtype=torch.float64)
    x[:n] = m.double()
    B = dct_basis(chunk)
    c = x.view(nc, chunk) @ B.T
    idx = c.abs().topk(k, dim=1).indices
    kept = torch.gather(c, 1, idx)
    s = kept.abs().mean()
    spec = torch.zeros_like(c)
    spec.scatter_(1, idx, torch.sign(kept) * s)
    return (spec @ B).reshape(-1)[:n], s


def packet_bytes(n, chunk, k):
    """dct_sign's packet (codec/format/dct_sign.hpp): 32-byte header, f32 scale, K sign bits,
    K indices of log2(chunk) bits, K = k per chunk."""
    K = (n + chunk - 1) // chunk * k
    return 32 + 4 + (K + 7) // 8 + (K * int(math.log2(chunk)) + 7) // 8


def make_params(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    # 200: not a multiple of the chunk (a padded last chunk); 8 x 48 = 384: six chunks of 64
    return [torch.nn.Parameter(torch.randn(200, generator=g).to(dtype)),
            torch.nn.Parameter(torch.randn(8, 48, generator=g).to(dtype))]


def grads(seed, step, rank, params):
    g = torch.Generator().manual_seed(1000 * seed + 10 * step + rank)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


@pytest.mark.parametrize("chunk,k", [(64, 64), (64, 8), (16, 3)])
def test_one_process_matches_the_reference(chunk, k):
    """k = chunk keeps every coefficient; k < chunk keeps the top k. One process, no group."""
    params = make_params(1)
    lr, beta, wd = 0.01, 0.9, 0.1
    opt = gradcomp.DeMo(params, lr=lr, momentum_decay=beta, chunk=chunk, topk=k, weight_decay=wd)
    for step in range(5):
        before = [p.detach().clone() for p in params]
        moms = [opt.state[p]["momentum"].clone() if p in opt.state else torch.zeros_like(p)
                for p in params]
        for p, g in zip(params, grads(1, step, 0, params)):
            p.grad = g
        opt.step()
        checked = 0
        for p, p0, m0 in zip(params, before, moms):
            m = (beta * m0.double() + p.grad.double()).reshape(-1)
            q, s = reference_extract(m, chunk, k)
            # the momentum keeps m - q: float32 against float64, within a few float32 roundings
            got = opt.state[p]["momentum"].reshape(-1).double()
            assert torch.allclose(got, m - q, rtol=1e-5, atol=1e-5 * float(m.abs().max()))
            # the update: decay, then -lr * sign(q), wherever sign(q) is clear of rounding
            clear = q.abs() > 1e-4 * float(s)
            want = (p0.double() * (1 - lr * wd) - lr * torch.sign(q).reshape(p.shape)).reshape(-1)
            diff = (p.detach().double().reshape(-1) - want).abs()
            assert float(diff[clear].max()) < 1e-6
            checked += int(clear.sum())
        assert checked >= 0.99 * sum(p.numel() for p in params)
        assert opt.state[params[0]]["step"] == step + 1


def test_k_equal_chunk_extracts_the_momentum_when_its_spectrum_is_flat():
    """With k = chunk nothing is dropped by the top-k: a momentum whose DCT coefficients all
    have one magnitude is sent whole (sign and scale are exact), leaving a zero momentum, and
    the step is sign-SGD with that momentum."""
    C = 32
    B = dct_basis(C)
    g = torch.Generator().manual_seed(5)
    spec = torch.where(torch.rand(2, C, generator=g) < 0.5, -1.0, 1.0).double() * 0.25
    grad = (spec @ B).reshape(-1).float()
    p = torch.nn.Parameter(torch.zeros(2 * C))
    opt = gradcomp.DeMo([p], lr=0.5, chunk=C, topk=C)
    p.grad = grad
    opt.step()
    assert float(opt.state[p]["momentum"].abs().max()) < 1e-6
    assert torch.equal(p.detach(), -0.5 * torch.sign(grad))


def _two_ranks(rank, world, steps, chunk, k):
    params = make_params(2)  # the same initial parameters on every rank
    opt = gradcomp.DeMo(params, lr=0.02, momentum_decay=0.999, chunk=chunk, topk=k,
                        weight_decay=0.01)
    log = []
    for step in range(steps):
        gs = grads(2, step, rank, params)  # each rank its own gradients
        moms = [opt.state[p]["momentum"].clone() if p in opt.state else torch.zeros_like(p)
                for p in params]
        before = [p.detach().clone() for p in params]
        for p, g in zip(params, gs):
            p.grad = g
        opt.step()
        log.append(dict(before=before, moms=moms, grads=gs, after=[p.detach().clone() for p in params],
                        stats=dict(opt.last_stats)))
    return log, opt.bytes_sent


@pytest.mark.parametrize("chunk,k", [(64, 8), (64, 32)])
def test_two_ranks_agree_with_the_reference_and_each_other(chunk, k):
    steps = 4
    results = run_ranks(_two_ranks, 2, steps, chunk, k)
    codec = gradcomp.Codec("dct_sign:chunk=%d,k=%d" % (chunk, k))
    per_step = sum(packet_bytes(n, chunk, k) for n in (200, 384))
    for step in range(steps):
        logs = [results[r][0][step] for r in range(2)]
        # replicas identical, bit for bit, after every step
        for a, b in zip(logs[0]["after"], logs[1]["after"]):
            assert torch.equal(a, b)
        # the update is -lr * sign(mean of both ranks' decoded packets) after the decay
        for i in range(2):
            mean = torch.zeros(logs[0]["before"][i].numel())
            for r in range(2):
                m = logs[r]["moms"][i].reshape(-1) * 0.999 + logs[r]["grads"][i].reshape(-1)
                codec.decompress_add(codec.compress(m), mean, 0.5)
            want = logs[0]["before"][i] * (1 - 0.02 * 0.01)
            want = want + (-0.02) * torch.sign(mean).reshape(want.shape)
            assert torch.equal(logs[0]["after"][i], want)
        # bytes: each rank sends its two packets, headers included
        for r in range(2):
            st = logs[r]["stats"]
            assert st["packet_bytes"] == per_step
            assert st["received_bytes"] == per_step
            assert st["dense_bytes"] == 4 * 584 and st["world"] == 2
    assert results[0][1] == results[1][1] == steps * per_step


def test_bytes_of_the_paper_setting():
    """The packet sizes the docs quote: bits per element against float32."""
    n = 1 << 20
    for chunk, k, bits in [(64, 8, 0.875), (64, 32, 3.5), (1024, 8, 11 * 8 / 1024)]:
        p = torch.zeros(n)
        got = gradcomp.Codec(gradcomp.DeMo.spec(chunk, k)).compress(p)
        assert got.numel() == packet_bytes(n, chunk, k)
        assert abs((got.numel() - 36) * 8 / n - bits) < 1e-3


def _train(params, opt, first, steps):
    for step in range(first, first + steps):
        for p, g in zip(params, grads(3, step, 0, params)):
            p.grad = g
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resume_is_bit_identical(dtype):
    params = make_params(3, dtype)
    opt = gradcomp.DeMo(params, lr=0.01, momentum_decay=0.99, chunk=32, topk=4, weight_decay=0.05)
    _train(params, opt, 0, 3)
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict()}, buf)
    _train(params, opt, 3, 4)

    saved = torch.load(io.BytesIO(buf.getvalue()))
    params2 = [torch.nn.Parameter(t) for t in saved["params"]]
    opt2 = gradcomp.DeMo(params2, lr=1.0, momentum_decay=0.5, chunk=64, topk=8)  # all replaced
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[0]["chunk"] == 32 and opt2.param_groups[0]["topk"] == 4
    for p in params2:
        assert opt2.state[p]["momentum"].dtype == torch.float32
    _train(params2, opt2, 3, 4)
    for a, b in zip(params, params2):
        assert torch.equal(a.detach(), b.detach())
    for a, b in zip(params, params2):
        assert torch.equal(opt.state[a]["momentum"], opt2.state[b]["momentum"])


@pytest.mark.parametrize("kwargs,option", [
    (dict(lr=-1.0), "lr"), (dict(lr=float("nan")), "lr"),
    (dict(momentum_decay=1.0), "momentum_decay"), (dict(momentum_decay=-0.1), "momentum_decay"),
    (dict(chunk=100), "chunk"), (dict(chunk=2048), "chunk"), (dict(chunk=1), "chunk"),
    (dict(topk=0), "topk"), (dict(topk=65), "topk"), (dict(topk=2.5), "topk"),
    (dict(weight_decay=-0.1), "weight_decay"), (dict(timeout_s=0), "timeout_s"),
])
def test_bad_options_are_refused_naming_them(kwargs, option):
    args = dict(lr=0.1)
    args.update(kwargs)
    with pytest.raises(gradcomp.ConfigError, match=r"gradcomp\.DeMo: %s " % option):
        gradcomp.DeMo([torch.nn.Parameter(torch.zeros(10))], **args)


def test_bad_parameters_and_state_are_refused():
    with pytest.raises(gradcomp.ConfigError, match="params must be float32"):
        gradcomp.DeMo([torch.nn.Parameter(torch.zeros(10, dtype=torch.float64))], lr=0.1)
    opt = gradcomp.DeMo([torch.nn.Parameter(torch.zeros(10))], lr=0.1)
    with pytest.raises(gradcomp.ConfigError, match="topk"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))], "topk": 100})
    assert len(opt.param_groups) == 1
    # a state of another shape, and a non-finite momentum: errors, nothing changed
    p = torch.nn.Parameter(torch.zeros(10))
    opt = gradcomp.DeMo([p], lr=0.1)
    p.grad = torch.ones(10)
    opt.step()
    sd = opt.state_dict()
    other = gradcomp.DeMo([torch.nn.Parameter(torch.zeros(12))], lr=0.1)
    with pytest.raises(gradcomp.FormatError, match="shape"):
        other.load_state_dict(sd)
    assert len(other.state) == 0
    before_p, before_m = p.detach().clone(), opt.state[p]["momentum"].clone()
    p.grad = torch.full((10,), float("inf"))
    with pytest.raises(gradcomp.NumericError):
        opt.step()
    assert torch.equal(p.detach(), before_p) and torch.equal(opt.state[p]["momentum"], before_m)
    assert opt.state[p]["step"] == 1


def _mismatch(rank, world):
    params = make_params(4)
    opt = gradcomp.DeMo(params, lr=0.1, chunk=64, topk=8)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in params]
    params[1].grad = None if rank == 1 else torch.ones_like(params[1])
    params[0].grad = torch.ones_like(params[0])
    try:
        opt.step()
    except gradcomp.ConfigError as e:
        message = str(e)
    else:
        message = ""
    unchanged = all(torch.equal(p.detach(), b) for p, b in zip(params, before))
    return message, unchanged, opt.state[params[0]]["step"]


def test_ranks_with_different_gradients_fail_alike_and_change_nothing():
    for message, unchanged, step in run_ranks(_mismatch, 2):
        assert "params with gradients differ between the ranks" in message
        assert unchanged and step == 1


def run_doc_example(name, tmp_path):
    """Runs docs/pytorch.md's `<!-- python-example: NAME -->` block as its comment says (the
    environment's torchrun, 2 processes); returns rank 0's line."""
    import os
    import re
    import subprocess
    import sys

    root = os.environ.get("GRADCOMP_SOURCE_DIR",
                          os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    text = open(os.path.join(root, "docs", "pytorch.md"), encoding="utf-8").read()
    m = re.search(r"<!-- python-example: %s -->\s*```python\n(.*?)```" % re.escape(name), text, re.S)
    assert m, "docs/pytorch.md has no %s example" % name
    code = m.group(1)
    assert "torchrun --standalone --nproc_per_node 2 this.py" in code
    script = tmp_path / (name + ".py")
    script.write_text(code)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    line = re.search(r"rank 0: loss (\S+), (\d+) bytes sent per step, (\d+)x", out.stdout)
    assert line, out.stdout + out.stderr
    return float(line.group(1)), int(line.group(2)), int(line.group(3))


def test_the_docs_example_runs(tmp_path):
    loss, sent, ratio = run_doc_example("demo", tmp_path)
    # the teacher's targets have variance |teacher|^2 (about 32): the model learned them
    assert loss < 3.0
    # Linear(32, 64) and Linear(64, 1): tensors of 2048, 64, 64 and 1 elements
    assert sent == sum(packet_bytes(n, 64, 8) for n in (2048, 64, 64, 1))
    assert ratio == round(4 * 2177 / sent)
