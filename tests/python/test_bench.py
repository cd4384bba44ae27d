# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp.capture and python -m gradcomp.bench: the capture hook leaves DDP training
bit-identical to DDP's own all-reduce and records exactly the local gradients; the module
hooks record exactly p.grad; the capture directory, .pt tensors and state dicts go through
gradcomp-bench with packet sizes equal to gradcomp.Codec's; bad torch files give one line and
exit status 2. The tests that run the program are skipped where it is not built."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.bench
from ranks import run_ranks


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(model, steps, rank):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        x, y = batch(rank, s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def read_index(d):
    with open(os.path.join(d, "index.tsv"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "# gradcomp capture v1"
    assert lines[1] == "step\tname\tfile"
    return [tuple(l.split("\t")) for l in lines[2:]]


def _capture_vs_default(rank, world, out):
    ref = DDP(make_model(), bucket_cap_mb=0.01)
    train(ref, 6, rank)
    mine = DDP(make_model(), bucket_cap_mb=0.01)
    cap = gradcomp.capture(mine, steps=2, every=3, out=out)
    train(mine, 6, rank)
    # the local gradient of step 0, computed without DDP (same initial parameters)
    plain = make_model()
    x, y = batch(rank, 0)
    nn.functional.cross_entropy(plain(x), y).backward()
    local = {n: p.grad.clone() for n, p in plain.named_parameters()}
    return torch.equal(params(ref), params(mine)), cap.step, cap.recorded, local


def test_capture_ddp_bit_identical_and_records_local_gradients(tmp_path):
    out = str(tmp_path / "cap")
    results = run_ranks(_capture_vs_default, 2, out)
    for same, step, recorded, _ in results:
        assert same  # training with the capture hook == DDP's own all-reduce, bit for bit
        assert step == 6
    assert results[0][2] == 2  # rank 0 wrote steps 0 and 3
    entries = read_index(out)
    names = [n for n, _ in make_model().named_parameters()]
    assert sorted({s for s, _, _ in entries}) == ["0", "3"]
    assert sorted(n for s, n, _ in entries if s == "0") == sorted(names)
    local = results[0][3]
    for s, n, f in entries:
        g = np.load(os.path.join(out, f))
        assert g.dtype == np.float32
        if s == "0":
            assert np.array_equal(g, local[n].numpy())  # rank 0's gradient before averaging


def test_capture_module_hooks_record_p_grad(tmp_path):
    model = make_model()
    ref = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    seen = {}
    with gradcomp.capture(model, steps=3, every=2, out=str(tmp_path)) as cap:
        for s in range(6):
            x, y = batch(0, s)
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                nn.functional.cross_entropy(m(x), y).backward()
            if s % 2 == 0:
                seen[s] = {n: p.grad.clone() for n, p in model.named_parameters()}
            opt.step()
            ref_opt.step()
    assert cap.step == 6 and cap.recorded == 3
    assert torch.equal(params(model), params(ref))
    entries = read_index(str(tmp_path))
    assert len(entries) == 3 * 4
    for s, n, f in entries:
        assert np.array_equal(np.load(os.path.join(str(tmp_path), f)), seen[int(s)][n].numpy())
    with pytest.raises(ValueError, match="steps"):
        gradcomp.capture(model, steps=0, out=str(tmp_path / "x"))


def _program():
    exe = gradcomp.bench.find_program()
    if exe is None:
        pytest.skip("gradcomp-bench is not built here (needs CLI11; GRADCOMP_BENCH_EXE names it)")
    return exe


def run_bench(args):
    env = dict(os.environ, GRADCOMP_BENCH_EXE=_program())
    return subprocess.run([sys.executable, "-m", "gradcomp.bench", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bench_reads_state_dicts_and_tensors(tmp_path):
    model = make_model()
    sd = model.state_dict()
    sd["step"] = torch.tensor(3)  # not floating: skipped
    sd["half"] = torch.randn(50).half()
    torch.save(sd, tmp_path / "sd.pt")
    torch.save(torch.randn(1000), tmp_path / "g.pt")
    r = run_bench([str(tmp_path / "sd.pt"), str(tmp_path / "g.pt"), "--codec", "topk:ratio=0.1", "--codec",
                   "qsgd:levels=7", "--no-timing", "-q", "--csv", str(tmp_path / "r.csv")])
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "r.csv")
    tensors = {n: t for n, t in sd.items() if t.is_floating_point()}
    tensors["g"] = torch.load(tmp_path / "g.pt")
    assert sorted({row["tensor"] for row in rows}) == sorted(tensors)
    assert len(rows) == 2 * len(tensors)
    for row in rows:
        t = tensors[row["tensor"]].float().reshape(-1)
        packet = gradcomp.Codec(row["codec"]).compress(t, seed=20261122, step=0)
        assert int(row["bytes"]) == packet.numel()
        assert int(row["n"]) == t.numel()
        y = gradcomp.Codec(row["codec"]).decompress(packet, torch.empty_like(t), seed=20261122, step=0)
        rel = float(torch.linalg.vector_norm((y - t).double()) / torch.linalg.vector_norm(t.double()))
        assert float(row["rel_l2"]) == pytest.approx(rel, rel=1e-5)


def test_bench_reads_a_capture(tmp_path):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with gradcomp.capture(model, steps=4, out=str(tmp_path / "cap")):
        for s in range(4):
            x, y = batch(0, s)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    r = run_bench([str(tmp_path / "cap"), "--codec", "topk:ratio=0.05", "--feedback", "residual", "--no-timing",
                   "--json", str(tmp_path / "r.json")])
    assert r.returncode == 0, r.stderr
    assert "ef_delay" in r.stdout
    import json

    doc = json.load(open(tmp_path / "r.json"))
    assert doc["tool"] == "gradcomp-bench"
    assert {row["tensor"] for row in doc["rows"]} == {n for n, _ in model.named_parameters()}
    assert all(row["ef_steps"] == 4 and row["ef_delay"] > 0 for row in doc["rows"])


@pytest.mark.parametrize("content, expect", [
    (b"not a torch file", "not a readable torch file"),
    ("list", "holds a list"),
    ("ints", "no non-empty floating-point tensor"),
])
def test_bench_bad_torch_files(tmp_path, content, expect):
    _program()
    path = tmp_path / "bad.pt"
    if content == "list":
        torch.save([torch.ones(3)], path)
    elif content == "ints":
        torch.save({"a": torch.arange(4)}, path)
    else:
        path.write_bytes(content)
    r = run_bench([str(path), "--no-timing"])
    assert r.returncode == 2
    assert r.stderr.startswith("gradcomp-bench: ") and expect in r.stderr
    assert r.stderr.count("\n") == 1
