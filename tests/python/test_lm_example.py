# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
# examples/05_lm/train_lm.py --smoke (what scripts/demo runs): 4 gloo workers, a tiny byte-level
# transformer on the King James Bible, 40 steps of the rows ddp, topk, diloco and demo (those
# this gradcomp has). 49-98 s on the shared 2-core machine under load 13-18. Skipped, with the reason, where the corpus cannot be
# prepared (no `bible` program and no root to install Debian's bible-kjv).
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "05_lm"))
import corpus  # noqa: E402
import train_lm  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    try:
        data, _ = corpus.prepare()
    except SystemExit as e:
        pytest.skip("the corpus cannot be prepared here: %s" % e)
    out = tmp_path_factory.mktemp("lm")
    args = train_lm.parse_args(["--smoke", "--rows", "ddp,topk,diloco,demo", "--data", str(data),
                                "--out", str(out)])
    results, table, meta = train_lm.run(args)
    return {r["row"]: r for r in results}, {t["row"]: t for t in table}, meta, out


def test_rows_finish_with_finite_losses(smoke):
    results, _, meta, _ = smoke
    for name, r in results.items():
        assert not r["status"].startswith("failed"), (name, r["status"], r.get("traceback"))
        if r["status"].startswith("unavailable"):
            assert name in ("onebit_adam", "diloco", "streaming", "sparseloco", "demo")
            continue
        assert r["status"] == "ok", (name, r["status"])
        assert r["steps"] == meta["config"]["steps"]
        assert all(math.isfinite(x) for x in r["train_loss"])
        evals = r["evals"]
        # step 0 and every eval_every steps
        assert [e["step"] for e in evals] == list(range(0, meta["config"]["steps"] + 1,
                                                       meta["config"]["eval_every"]))
        assert all(math.isfinite(e["val_nats"]) for e in evals)
        assert all(e["val_bpc"] == pytest.approx(e["val_nats"] / math.log(2)) for e in evals)
        # the same tokens for every row
        assert evals[-1]["tokens"] == meta["config"]["steps"] * meta["tokens_per_step"]
        # bytes never go down
        sent = [e["bytes_sent"] for e in evals]
        assert sent == sorted(sent)


def test_ddp_learns(smoke):
    results, _, _, _ = smoke
    evals = results["ddp"]["evals"]
    # from about ln 256 = 5.55 nats (a uniform guess) to well below: the model learns the
    # byte statistics of English in 40 steps
    assert evals[0]["val_nats"] == pytest.approx(math.log(256), abs=0.3)
    assert evals[-1]["val_nats"] < evals[0]["val_nats"] - 1.0
    nats = [e["val_nats"] for e in evals]
    assert all(b < a for a, b in zip(nats, nats[1:])), nats


def test_ddp_bytes_are_the_formula(smoke):
    results, table, meta, _ = smoke
    params, steps, world = meta["params"], meta["config"]["steps"], meta["config"]["workers"]
    assert params == sum(p.numel() for p in train_lm.make_model(meta["config"]).parameters())
    r = results["ddp"]
    # counted bucket by bucket by the hook around DDP's all-reduce: 4 bytes per parameter per
    # step, and 2(W - 1)/W of that on the ring
    assert r["bytes_sent"] == 4 * params * steps
    assert r["wire_bytes"] == pytest.approx(4 * params * steps * 2 * (world - 1) / world)
    assert (r["bytes_sent"], r["wire_bytes"]) == pytest.approx(
        train_lm.ddp_formula_bytes(params, steps, world))
    assert table["ddp"]["fewer_bytes"] == 1.0
    assert table["ddp"]["gap_nats"] == 0.0


def test_topk_sends_fewer_bytes(smoke):
    results, table, _, _ = smoke
    if results["topk"]["status"] != "ok":
        pytest.skip("topk: %s" % results["topk"]["status"])
    # top-k 1 % of the large tensors in 8-byte entries, the small ones dense: far fewer bytes
    assert 5 < table["topk"]["fewer_bytes"] < 100
    assert math.isfinite(table["topk"]["gap_nats"])


