# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The Python codec API: every codec and dtype round-trips, zero-copy where promised, and bad
input raises gradcomp's errors with the library's messages."""

import pytest
import torch

import gradcomp

CODECS = [
    "identity", "fp16", "bf16", "int8", "onebit", "qsgd:levels=15", "terngrad", "natural",
    "dithering", "topk:ratio=0.05", "threshold:value=0.5", "randomk:ratio=0.05",
    "approx_topk:ratio=0.05", "powersgd:rank=2",
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def sample(dtype, shape=(96, 64), seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("spec", CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_codec_and_dtype(spec, dtype):
    codec = gradcomp.Codec(spec)
    x = sample(dtype)
    packet = codec.compress(x, seed=7, step=3)
    assert packet.dtype == torch.uint8 and packet.dim() == 1
    assert packet.numel() <= codec.max_compressed_bytes(x)
    header = gradcomp.inspect(packet)
    assert header["packet_bytes"] == packet.numel()
    assert header["count"] == x.numel()

    # the codec's decoder and the stateless one agree exactly
    y = codec.decompress(packet, torch.empty_like(x), seed=7, step=3)
    z = gradcomp.decompress(packet, torch.zeros_like(x), seed=7, step=3)
    assert torch.equal(y, z)
    # decompress_add adds alpha times the decoded tensor (exact in float32 from zero)
    if dtype == torch.float32:
        w = codec.decompress_add(packet, torch.zeros_like(x), alpha=2.0, seed=7, step=3)
        assert torch.equal(w, 2.0 * y)
        base = torch.ones_like(x)
        codec.decompress_add(packet, base, seed=7, step=3)
        assert torch.allclose(base, 1.0 + y, rtol=0, atol=1e-6)
    # a stateless codec is a function of its input and seed: byte-identical packets
    if not spec.startswith("powersgd"):
        again = gradcomp.Codec(spec).compress(x, seed=7, step=3)
        assert torch.equal(packet, again)

    xf = x.float()
    yf = y.float()
    if spec == "identity":
        assert torch.equal(y, x)
    elif spec in ("fp16", "bf16"):
        # one rounding of a value already of the input's type (rel. error of the narrower type)
        eps = 2.0 ** -11 if spec == "fp16" else 2.0 ** -8
        assert ((yf - xf).abs() <= eps * xf.abs() + 1e-7).all()
    elif spec.startswith("topk"):
        k = int((yf != 0).sum())
        assert k == max(1, round(0.05 * x.numel()))
        kept = (yf != 0)
        assert torch.equal(yf[kept], xf[kept])  # values exact
        assert xf[kept].abs().min() >= xf[~kept].abs().max()  # the largest magnitudes
    elif spec == "onebit":
        nz = xf != 0
        assert (torch.sign(yf[nz]) == torch.sign(xf[nz])).float().mean() > 0.99
    elif spec.startswith("powersgd"):
        # rank-2 reconstruction: error no larger than the best rank-2 approximation allows,
        # within the single power-iteration step's slack
        m = xf.reshape(x.shape[0], -1)
        s = torch.linalg.svdvals(m)
        best = float(s[2:].pow(2).sum().sqrt())
        err = float((yf.reshape(m.shape) - m).norm())
        assert err <= 1.2 * best + 1e-3
        assert header["codec"] == "powersgd"


def test_qsgd_unbiased_with_fixed_seeds():
    codec = gradcomp.Codec("qsgd:levels=3")
    x = sample(torch.float32, (4096,), seed=5)
    acc = torch.zeros_like(x)
    draws = 400
    for s in range(draws):
        codec.decompress_add(codec.compress(x, seed=s), acc, alpha=1.0 / draws, seed=s)
    # per-coordinate variance of QSGD with s levels is at most ||x|| |x_i| / s; the mean of
    # `draws` independent draws deviates by more than 5 sigma with negligible probability
    sigma = (x.norm() * x.abs() / 3 / draws).sqrt()
    assert ((acc - x).abs() <= 5 * sigma + 1e-6).float().mean() > 0.999


def test_zero_copy():
    codec = gradcomp.Codec("topk:ratio=0.1")
    x = sample(torch.float32, (1000,))
    buf = torch.empty(codec.max_compressed_bytes(x), dtype=torch.uint8)
    packet = codec.compress(x, out=buf)
    assert packet.data_ptr() == buf.data_ptr()
    out = torch.zeros(1000)
    ret = codec.decompress(packet, out)
    assert ret.data_ptr() == out.data_ptr()
    assert (out != 0).sum() == 100


def test_bad_specs_raise():
    with pytest.raises(gradcomp.ConfigError, match="unknown codec 'nope'"):
        gradcomp.Codec("nope")
    with pytest.raises(gradcomp.ConfigError):
        gradcomp.Codec("topk:ratio=2")
    with pytest.raises(gradcomp.ConfigError):
        gradcomp.Codec("qsgd:levels=0")
    assert issubclass(gradcomp.ConfigError, gradcomp.Error)
    assert issubclass(gradcomp.Error, RuntimeError)


def test_bad_tensors_raise():
    codec = gradcomp.Codec("fp16")
    with pytest.raises(gradcomp.ConfigError, match="contiguous"):
        codec.compress(torch.randn(8, 8).t())
    with pytest.raises(gradcomp.ConfigError, match="float32, float16 or bfloat16"):
        codec.compress(torch.arange(10))
    with pytest.raises(gradcomp.ConfigError, match="out has"):
        codec.compress(torch.randn(100), out=torch.empty(10, dtype=torch.uint8))
    packet = codec.compress(torch.randn(100))
    with pytest.raises(gradcomp.Error):
        codec.decompress(packet, torch.empty(99))  # wrong size


def test_malformed_packets_raise():
    codec = gradcomp.Codec("topk:ratio=0.1")
    x = sample(torch.float32, (1000,))
    packet = codec.compress(x)
    out = torch.zeros(1000)
    with pytest.raises(gradcomp.FormatError, match="shorter than the 32-byte header"):
        gradcomp.decompress(packet[:10].clone(), out)
    with pytest.raises(gradcomp.FormatError):
        gradcomp.decompress(packet[:-4].clone(), out)  # truncated payload
    bad = packet.clone()
    bad[0] ^= 0xFF  # magic
    with pytest.raises(gradcomp.FormatError):
        gradcomp.decompress(bad, out)
    with pytest.raises(gradcomp.FormatError):
        gradcomp.inspect(bad)
    # NaN input is refused, not encoded
    with pytest.raises(gradcomp.NumericError):
        codec.compress(torch.tensor([1.0, float("nan")] * 100))
    # random bytes never crash the interpreter: an error or a decoded tensor
    g = torch.Generator().manual_seed(3)
    for i in range(300):
        junk = packet.clone()
        pos = torch.randint(0, junk.numel(), (4,), generator=g)
        junk[pos] = torch.randint(0, 256, (4,), generator=g, dtype=torch.uint8)
        try:
            gradcomp.decompress(junk, out)
        except gradcomp.Error:
            pass


def test_tensors_off_the_cpu_are_refused_with_the_device():
    # a meta tensor stands in for a CUDA one on a machine without a GPU: the same check refuses
    # both, naming the device
    c = gradcomp.Codec("fp16")
    x = torch.empty(16, device="meta")
    with pytest.raises(gradcomp.ConfigError, match="must be a CPU tensor.*got one on meta"):
        c.compress(x)
    with pytest.raises(gradcomp.ConfigError, match="must be a CPU tensor.*got one on meta"):
        c.decompress(c.compress(torch.ones(16)), x)


def test_the_package_imports_in_a_fresh_interpreter():
    # what a user types first: `python -c "import gradcomp"`, torch not imported beforehand
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import gradcomp; print(gradcomp.__version__)"],
                         capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == gradcomp.__version__
