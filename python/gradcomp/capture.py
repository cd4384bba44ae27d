# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Recording real gradients during training, for ``gradcomp-bench`` (docs/bench.md).

``gradcomp.capture(model, steps=..., every=..., out=DIR)`` writes the gradients of ``model``
at some training steps into ``DIR`` in the capture format that ``gradcomp-bench`` and
``python -m gradcomp.bench`` read:

- ``DIR/index.tsv``: the line ``# gradcomp capture v1``, the header ``step<TAB>name<TAB>file``,
  then one line per tensor and step (``file`` relative to ``DIR``), appended as the files are
  written, so an interrupted run leaves a readable directory;
- ``DIR/step_<k>/<name>.npy``: the gradient of parameter ``name`` at training step ``k``, in
  its own shape; float32 and float16 as they are, other floating types as float32.

With a ``DistributedDataParallel`` model it registers a communication hook that records each
bucket's per-parameter gradients (this rank's, before averaging) and then all-reduces the bucket
exactly as DDP's own hook does (divide by the world size, sum): training is bit-identical to
DDP without the capture. Only rank ``rank`` writes. A step ends with DDP's last bucket.

With a plain module it registers a post-accumulate-grad hook on every parameter that requires a
gradient; a step ends when each of them has received its gradient once (a parameter that gets
no gradient in a step delays the count: use the DDP path, or ``every=1``, for such models).

Steps are counted from 0 at ``capture()``; steps 0, every, 2·every, ... are recorded until
``steps`` of them are on disk. The returned ``Capture`` is a context manager; ``close()``
removes the module hooks (a DDP communication hook cannot be removed: it keeps passing buckets
through unchanged).
"""

import os

import numpy as np
import torch

__all__ = ["Capture", "capture"]

_MAGIC = "# gradcomp capture v1"


def _as_numpy(t):
    t = t.detach()
    if t.dtype not in (torch.float32, torch.float16):
        t = t.to(torch.float32)
    return t.cpu().contiguous().numpy()


class Capture:
    """Records gradients into a capture directory; made by :func:`capture`."""

    def __init__(self, model, steps, every, out, rank):
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradcomp.capture: steps must be a positive int, got {steps!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"gradcomp.capture: every must be a positive int, got {every!r}")
        self.steps = steps
        self.every = every
        self.out = os.fspath(out)
        self.step = 0  # the training step in progress
        self.recorded = 0  # steps written
        self._handles = []
        self._writes = True
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            import torch.distributed as dist

            self._group = model.process_group
            self._writes = dist.get_rank(self._group) == rank
            self._names = {id(p): n for n, p in model.module.named_parameters()}
            if self._writes:
                self._start_index()
            model.register_comm_hook(self, Capture._ddp_hook)
        else:
            self._names = {}
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            if not params:
                raise ValueError("gradcomp.capture: the model has no parameter that requires a gradient")
            self._start_index()
            self._fired = set()
            self._count = len(params)
            for name, p in params:
                self._handles.append(p.register_post_accumulate_grad_hook(self._module_hook(name)))

    # -- the directory -------------------------------------------------------------------------

    def _start_index(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "index.tsv"), "w", encoding="utf-8") as f:
            f.write(f"{_MAGIC}\nstep\tname\tfile\n")

    def _recording(self):
        return self._writes and self.recorded < self.steps and self.step % self.every == 0

    def _write(self, name, grad):
        if "\t" in name or "\n" in name:
            raise ValueError(f"gradcomp.capture: parameter name {name!r} has a tab or newline")
        rel = os.path.join(f"step_{self.step}", name.replace(os.sep, "_") + ".npy")
        path = os.path.join(self.out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, _as_numpy(grad))
        with open(os.path.join(self.out, "index.tsv"), "a", encoding="utf-8") as f:
            f.write(f"{self.step}\t{name}\t{rel.replace(os.sep, '/')}\n")

    def _end_step(self):
        if self._recording():
            self.recorded += 1
        self.step += 1

    # -- DDP: a communication hook that passes buckets through -------------------------------------

    @staticmethod
    def _ddp_hook(self, bucket):
        import torch.distributed as dist

        if self._recording():
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                self._write(self._names.get(id(p), f"param{id(p)}"), g)
        if bucket.is_last():
            self._end_step()
        # DDP's own all-reduce: the average, as the sum of the buffer divided by the world size
        group = self._group if self._group is not None else dist.group.WORLD
        buf = bucket.buffer()
        buf.div_(dist.get_world_size(group))
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    # -- a plain module: per-parameter hooks --------------------------------------------------------

    def _module_hook(self, name):
        def hook(p):
            if self._recording():
                self._write(name, p.grad)
            self._fired.add(name)
            if len(self._fired) == self._count:
                self._fired.clear()
                self._end_step()

        return hook

    def close(self):
        """Removes the module hooks (nothing to remove for DDP)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def capture(model, steps=10, every=1, out="gradients", rank=0):
    """Records the gradients of ``model`` (a module or a DDP model) at ``steps`` training steps,
    one every ``every`` steps, into the capture directory ``out`` (written by rank ``rank``).
    Returns the :class:`Capture`."""
    return Capture(model, steps, every, out, rank)
