# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
# examples/04_torch_ddp/train_ddp.py's momentum rule for top-k with error feedback
# (docs/training.md, "Momentum after a delay"): which rows fold SGD's momentum into the learning
# rate, and that the folded rate moves the weights as momentum SGD does on a constant gradient.
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "04_torch_ddp"))
import train_ddp  # noqa: E402


def test_folded_rate_is_heavy_balls_start():
    assert train_ddp.folded_lr(0.02, 0.9, 0) == pytest.approx(0.02)
    assert train_ddp.folded_lr(0.02, 0.9, 1) == pytest.approx(0.038)
    assert train_ddp.folded_lr(0.02, 0.9, 500) == pytest.approx(0.2)
    assert train_ddp.folded_lr(0.02, 0.0, 7) == 0.02
    # On a constant gradient, torch's momentum SGD and the folded rate without momentum move
    # the weights alike, step by step.
    a = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    b = torch.nn.Parameter(a.detach().clone())
    heavy = torch.optim.SGD([a], lr=0.02, momentum=0.9)
    plain = torch.optim.SGD([b], lr=0.02, momentum=0.0)
    g = torch.tensor([0.25, 0.5], dtype=torch.float64)
    for t in range(40):
        a.grad = g.clone()
        b.grad = g.clone()
        for group in plain.param_groups:
            group["lr"] = train_ddp.folded_lr(0.02, 0.9, t)
        heavy.step()
        plain.step()
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_which_rows_fold():
    cfg = {"momentum": 0.9, "momentum_fold": True, "custom": {"codec": "topk:ratio=0.1"}}
    folded = {n for n in train_ddp.ROWS if train_ddp.row_folds_momentum(n, cfg)}
    assert folded == {"gradcomp-topk-ef", "gradcomp-gravac", "gradcomp-accordion",
                      "gradcomp-ef-window", "reference-topk-ef", "gradcomp-custom"}
    for custom in ({"codec": "onebit"}, {"codec": "topk:ratio=0.1", "feedback": "none"},
                   {"codec": "fp16"}):
        assert not train_ddp.row_folds_momentum("gradcomp-custom",
                                                {"momentum": 0.9, "custom": custom})
    assert train_ddp.row_folds_momentum(
        "gradcomp-custom", {"momentum": 0.9, "custom": {"codec": "approx_topk:ratio=0.01"}})
    assert not train_ddp.row_folds_momentum("gradcomp-topk-ef",
                                            {"momentum": 0.9, "momentum_fold": False})
    assert not train_ddp.row_folds_momentum("gradcomp-topk-ef", {"momentum": 0.0})
    assert train_ddp.parse_args([]).momentum_fold
    assert not train_ddp.parse_args(["--no-momentum-fold"]).momentum_fold
