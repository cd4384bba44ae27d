# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""A corrupted hook checkpoint is refused and changes nothing: every byte of a real
``GradcompState.state_dict()["engine"]`` (the "GCDH" state with the pipeline's "GCPL"
checkpoint inside: residuals, controller, PowerSGD sessions, two-way residuals), flipped in all
its bits and in its lowest bit, makes ``load_state_dict`` raise FormatError; afterwards the
state saves the same bytes as before and its next step matches a twin restored from the
intact checkpoint, bit for bit."""

import pytest
import torch

import gradcomp
from ranks import run_cases

N = 300

CASES = [
    # codec, feedback, controller, two_way, shape
    ("topk:ratio=0.1", "residual", "static:factor=5", False, None),
    ("onebit", "ef21", "", False, None),
    ("topk:ratio=0.1", "dgc", "", False, None),
    ("powersgd:rank=2", "residual", "", False, (20, 15)),
    ("fp16", "residual", "", True, None),
]


def _grad(rank, step):
    return torch.randn(N, generator=torch.Generator().manual_seed(5 + 17 * rank + 1000 * step))


def _step(state, rank, step, shape):
    buf = _grad(rank, step)
    views, shapes = ([], []) if shape is None else ([buf], [shape])
    return state._engine.submit(0, buf, views, shapes, [], True).wait().clone()


def _flip_every_byte(rank, world, codec, feedback, controller, two_way, shape):
    opts = dict(codec=codec, feedback=feedback, controller=controller, two_way=two_way,
                min_compress_elements=1, start_iter=0, measured_timing=False, seed=3)
    state = gradcomp.GradcompState(**opts)
    twin = gradcomp.GradcompState(**opts)
    for s in range(3):
        _step(state, rank, s, shape)
    saved = state.state_dict()
    blob = saved["engine"]
    assert isinstance(blob, bytes) and len(blob) > 64
    twin.load_state_dict(saved)
    refused = 0
    messages = set()
    for i in range(len(blob)):
        for mask in (0xFF, 0x01):
            bad = bytearray(blob)
            bad[i] ^= mask
            try:
                state.load_state_dict({"version": 1, "options": saved["options"], "engine": bytes(bad)})
            except gradcomp.FormatError as e:
                refused += 1
                messages.add(str(e).split(":")[1].strip() if ":" in str(e) else str(e))
    unchanged = state.state_dict()["engine"] == blob
    # the next step (collective: both ranks take it) agrees with the twin's
    same = torch.equal(_step(state, rank, 3, shape), _step(twin, rank, 3, shape))
    state.close()
    twin.close()
    return len(blob), refused, unchanged, same, sorted(messages)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c[:4]))
def test_every_flipped_byte_is_refused(case):
    results = _results()[CASES.index(case)]
    for size, refused, unchanged, same, messages in results:
        assert refused == 2 * size, messages
        assert unchanged
        assert same


_cache = {}


def _results():
    if "r" not in _cache:
        _cache["r"] = run_cases(_flip_every_byte, 2, CASES, timeout_s=900)
    return _cache["r"]
