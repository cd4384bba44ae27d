# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Captures ResNet-18 gradients for gradcomp-bench (docs/bench.md).

Trains torchvision's ResNet-18 (10 classes, CIFAR-sized 32x32 inputs) with SGD + momentum on
torchvision's FakeData (random images and labels: nothing is downloaded, so the gradients are
those of the real network at a real training step, not of real data) for --warmup steps, then
records --steps more with gradcomp.capture into --out.

    python bench/capture_resnet18.py --out build/resnet18-grads
    gradcomp-bench build/resnet18-grads --flatten --threads 1
"""

import argparse

import torch
import torch.nn as nn
import torchvision

import gradcomp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="capture directory to write")
    ap.add_argument("--warmup", type=int, default=28, help="training steps before the capture")
    ap.add_argument("--steps", type=int, default=3, help="steps captured")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    data = torchvision.datasets.FakeData(size=args.batch * (args.warmup + args.steps), image_size=(3, 32, 32),
                                         num_classes=10, transform=torchvision.transforms.ToTensor(), random_offset=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    cap = None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            cap = gradcomp.capture(model, steps=args.steps, out=args.out)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    cap.close()
    print(f"captured {cap.recorded} steps of {sum(p.numel() for p in model.parameters())} gradient values into {args.out}")


if __name__ == "__main__":
    main()