def test_outputs_written(smoke):
    _, _, _, out = smoke
    for name in ("results.jsonl", "summary.csv", "evals.csv"):
        assert (out / name).stat().st_size > 0


def test_bad_rows_are_refused():
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--rows", "ddp,nosuch"])
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--steps", "0"])


def test_schedule():
    cfg = {"lr": 1e-3, "steps": 100, "warmup_frac": 0.05, "min_lr_frac": 0.1}
    assert train_lm.lr_at(cfg, 0) == pytest.approx(2e-4)
    assert train_lm.lr_at(cfg, 4) == pytest.approx(1e-3)
    assert train_lm.lr_at(cfg, 99) == pytest.approx(1e-4, rel=0.01)
    lrs = [train_lm.lr_at(cfg, s) for s in range(5, 100)]
    assert all(b <= a for a, b in zip(lrs, lrs[1:]))


def test_momentum_fold_schedule():
    f = train_lm.fold_factor
    # documented (docs/pytorch.md): (1 - beta^(t+1)) / (1 - beta): 1, 1.9, 2.71, ... -> 10
    assert f(0.9, 0, "documented") == pytest.approx(1.0)
    assert f(0.9, 1, "documented") == pytest.approx(1.9)
    assert f(0.9, 2, "documented") == pytest.approx(2.71)
    assert f(0.9, 500, "documented") == pytest.approx(10.0)
    # capped: the same ramp until it reaches the cap, then the cap
    assert f(0.9, 1, "capped", 3.0) == pytest.approx(1.9)
    assert f(0.9, 2, "capped", 3.0) == pytest.approx(2.71)
    assert f(0.9, 3, "capped", 3.0) == 3.0
    assert f(0.9, 500, "capped", 3.0) == 3.0
    ramp = [f(0.9, t, "capped", 3.0) for t in range(50)]
    assert all(b >= a for a, b in zip(ramp, ramp[1:]))
    # no fold, or no momentum to fold
    assert f(0.9, 7, "none") == 1.0
    assert f(0.0, 7, "documented") == 1.0
    with pytest.raises(ValueError, match="--momentum-fold"):
        f(0.9, 0, "nosuch")


def test_documented_fold_moves_as_far_as_momentum_for_a_constant_gradient():
    """The rule's premise: for a constant gradient, SGD with momentum 0 and the rate times the
    documented factor takes, step by step, the same steps as momentum SGD."""
    cfg = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0,
           "fold_cap": 3.0}
    g = torch.tensor([0.5, -2.0, 1.25])
    paths = {}
    for fold in ("none", "documented"):
        w = torch.nn.Parameter(torch.zeros(3))
        opt = train_lm.make_inner([w], dict(cfg, momentum_fold=fold))
        assert opt.param_groups[0]["momentum"] == (0.0 if fold != "none" else 0.9)
        row = object.__new__(train_lm.Row)
        row.cfg, row.opt, row.fold = dict(cfg, momentum_fold=fold), opt, fold
        path = []
        for t in range(20):
            row.set_lr(cfg["lr"], 1.0, t)
            w.grad = g.clone()
            opt.step()
            path.append(w.detach().clone())
        paths[fold] = torch.stack(path)
    torch.testing.assert_close(paths["documented"], paths["none"], rtol=1e-5, atol=1e-6)


def test_inner_optimizer_options():
    # the default is unchanged: AdamW, no fold
    args = train_lm.parse_args([])
    assert (args.optimizer, args.momentum_fold) == ("adamw", "none")
    cfg = train_lm.config(args)
    w = torch.nn.Parameter(torch.zeros(2))
    assert isinstance(train_lm.make_inner([w], cfg), torch.optim.AdamW)
    args = train_lm.parse_args(["--optimizer", "sgd", "--momentum", "0.8",
                                "--momentum-fold", "capped", "--fold-cap", "2.5"])
    cfg = train_lm.config(args)
    assert (cfg["optimizer"], cfg["momentum"], cfg["momentum_fold"], cfg["fold_cap"]) == (
        "sgd", 0.8, "capped", 2.5)
    opt = train_lm.make_inner([w], cfg)
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.0


