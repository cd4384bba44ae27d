# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp's DistributedDataParallel communication hook.

``GradcompState`` holds the configuration and the C++ engine (a ``gradient_pipeline`` over the
process group, on a worker thread); ``hook`` hands each DDP bucket to it and returns the future
DDP waits for. One DDP iteration is one pipeline step: buckets are compressed as they arrive
(overlapping the backward pass); the last bucket of the iteration starts the exchange, and every
bucket's future then completes with its average (the hook divides by the world size, as DDP's
contract asks), or fails on every rank with the step's error.
"""

import atexit
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C, _options

# The options a state takes: the table of gradcomp/_options.py (names, types, defaults, meanings).
_D = _options.DEFAULTS


def process_group_of(group):
    """The ``torch.distributed.ProcessGroup`` to exchange over: ``group`` itself (the default
    group, ``dist.group.WORLD``, or one of ``dist.new_group()``), or the default group for None.
    A backend object (``ProcessGroupGloo``, ``ProcessGroupNCCL``: since torch 2.0 these are
    ``Backend``s behind a ``ProcessGroup``) or anything else raises ConfigError saying what to
    pass instead."""
    if group is None:
        if not dist.is_available() or not dist.is_initialized():
            raise _C.ConfigError(
                "gradcomp: torch.distributed is not initialized: call "
                "torch.distributed.init_process_group() first, or pass process_group=")
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, dist.ProcessGroup):
        return group
    backend_type = getattr(torch._C._distributed_c10d, "Backend", None)
    if backend_type is not None and isinstance(group, backend_type):
        raise _C.ConfigError(
            "gradcomp: got a %s, a torch.distributed backend object; pass the process group "
            "it belongs to instead (dist.group.WORLD, dist.new_group(...), or None for the "
            "default group)" % type(group).__name__)
    raise _C.ConfigError(
        "gradcomp: process_group must be a torch.distributed.ProcessGroup (dist.group.WORLD, "
        "dist.new_group(...)) or None, got %s" % type(group).__name__)


def _bound_group_timeout(group, timeout_s):
    """Lowers the process group's own timeout to ``timeout_s`` where it is longer.

    The engine stops waiting for an exchange after ``timeout_s``, but the process group's
    operation it waited for stays queued in the backend: with a peer that is frozen (alive,
    not answering) gloo's worker thread is blocked in it until gloo's own timeout (the
    ``init_process_group(timeout=...)``, 30 minutes by default), and
    ``destroy_process_group()`` and interpreter exit wait for that thread. With the group's
    timeout at ``timeout_s``, the blocked operation fails then too, and the process can exit
    a moment after the step has raised. Every later operation on the group (yours too) then
    has this timeout; a group whose timeout is already shorter is left as it is, as is a
    backend that does not say its timeout."""
    want = timedelta(seconds=timeout_s)
    try:
        current = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError, ValueError):
        return
    if current > want:
        group.set_timeout(want)


# The states whose engine is open: closed at interpreter exit (see GradcompState.close).
_open_states = weakref.WeakSet()


def _close_open_states():
    for state in list(_open_states):
        state.close()


atexit.register(_close_open_states)


class GradcompState:
    # The docstring is generated from the option table (below the class).

    def __init__(self, process_group=None, *, codec=_D["codec"], feedback=_D["feedback"],
                 controller=_D["controller"], guard=_D["guard"], two_way=_D["two_way"],
                 seed=_D["seed"], start_iter=_D["start_iter"], batch_size=_D["batch_size"],
                 measure_gain=_D["measure_gain"], measured_timing=_D["measured_timing"],
                 min_compress_elements=_D["min_compress_elements"], bucket_mb=_D["bucket_mb"],
                 log_every=_D["log_every"], timeout_s=_D["timeout_s"], **unknown):
        given = locals()
        if unknown:  # a ConfigError, as every other bad option (not Python's TypeError)
            raise _C.ConfigError(
                "gradcomp: GradcompState got unknown options: %s (it takes %s)"
                % (", ".join(sorted(unknown)), ", ".join(_options.NAMES)))
        # every option of the table, in its order (test_options.py checks that the keyword
        # arguments are exactly the table's, with its defaults)
        self._options = {name: given[name] for name in _options.NAMES}
        self.process_group = process_group
        self._engine = None
        self._param_index = {}
        self._device = None
        self._make_engine()

    # -- configuration -----------------------------------------------------------------------

    @property
    def options(self):
        """The options (a copy)."""
        return dict(self._options)

    def _group(self):
        return process_group_of(self.process_group)

    def _make_engine(self):
        group = self._group()
        self._engine = _C.Engine(group, dict(self._options))
        _bound_group_timeout(group, self._options["timeout_s"])
        _open_states.add(self)

    def _live(self):
        if self._engine is None:
            raise _C.ConfigError("gradcomp: this GradcompState is closed")
        return self._engine

    def close(self):
        """Stops the engine's worker thread and lets go of the process group. Buckets still
        queued fail with ConfigError; later use of the state raises ConfigError. Idempotent.

        Called for every open state at interpreter exit (an ``atexit`` handler), so that no
        gradcomp thread is left to touch Python objects while the interpreter shuts down;
        call it yourself (before ``dist.destroy_process_group()``) to end sooner."""
        engine, self._engine = self._engine, None
        _open_states.discard(self)
        del engine  # the binding joins the worker without the GIL

    # -- statistics ---------------------------------------------------------------------------

    @property
    def iteration(self):
        """DDP iterations handled so far (plain all-reduce ones included)."""
        return self._live().iteration

    @property
    def last_stats(self):
        """Statistics of the last iteration: bytes_sent, wire_bytes, factor, gain, tensors,
        compressed_tensors, messages, compress_s, communicate_s, decode_s, total_s, sent, and
        the divergence guard's guard ("none", "skipped", "dense"), gradient_norm,
        residual_norm and loss (NaN where not measured)."""
        return self._live().last_stats()

    def report_loss(self, loss):
        """Gives this rank's loss of the coming iteration to the divergence guard (call it
        before ``backward()``; a tensor is read with ``.item()``). Optional: without it the guard
        watches the gradient and the residual only."""
        self._live().report_loss(float(loss.item() if hasattr(loss, "item") else loss))

    @property
    def totals(self):
        """Totals since the start: iterations, bytes_sent, hook_s (first bucket in to last
        future done, summed), layout_changes."""
        return self._live().totals()

    def wait(self):
        """Blocks until every bucket handed to the hook has been exchanged."""
        self._live().wait_idle()

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self):
        """Everything needed to resume: options, iteration, residuals, controller, PowerSGD
        factors (bytes in the library's checkpoint format, docs/wire-format.md)."""
        return {"version": 1, "options": dict(self._options), "engine": self._live().save()}

    def load_state_dict(self, state):
        """Restores a ``state_dict``; the options must match. A malformed or mismatched state
        raises FormatError and changes nothing."""
        if not isinstance(state, dict) or state.get("version") != 1 or "engine" not in state:
            raise _C.FormatError("gradcomp: not a GradcompState state_dict (version 1)")
        if state.get("options") != self._options:
            raise _C.FormatError(
                "gradcomp: the state_dict was saved with options %r, this state has %r"
                % (state.get("options"), self._options))
        self._live().load(state["engine"])

    def __getstate__(self):
        # Like PyTorch's PowerSGDState: the process group is not pickled; the unpickled state
        # runs on the default group (or set process_group and call load_state_dict).
        return self.state_dict()

    def __setstate__(self, state):
        self._options = dict(state["options"])
        self.process_group = None
        self._engine = None
        self._param_index = {}
        self._device = None
        self._make_engine()
        self._engine.load(state["engine"])


# What the hook does not run on CUDA buckets in this release (docs/pytorch.md, "CUDA tensors").
_NOT_ON_CUDA = ("codec", "feedback", "controller", "guard", "two_way", "PowerSGD", "start_iter",
                "state_dict")


def _check_device(state, bucket):
    """The hook's device rules: every bucket of a model on one device, and that device the CPU.
    A model with parameters on several devices, or on a CUDA device, raises ConfigError saying
    so (before anything is queued, so the engine's state is untouched)."""
    buffer = bucket.buffer()
    device = buffer.device
    for p in bucket.parameters():
        if p.device != device:
            raise _C.ConfigError(
                "gradcomp: DDP bucket %d holds parameters on %s and %s; the gradcomp hook takes a "
                "model whose parameters are all on one device" % (bucket.index(), device, p.device))
    if state._device is None:
        state._device = device
    elif device != state._device:
        raise _C.ConfigError(
            "gradcomp: the DDP model has parameters on several devices (%s and %s); the gradcomp "
            "hook takes a model whose parameters are all on one device" % (state._device, device))
    if device.type != "cpu":
        raise _C.ConfigError(
            "gradcomp: the DDP hook compresses CPU buckets; this model is on %s. On %s buckets this "
            "release runs none of the hook's options (%s): docs/pytorch.md, \"CUDA tensors\". "
            "Train the model on the CPU (gloo), or use PyTorch's own hooks for GPU buckets; "
            "gradcomp.Codec compresses CUDA tensors for an exchange of your own"
            % (device, device.type, ", ".join(_NOT_ON_CUDA)))

GradcompState.__doc__ = _options.docstring(
    """State of the gradcomp DDP hook: pass it with ``gradcomp.hook`` to
    ``DistributedDataParallel.register_comm_hook``.

    The options are those of the C++ ``pipeline_options`` (docs/pipeline.md, the same specs)
    and of the hook's engine; docs/pytorch.md describes them. An unknown option, a value of
    the wrong type (named in the message with the type it takes), a bad spec or combination
    raises ConfigError here, on every rank.""")


def _pieces(state, bucket):
    """What the engine compresses: each parameter's gradient, a view of the bucket's buffer,
    keyed by the parameter's index in order of first appearance (the same in every run of the
    model, whatever DDP's bucketing), with its matrix shape for PowerSGD (first dimension by
    the rest; 1-D tensors 1 × n)."""
    views, shapes, keys = [], [], []
    buffer = bucket.buffer()
    offset = 0
    index = state._param_index
    for p in bucket.parameters():
        n = p.numel()
        views.append(buffer.narrow(0, offset, n))
        shapes.append((p.shape[0], n // p.shape[0]) if p.dim() >= 2 and p.shape[0] > 0 else (1, n))
        keys.append(index.setdefault(id(p), len(index)))
        offset += n
    if offset != buffer.numel():
        raise _C.ConfigError("gradcomp: DDP bucket %d holds %d elements, its parameters %d"
                             % (bucket.index(), buffer.numel(), offset))
    return views, shapes, keys


def hook(state, bucket):
    """The DDP communication hook: ``ddp_model.register_comm_hook(state, gradcomp.hook)``.

    Returns a ``torch.futures.Future`` that completes with the bucket averaged over the ranks
    (in place). The exchange runs on gradcomp's worker thread; autograd goes on meanwhile.
    Buckets must be CPU tensors of a model on one device (ConfigError otherwise)."""
    state._live()
    _check_device(state, bucket)
    views, shapes, keys = _pieces(state, bucket)
    return state._live().submit(bucket.index(), bucket.buffer(), views, shapes, keys, bucket.is_last())
