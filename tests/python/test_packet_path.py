# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The DDP hook's packet path (gradcomp/packets.py), the exchange it runs on CUDA buckets, run
here on CPU buckets over 2 and 3 gloo processes through ``gradcomp.packet_hook``: the same code,
the device aside (tests/python/test_cuda.py runs it on a GPU when one is there).

Checked: every rank's bucket after the exchange equals, bit for bit, a plain reference computed
here from every rank's gradients (compress each rank's g + residual with gradcomp.Codec, decode
every rank's packet in rank order into float32, multiply by 1/W; small tensors summed raw), with
error feedback over several steps, float32 and bfloat16 buckets, fixed- and variable-size
packets, per-rank and shared seeds; in a real DDP model, agreement with the C++ hook (bit for bit
where both compute the same sums) and with DDP's own all-reduce; a failure on one rank fails the
step on every rank and commits nothing; the options the packet path refuses, with ConfigError."""

import functools

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
from ranks import Bucket, run_cases, run_ranks

SIZES = ((6000, 100), (5000,))  # two buckets: a large and a small piece, then one large piece
MIN = 4096                       # min_compress_elements: the 100-element piece goes raw
STEPS = 3
SEED = 11


def grads(rank, step, dtype, nan=False):
    """This rank's gradient of every piece at `step`, bucket by bucket."""
    out = []
    for b, sizes in enumerate(SIZES):
        g = torch.Generator().manual_seed(7 + 31 * rank + 1000 * step + 100 * b)
        pieces = [torch.randn(n, generator=g) * (1 + b) for n in sizes]
        if nan and b == 0:
            pieces[0][17] = float("nan")
        out.append([p.to(dtype) for p in pieces])
    return out


def make_params():
    return [[nn.Parameter(torch.zeros(n)) for n in sizes] for sizes in SIZES]


def run_packet_steps(state, rank, steps, dtype, params, nan_at=None, first=0):
    """Feeds the buckets of steps first, ..., first + steps - 1 to packet_hook; returns the
    buckets after each step (or the error's type name and message for a step that failed)."""
    outs = []
    for s in range(first, first + steps):
        futures = []
        for b, pieces in enumerate(grads(rank, s, dtype, nan=(nan_at == (rank, s)))):
            buffer = torch.cat(pieces)
            futures.append(gradcomp.packet_hook(state, Bucket(b, buffer, params[b], b == len(SIZES) - 1)))
        try:
            outs.append([f.wait().clone() for f in futures])
        except gradcomp.Error as e:
            outs.append((type(e).__name__, str(e)))
    return outs


def reference(spec, feedback, world, steps, dtype, shared):
    """The plain reference: per step, every bucket as every rank ends with it."""
    codec = gradcomp.Codec(spec)
    residual = {}
    result = []
    for s in range(steps):
        per_rank = [grads(r, s, dtype) for r in range(world)]
        buckets = []
        key = 0
        for b, sizes in enumerate(SIZES):
            outs = []
            for i, n in enumerate(sizes):
                if n < MIN:
                    acc = per_rank[0][b][i].float().clone()
                    for r in range(1, world):
                        acc += per_rank[r][b][i].float()
                else:
                    acc = torch.zeros(n)
                    for r in range(world):
                        seed = SEED + (0 if shared else r)
                        x = per_rank[r][b][i].float() + residual.get((r, key), torch.zeros(n))
                        packet = codec.compress(x, seed=seed, step=s, id=key)
                        if feedback == "residual":
                            residual[(r, key)] = x - codec.decompress(packet, torch.empty(n), seed=seed, step=s)
                        codec.decompress_add(packet, acc, alpha=1.0, seed=seed, step=s)
                acc *= 1.0 / world
                outs.append(acc.to(dtype))
                key += 1
            buckets.append(torch.cat(outs))
        result.append(buckets)
    return result


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


CASES = [
    ("topk:ratio=0.05", "residual", torch.float32),
    ("topk:ratio=0.05", "none", torch.float32),
    ("topk:k=40,values=f16", "residual", torch.bfloat16),
    ("threshold:value=1.5", "residual", torch.float32),     # packet sizes differ by rank
    ("randomk:ratio=0.05", "residual", torch.float32),      # shared seed
    ("qsgd:levels=15,bucket=256", "none", torch.float32),  # stochastic: seed + rank
    ("int8", "residual", torch.bfloat16),
    ("fp16", "residual", torch.float32),
    ("onebit", "residual", torch.float32),
    ("identity", "residual", torch.float32),
]