@pytest.mark.parametrize("argv", [
    ["--momentum-fold", "documented"],                       # AdamW has its own momentum
    ["--optimizer", "sgd", "--momentum-fold", "nosuch"],
    ["--optimizer", "nosuch"],
    ["--optimizer", "sgd", "--momentum", "1.0"],
    ["--optimizer", "sgd", "--momentum", "-0.1"],
    ["--optimizer", "sgd", "--momentum-fold", "capped", "--fold-cap", "0.5"],
])
def test_inner_optimizer_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        train_lm.parse_args(argv)
    err = capsys.readouterr().err
    assert any(name in err for name in ("--momentum-fold", "--optimizer", "--momentum",
                                        "--fold-cap")), err


def _capture_lm():
    """bench/capture_lm.py as a module (loaded from its path: bench/ is not put on sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "capture_lm.py")
    spec = importlib.util.spec_from_file_location("capture_lm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_capture_lm_records_the_example_gradients(tmp_path):
    """bench/capture_lm.py (the language-model report of docs/bench.md): the capture directory
    holds every parameter of the example's model at the steps after the warm-up, and each file
    is, bit for bit, the gradient of that step of the same training done here by hand."""
    gradcomp = pytest.importorskip("gradcomp")
    np = pytest.importorskip("numpy")
    import torch
    import torch.nn.functional as F

    try:
        data, _ = corpus.prepare()
    except SystemExit as e:
        pytest.skip("the corpus cannot be prepared here: %s" % e)
    capture_lm = _capture_lm()
    assert gradcomp.capture is not None
    out = tmp_path / "grads"
    threads = torch.get_num_threads()
    try:
        capture_lm.main(["--out", str(out), "--warmup", "2", "--steps", "2", "--schedule-steps", "10",
                         "--workers", "2", "--batch", "2", "--seq", "16", "--d-model", "16",
                         "--layers", "1", "--heads", "2", "--data", str(data)])
        # the same run by hand: rank 0's batches of a 2-worker run, AdamW under the schedule
        cfg = dict(seed=1, workers=2, batch=2, seq=16, d_model=16, layers=1, heads=2, lr=1e-3,
                   weight_decay=0.1, warmup_frac=0.05, min_lr_frac=0.1, steps=10)
        tokens = train_lm.load_tokens(data / "train.bin")
        model = train_lm.make_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        expected = {}
        for step in range(4):
            for group in opt.param_groups:
                group["lr"] = train_lm.lr_at(cfg, step)
            x, y = train_lm.batch(tokens, cfg, step, 0)
            loss = F.cross_entropy(model(x).reshape(-1, train_lm.VOCAB), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step >= 2:
                expected[step - 2] = {n: p.grad.clone() for n, p in model.named_parameters()}
            opt.step()
    finally:
        torch.set_num_threads(threads)

    lines = (out / "index.tsv").read_text().splitlines()
    assert lines[:2] == ["# gradcomp capture v1", "step\tname\tfile"]
    rows = [line.split("\t") for line in lines[2:]]
    names = [n for n, _ in model.named_parameters()]
    for k in (0, 1):
        mine = {name: path for s, name, path in rows if int(s) == k}
        assert sorted(mine) == sorted(names)
        for name, path in mine.items():
            got = np.load(out / path)
            want = expected[k][name].numpy()
            assert got.dtype == np.float32 and got.shape == want.shape, name
            assert np.array_equal(got, want), (k, name)
    assert len(rows) == 2 * len(names)


def test_capture_lm_refuses_bad_options(tmp_path):
    pytest.importorskip("gradcomp")
    capture_lm = _capture_lm()
    for bad in (["--steps", "0"], ["--batch", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            capture_lm.main(["--out", str(tmp_path / "x")] + bad)
    assert not (tmp_path / "x").exists()
