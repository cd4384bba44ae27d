# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The c10d communicator (include/gradcomp/comm/c10d.hpp) over a gloo process group, against
plain references: its all-reduce for every type and operation (native and the library's own
reduction), unequal all-gathers, and the library's compressed all-reduce across 2 and 4 ranks."""

import functools

import pytest
import torch
import torch.distributed as dist

import gradcomp
from ranks import run_cases, run_ranks


def values(rank, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(n, generator=g) * 10
    if dtype in (torch.int32, torch.int64, torch.uint8):
        x = x.abs() if dtype == torch.uint8 else x
        return x.to(dtype)
    x[3] = float("nan") if dtype.is_floating_point and rank == 0 else x[3]
    return x.to(dtype)


def _all_reduce(rank, world, dtype, op, n):
    comm = gradcomp.Communicator(dist.group.WORLD)
    x = values(rank, n, dtype)
    comm.all_reduce(x, op)
    return x


CASES = [(dt, op) for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                             torch.int32, torch.int64, torch.uint8)
         for op in ("sum", "max", "min")]


N_ALL_REDUCE = 1001  # not a multiple of the ranks: uneven shares


@functools.cache
def _all_reduce_results(world):
    # every case on one launch of the ranks; each test below checks its own
    return run_cases(_all_reduce, world, [(dt, op, N_ALL_REDUCE) for dt, op in CASES])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype,op", CASES, ids=lambda v: str(v))
def test_all_reduce_matches_reference(world, dtype, op):
    n = N_ALL_REDUCE
    results = _all_reduce_results(world)[CASES.index((dtype, op))]
    for r in results[1:]:
        assert torch.equal(r, results[0]) or (r.isnan() == results[0].isnan()).all()
    inputs = [values(r, n, dtype) for r in range(world)]
    if op == "sum":
        if dtype in (torch.float16, torch.bfloat16):
            # summed in float32 and rounded once per peer, in whatever order the ring takes:
            # each of the world - 1 roundings is within eps of a partial sum <= sum |x|
            eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
            ref = sum(x.float() for x in inputs)
            bound = (world - 1) * eps * sum(x.float().abs() for x in inputs)
            got = results[0].float()
            ok = (got - ref).abs() <= bound + 1e-3
            assert ok[~ref.isnan()].all() and got[3].isnan()
        elif dtype.is_floating_point:
            ref = sum(x.double() for x in inputs)
            got = results[0].double()
            assert torch.allclose(got[~ref.isnan()], ref[~ref.isnan()], rtol=1e-5, atol=1e-4) and got[3].isnan()
        else:
            assert torch.equal(results[0], sum(inputs).to(dtype))
    else:
        stack = torch.stack([x.double() for x in inputs])
        if dtype.is_floating_point:
            # the library's max/min: the non-NaN operand wins (fmax / fmin)
            ref = torch.stack([x.double() for x in inputs]).nan_to_num(nan=float("-inf") if op == "max" else float("inf"))
            ref = ref.max(0).values if op == "max" else ref.min(0).values
        else:
            ref = stack.max(0).values if op == "max" else stack.min(0).values
        assert torch.equal(results[0].double(), ref)


def _gather_v(rank, world):
    comm = gradcomp.Communicator(dist.group.WORLD)
    counts = [3 * r + (r % 2) * 7 for r in range(world)]  # unequal, one empty
    mine = torch.full((counts[rank],), rank + 1, dtype=torch.uint8)
    return comm.all_gather_v(mine, counts)


@pytest.mark.parametrize("world", [2, 4])
def test_all_gather_v_unequal_counts(world):
    results = run_ranks(_gather_v, world)
    counts = [3 * r + (r % 2) * 7 for r in range(world)]
    ref = torch.cat([torch.full((c,), r + 1, dtype=torch.uint8) for r, c in enumerate(counts)])
    for got in results:
        assert torch.equal(got, ref)


def _compressed(rank, world, spec):
    comm = gradcomp.Communicator(dist.group.WORLD)
    x = values(rank, 5000, torch.float32, seed=3).nan_to_num()
    comm.all_reduce_compressed(spec, x, 9)
    return x


SPECS = ["fp16", "topk:ratio=0.05", "randomk:ratio=0.05", "qsgd:levels=15"]


@functools.cache
def _compressed_results(world):
    return run_cases(_compressed, world, [(spec,) for spec in SPECS])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("spec", SPECS)
def test_compressed_all_reduce_over_the_process_group(world, spec):
    results = _compressed_results(world)[SPECS.index(spec)]
    for r in results[1:]:
        assert torch.equal(r, results[0])
    inputs = [values(r, 5000, torch.float32, seed=3).nan_to_num() for r in range(world)]
    codec = gradcomp.Codec(spec)
    if spec.startswith("topk"):
        # the sum of every rank's packet (gather: decoded in rank order)
        ref = torch.zeros(5000)
        for r, x in enumerate(inputs):
            codec.decompress_add(codec.compress(x, seed=9 + r), ref)
        assert torch.allclose(results[0], ref, rtol=1e-6, atol=1e-5)
    else:
        # within the codec's error of the exact sum. fp16: one rounding per value (2^-11) and
        # per peer. random-k (scaled by n/k for unbiasedness): variance (n/k - 1) |x|^2 per
        # rank, so a relative error near sqrt(19). QSGD with s = 15 levels in buckets of
        # d = 512: variance at most min(d / s^2, sqrt(d) / s) |x|^2 = 1.51 |x|^2 per rank.
        exact = sum(inputs)
        rel = float((results[0] - exact).norm() / exact.norm())
        assert rel < {"fp16": 1e-3, "randomk:ratio=0.05": 6.0, "qsgd:levels=15": 1.3}[spec]