def _case(rank, world, spec, feedback, dtype):
    state = gradcomp.GradcompState(codec=spec, feedback=feedback, guard="off", seed=SEED,
                                   min_compress_elements=MIN)
    try:
        outs = run_packet_steps(state, rank, STEPS, dtype, make_params())
        return outs, state.last_stats, state.totals, state.iteration
    finally:
        state.close()


@functools.cache
def _results(world):
    return run_cases(_case, world, CASES)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("spec,feedback,dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_packet_path_equals_the_plain_reference(world, spec, feedback, dtype):
    results = _results(world)[CASES.index((spec, feedback, dtype))]
    shared = gradcomp.Codec(spec).aggregation == "shared support"
    ref = reference(spec, feedback, world, STEPS, dtype, shared)
    for rank, (outs, stats, totals, iteration) in enumerate(results):
        assert iteration == STEPS and totals["iterations"] == STEPS
        for s in range(STEPS):
            for b in range(len(SIZES)):
                assert torch.equal(_bits(outs[s][b]), _bits(ref[s][b])), (rank, s, b)
        assert stats["messages"] == len(SIZES)
        assert stats["tensors"] == 3 and stats["compressed_tensors"] == 2
        assert stats["step"] == STEPS - 1


@pytest.mark.parametrize("world", [2, 3])
def test_packet_path_bytes(world):
    # bytes_sent: this rank's packets (their real sizes) and the raw small piece; wire_bytes:
    # what a ring all-gather of the padded messages sends
    spec, feedback, dtype = "threshold:value=1.5", "residual", torch.float32
    results = _results(world)[CASES.index((spec, feedback, dtype))]
    codec = gradcomp.Codec(spec)
    residual = {}
    for rank, (_, stats, totals, _) in enumerate(results):
        # the last step's packets of this rank, recomputed
        sent = 100 * 4
        key = 0
        for s in range(STEPS):
            sent = 100 * 4
            key = 0
            for b, pieces in enumerate(grads(rank, s, dtype)):
                for p in pieces:
                    if p.numel() >= MIN:
                        x = p + residual.get(key, torch.zeros(p.numel()))
                        packet = codec.compress(x, seed=SEED + rank, step=s, id=key)
                        residual[key] = x - codec.decompress(packet, torch.empty(p.numel()), seed=SEED + rank, step=s)
                        sent += packet.numel()
                    key += 1
        residual.clear()
        assert stats["bytes_sent"] == sent
        assert stats["wire_bytes"] > 0 and stats["wire_bytes"] % (world - 1) == 0
        assert stats["factor"] == pytest.approx((6000 + 100 + 5000) * 4 / sent)
        assert totals["bytes_sent"] >= sent


# ---------------------------------------------------------------------------------------------
# A failure on one rank fails every rank's step and commits nothing

def _failure(rank, world):
    state = gradcomp.GradcompState(codec="int8", feedback="residual", guard="off", seed=SEED,
                                   min_compress_elements=MIN)
    try:
        params = make_params()
        first = run_packet_steps(state, rank, 1, torch.float32, params)
        before = {k: v.clone() for k, v in state._packets.residuals.items()}
        # step 1: rank 1's gradient has a NaN (int8 refuses non-finite input)
        outs = []
        for b, pieces in enumerate(grads(rank, 1, torch.float32, nan=(rank == 1))):
            outs.append(gradcomp.packet_hook(state, Bucket(b, torch.cat(pieces), params[b], b == 1)))
        errors = []
        for f in outs:
            try:
                f.wait()
                errors.append(None)
            except gradcomp.Error as e:
                errors.append((type(e).__name__, str(e)))
        after = state._packets.residuals
        # bucket 0's residual (key 0; key 1 is the raw small piece) is as before the step;
        # bucket 1 (key 2) went through on every rank and committed its own
        unchanged = (sorted(before) == sorted(after) == [0, 2] and torch.equal(before[0], after[0])
                     and not torch.equal(before[2], after[2]))
        # and the state goes on
        again = run_packet_steps(state, rank, 1, torch.float32, params)
        return first, errors, unchanged, again, state.iteration
    finally:
        state.close()


def test_a_failure_on_one_rank_fails_the_step_on_every_rank():
    for rank, (first, errors, unchanged, again, iteration) in enumerate(run_ranks(_failure, 2)):
        assert isinstance(first[0], list)
        kind, message = errors[0]  # bucket 0 held the NaN
        assert kind == "NumericError", message
        if rank == 1:
            assert "on rank 1" in message
        else:
            assert "failed on rank(s) 1" in message
        assert errors[1] is None  # bucket 1 of that step was fine everywhere
        assert unchanged
        assert isinstance(again[0], list) and torch.isfinite(again[0][0]).all()
        assert iteration == 3


# ---------------------------------------------------------------------------------------------
# Checkpoints: a resumed run continues bit for bit

def _resume(rank, world, spec):
    import io
    import pickle

    options = dict(codec=spec, feedback="residual", guard="off", seed=SEED, min_compress_elements=MIN)
    straight = gradcomp.GradcompState(**options)
    expected = run_packet_steps(straight, rank, 4, torch.float32, make_params())
    straight.close()

    first = gradcomp.GradcompState(**options)
    run_packet_steps(first, rank, 2, torch.float32, make_params())
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    pickled = pickle.dumps(first)
    first.close()

    outs = {}
    for how in ("state_dict", "pickle"):
        if how == "state_dict":
            resumed = gradcomp.GradcompState(**options)
            saved = torch.load(io.BytesIO(buf.getvalue()))
            # a malformed one changes nothing
            broken = dict(saved, packets=dict(saved["packets"], residuals={0: torch.zeros(3, dtype=torch.float64)}))
            with pytest.raises(gradcomp.FormatError, match="not a 1-D float32 tensor"):
                resumed.load_state_dict(broken)
            with pytest.raises(gradcomp.FormatError, match="saved with options"):
                resumed.load_state_dict(dict(saved, options=dict(saved["options"], seed=SEED + 1)))
            assert resumed.iteration == 0
            resumed.load_state_dict(saved)
        else:
            resumed = pickle.loads(pickled)
        assert resumed.iteration == 2
        outs[how] = run_packet_steps(resumed, rank, 2, torch.float32, make_params(), first=2)
        assert resumed.iteration == 4
        resumed.close()
    return expected[2:], outs


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "qsgd:levels=15,bucket=256"])
def test_packet_path_resumes_bit_for_bit(spec):
    for expected, outs in run_ranks(_resume, 2, spec):
        for how, got in outs.items():
            for s in range(2):
                for b in range(len(SIZES)):
                    assert torch.equal(got[s][b], expected[s][b]), (how, s, b)


