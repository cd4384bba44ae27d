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
    # torch's own ops by default: half, bfloat16, sign and topk at the run's ratio, per tensor
    torch_rows = [row for row in rows if row["codec"].startswith("torch.")]
    assert sorted({row["codec"] for row in torch_rows}) == ["torch.bfloat16", "torch.half", "torch.sign",
                                                            "torch.topk:ratio=0.1"]
    rows = [row for row in rows if not row["codec"].startswith("torch.")]
    assert len(torch_rows) == 4 * len(tensors)
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


# ---------------------------------------------------------------------------------------------
# torch's own ops in the same run (--torch), --device cuda, controllers through Python


def _direct_torch(op, x):
    """What a user sends for torch op ``op`` on float32 ``x``, computed here: (bytes, decoded)."""
    n = x.numel()
    if op == "torch.half":
        return 2 * n, x.half().float()
    if op == "torch.bfloat16":
        return 2 * n, x.bfloat16().float()
    if op == "torch.sign":
        scale = x.abs().mean()
        return n + 4, torch.sign(x) * scale
    ratio = float(op.split("ratio=")[1])
    k = max(1, int(ratio * n))
    idx = torch.topk(x.abs(), k).indices
    d = torch.zeros_like(x)
    d[idx] = x[idx]
    return 12 * k, d


def _rel_cos(x, d):
    x, d = x.double(), d.double()
    return float((d - x).norm() / x.norm()), float(x.dot(d) / (x.norm() * d.norm()))


def test_bench_torch_rows_equal_direct_computation(tmp_path):
    _program()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(30000, generator=g) * (torch.rand(30000, generator=g) < 0.4)  # 60 % zeros
    np.save(tmp_path / "g.npy", x.numpy())
    r = run_bench([str(tmp_path / "g.npy"), "--codec", "topk:ratio=0.01", "--codec", "topk:ratio=0.001",
                   "--codec", "fp16", "--no-timing", "-q", "--csv", str(tmp_path / "r.csv")])
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "r.csv")
    codecs = [row["codec"] for row in rows]
    # the codecs' rows, then torch's: half, bfloat16, sign, topk at each ratio of the run
    assert codecs == ["topk:ratio=0.01", "topk:ratio=0.001", "fp16", "torch.half", "torch.bfloat16", "torch.sign",
                      "torch.topk:ratio=0.01", "torch.topk:ratio=0.001"]
    for row in rows[3:]:
        nbytes, d = _direct_torch(row["codec"], x)
        assert int(row["bytes"]) == nbytes, row["codec"]
        assert int(row["n"]) == x.numel()
        assert float(row["smaller"]) == pytest.approx(4 * x.numel() / nbytes, rel=1e-5)
        rel, cos = _rel_cos(x, d)
        assert float(row["rel_l2"]) == pytest.approx(rel, rel=1e-5, abs=1e-12), row["codec"]
        assert float(row["cosine"]) == pytest.approx(cos, rel=1e-5), row["codec"]
        assert row["unbiased"] == "0" and row["bias"] == ""
    # torch's topk at 1 % keeps the same values as gradcomp's topk: the same error (ties aside)
    assert float(rows[6]["rel_l2"]) == pytest.approx(float(rows[0]["rel_l2"]), rel=1e-4)


