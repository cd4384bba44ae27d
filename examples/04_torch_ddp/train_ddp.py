#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""PyTorch DistributedDataParallel with PyTorch's communication hooks and gradcomp's, side by side.

    build/venv/bin/python examples/04_torch_ddp/train_ddp.py [--demo] [--rows A,B,...] [--data DIR]
    build/venv/bin/python examples/04_torch_ddp/train_ddp.py --bench
    build/venv/bin/python examples/04_torch_ddp/train_ddp.py --netlab [--rate 1gbit]

Starts N processes (torch.multiprocessing, default 2) that form a gloo process group on
127.0.0.1 and train torchvision's ResNet-18 (num_classes from the data; a 3x3 first convolution
and no max-pool, for small inputs) with SGD. Every row of the table trains a fresh model from the
same seed on the same batches; only the DDP communication hook differs:

  torch-allreduce      PyTorch's allreduce_hook (what DDP does without a hook: sum, divide)
  torch-fp16           PyTorch's fp16_compress_hook
  torch-powersgd-r1    PyTorch's powerSGD_hook, rank 1 (error feedback, warm start, from step 2)
  torch-powersgd-r4    the same at rank 4
  gradcomp-fp16        gradcomp.hook, codec fp16
  gradcomp-topk-ef     gradcomp.hook, top-k 1 % with error feedback
  gradcomp-onebit-ef   gradcomp.hook, onebit with error feedback
  gradcomp-powersgd-r4 gradcomp.hook, PowerSGD rank 4 (its residual on, from step 2)
  gradcomp-gravac      gradcomp.hook, top-k under the GraVAC controller (factors 10 to 1000)

(gradcomp-powersgd-r1 exists too, for --bench and --rows; so do gradcomp-accordion, top-k under
Accordion at 10 / 1000, and gradcomp-ef-window, top-k under the ef_window controller with its
defaults, for --rows; and reference-topk-ef, top-k 1 % + error feedback in plain torch ops,
to check gradcomp-topk-ef against.) The data is an embedded synthetic
image task by default, or a directory (--data): an ImageFolder tree or MNIST-format IDX files.
It prints one table (test accuracy, bytes sent per worker, time per step, time in the hook per
step) and writes OUT/summary.csv, OUT/curves.csv (every step), OUT/evals.csv (the test
accuracy at each evaluation), OUT/plot.gp and, when gnuplot is installed, OUT/plot.png.

--bench times gradcomp's hooks against PyTorch's on 2 processes (fp16; PowerSGD at ranks 1 and
4), alternating the two models of a pair in blocks of steps, and prints one line per target:
"measured X, needed Y, met|missed". --netlab does the same for top-k with error feedback
against DDP's own all-reduce, on 4 processes and a communication-bound wide MLP, inside
bench/netlab.sh (a loopback shaped to 1 Gbit/s; needs root). README.md has the details.

gradcomp must be importable: `scripts/build-python` installs it into the project's environment
build/venv (torch from PyPI) and prints its interpreter; run this script with that interpreter.
"""

import argparse
import csv
import gc
import gzip
import json
import math
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def import_gradcomp():
    """gradcomp, as installed for this interpreter (scripts/build-python: build/venv)."""
    try:
        import gradcomp
    except ImportError as e:
        raise SystemExit(
            "train_ddp.py: cannot import gradcomp (%s); install it first: scripts/build-python "
            "(into build/venv), then run this script with build/venv/bin/python" % e)
    return gradcomp


# ----------------------------------------------------------------------------------------------
# Data

def synthetic_task(train, test, size, classes, noise, seed):
    """The embedded task: each class is an oriented grating of its own angle, spatial frequency
    and colour, drawn at a random phase and contrast, over a fainter grating of another class
    and Gaussian noise. Fixed seeds: the same tensors on every machine."""
    proto = torch.Generator().manual_seed(12345)
    angle = torch.arange(classes) * math.pi / classes + 0.1 * torch.rand(classes, generator=proto)
    freq = 1.5 + 1.5 * torch.rand(classes, generator=proto)
    colour = torch.randn(classes, 3, generator=proto)
    colour = colour / colour.norm(dim=1, keepdim=True)
    axis = torch.linspace(-1.0, 1.0, size)
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")

    def grating(c, phase, contrast):
        a = angle[c].view(-1, 1, 1)
        wave = torch.sin(math.pi * freq[c].view(-1, 1, 1) * (xx * torch.cos(a) + yy * torch.sin(a))
                         + phase.view(-1, 1, 1))
        return contrast.view(-1, 1, 1, 1) * wave.unsqueeze(1) * colour[c].view(-1, 3, 1, 1)

    def draw(n, g):
        y = torch.randint(0, classes, (n,), generator=g)
        contrast = 0.4 + 0.6 * torch.rand(n, generator=g)
        x = grating(y, 2 * math.pi * torch.rand(n, generator=g), contrast)
        other = (y + 1 + torch.randint(0, classes - 1, (n,), generator=g)) % classes
        x += grating(other, 2 * math.pi * torch.rand(n, generator=g),
                     0.5 * contrast * torch.rand(n, generator=g))
        x += noise * torch.randn(n, 3, size, size, generator=g)
        return x, y

    xtr, ytr = draw(train, torch.Generator().manual_seed(seed * 2 + 1))
    xte, yte = draw(test, torch.Generator().manual_seed(seed * 2 + 2))
    return {"train": (xtr, ytr), "test": (xte, yte), "classes": classes,
            "name": "synthetic gratings (%d classes, noise %.2f)" % (classes, noise)}


def read_idx(path):
    """An IDX file (MNIST format), optionally gzipped, as a uint8 tensor."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit("train_ddp.py: %s is not an unsigned-byte IDX file" % path)
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
    count = math.prod(shape)
    body = raw[4 + 4 * dims:]
    if len(body) != count:
        raise SystemExit("train_ddp.py: %s holds %d bytes of data, its header says %d"
                         % (path, len(body), count))
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).view(*shape)


def find_idx(directory, stem):
    for name in (stem, stem.replace("-idx", ".idx")):
        for suffix in ("", ".gz"):
            p = directory / (name + suffix)
            if p.exists():
                return p
    return None


def shrink(x, size):
    """N x C x H x W floats resized to size x size (antialiased when shrinking)."""
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=x.shape[-1] > size)


def subset(x, y, limit, seed):
    if limit and limit < len(y):
        keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:limit]
        return x[keep], y[keep]
    return x, y