# ---------------------------------------------------------------------------------------------
# What the packet path refuses

def _refusals(rank, world):
    bucket = Bucket(0, torch.ones(5000), [nn.Parameter(torch.zeros(5000))], True)
    refused = {}
    for options in (dict(codec="topk:ratio=0.01"),  # guard "raise" by default
                    dict(controller="static:factor=10", guard="off"),
                    dict(two_way=True, guard="off"),
                    dict(measure_gain=True, guard="off"),
                    dict(codec="powersgd:rank=2", guard="off"),
                    dict(feedback="ef21", guard="off"),
                    dict(feedback="dgc", guard="off")):
        state = gradcomp.GradcompState(**options)
        try:
            with pytest.raises(gradcomp.ConfigError) as e:
                gradcomp.packet_hook(state, bucket)
            # nothing taken: the state has no path, no device, no iteration
            assert state._path is None and state._device is None and state.iteration == 0
            refused[tuple(sorted(options))] = str(e.value)
        finally:
            state.close()
    # a checkpoint of the C++ engine is not silently dropped by the packet path
    engine_state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    gradcomp.hook(engine_state, Bucket(0, torch.ones(5000), bucket.parameters(), True)).wait()
    saved = engine_state.state_dict()
    engine_state.close()
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    try:
        state.load_state_dict(saved)
        with pytest.raises(gradcomp.ConfigError, match="C\\+\\+ engine's state of 1 iterations"):
            gradcomp.packet_hook(state, bucket)
        assert state._path is None
    finally:
        state.close()
    # a packet-path checkpoint is not taken by the C++ engine either
    packets_saved = None
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    try:
        gradcomp.packet_hook(state, Bucket(0, torch.ones(5000), bucket.parameters(), True)).wait()
        packets_saved = state.state_dict()
    finally:
        state.close()
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    try:
        state.load_state_dict(packets_saved)
        with pytest.raises(gradcomp.ConfigError, match="packet-path state_dict"):
            gradcomp.hook(state, bucket)
        assert state._path is None and state.iteration == 1
    finally:
        state.close()
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    try:
        gradcomp.hook(state, Bucket(0, torch.ones(5000), bucket.parameters(), True)).wait()
        with pytest.raises(gradcomp.ConfigError, match="is the packet path's"):
            state.load_state_dict(packets_saved)
    finally:
        state.close()
    # a state takes one path
    state = gradcomp.GradcompState(codec="topk:ratio=0.01", guard="off")
    try:
        gradcomp.packet_hook(state, Bucket(0, torch.ones(5000), bucket.parameters(), True)).wait()
        with pytest.raises(gradcomp.ConfigError, match="one state takes one path"):
            gradcomp.hook(state, Bucket(0, torch.ones(5000), bucket.parameters(), True))
        # checkpoints of the other path are refused
        with pytest.raises(gradcomp.ConfigError, match="is the C\\+\\+ engine's"):
            state.load_state_dict(saved)
        assert "packets" in state.state_dict() and state.iteration == 1
        state.report_loss(1.0)  # no guard on the packet path: accepted, nothing to do
        state.wait()
    finally:
        state.close()
    return refused


