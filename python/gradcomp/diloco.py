# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""``gradcomp.DiLoCo``: local-update training (DiLoCo, Streaming DiLoCo, SparseLoCo, model
averaging) over a torch.distributed process group, with any gradcomp codec and error feedback on
the pseudo-gradients. The algorithms and their guarantees are those of the C++ step
``gradcomp::local_update`` (include/gradcomp/optim/local_update.hpp; docs/pytorch.md,
"Local-update training")."""

import torch

from . import _C
from .ddp import process_group_of

_VERSION = 1


class DiLoCo:
    """Turns ``model`` and its ``inner_optimizer`` into local-update training.

    Every rank trains its own replica (no DistributedDataParallel, no per-step all-reduce): call
    ``inner_optimizer.step()`` as usual, then ``diloco.step()``. Every ``sync_every`` steps (per
    fragment with ``fragments`` > 1) the ranks average the pseudo-gradients
    theta_sync - theta_local through ``codec`` (and ``feedback``), the outer optimizer moves
    theta_sync, and every replica takes it (``overlap`` steps later with ``fragments``, mixed by
    ``mix``). The replicas start identical: rank 0's parameters are broadcast at construction
    (a collective: every rank constructs its DiLoCo at the same point).

    outer: ``"nesterov"`` (DiLoCo; outer_lr 0.7, outer_momentum 0.9 when left None),
    ``"sparseloco"`` (the accumulator's decay as outer_momentum, 0.95; outer_lr 1) or
    ``"average"`` (outer_lr 1, outer_momentum 0). Parameters must be float32 (on any device:
    others than the CPU are staged through CPU copies at the steps that read or write them).
    Errors are gradcomp.ConfigError (naming the option), NumericError, FormatError, CommError;
    a failed sync changes no state and no weight on any rank.
    """

    def __init__(self, model, inner_optimizer, sync_every=30, outer="nesterov", outer_lr=None,
                 outer_momentum=None, codec="identity", feedback=None, fragments=1, overlap=0,
                 mix=0.5, process_group=None, *, seed=0, checksum=False, timeout_s=300.0):
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.process_group = process_group
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise _C.ConfigError("gradcomp: DiLoCo: the model has no parameters that require grad")
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32:
                raise _C.ConfigError(
                    "gradcomp: DiLoCo: parameter %d is %s; the local-update step keeps float32 "
                    "weights (cast the model with model.float())" % (i, p.dtype))
        for name, value in (("sync_every", sync_every), ("fragments", fragments), ("overlap", overlap),
                            ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _C.ConfigError("gradcomp: DiLoCo option '%s' must be an int >= 0, got %r" % (name, value))
        self.options = {
            "outer": outer, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
            "sync_every": sync_every, "fragments": fragments, "overlap": overlap, "mix": float(mix),
            "codec": codec, "feedback": "none" if feedback is None else feedback, "seed": seed,
            "checksum": bool(checksum),
        }
        self._step = _C.LocalUpdate(self.options)  # ConfigError naming a bad option, before any collective
        self._comm = _C.Communicator(process_group_of(process_group), timeout_s)
        self._direct = all(p.device.type == "cpu" and p.is_contiguous() for p in self._params)
        self._stage = None if self._direct else [
            torch.empty(p.numel(), dtype=torch.float32) for p in self._params]
        self.last_stats = None
        with torch.no_grad():
            self._step.start(self._comm, self._tensors(read=True))
            self._write_back()

    # -- the weights as the C++ step sees them: flat float32 CPU views (or staged copies)
    def _tensors(self, read):
        if self._direct:
            return [p.data.view(-1) for p in self._params]
        if read:
            for s, p in zip(self._stage, self._params):
                s.copy_(p.data.reshape(-1))
        return self._stage

    def _write_back(self):
        if not self._direct:
            for s, p in zip(self._stage, self._params):
                p.data.copy_(s.view_as(p.data))

    @torch.no_grad()
    def step(self):
        """Call after every inner optimizer step: syncs the fragments that are due (a collective
        then, on every rank at the same step) and applies delayed results. Returns the step's
        stats (also ``last_stats``): step, synced, fragments, tensors, elements, applied,
        packet_bytes, wire_bytes."""
        acts = self._step.acts_at(self._step.steps + 1)
        self.last_stats = self._step.step(self._comm, self._tensors(read=acts))
        if acts:
            self._write_back()
        return self.last_stats

    @torch.no_grad()
    def flush(self):
        """Applies every pending delayed result now (``overlap`` > 0): before an evaluation or at
        the end of training. Local."""
        done = self._step.flush(self._tensors(read=True))
        self._write_back()
        return done

    @property
    def bytes_sent(self):
        """Bytes of this rank's packets over all syncs."""
        return self._step.bytes_sent

    @property
    def wire_bytes(self):
        """Modeled ring traffic of this rank over all syncs (agreement rounds included)."""
        return self._step.wire_bytes

    @property
    def steps(self):
        return self._step.steps

    @property
    def syncs(self):
        return self._step.syncs

    @property
    def outer_lr(self):
        return self._step.outer_lr

    @property
    def outer_momentum(self):
        return self._step.outer_momentum

    def synchronized_parameters(self):
        """Copies of theta_sync, shaped like the parameters."""
        return [self._step.synchronized(i).view_as(p) for i, p in enumerate(self._params)]

    def state_dict(self):
        """The local-update state (theta_sync, outer momenta or accumulators, residuals, step,
        pending mixings: a CRC32C-checked frame) and the inner optimizer's state_dict. The
        model's own weights are the caller's to save (``model.state_dict()``), as with DDP."""
        return {"version": _VERSION, "local_update": self._step.save(),
                "inner_optimizer": self.inner_optimizer.state_dict()}

    def load_state_dict(self, state):
        """Restores ``state_dict()``'s result (into a DiLoCo built with the same options over
        the same model); FormatError for a damaged or foreign state, which changes nothing."""
        if not isinstance(state, dict) or state.get("version") != _VERSION or "local_update" not in state:
            raise _C.FormatError("gradcomp: not a DiLoCo state_dict (version %d)" % _VERSION)
        before = self._step.save()
        self._step.load(state["local_update"])
        if "inner_optimizer" in state:
            try:
                self.inner_optimizer.load_state_dict(state["inner_optimizer"])
            except BaseException:
                self._step.load(before)
                raise
