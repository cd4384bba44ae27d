# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors (docs/pytorch.md, "CUDA tensors").

Without a GPU (this suite's usual machine): the CUDA part is compiled where torch is a CUDA build
and nvcc is on PATH (the build's GRADCOMP_PYTHON_CUDA=AUTO), and what the hook refuses (CUDA
buckets, a model on several devices) is refused before anything runs, checked with meta tensors
standing in for CUDA ones. The device codecs themselves are checked against the CPU codecs under
host emulation by the C++ test gradcomp_cuda_python_codec_test (tests/cuda/python_codec_host.cu).

With a GPU: `Codec(spec)` on CUDA tensors against the same codec on the CPU, byte for byte
(packets, decoded tensors, decompress_add), and its refusals; the DDP hook on CUDA buckets (its
packet path, gradcomp/packets.py) over NCCL and over gloo against the same path on CPU copies of
the buckets, bit for bit, and a CUDA model trained through it. These tests are skipped, with the
reason, where there is no GPU or the package has no CUDA part (the packet path itself runs on
CPU buckets in test_packet_path.py)."""

import shutil

import pytest
import torch

import gradcomp
from ranks import Bucket, run_ranks

needs_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and gradcomp.has_cuda),
    reason="needs a CUDA device and the package's CUDA part (torch.cuda.is_available() is %s, "
    "gradcomp.has_cuda is %s)" % (torch.cuda.is_available(), gradcomp.has_cuda))

# Every codec family the CUDA part carries, several with options.
SPECS = [
    "identity", "fp16", "bf16", "int8", "int8:bucket=100,rounding=stochastic", "onebit",
    "onebit:scaling=none", "qsgd:levels=15,bucket=256", "terngrad", "natural",
    "dithering:levels=3,partition=natural,norm=l2", "topk:ratio=0.1", "topk:k=7,values=f16",
    "threshold:value=0.5", "randomk:ratio=0.05", "randomk:k=9,scale=true", "int4",
    "int4:bucket=17", "chunk_topk:chunk=64,k=5", "chunk_topk:chunk=16,k=3,values=int2",
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_the_cuda_part_is_compiled_where_torch_and_nvcc_allow():
    if not torch.version.cuda or shutil.which("nvcc") is None:
        pytest.skip("torch is a CPU-only build or nvcc is not on PATH: the package is built "
                    "without its CUDA part here")
    assert gradcomp.has_cuda
    carried = [c.strip() for c in gradcomp.cuda_codecs.split(",")]
    assert {s.split(":")[0] for s in SPECS} <= set(carried)
    assert "powersgd" not in carried


def test_without_the_cuda_part_nothing_claims_it():
    if gradcomp.has_cuda:
        pytest.skip("this build has its CUDA part")
    assert gradcomp.cuda_codecs == ""


# ---------------------------------------------------------------------------------------------
# The codec API on a GPU

def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _input(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).to(dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("spec", SPECS)
def test_codec_on_cuda_writes_the_cpu_packets(spec, dtype):
    c = gradcomp.Codec(spec)
    for n, step in ((1, 0), (1000, 3), (70001, 5)):
        x = _input(n, dtype, n + step)
        kw = dict(seed=1234 + step, step=step, id=step + 2)
        ref = c.compress(x, **kw)
        got = c.compress(x.cuda(), **kw)
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), ref), (spec, n)
        dec_ref = c.decompress(ref, torch.full((n,), 7.0, dtype=dtype), seed=kw["seed"], step=step)
        dec_got = c.decompress(got, torch.full((n,), -7.0, dtype=dtype, device="cuda"),
                               seed=kw["seed"], step=step)
        assert torch.equal(_bits(dec_got.cpu()), _bits(dec_ref)), (spec, n)
        add_ref = c.decompress_add(ref, x.clone(), alpha=0.5, seed=kw["seed"], step=step)
        add_got = c.decompress_add(got, x.cuda(), alpha=0.5, seed=kw["seed"], step=step)
        assert torch.equal(_bits(add_got.cpu()), _bits(add_ref)), (spec, n)


@needs_gpu
def test_codec_on_cuda_uses_the_current_stream_and_out():
    c = gradcomp.Codec("topk:ratio=0.01")
    x = _input(1 << 16, torch.float32, 3).cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = x * 2  # enqueued on s: the codec must see it through the same stream
        out = torch.empty(c.max_compressed_bytes(y), dtype=torch.uint8, device="cuda")
        p = c.compress(y, out=out)
        assert p.data_ptr() == out.data_ptr()
        back = c.decompress(p, torch.empty_like(y))
    s.synchronize()
    assert torch.equal(p.cpu(), c.compress((x * 2).cpu()))
    assert torch.equal(back.cpu(), c.decompress(p.cpu(), torch.empty(1 << 16)))


@needs_gpu
def test_codec_on_cuda_refusals():
    x = torch.ones(64, device="cuda")
    with pytest.raises(gradcomp.ConfigError, match="PowerSGD compresses CPU tensors only"):
        gradcomp.Codec("powersgd:rank=2").compress(x.view(8, 8))
    with pytest.raises(gradcomp.ConfigError, match="approx_topk.*no CUDA implementation"):
        gradcomp.Codec("approx_topk:ratio=0.1").compress(x)
    c = gradcomp.Codec("fp16")
    p = c.compress(x)
    with pytest.raises(gradcomp.ConfigError, match="decode into a tensor on the packet's device"):
        c.decompress(p.cpu(), x.clone())
    with pytest.raises(gradcomp.ConfigError, match="decode into a tensor on the packet's device"):
        c.decompress(p, torch.ones(64))
    with pytest.raises(gradcomp.ConfigError, match="out must be a contiguous uint8 tensor on cuda"):
        c.compress(x, out=torch.empty(1000, dtype=torch.uint8))
    with pytest.raises(gradcomp.ConfigError, match="only Codec"):
        gradcomp.decompress(p, x.clone())
    with pytest.raises(gradcomp.FormatError):
        c.decompress(p[:-1], x.clone())
    with pytest.raises(gradcomp.NumericError):
        gradcomp.Codec("int8").compress(torch.tensor([1.0, float("nan")], device="cuda"))


# ---------------------------------------------------------------------------------------------
# The hook's device rules, on the CPU (meta tensors stand in for CUDA ones)


def _device_rules(rank, world):
    state = gradcomp.GradcompState(codec="topk:ratio=0.5", feedback="residual", start_iter=0)
    try:
        # A bucket on neither the CPU nor a CUDA device: refused before anything is queued.
        meta = torch.zeros(8, device="meta")
        with pytest.raises(gradcomp.ConfigError) as e:
            gradcomp.hook(state, Bucket(0, meta, [torch.nn.Parameter(meta)]))
        for word in ("takes CPU buckets", "CUDA buckets (the packet path", "this model is on meta"):
            assert word in str(e.value), (word, str(e.value))
        assert state.iteration == 0 and state._path is None

        # The C++ engine refuses one too (a caller that bypasses the hook).
        with pytest.raises(gradcomp.ConfigError, match="C\\+\\+ engine compresses CPU buckets; this bucket is on meta"):
            state._engine.submit(0, meta, [], [], [], True)

        # A bucket whose parameters sit on two devices.
        buf = torch.ones(8)
        with pytest.raises(gradcomp.ConfigError, match="parameters on cpu and meta"):
            gradcomp.hook(state, Bucket(0, buf, [torch.nn.Parameter(torch.zeros(4)),
                                                  torch.nn.Parameter(torch.zeros(4, device="meta"))]))

        # A model on two devices: a CPU bucket runs, then one on another device is refused.
        state2 = gradcomp.GradcompState(codec="topk:ratio=0.5", feedback="residual", start_iter=0)
        try:
            x = torch.arange(8, dtype=torch.float32)
            out = gradcomp.hook(state2, Bucket(0, x.clone(), [torch.nn.Parameter(torch.zeros(8))])).wait()
            assert out.shape == (8,)
            assert state2.iteration == 1
            with pytest.raises(gradcomp.ConfigError, match="several devices \\(cpu and meta\\)"):
                gradcomp.hook(state2, Bucket(1, meta, [torch.nn.Parameter(meta)]))
            assert state2.iteration == 1
            # and the state goes on with its CPU buckets
            gradcomp.hook(state2, Bucket(0, x.clone(), [torch.nn.Parameter(torch.zeros(8))])).wait()
            assert state2.iteration == 2
        finally:
            state2.close()
    finally:
        state.close()
    return True


def test_hook_refuses_buckets_off_the_cpu_and_models_on_several_devices():
    assert all(run_ranks(_device_rules, 1))


# ---------------------------------------------------------------------------------------------
# The DDP hook on CUDA buckets (the packet path), on a GPU

HOOK_CASES = [("topk:ratio=0.05", "residual"), ("fp16", "none"), ("randomk:ratio=0.05", "residual"),
              ("qsgd:levels=15,bucket=256", "residual"), ("threshold:value=1.5", "residual"),
              ("int8", "none")]


def _hook_buckets(rank, step, device):
    g = torch.Generator().manual_seed(5 + 31 * rank + 1000 * step)
    return [torch.randn(6100, generator=g).to(device), torch.randn(5000, generator=g).to(device)]


def _cuda_vs_cpu(rank, world, backend):
    """The hook on CUDA buckets over `backend` against packet_hook on CPU copies over gloo."""
    import torch.distributed as dist

    cuda_group = dist.new_group(backend=backend) if backend != "gloo" else None
    out = []
    for spec, feedback in HOOK_CASES:
        on_gpu = gradcomp.GradcompState(cuda_group, codec=spec, feedback=feedback, guard="off", seed=3)
        on_cpu = gradcomp.GradcompState(codec=spec, feedback=feedback, guard="off", seed=3)
        gpu_params = [[torch.nn.Parameter(torch.zeros(6000, device="cuda")),
                       torch.nn.Parameter(torch.zeros(100, device="cuda"))],
                      [torch.nn.Parameter(torch.zeros(5000, device="cuda"))]]
        cpu_params = [[torch.nn.Parameter(torch.zeros(6000)), torch.nn.Parameter(torch.zeros(100))],
                      [torch.nn.Parameter(torch.zeros(5000))]]
        same = True
        for step in range(3):
            bufs = _hook_buckets(rank, step, "cuda")
            futs = [gradcomp.hook(on_gpu, Bucket(b, bufs[b], gpu_params[b], last=b == 1)) for b in range(2)]
            cpu = [x.cpu() for x in _hook_buckets(rank, step, "cpu")]
            ref = [gradcomp.packet_hook(on_cpu, Bucket(b, cpu[b], cpu_params[b], last=b == 1)) for b in range(2)]
            for f, r in zip(futs, ref):
                got = f.wait()
                assert got.is_cuda
                same = same and torch.equal(_bits(got.cpu()), _bits(r.wait()))
        stats = on_gpu.last_stats
        out.append((spec, same, stats["bytes_sent"] == on_cpu.last_stats["bytes_sent"], on_gpu.iteration))
        on_gpu.close()
        on_cpu.close()
    return out


@needs_gpu
def test_hook_on_cuda_buckets_over_nccl_equals_the_packet_path_on_cpu():
    (rows,) = run_ranks(_cuda_vs_cpu, 1, "nccl")
    for spec, same, same_bytes, iterations in rows:
        assert same and same_bytes and iterations == 3, spec


@needs_gpu
def test_hook_on_cuda_buckets_over_gloo_two_processes_on_one_gpu():
    # two ranks share the GPU (NCCL takes one rank per GPU; gloo carries CUDA tensors)
    for rows in run_ranks(_cuda_vs_cpu, 2, "gloo"):
        for spec, same, same_bytes, iterations in rows:
            assert same and same_bytes and iterations == 3, spec


def _train_cuda(rank, world):
    import torch.distributed as dist

    group = dist.new_group(backend="nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], process_group=group)
    state = gradcomp.GradcompState(group, codec="topk:ratio=0.1", feedback="residual", guard="off")
    ddp.register_comm_hook(state, gradcomp.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 64, generator=g).cuda()
    y = (x[:, :10].argmax(1)).cuda()
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    stats = state.last_stats
    residual_devices = {str(r.device) for r in state._packets.residuals.values()}
    saved = state.state_dict()["packets"]  # the residuals come back as CPU tensors
    assert saved["iteration"] == 60 and all(r.device.type == "cpu" for r in saved["residuals"].values())
    iterations = state.iteration
    state.close()
    return losses[0], losses[-1], stats["compressed_tensors"], residual_devices, iterations


@needs_gpu
def test_a_cuda_model_trains_through_the_hook_over_nccl():
    ((first, last, compressed, devices, iterations),) = run_ranks(_train_cuda, 1)
    assert last < 0.5 * first
    assert compressed >= 1
    assert devices == {"cuda:0"}
    assert iterations == 60


def _cuda_refusals(rank, world):
    import torch.distributed as dist
    group = dist.new_group(backend="nccl")
    bucket = Bucket(0, torch.ones(5000, device="cuda"), [torch.nn.Parameter(torch.zeros(5000, device="cuda"))])
    messages = []
    for options in (dict(codec="topk:ratio=0.1"), dict(codec="approx_topk:ratio=0.1", guard="off"),
                    dict(codec="powersgd:rank=2", guard="off"), dict(two_way=True, guard="off")):
        state = gradcomp.GradcompState(group, **options)
        with pytest.raises(gradcomp.ConfigError) as e:
            gradcomp.hook(state, bucket)
        messages.append(str(e.value))
        state.close()
    return messages


@needs_gpu
def test_hook_on_cuda_buckets_refuses_what_the_packet_path_does_not_run():
    (messages,) = run_ranks(_cuda_refusals, 1)
    assert "guard='raise'" in messages[0]
    assert "on CUDA tensors the codecs are" in messages[1]
    assert "PowerSGD" in messages[2]
    assert "two_way=True" in messages[3]