def idx_task(directory, size, max_train, max_test, seed):
    files = {k: find_idx(directory, k) for k in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    if files["train-images-idx3-ubyte"] is None or files["train-labels-idx1-ubyte"] is None:
        return None
    if files["t10k-images-idx3-ubyte"] is None or files["t10k-labels-idx1-ubyte"] is None:
        raise SystemExit("train_ddp.py: %s has the IDX training files but not "
                         "t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte" % directory)

    def load(images, labels, limit, s):
        x = read_idx(files[images])
        y = read_idx(files[labels]).long()
        if x.dim() != 3 or y.dim() != 1 or x.shape[0] != y.shape[0]:
            raise SystemExit("train_ddp.py: %s and %s do not match (%s images, %s labels)"
                             % (files[images], files[labels], tuple(x.shape), tuple(y.shape)))
        x, y = subset(x, y, limit, s)
        return shrink(x.unsqueeze(1).float() / 255.0, size), y

    train = load("train-images-idx3-ubyte", "train-labels-idx1-ubyte", max_train, seed)
    test = load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", max_test, seed + 1)
    classes = int(max(train[1].max(), test[1].max())) + 1
    return {"train": train, "test": test, "classes": classes,
            "name": "IDX files in %s" % directory}


def image_folder_task(directory, size, max_train, max_test, seed):
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])

    def load(ds, indices):
        xs = torch.stack([ds[i][0] for i in indices])
        ys = torch.tensor([ds.targets[i] for i in indices], dtype=torch.long)
        return xs, ys

    def pick(n, limit, s):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(s)).tolist()
        return order[:limit] if limit else order

    splits = [d for d in ("test", "val") if (directory / d).is_dir()]
    if (directory / "train").is_dir() and splits:
        train_ds = datasets.ImageFolder(directory / "train", transform=tf)
        test_ds = datasets.ImageFolder(directory / splits[0], transform=tf)
        if test_ds.classes != train_ds.classes:
            raise SystemExit("train_ddp.py: %s/train and %s/%s have different classes"
                             % (directory, directory, splits[0]))
        train = load(train_ds, pick(len(train_ds), max_train, seed))
        test = load(test_ds, pick(len(test_ds), max_test, seed + 1))
        where = "%s/{train,%s}" % (directory, splits[0])
    else:
        # One tree: a fixed tenth of it, drawn with the seed, is held out for the test.
        ds = datasets.ImageFolder(directory, transform=tf)
        order = pick(len(ds), 0, seed)
        held = max(1, len(order) // 10)
        test_idx, train_idx = order[:held], order[held:]
        if max_train:
            train_idx = train_idx[:max_train]
        if max_test:
            test_idx = test_idx[:max_test]
        train, test = load(ds, train_idx), load(ds, test_idx)
        where = "%s (a tenth held out)" % directory
        train_ds = ds
    return {"train": train, "test": test, "classes": len(train_ds.classes),
            "name": "ImageFolder %s" % where}


def load_task(args):
    if args.data is None:
        return synthetic_task(args.train_size, args.test_size, args.size, 10, args.noise, args.seed)
    directory = Path(args.data)
    if not directory.is_dir():
        raise SystemExit("train_ddp.py: --data %s is not a directory" % directory)
    task = idx_task(directory, args.size, args.max_train, args.max_test, args.seed)
    if task is None:
        task = image_folder_task(directory, args.size, args.max_train, args.max_test, args.seed)
    # Normalise with the training set's per-channel mean and deviation.
    xtr = task["train"][0]
    mean = xtr.mean(dim=(0, 2, 3), keepdim=True)
    std = xtr.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    task["train"] = ((xtr - mean) / std, task["train"][1])
    task["test"] = ((task["test"][0] - mean) / std, task["test"][1])
    return task


def vector_task(train, test, dim, classes, seed):
    """The network lab's data: class prototypes in `dim` dimensions plus noise."""
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(classes, dim, generator=g)

    def draw(n):
        y = torch.randint(0, classes, (n,), generator=g)
        return proto[y] + 2.0 * torch.randn(n, dim, generator=g), y

    return {"train": draw(train), "test": draw(test), "classes": classes,
            "name": "synthetic vectors (%d dims, %d classes)" % (dim, classes)}


# ----------------------------------------------------------------------------------------------
# Models

def make_resnet(classes, channels):
    from torchvision.models import resnet18

    model = resnet18(num_classes=classes)
    model.conv1 = torch.nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def make_cnn(classes, channels):
    """A small all-convolutional network with BatchNorm (--model cnn): four 3x3 convolutions of
    64, 128, 256 and 512 channels, each followed by BatchNorm and ReLU, 2x2 max-pooling after
    the second and the third, global average pooling and one linear layer; 1.56 M parameters
    for one input channel, of which the three larger convolutions and the linear layer's weight
    (99.8 %) are above the hook's 4,096-element threshold and get compressed."""
    layers = []
    width = channels
    for i, out in enumerate((64, 128, 256, 512)):
        layers += [torch.nn.Conv2d(width, out, 3, padding=1, bias=False),
                   torch.nn.BatchNorm2d(out), torch.nn.ReLU()]
        if i in (1, 2):
            layers.append(torch.nn.MaxPool2d(2))
        width = out
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, classes)]
    return torch.nn.Sequential(*layers)


def make_wide_mlp(dim, width, classes):
    return torch.nn.Sequential(
        torch.nn.Linear(dim, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, dim), torch.nn.ReLU(),
        torch.nn.Linear(dim, classes))


def make_model(cfg, task):
    torch.manual_seed(cfg["seed"])
    if cfg["model"] == "mlp":
        return make_wide_mlp(task["train"][0].shape[1], cfg["width"], task["classes"])
    if cfg["model"] == "cnn":
        return make_cnn(task["classes"], task["train"][0].shape[1])
    return make_resnet(task["classes"], task["train"][0].shape[1])


MODELS = {"resnet18": "ResNet-18", "cnn": "CNN"}


# ----------------------------------------------------------------------------------------------
# Hooks: the rows, the bytes each sends, and the timing wrapper

def count_dense(state, bucket):
    b = bucket.buffer()
    return b.numel() * b.element_size()


def count_fp16(state, bucket):
    return bucket.buffer().numel() * 2


def count_powersgd(state, bucket):
    """What powerSGD_hook sends for this bucket, by its own rules: before start_powerSGD_iter
    the bucket all-reduced; then each gradient as an n x m matrix (n its first dimension) sends
    P and Q, (n + m) * rank elements, when (n + m) * rank * min_compression_rate < n * m, and
    is all-reduced whole otherwise (1-D tensors always are)."""
    b = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return b.numel() * b.element_size()
    elements = 0
    for g in bucket.gradients():
        n = g.shape[0] if g.dim() > 0 else 1
        m = g.numel() // max(n, 1)
        r = min(n, m, state.matrix_approximation_rank)
        if (n + m) * r * state.min_compression_rate < n * m:
            elements += (n + m) * r
        else:
            elements += n * m
    return elements * b.element_size()