def test_bench_torch_rows_feedback_and_speed(tmp_path):
    _program()
    steps = [torch.randn(5000, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    # a capture directory of one tensor over 4 steps
    os.makedirs(tmp_path / "cap")
    with open(tmp_path / "cap" / "index.tsv", "w") as f:
        f.write("# gradcomp capture v1\nstep\tname\tfile\n")
        for k, s in enumerate(steps):
            np.save(tmp_path / "cap" / f"s{k}.npy", s.numpy())
            f.write(f"{k}\tw\ts{k}.npy\n")
    r = run_bench([str(tmp_path / "cap"), "--codec", "fp16", "--torch", "sign,topk:ratio=0.05", "--feedback",
                   "residual", "--threads", "1,2", "--min-time", "0.002", "-q", "--csv", str(tmp_path / "r.csv"),
                   "--json", str(tmp_path / "r.json")])
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "r.csv")
    assert [(row["codec"], row["threads"]) for row in rows] == [
        ("fp16", "1"), ("fp16", "2"), ("torch.sign", "1"), ("torch.sign", "2"),
        ("torch.topk:ratio=0.05", "1"), ("torch.topk:ratio=0.05", "2")]
    for row in rows[2:]:
        for k in ("compress_gbps", "decompress_gbps", "decompress_add_gbps", "read_gbps", "compress_ratio",
                  "decompress_ratio", "decompress_add_ratio"):
            assert float(row[k]) > 0, (row["codec"], k)
        # error feedback as the program measures it: p = g + e, d = D(C(p)), e = p - d
        e = torch.zeros(5000)
        res = sent = 0.0
        for g in steps:
            p = e + g
            _, d = _direct_torch(row["codec"], p)
            e = p - d
            res += float(e.double().dot(e.double()))
            sent += float(d.double().dot(d.double()))
        assert int(row["ef_steps"]) == 4
        assert float(row["ef_delay"]) == pytest.approx(res / sent, rel=1e-5)
        assert float(row["ef_residual"]) == pytest.approx(float(e.norm() / steps[-1].norm()), rel=1e-5)
    import json

    doc = json.load(open(tmp_path / "r.json"))
    assert [row["codec"] for row in doc["rows"]] == ["fp16", "torch.sign", "torch.topk:ratio=0.05"]


def test_bench_torch_options(tmp_path):
    _program()
    np.save(tmp_path / "g.npy", np.linspace(-1, 1, 1000, dtype=np.float32))
    r = run_bench([str(tmp_path / "g.npy"), "--codec", "fp16", "--no-torch", "--no-timing", "-q", "--csv",
                   str(tmp_path / "r.csv")])
    assert r.returncode == 0, r.stderr
    assert [row["codec"] for row in read_csv(tmp_path / "r.csv")] == ["fp16"]
    for args, expect in ((["--torch", "cube"], "--torch 'cube' is not one of torch's ops"),
                         (["--torch", "topk:ratio=2"], "topk takes ratio=R"),
                         (["--device", "tpu"], "--device 'tpu' is not a device"),
                         (["--codec", "zstd"], "--codec 'zstd'")):
        r = run_bench([str(tmp_path / "g.npy"), "--no-timing", *args])
        assert r.returncode == 2, args
        assert r.stderr.startswith("gradcomp-bench: ") and expect in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1


def test_bench_device_cuda_without_gpu(tmp_path):
    _program()
    np.save(tmp_path / "g.npy", np.linspace(-1, 1, 1000, dtype=np.float32))
    if torch.cuda.is_available() and gradcomp.has_cuda:
        pytest.skip("a CUDA device is here: test_bench_device_cuda runs instead")
    r = run_bench([str(tmp_path / "g.npy"), "--device", "cuda", "--codec", "fp16"])
    assert r.returncode == 2
    assert r.stderr.startswith("gradcomp-bench: --device cuda: ") and r.stderr.count("\n") == 1


def test_bench_device_cuda(tmp_path):
    _program()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the GPU part of --device cuda is not tested")
    if not gradcomp.has_cuda:
        pytest.skip("the package has no CUDA part: the GPU part of --device cuda is not tested")
    x = torch.randn(50000)
    np.save(tmp_path / "g.npy", x.numpy())
    r = run_bench([str(tmp_path / "g.npy"), "--device", "cuda", "--codec", "fp16", "--codec", "topk:ratio=0.01",
                   "--codec", "approx_topk:ratio=0.01", "--min-time", "0.01", "-q", "--csv", str(tmp_path / "r.csv")])
    assert r.returncode == 0, r.stderr
    assert "approx_topk" in r.stderr  # not carried on CUDA: named and left out
    rows = read_csv(tmp_path / "r.csv")
    assert [row["codec"] for row in rows] == ["fp16 @cuda", "topk:ratio=0.01 @cuda", "torch.half @cuda",
                                             "torch.bfloat16 @cuda", "torch.sign @cuda",
                                             "torch.topk:ratio=0.01 @cuda"]
    for row in rows[:2]:
        spec = row["codec"].split(" @")[0]
        packet = gradcomp.Codec(spec).compress(x, seed=20261122, step=0)
        assert int(row["bytes"]) == packet.numel()  # the CUDA packet is the CPU packet, byte for byte
    for row in rows[2:]:
        nbytes, d = _direct_torch(row["codec"].split(" @")[0], x)
        assert int(row["bytes"]) == nbytes
        assert float(row["rel_l2"]) == pytest.approx(_rel_cos(x, d)[0], rel=1e-4, abs=1e-12)
    assert all(float(row["compress_gbps"]) > 0 for row in rows)


def test_bench_controller_from_python(tmp_path):
    _program()
    np.save(tmp_path / "g.npy", torch.randn(8000, generator=torch.Generator().manual_seed(3)).numpy())
    r = run_bench([str(tmp_path / "g.npy"), "--controller", "schedule:0=10,2=100,4=1", "--steps", "6", "-q",
                   "--csv", str(tmp_path / "c.csv")])
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "c.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # the schedule, step by step (tools/tests/test_bench_tool.cpp checks other controllers and
    # the bytes against the controller driven directly)
    assert [row["step"] for row in rows] == [str(k) for k in range(6)]
    assert [row["factor"] for row in rows] == ["10", "10", "100", "100", "1", "1"]
    assert [row["sent"] for row in rows] == ["minimum"] * 4 + ["dense"] * 2
    assert [row["codec"] for row in rows] == ["topk:ratio=0.1"] * 2 + ["topk:ratio=0.01"] * 2 + ["dense"] * 2
    assert [row["bytes"] for row in rows[4:]] == [str(4 * 8000)] * 2
    assert all(int(row["dense_bytes"]) == 4 * 8000 for row in rows)


def test_bench_gradcomp_coder_on_cpu_equals_program(tmp_path):
    """The coder that --device cuda measures the codecs with (gradcomp.Codec through
    gradcomp.bench.measure_rows), run here on CPU tensors: its bytes, error and error feedback
    equal the program's rows for the same codecs and steps, and it is timed."""
    _program()
    steps = [np.random.default_rng(k).laplace(size=6000).astype(np.float32) for k in range(3)]
    os.makedirs(tmp_path / "cap")
    with open(tmp_path / "cap" / "index.tsv", "w") as f:
        f.write("# gradcomp capture v1\nstep\tname\tfile\n")
        for k, s in enumerate(steps):
            np.save(tmp_path / "cap" / f"s{k}.npy", s)
            f.write(f"{k}\tw\ts{k}.npy\n")
    specs = ["fp16", "topk:ratio=0.02", "qsgd:levels=7,bucket=512"]
    args = [str(tmp_path / "cap"), "--feedback", "residual", "--no-timing", "--no-torch", "-q", "--csv",
            str(tmp_path / "r.csv")]
    for s in specs:
        args += ["--codec", s]
    r = run_bench(args)
    assert r.returncode == 0, r.stderr
    program_rows = read_csv(tmp_path / "r.csv")
    settings = {"feedback": "1", "timing": "1", "min_time": "0.001", "threads": "1"}
    coders = [gradcomp.bench.GradcompCodec(s, "cpu") for s in specs]
    lines = gradcomp.bench.measure_rows(coders, [("w", steps)], settings, "cpu")
    assert len(lines) == len(specs)
    for line, want in zip(lines, program_rows):
        row = dict(zip(gradcomp.bench.CSV_HEADER, line))
        assert row["codec"] == want["codec"] + " @cpu"
        assert row["bytes"] == want["bytes"] and row["n"] == want["n"]
        for k in ("rel_l2", "cosine", "ef_residual", "ef_delay"):
            assert float(row[k]) == pytest.approx(float(want[k]), rel=2e-5), (row["codec"], k)
        assert row["threads"] == "1" and float(row["compress_gbps"]) > 0 and float(row["decompress_add_ratio"]) > 0