def test_packet_path_refusals_name_what_it_does_not_run():
    (refused,) = run_ranks(_refusals, 1)
    expect = {
        ("codec",): "guard='raise'",
        ("controller", "guard"): "controller='static:factor=10'",
        ("guard", "two_way"): "two_way=True",
        ("guard", "measure_gain"): "measure_gain=True",
        ("codec", "guard"): "PowerSGD runs in the C++ pipeline only",
        ("feedback", "guard"): "feedback=",
    }
    for key, message in refused.items():
        assert "packet path" in message and "it does not run" in message, message
        assert expect[key] in message, (key, message)


# ---------------------------------------------------------------------------------------------
# In a DDP model: the C++ hook and DDP's own all-reduce

def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def train(model, steps, rank):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 * s + rank)
        x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _in_ddp(rank, world, spec, feedback):
    out = {}
    for name, hook in (("engine", gradcomp.hook), ("packets", gradcomp.packet_hook), ("ddp", None)):
        model = DDP(make_model(), bucket_cap_mb=0.05)
        state = None
        if hook is not None:
            state = gradcomp.GradcompState(codec=spec, feedback=feedback, guard="off", seed=SEED)
            model.register_comm_hook(state, hook)
        train(model, 5, rank)
        out[name] = params(model)
        if state is not None:
            out[name + "_iterations"] = state.iteration
            state.close()
    return out


DDP_CASES = [("topk:ratio=0.05", "residual"), ("identity", "none"), ("fp16", "none")]


@functools.cache
def _ddp_results():
    return run_cases(_in_ddp, 2, DDP_CASES)


@pytest.mark.parametrize("spec,feedback", DDP_CASES)
def test_packet_hook_in_ddp_against_the_cpp_hook(spec, feedback):
    for out in _ddp_results()[DDP_CASES.index((spec, feedback))]:
        assert out["packets_iterations"] == 5 and out["engine_iterations"] == 5
        if spec == "fp16":
            # the C++ pipeline sums the f16 packets in the compressed domain (summable), the
            # packet path decodes each rank's: the same up to f16 roundings of the sums
            assert torch.allclose(out["packets"], out["engine"], rtol=1e-3, atol=1e-4)
        else:
            # top-k with error feedback: both decode every rank's packet in rank order into
            # float32 and halve the sum, the small tensors summed raw; identity without
            # feedback is DDP's all-reduce on both
            assert torch.equal(out["packets"], out["engine"])
        if spec == "identity":
            assert torch.equal(out["packets"], out["ddp"])


# ---------------------------------------------------------------------------------------------
# bench/torch_cuda_hooks.py (the GPU benchmark of the hooks) runs its rows in --smoke mode

def test_cuda_hook_benchmark_smoke_runs_every_row_on_the_cpu():
    import os
    import subprocess
    import sys

    from ranks import free_port

    root = os.environ.get("GRADCOMP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.join(root, "bench", "torch_cuda_hooks.py"), "--smoke"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines() if "ms/step" in line]
    assert rows == ["ddp_allreduce", "torch_fp16", "torch_powersgd_r4", "gradcomp_fp16", "gradcomp_topk"], out.stdout
    assert "target" not in out.stdout  # no figures from a smoke run