# name: (label, kind, options). kind "torch": options name PyTorch's hook; kind "gradcomp":
# options are GradcompState's.
ROWS = {
    "torch-allreduce": ("torch all-reduce", "torch", {"hook": "allreduce"}),
    "torch-fp16": ("torch fp16_compress_hook", "torch", {"hook": "fp16"}),
    "torch-powersgd-r1": ("torch powerSGD_hook r1", "torch", {"hook": "powersgd", "rank": 1}),
    "torch-powersgd-r4": ("torch powerSGD_hook r4", "torch", {"hook": "powersgd", "rank": 4}),
    "gradcomp-fp16": ("gradcomp fp16", "gradcomp", {"codec": "fp16", "feedback": "none"}),
    "gradcomp-topk-ef": ("gradcomp topk 1% +EF", "gradcomp",
                         {"codec": "topk:ratio=0.01", "feedback": "residual"}),
    "gradcomp-onebit-ef": ("gradcomp onebit +EF", "gradcomp",
                           {"codec": "onebit", "feedback": "residual"}),
    "gradcomp-powersgd-r1": ("gradcomp PowerSGD r1", "gradcomp",
                             {"codec": "powersgd:rank=1", "feedback": "residual", "start_iter": 2}),
    "gradcomp-powersgd-r4": ("gradcomp PowerSGD r4", "gradcomp",
                             {"codec": "powersgd:rank=4", "feedback": "residual", "start_iter": 2}),
    "gradcomp-gravac": ("gradcomp GraVAC topk", "gradcomp",
                        {"codec": "topk:ratio=0.01", "feedback": "residual",
                         "controller": "gravac"}),
    "gradcomp-accordion": ("gradcomp Accordion topk", "gradcomp",
                           {"codec": "topk:ratio=0.01", "feedback": "residual",
                            "controller": "accordion"}),
    "gradcomp-ef-window": ("gradcomp ef_window topk", "gradcomp",
                           {"codec": "topk:ratio=0.01", "feedback": "residual",
                            "controller": "ef_window"}),
    "reference-topk-ef": ("reference topk 1% +EF (plain torch)", "reference",
                          {"ratio": 0.01, "min_elements": 4096, "start_iter": 0}),
    # The options of --gradcomp-options (any GradcompState options, as JSON).
    "gradcomp-custom": ("gradcomp --gradcomp-options", "gradcomp", None),
}


def row_folds_momentum(name, cfg):
    """Whether row `name` folds SGD's momentum into the learning rate: the rows that send top-k
    with error feedback (gradcomp's topk / approx_topk with feedback residual, and the plain-torch
    reference of gradcomp-topk-ef), when momentum > 0 and --no-momentum-fold is not given.
    docs/training.md, "Momentum after a delay: why top-k with error feedback failed"."""
    if not cfg.get("momentum_fold", True) or cfg.get("momentum", 0.9) <= 0.0:
        return False
    _, kind, options = ROWS[name]
    if kind == "reference":
        return True
    if kind != "gradcomp":
        return False
    if options is None:  # gradcomp-custom
        options = cfg.get("custom") or {}
    codec = str(options.get("codec", ""))
    return (codec.split(":")[0] in ("topk", "approx_topk")
            and options.get("feedback", "residual") == "residual")


def folded_lr(lr, beta, step):
    """The learning rate of step `step` (from 0) with momentum `beta` folded into it: what
    momentum SGD moves for a constant gradient, lr * (1 - beta^(step+1)) / (1 - beta) (lr at
    step 0, lr / (1 - beta) in the limit). `lr` is the step's scheduled rate."""
    if beta <= 0.0:
        return lr
    return lr * (1.0 - beta ** (step + 1)) / (1.0 - beta)


DEFAULT_ROWS = ["torch-allreduce", "torch-fp16", "torch-powersgd-r1", "torch-powersgd-r4",
                "gradcomp-fp16", "gradcomp-topk-ef", "gradcomp-onebit-ef",
                "gradcomp-powersgd-r4", "gradcomp-gravac"]

# DDP's bucket size for the PowerSGD rows: one bucket for the whole model (see Trainer).
ONE_BUCKET_MB = 4096

# PowerSGD's start, the same for PyTorch's hook and gradcomp's (both all-reduce before it).
POWERSGD_START = 2


def make_hook(name, cfg, per_worker_batch):
    """(hook state, hook function, byte counter or None) of a row. A None counter means the
    hook counts its own bytes (gradcomp: state.totals)."""
    label, kind, o = ROWS[name]
    if kind == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if o["hook"] == "allreduce":
            return None, default_hooks.allreduce_hook, count_dense
        if o["hook"] == "fp16":
            return None, default_hooks.fp16_compress_hook, count_fp16
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=o["rank"],
            start_powerSGD_iter=POWERSGD_START, use_error_feedback=True, warm_start=True,
            random_seed=cfg["seed"])
        return state, powerSGD_hook.powerSGD_hook, count_powersgd
    if kind == "reference":
        state = ReferenceTopkState(o["ratio"], o["min_elements"], o["start_iter"])
        return state, reference_topk_hook, count_reference
    gradcomp = import_gradcomp()
    options = dict(cfg["custom"] if o is None else o)
    if options.get("controller") == "gravac":
        # Windows scaled to the run's length (the paper's are 500 steps and more), and epsilon
        # from the gains such models show (docs/training.md): with 0.7 no factor above 10 is
        # ever sent.
        window = max(1, cfg["steps"] // 10)
        options["controller"] = (
            "gravac:theta_min=10,theta_max=1000,epsilon=0.1,window=%d" % window)
    elif options.get("controller") == "accordion":
        # The levels and scaled interval of examples/03_train_mlp's demo row.
        interval = max(1, cfg["steps"] // 10)
        options["controller"] = "accordion:low=10,high=1000,interval=%d,accumulation=%d" % (
            interval, max(1, cfg["steps"] // 50))
    # "ef_window" is passed as it is: its defaults do not depend on the run's length.
    # Compression from the first iteration (the PowerSGD rows set their own start, PyTorch's):
    # gradcomp keys its state by parameter, so DDP's bucket rebuild needs no plain all-reduce
    # first, and one would cost 1/steps of a dense run's bytes (0.5 % of them in 200 steps, a
    # cap of 200x on what a row can save).
    options.setdefault("start_iter", 0)
    state = gradcomp.GradcompState(seed=cfg["seed"], batch_size=per_worker_batch, **options)
    return state, gradcomp.hook, None


class ReferenceTopkState:
    """State of the plain-PyTorch top-k + error feedback hook (row reference-topk-ef): gradcomp's
    `gradcomp-topk-ef` arithmetic written with torch ops only, to tell a defect of gradcomp's
    path from a property of the method. Per parameter of at least `min_elements` elements:
    acc = g + e, keep the ceil(ratio * n) entries of largest |acc| (ties: torch.topk's order),
    e = acc - kept; smaller parameters go dense; the first `start_iter` iterations all-reduce
    plainly. The kept values are summed with a dense all-reduce (the sum a sparse exchange
    computes); the byte counter counts what a sparse packet would carry, a 4-byte index and a
    4-byte value per kept entry, and 4 bytes per element of a dense tensor."""

    def __init__(self, ratio, min_elements, start_iter):
        self.ratio, self.min_elements, self.start_iter = ratio, min_elements, start_iter
        self.residuals = {}
        self.iteration = 0
        self.sent = 0


def reference_topk_hook(state, bucket):
    buf = bucket.buffer()
    compress = state.iteration >= state.start_iter
    if bucket.is_last():
        state.iteration += 1
    offset = 0
    for p in bucket.parameters():
        n = p.numel()
        view = buf.narrow(0, offset, n)
        offset += n
        if not compress or n < state.min_elements:
            state.sent += 4 * n
            continue
        e = state.residuals.get(id(p))
        acc = view + e if e is not None else view.clone()
        k = max(1, math.ceil(state.ratio * n))
        keep = acc.abs().topk(k).indices
        kept = torch.zeros_like(acc)
        kept[keep] = acc[keep]
        state.residuals[id(p)] = acc - kept
        view.copy_(kept)
        state.sent += 8 * k
    world = dist.get_world_size()
    return dist.all_reduce(buf, async_op=True).get_future().then(
        lambda f: f.value()[0].div_(world))


def count_reference(state, bucket):
    return 0  # counted by the hook itself (state.sent), after it has chosen what to keep


class HookTimer:
    """Wraps a hook (the same way for every row) to time it: from the first bucket's hook call
    of an iteration to the completion of the last bucket's future; and to count the bytes the
    inner hook sends when it does not count them itself."""

    def __init__(self, state, hook, counter):
        self.state = state
        self.hook = hook
        self.counter = counter
        self.bytes = 0
        self.first = None
        self.last = None
        self.lock = threading.Lock()

    def begin(self):
        self.first = None
        self.last = None

    def end(self):
        """Seconds in the hook during the iteration that just ended."""
        if self.first is None or self.last is None:
            return 0.0
        return self.last - self.first

    def done(self, fut):
        now = time.perf_counter()
        with self.lock:
            if self.last is None or now > self.last:
                self.last = now
        return fut.value()


def timed_hook(timer, bucket):
    if timer.first is None:
        timer.first = time.perf_counter()
    if timer.counter is not None:
        timer.bytes += timer.counter(timer.state, bucket)
    return timer.hook(timer.state, bucket).then(timer.done)


def sent_bytes(timer):
    if timer.counter is None:
        return timer.state.totals["bytes_sent"]
    if isinstance(timer.state, ReferenceTopkState):
        return timer.state.sent
    return timer.bytes


# ----------------------------------------------------------------------------------------------
# Training, on every rank

class Batches:
    """The global batch of each step (every rank draws the same), an epoch-wise permutation
    from the seed; rank r takes its slice."""

    def __init__(self, n, global_batch, seed):
        self.n = n
        self.batch = global_batch
        self.g = torch.Generator().manual_seed(seed + 7)
        self.order = torch.empty(0, dtype=torch.long)

    def take(self, step):
        need = (step + 1) * self.batch
        while len(self.order) < need:
            self.order = torch.cat([self.order, torch.randperm(self.n, generator=self.g)])
        return self.order[step * self.batch:need]


def shard(indices, rank, world):
    per = len(indices) // world
    return indices[rank * per:(rank + 1) * per]


def evaluate(model, task, rank, world, batch=256):
    """Test accuracy of the (identical) replicas: BN buffers from rank 0, each rank scores
    every world-th test sample, counts summed."""
    for b in model.buffers():
        dist.broadcast(b, 0)
    x, y = task["test"]
    x, y = x[rank::world], y[rank::world]
    correct = 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    model.train()
    counts = torch.tensor([correct, len(y)], dtype=torch.float64)
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def make_ddp(model, one_bucket, bucket_view=False):
    """DDP over the default group; `one_bucket`: every gradient in one bucket, also after DDP
    rebuilds its buckets at the end of the first iteration (it then keeps a first bucket of
    dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB, apart, unless that is raised)."""
    if not one_bucket:
        return DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = ONE_BUCKET_MB * 1024 * 1024
    try:
        return DistributedDataParallel(model, bucket_cap_mb=ONE_BUCKET_MB,
                                       gradient_as_bucket_view=bucket_view)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved


class Trainer:
    """One model under DDP with one hook (or DDP's own all-reduce: hook None), stepping on the
    shared batch sequence."""

    def __init__(self, name, cfg, task, rank, world, wrap=True):
        self.name = name
        self.cfg = cfg
        self.task = task
        self.rank = rank
        self.world = world
        self.model = make_model(cfg, task)
        # PyTorch's powerSGD_hook issues the P and Q all-reduces of a bucket from future
        # callbacks, while the autograd thread goes on to the next bucket's all-reduce: on gloo,
        # whose collectives are matched by the order each rank posts them, two buckets in flight
        # can meet in different orders on different ranks (gloo aborts: "op.preamble.length <=
        # op.nbytes"). With one bucket per iteration that cannot happen; both PowerSGD hooks get
        # the same bucketing, so that they are compared alike.
        one_bucket = name is not None and "powersgd" in name
        self.ddp = make_ddp(self.model, one_bucket, cfg.get("bucket_view", False))
        per_worker = cfg["batch"] // world
        self.timer = None
        self.state = None
        if name is not None:
            state, hook, counter = make_hook(name, cfg, per_worker)
            self.state = state
            if wrap:
                self.timer = HookTimer(state, hook, counter)
                self.ddp.register_comm_hook(self.timer, timed_hook)
            else:
                self.ddp.register_comm_hook(state, hook)
        # Top-k with error feedback: no momentum buffer, the momentum folded into the rate.
        self.fold = name is not None and row_folds_momentum(name, cfg)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=cfg["lr"],
                                   momentum=0.0 if self.fold else cfg.get("momentum", 0.9),
                                   weight_decay=cfg["weight_decay"])
        self.batches = Batches(len(task["train"][1]), cfg["batch"], cfg["seed"])
        self.step_no = 0
        self.decay_at = int(0.7 * cfg["steps"])

    def step(self):
        """One training step; returns (seconds, hook seconds, loss, batch accuracy)."""
        if self.fold:
            base = self.cfg["lr"] * (0.1 if self.step_no >= self.decay_at > 0 else 1.0)
            for group in self.opt.param_groups:
                group["lr"] = folded_lr(base, self.cfg["momentum"], self.step_no)
        elif self.step_no == self.decay_at and self.step_no > 0:
            for group in self.opt.param_groups:
                group["lr"] = self.cfg["lr"] * 0.1
        idx = shard(self.batches.take(self.step_no), self.rank, self.world)
        x, y = self.task["train"][0][idx], self.task["train"][1][idx]
        if self.timer is not None:
            self.timer.begin()
        t0 = time.perf_counter()
        out = self.ddp(x)
        loss = F.cross_entropy(out, y)
        self.opt.zero_grad(set_to_none=True)
        if hasattr(self.state, "report_loss"):
            # gradcomp's divergence guard and ef_window's loss check read it (this iteration's).
            self.state.report_loss(loss)
        loss.backward()
        self.opt.step()
        dt = time.perf_counter() - t0
        self.step_no += 1
        hook_s = self.timer.end() if self.timer is not None else 0.0
        return dt, hook_s, float(loss), float((out.argmax(1) == y).float().mean())

    def accuracy(self):
        return evaluate(self.model, self.task, self.rank, self.world)

    def close(self):
        if self.state is not None and hasattr(self.state, "wait"):
            self.state.wait()


def gradcomp_profile(state):
    """This iteration's gradcomp statistics (seconds), for the profile columns."""
    s = state.last_stats
    return {k: s.get(k, 0.0) for k in ("compress_s", "communicate_s", "decode_s", "total_s")}


def run_table_row(name, cfg, task, rank, world):
    trainer = Trainer(name, cfg, task, rank, world)
    steps, evals = [], []
    profile = []
    for s in range(cfg["steps"]):
        dt, hook_s, loss, acc = trainer.step()
        sent = sent_bytes(trainer.timer)
        steps.append({"step": s + 1, "seconds": dt, "hook_s": hook_s, "loss": loss,
                      "train_acc": acc, "bytes": sent})
        if ROWS[name][1] == "gradcomp":
            profile.append(gradcomp_profile(trainer.state))
            st = trainer.state.last_stats
            steps[-1].update(factor=st.get("factor", ""), gain=st.get("gain", ""))
        if (s + 1) % cfg["eval_every"] == 0 or s + 1 == cfg["steps"]:
            evals.append((s + 1, trainer.accuracy(), sent))
    trainer.close()
    extra = {}
    if ROWS[name][1] == "gradcomp":
        totals = trainer.state.totals
        extra["layout_changes"] = totals["layout_changes"]
        warm = profile[cfg["warmup"]:] or profile
        for k in ("compress_s", "communicate_s", "decode_s", "total_s"):
            extra[k] = statistics.fmean(p[k] for p in warm)
    del trainer
    gc.collect()  # DDP holds reference cycles: end the row's hook state (gradcomp's engine) now
    return {"steps": steps, "evals": evals, "extra": extra}


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def merge_ranks(name, per_rank, warmup):
    """One row's result from every rank's: means over ranks."""
    first = per_rank[0]
    n = len(first["steps"])
    steps = []
    for i in range(n):
        vals = [r["steps"][i] for r in per_rank]
        steps.append({k: statistics.fmean(v[k] for v in vals) for k in vals[0]})
    timed = steps[warmup:] if n > warmup else steps
    return {
        "name": name,
        "label": ROWS[name][0],
        "accuracy": first["evals"][-1][1],
        "bytes": steps[-1]["bytes"] if steps else 0,
        "ms_per_step": 1e3 * statistics.fmean(s["seconds"] for s in timed),
        "hook_ms_per_step": 1e3 * statistics.fmean(s["hook_s"] for s in timed),
        "steps": steps,
        "evals": [(s, a, statistics.fmean(r["evals"][j][2] for r in per_rank))
                  for j, (s, a, _) in enumerate(first["evals"])],
        "extra": {k: statistics.fmean(r["extra"][k] for r in per_rank) for k in first["extra"]},
    }


# ----------------------------------------------------------------------------------------------
# Benchmark mode: pairs of models, alternating blocks of steps

def run_pair(names, cfg, task, rank, world):
    """Trains the models of `names` side by side (each its own DDP over the same process group),
    alternating blocks of cfg["block"] steps, the order swapped every round; returns, per name,
    the per-step times of the timed blocks (the first round is warm-up) and the final test
    accuracy (after cfg["steps"] steps each)."""
    trainers = [Trainer(None if n == "ddp" else n, cfg, task, rank, world, wrap=False)
                for n in names]
    times = {n: [] for n in names}
    profile = {n: [] for n in names}
    rounds = math.ceil(cfg["steps"] / cfg["block"])
    for r in range(rounds):
        order = list(range(len(names))) if r % 2 == 0 else list(reversed(range(len(names))))
        for i in order:
            t = trainers[i]
            for _ in range(min(cfg["block"], cfg["steps"] - t.step_no)):
                dt, _, _, _ = t.step()
                # Rank 0's clock decides; every rank takes part in the same steps anyway.
                if r > 0:
                    times[names[i]].append(dt)
                    if t.state is not None and hasattr(t.state, "last_stats"):
                        profile[names[i]].append(gradcomp_profile(t.state))
    result = {}
    for n, t in zip(names, trainers):
        acc = t.accuracy() if cfg["bench_accuracy"] else None
        t.close()
        prof = {}
        if profile[n]:
            for k in profile[n][0]:
                prof[k] = statistics.median(p[k] for p in profile[n])
        result[n] = {"times": times[n], "accuracy": acc, "profile": prof}
    del trainers
    return result


# ----------------------------------------------------------------------------------------------
# Process entry

def worker(rank, world, cfg, data_path, result_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    task = torch.load(data_path)
    results = {}
    try:
        if cfg["mode"] == "table":
            rows = []
            for name in cfg["rows"]:
                t0 = time.perf_counter()
                r = run_table_row(name, cfg, task, rank, world)
                per_rank = gather(r)
                if rank == 0:
                    merged = merge_ranks(name, per_rank, cfg["warmup"])
                    merged["wall_s"] = time.perf_counter() - t0
                    rows.append(merged)
                    if cfg["verbose"]:
                        print("  %-26s %6.1f %% in %.1f s" % (
                            merged["label"], 100 * merged["accuracy"], merged["wall_s"]),
                            file=sys.stderr, flush=True)
                dist.barrier()
            results["rows"] = rows
        else:
            pairs = []
            for names, seed in cfg["pairs"]:
                r = run_pair(names, dict(cfg, seed=seed), task, rank, world)
                per_rank = gather(r)
                if rank == 0:
                    # A step ends on every rank at about the same time (the exchange syncs
                    # them): take the slowest rank's time of each step.
                    merged = {}
                    for n in names:
                        times = [max(pr[n]["times"][i] for pr in per_rank)
                                 for i in range(len(per_rank[0][n]["times"]))]
                        merged[n] = {"times": times, "accuracy": per_rank[0][n]["accuracy"],
                                     "profile": per_rank[0][n]["profile"]}
                    pairs.append({"names": names, "seed": seed, "models": merged})
                    if cfg["verbose"]:
                        print("  seed %d: " % seed + ", ".join(
                            "%s %.1f ms, %.1f %%" % (n, 1e3 * statistics.median(merged[n]["times"]),
                                                     100 * (merged[n]["accuracy"] or 0))
                            for n in names), file=sys.stderr, flush=True)
                dist.barrier()
            results["pairs"] = pairs
    finally:
        if rank == 0:
            with open(result_path, "w", encoding="utf-8") as f:
                json.dump(results, f)
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, task, workers):
    """Runs `worker` on `workers` processes; returns rank 0's results."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    # gloo over the loopback (also what the network lab shapes), one thread per process for
    # PyTorch's kernels and for gradcomp's codecs.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GRADCOMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="gradcomp-ddp-") as tmp:
        data_path = os.path.join(tmp, "task.pt")
        result_path = os.path.join(tmp, "result.json")
        torch.save(task, data_path)
        mp.spawn(worker, args=(workers, cfg, data_path, result_path), nprocs=workers, join=True)
        with open(result_path, encoding="utf-8") as f:
            return json.load(f)


# ----------------------------------------------------------------------------------------------
# Output


def print_table(rows, cfg, task, workers, params):
    print()
    print("PyTorch DDP on %d gloo processes: %s, %.2f M parameters, input %s; %s;" % (
        workers, cfg["model_name"], params / 1e6, "x".join(map(str, task["train"][0].shape[1:])),
        task["name"]))
    print("%d steps of %d samples (%d per worker), SGD lr %g (x0.1 from step %d), momentum %g, "
          "weight decay %g; times are means over steps %d-%d" % (
              cfg["steps"], cfg["batch"], cfg["batch"] // workers, cfg["lr"],
              int(0.7 * cfg["steps"]) + 1, cfg["momentum"], cfg["weight_decay"],
              cfg["warmup"] + 1, cfg["steps"]))
    folded = [r["label"] for r in rows if row_folds_momentum(r["name"], cfg)]
    if folded:
        print("top-k + error feedback rows (%s): momentum folded into the learning rate, "
              "lr_t = %g * (1 - %g^(t+1)) / (1 - %g) -> %g, no momentum buffer "
              "(--no-momentum-fold: momentum SGD; docs/training.md)" % (
                  ", ".join(folded), cfg["lr"], cfg["momentum"], cfg["momentum"],
                  cfg["lr"] / (1.0 - cfg["momentum"])))
    dense = 4 * params * cfg["steps"]
    head = "%-26s %9s %12s %9s %9s %13s" % (
        "row", "test acc", "MB/worker", "vs fp32", "ms/step", "hook ms/step")
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = dense / r["bytes"] if r["bytes"] else float("inf")
        print("%-26s %7.1f %% %12.1f %8.1fx %9.1f %13.1f" % (
            r["label"], 100 * r["accuracy"], r["bytes"] / 1e6, ratio, r["ms_per_step"],
            r["hook_ms_per_step"]))
    print("MB/worker: what each worker hands to the exchange over all %d steps (fp32 all-reduce "
          "of every gradient: %.1f MB); README.md says how each row is counted." % (
              cfg["steps"], dense / 1e6))
    if cfg.get("custom") is not None:
        print("gradcomp --gradcomp-options: %s" % json.dumps(cfg["custom"], sort_keys=True))


def write_outputs(out, rows, cfg, params):
    out.mkdir(parents=True, exist_ok=True)
    dense = 4 * params * cfg["steps"]
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["row", "label", "test_accuracy", "bytes_per_worker", "reduction_vs_fp32",
                    "ms_per_step", "hook_ms_per_step", "steps", "wall_s", "gradcomp_compress_ms",
                    "gradcomp_communicate_ms", "gradcomp_decode_ms"])
        for r in rows:
            e = r["extra"]
            w.writerow([r["name"], r["label"], "%.4f" % r["accuracy"], int(r["bytes"]),
                        "%.2f" % (dense / r["bytes"] if r["bytes"] else 0),
                        "%.2f" % r["ms_per_step"], "%.2f" % r["hook_ms_per_step"], cfg["steps"],
                        "%.1f" % r["wall_s"]] +
                       ["%.2f" % (1e3 * e[k]) if k in e else ""
                        for k in ("compress_s", "communicate_s", "decode_s")])
    with open(out / "curves.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["row_index", "row", "step", "loss", "loss_mean10", "train_accuracy",
                    "test_accuracy", "bytes_per_worker", "step_ms", "hook_ms", "factor",
                    "gain"])
        for i, r in enumerate(rows):
            evals = {s: a for s, a, _ in r["evals"]}
            recent = []
            for s in r["steps"]:
                recent = (recent + [s["loss"]])[-10:]
                acc = evals.get(int(s["step"]))
                w.writerow([i, r["name"], int(s["step"]), "%.5f" % s["loss"],
                            "%.5f" % statistics.fmean(recent), "%.4f" % s["train_acc"],
                            "" if acc is None else "%.4f" % acc, int(s["bytes"]),
                            "%.3f" % (1e3 * s["seconds"]), "%.3f" % (1e3 * s["hook_s"]),
                            s.get("factor", ""), s.get("gain", "")])
    with open(out / "evals.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["row_index", "row", "step", "test_accuracy", "bytes_per_worker"])
        for i, r in enumerate(rows):
            for s, a, b in r["evals"]:
                w.writerow([i, r["name"], s, "%.4f" % a, int(b)])
    lines = ["# gnuplot script written by train_ddp.py: gnuplot plot.gp -> plot.png",
             "set datafile separator ','",
             "set terminal pngcairo size 1800,560 noenhanced font ',10'",
             "set output '%s'" % (out / "plot.png"),
             "set multiplot layout 1,3",
             "set key top left",
             "set grid",
             "evals = '%s'" % (out / "evals.csv"),
             "curves = '%s'" % (out / "curves.csv"),
             "set title 'test accuracy vs steps'",
             "set xlabel 'step'",
             "set ylabel 'test accuracy (%)'",
             "set yrange [0:100]"]

    def plot(source, x, y, style):
        parts = ["%s using ($1==%d ? %s : NaN):(%s) skip 1 with %s title '%s'"
                 % (source, i, x, y, style, r["label"]) for i, r in enumerate(rows)]
        return "plot " + ", \\\n     ".join(parts)

    lines.append(plot("evals", "$3", "100*$4", "linespoints"))
    # One key, in the first panel: the rows keep their colours in the others.
    lines += ["unset key", "set title 'test accuracy vs bytes sent per worker'",
              "set xlabel 'MB sent per worker (log scale)'", "set logscale x"]
    # Step 0 has sent nothing: start the bytes axis at the first evaluation after it.
    lines.append(plot("evals", "($5 > 0 ? $5/1e6 : NaN)", "100*$4", "linespoints"))
    lines += ["unset logscale x", "set title 'training loss (mean of the last 10 steps)'",
              "set xlabel 'step'", "set ylabel 'loss'", "set yrange [0:*]"]
    lines.append(plot("curves", "$3", "$5", "lines"))
    lines.append("unset multiplot")
    (out / "plot.gp").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if shutil.which("gnuplot"):
        r = subprocess.run(["gnuplot", str(out / "plot.gp")], capture_output=True, text=True)
        if r.returncode == 0:
            return out / "plot.png"
        print("train_ddp.py: gnuplot failed (%s); the CSV files are in %s"
              % (r.stderr.strip(), out), file=sys.stderr)
    else:
        print("train_ddp.py: gnuplot not found; no plot (plot.gp and the CSV files are in %s)"
              % out, file=sys.stderr)
    return None


def target_line(what, measured, needed, met, detail):
    return "%s: measured %s, needed %s, %s  (%s)" % (
        what, measured, needed, "met" if met else "missed", detail)


def median_ms(times):
    return 1e3 * statistics.median(times)


def bench_report(pairs, cfg, tolerance):
    """The target lines of --bench: gradcomp at least as fast per step as PyTorch (medians of
    the step times pooled over the seeds), and for PowerSGD a test accuracy, averaged over the
    seeds, within `tolerance` of PyTorch's."""
    groups = {}
    for p in pairs:
        groups.setdefault(tuple(p["names"]), []).append(p)
    lines = []
    for names, runs in groups.items():
        torch_name, g_name = sorted(names, key=lambda n: not n.startswith("torch"))
        times = {n: [t for r in runs for t in r["models"][n]["times"]] for n in names}
        t_ms, g_ms = median_ms(times[torch_name]), median_ms(times[g_name])
        ratio = g_ms / t_ms
        detail = "median step: %s %.1f ms, %s %.1f ms, %d steps each" % (
            g_name, g_ms, torch_name, t_ms, len(times[g_name]))
        profiles = [r["models"][g_name]["profile"] for r in runs if r["models"][g_name]["profile"]]
        if profiles:
            detail += "; gradcomp compress %.1f, communicate %.1f, decode %.1f ms" % tuple(
                1e3 * statistics.median(p[k] for p in profiles)
                for k in ("compress_s", "communicate_s", "decode_s"))
        lines.append(target_line(
            "%s vs %s, time per step (gradcomp / torch)" % (g_name, torch_name),
            "%.3f" % ratio, "<= 1.000", ratio <= 1.0, detail))
        if "powersgd" in g_name:
            ga = [r["models"][g_name]["accuracy"] for r in runs]
            ta = [r["models"][torch_name]["accuracy"] for r in runs]
            gm, tm = statistics.fmean(ga), statistics.fmean(ta)
            lines.append(target_line(
                "%s vs %s, test accuracy after %d steps, mean of %d seeds" % (
                    g_name, torch_name, cfg["steps"], len(runs)),
                "%.1f %%" % (100 * gm), ">= %.1f %% (torch's %.1f %% - %g points)" % (
                    100 * (tm - tolerance), 100 * tm, 100 * tolerance),
                gm >= tm - tolerance - 1e-12,
                "seeds %s: torch %s %%, gradcomp %s %%" % (
                    ", ".join(str(r["seed"]) for r in runs),
                    " / ".join("%.1f" % (100 * a) for a in ta),
                    " / ".join("%.1f" % (100 * a) for a in ga))))
    return lines


# ----------------------------------------------------------------------------------------------
# Command line

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch DDP with PyTorch's and gradcomp's communication hooks "
                    "(examples/04_torch_ddp/README.md)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", type=int, default=None,
                   help="processes (default 2; --netlab: 4)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per row (default 200; --demo 60; --bench 120; "
                        "--netlab 16)")
    p.add_argument("--batch", type=int, default=32, help="global batch (split over the workers)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (x0.1 after 70%%)")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD momentum (default 0.9; --netlab: 0)")
    p.add_argument("--momentum-fold", action=argparse.BooleanOptionalAction, default=True,
                   help="rows that send top-k with error feedback fold the momentum into the "
                        "learning rate (lr_t = lr (1 - m^(t+1)) / (1 - m), no momentum buffer; "
                        "docs/training.md); --no-momentum-fold: momentum SGD like the other rows")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="SGD weight decay (default 5e-4; --netlab: 0)")
    p.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=None,
                   help="DDP's gradient_as_bucket_view (default off; --netlab: on)")
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18",
                   help="the table's model: resnet18 (torchvision's ResNet-18 for small inputs) "
                        "or cnn (four convolutions with BatchNorm, 1.56 M parameters)")
    p.add_argument("--size", type=int, default=16, help="input images are SIZE x SIZE")
    p.add_argument("--rows", default=None,
                   help="comma-separated rows (default: all of them but gradcomp-powersgd-r1): "
                        + ", ".join(ROWS))
    p.add_argument("--gradcomp-options", default=None, metavar="JSON",
                   help="the options of row gradcomp-custom: GradcompState options as a JSON "
                        "object, e.g. '{\"codec\": \"topk:ratio=0.1\"}' (feedback residual "
                        "unless given)")
    p.add_argument("--data", default=None,
                   help="an ImageFolder directory (with train/ and test/ or val/, or one tree "
                        "of which a tenth is held out) or a directory of MNIST-format IDX files")
    p.add_argument("--max-train", type=int, default=0, help="use at most this many training "
                   "images of --data (0: all)")
    p.add_argument("--max-test", type=int, default=2000, help="... and test images (0: all)")
    p.add_argument("--train-size", type=int, default=4096, help="synthetic training samples")
    p.add_argument("--test-size", type=int, default=512, help="synthetic test samples")
    p.add_argument("--noise", type=float, default=0.6, help="synthetic task's noise level")
    p.add_argument("--eval-every", type=int, default=None,
                   help="evaluate every this many steps (default: steps / 4)")
    p.add_argument("--warmup", type=int, default=5,
                   help="steps left out of the time averages")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for the CSV files and the plot "
                   "(default build/torch_ddp, or build/torch_ddp/demo with --demo)")
    p.add_argument("--demo", action="store_true",
                   help="the short run of scripts/demo: every row, 60 steps")
    p.add_argument("--bench", action="store_true",
                   help="benchmark gradcomp's fp16 and PowerSGD hooks against PyTorch's")
    p.add_argument("--block", type=int, default=None,
                   help="--bench / --netlab: steps per block (default 10; --netlab 2)")
    p.add_argument("--seeds", type=int, default=3,
                   help="--bench: training seeds of the PowerSGD pairs")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="--bench: accuracy gradcomp's PowerSGD may lose against PyTorch's")
    p.add_argument("--netlab", action="store_true",
                   help="top-k + EF against DDP's all-reduce on 4 processes in bench/netlab.sh")
    p.add_argument("--rate", default="1gbit", help="--netlab: the loopback's rate")
    p.add_argument("--width", type=int, default=4096, help="--netlab: hidden width of the MLP")
    p.add_argument("--timeout", type=float, default=600.0, help="process group timeout (s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def base_cfg(args, steps, workers):
    return {
        "steps": steps,
        "batch": args.batch,
        "lr": args.lr,
        "weight_decay": 5e-4 if args.weight_decay is None else args.weight_decay,
        "momentum": 0.9 if args.momentum is None else args.momentum,
        "momentum_fold": args.momentum_fold,
        "bucket_view": bool(args.bucket_view),
        "seed": args.seed,
        "warmup": min(args.warmup, max(0, steps - 1)),
        "eval_every": args.eval_every or max(1, steps // 4),
        "timeout_s": args.timeout,
        "verbose": not args.quiet,
        "model": args.model,
        "model_name": MODELS[args.model],
        "workers": workers,
    }


def check_batch(batch, workers):
    if workers < 1 or batch % workers != 0 or batch < workers:
        raise SystemExit("train_ddp.py: --batch %d must be a positive multiple of --workers %d"
                         % (batch, workers))


def main_table(args):
    workers = args.workers or 2
    steps = args.steps or (60 if args.demo else 200)
    check_batch(args.batch, workers)
    rows = DEFAULT_ROWS if args.rows is None else [r.strip() for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            raise SystemExit("train_ddp.py: unknown row '%s'; rows: %s" % (r, ", ".join(ROWS)))
    if any(ROWS[r][1] == "gradcomp" for r in rows):
        import_gradcomp()  # fail early, with the build hint
    custom = None
    if args.gradcomp_options is not None:
        try:
            custom = json.loads(args.gradcomp_options)
        except ValueError as e:
            raise SystemExit("train_ddp.py: --gradcomp-options is not JSON: %s" % e)
        if not isinstance(custom, dict):
            raise SystemExit("train_ddp.py: --gradcomp-options wants a JSON object of "
                             "GradcompState options")
    if ("gradcomp-custom" in rows) != (custom is not None):
        raise SystemExit("train_ddp.py: row gradcomp-custom and --gradcomp-options go together")
    cfg = base_cfg(args, steps, workers)
    cfg.update(mode="table", rows=rows, custom=custom)
    task = load_task(args)
    params = sum(p.numel() for p in make_model(cfg, task).parameters())
    out = Path(args.out or (ROOT / "build" / "torch_ddp" / ("demo" if args.demo else "")))
    if cfg["verbose"]:
        print("train_ddp.py: %d rows on %d processes, %d steps each" % (len(rows), workers, steps),
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    result = launch(cfg, task, workers)
    wall = time.perf_counter() - t0
    print_table(result["rows"], cfg, task, workers, params)
    png = write_outputs(out, result["rows"], cfg, params)
    print("wrote %s/{summary,curves,evals}.csv and plot.gp%s (%.0f s)" % (
        out, ", plot: %s" % png if png else "", wall))
    return 0


def main_bench(args):
    workers = args.workers or 2
    steps = args.steps or 120
    check_batch(args.batch, workers)
    import_gradcomp()
    cfg = base_cfg(args, steps, workers)
    # fp16 once (its accuracy is not a target); PowerSGD with several training seeds (model,
    # batch order and PowerSGD's random factors; the data stays), since a single 120-step run's
    # accuracy moves by several points from seed to seed.
    seeds = [args.seed + i for i in range(max(1, args.seeds))]
    pairs = [[["torch-fp16", "gradcomp-fp16"], args.seed]]
    for seed in seeds:
        pairs.append([["torch-powersgd-r1", "gradcomp-powersgd-r1"], seed])
        pairs.append([["torch-powersgd-r4", "gradcomp-powersgd-r4"], seed])
    cfg.update(mode="bench", block=args.block or 10, bench_accuracy=True, pairs=pairs)
    task = load_task(args)
    print("train_ddp.py --bench: %d gloo processes, %s on %s, %d steps per model in "
          "alternating blocks of %d (the first block of each model is warm-up); fp16 with seed "
          "%d, PowerSGD with seeds %s" % (
              workers, cfg["model_name"], task["name"], steps, cfg["block"], args.seed,
              ", ".join(map(str, seeds))), file=sys.stderr, flush=True)
    result = launch(cfg, task, workers)
    for line in bench_report(result["pairs"], cfg, args.tolerance):
        print(line)
    return 0


def main_netlab(args):
    workers = args.workers or 4
    steps = args.steps or 16
    check_batch(args.batch, workers)
    if "GRADCOMP_NETLAB_RATE" not in os.environ:
        # Not inside the lab yet: run this same command inside it.
        lab = ROOT / "bench" / "netlab.sh"
        cmd = [str(lab), "--rate", args.rate, "--", sys.executable, str(Path(__file__).resolve())]
        cmd += sys.argv[1:]
        print("train_ddp.py: " + " ".join(cmd), file=sys.stderr, flush=True)
        return subprocess.call(cmd)
    import_gradcomp()
    rate = os.environ["GRADCOMP_NETLAB_RATE"]
    cfg = base_cfg(args, steps, workers)
    cfg.update(mode="bench", block=args.block or 2, bench_accuracy=True, model="mlp",
               model_name="MLP", width=args.width,
               pairs=[[["ddp", "gradcomp-topk-ef"], args.seed]])
    cfg["warmup"] = 0
    # The lab's model is there to be communication-bound: plain SGD (no momentum or weight-decay
    # passes over 100 MB each step) and gradients that are views into DDP's buckets (no copy in
    # and out of them); both rows run with the same settings.
    cfg["momentum"] = 0.0 if args.momentum is None else args.momentum
    cfg["weight_decay"] = 0.0 if args.weight_decay is None else args.weight_decay
    cfg["bucket_view"] = True if args.bucket_view is None else args.bucket_view
    task = vector_task(4096, 1024, 1024, 10, args.seed)
    params = sum(p.numel() for p in make_model(cfg, task).parameters())
    print("train_ddp.py --netlab: %d gloo processes over a loopback shaped to %s; MLP "
          "1024-%d-%d-1024-10 (%.1f M parameters), %d samples per worker, SGD momentum %g, "
          "weight decay %g, gradient_as_bucket_view %s; %d steps per model in alternating "
          "blocks of %d (the first block of each is warm-up)" % (
              workers, rate, args.width, args.width, params / 1e6, args.batch // workers,
              cfg["momentum"], cfg["weight_decay"], cfg["bucket_view"], steps, cfg["block"]),
          file=sys.stderr, flush=True)
    result = launch(cfg, task, workers)
    pair = result["pairs"][0]["models"]
    t_ms, g_ms = median_ms(pair["ddp"]["times"]), median_ms(pair["gradcomp-topk-ef"]["times"])
    speedup = t_ms / g_ms
    prof = pair["gradcomp-topk-ef"]["profile"]
    detail = ("median step: DDP all-reduce %.1f ms, gradcomp top-k 1%% +EF %.1f ms "
              "(compress %.1f, communicate %.1f, decode %.1f ms); test accuracy %.1f %% vs "
              "%.1f %%; %d steps each" % (
                  t_ms, g_ms, 1e3 * prof.get("compress_s", 0), 1e3 * prof.get("communicate_s", 0),
                  1e3 * prof.get("decode_s", 0), 100 * pair["ddp"]["accuracy"],
                  100 * pair["gradcomp-topk-ef"]["accuracy"], len(pair["ddp"]["times"])))
    what = "netlab %s, %d processes: gradcomp-topk-ef vs DDP all-reduce, speed-up per step" % (
        rate, workers)
    if rate == "unlimited":
        print("%s: not measured (no network namespace here; the loopback was not shaped)  (%s)"
              % (what, detail))
        return 0
    print(target_line(what, "%.1fx" % speedup, ">= 8.0x", speedup >= 8.0, detail))
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.bench:
        return main_bench(args)
    if args.netlab:
        return main_netlab(args)
    return main_table(args)


if __name__ == "__main__":
    sys.exit(main())
