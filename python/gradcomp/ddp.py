# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp's DistributedDataParallel communication hook.

``GradcompState`` holds the configuration and the C++ engine (a ``gradient_pipeline`` over the
process group, on a worker thread); ``hook`` hands each DDP bucket to it and returns the future
DDP waits for. One DDP iteration is one pipeline step: buckets are compressed as they arrive
(overlapping the backward pass); the last bucket of the iteration starts the exchange, and every
bucket's future then completes with its average (the hook divides by the world size, as DDP's
contract asks), or fails on every rank with the step's error.

CUDA buckets take the packet path instead (gradcomp/packets.py): each bucket is compressed on
its device with ``gradcomp.Codec``, the packets are all-gathered over the process group (NCCL),
decoded and averaged on the device, with the residuals of error feedback on the device too.
``packet_hook`` runs that path on CPU buckets as well (over gloo), which is how it is tested
without a GPU.
"""

import atexit
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C, _options
from .packets import PacketExchange, check_saved

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


def _bound_group_timeout(group, timeout_s, device=None):
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
        current = group._get_backend(device or torch.device("cpu")).options._timeout
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
        self._path = None      # "engine" (the C++ pipeline) or "packets", fixed by the first bucket
        self._packets = None   # the PacketExchange of the packet path
        self._pending_packets = None  # a packet-path state_dict loaded before its first bucket
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
        self._packets = None
        _open_states.discard(self)
        del engine  # the binding joins the worker without the GIL

    # -- statistics ---------------------------------------------------------------------------

    @property
    def iteration(self):
        """DDP iterations handled so far (plain all-reduce ones included)."""
        engine = self._live()
        if self._packets is not None:
            return self._packets.iteration
        if self._pending_packets is not None:
            return self._pending_packets["iteration"]
        return engine.iteration

    @property
    def last_stats(self):
        """Statistics of the last iteration: bytes_sent, wire_bytes, factor, gain, tensors,
        compressed_tensors, messages, compress_s, communicate_s, decode_s, total_s, sent, and
        the divergence guard's guard ("none", "skipped", "dense"), gradient_norm,
        residual_norm and loss (NaN where not measured). On the packet path (CUDA buckets) the
        times other than total_s, the gain and the norms are not measured (NaN); wire_bytes is what
        the all-gathers of the padded messages send."""
        engine = self._live()
        return dict(self._packets.last) if self._packets is not None else engine.last_stats()

    def report_loss(self, loss):
        """Gives this rank's loss of the coming iteration to the divergence guard (call it
        before ``backward()``; a tensor is read with ``.item()``). Optional: without it the guard
        watches the gradient and the residual only."""
        value = float(loss.item() if hasattr(loss, "item") else loss)
        engine = self._live()
        if self._packets is None:  # the packet path has no guard (guard="off"): nothing to do
            engine.report_loss(value)

    @property
    def totals(self):
        """Totals since the start: iterations, bytes_sent, hook_s (first bucket in to last
        future done, summed), layout_changes."""
        engine = self._live()
        return dict(self._packets.totals) if self._packets is not None else engine.totals()

    def wait(self):
        """Blocks until every bucket handed to the hook has been exchanged."""
        engine = self._live()
        if self._packets is not None:
            self._packets.wait()
        else:
            engine.wait_idle()

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self):
        """Everything needed to resume: options, iteration, residuals, controller, PowerSGD
        factors (bytes in the library's checkpoint format, docs/wire-format.md). On the packet
        path (CUDA buckets): its counters and residuals (CPU tensors) under "packets"."""
        engine = self._live()
        if self._path == "packets":
            return {"version": 1, "options": dict(self._options), "packets": self._packets.save()}
        if self._pending_packets is not None:
            return {"version": 1, "options": dict(self._options), "packets": self._pending_packets}
        return {"version": 1, "options": dict(self._options), "engine": engine.save()}

    def load_state_dict(self, state):
        """Restores a ``state_dict``; the options must match. A malformed or mismatched state
        raises FormatError and changes nothing; a state of the other path (the C++ engine's
        into a state that runs the packet path, or the reverse) raises ConfigError."""
        if not isinstance(state, dict) or state.get("version") != 1 or ("engine" in state) == ("packets" in state):
            raise _C.FormatError("gradcomp: not a GradcompState state_dict (version 1)")
        engine = self._live()
        if state.get("options") != self._options:
            raise _C.FormatError(
                "gradcomp: the state_dict was saved with options %r, this state has %r"
                % (state.get("options"), self._options))
        if "packets" in state:
            saved = check_saved(state["packets"])
            if self._path == "engine":
                raise _C.ConfigError(
                    "gradcomp: load_state_dict: the state_dict is the packet path's (CUDA buckets, "
                    "packet_hook), this state runs the C++ engine (CPU buckets through gradcomp.hook)")
            if self._packets is not None:
                self._packets.load(saved)
            else:
                self._pending_packets = saved  # taken by the packet path at its first bucket
            return
        if self._path == "packets":
            raise _C.ConfigError(
                "gradcomp: load_state_dict: the state_dict is the C++ engine's (CPU buckets through "
                "gradcomp.hook), this state runs the packet path (CUDA buckets, packet_hook)")
        engine.load(state["engine"])
        self._pending_packets = None

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
        self._path = None
        self._packets = None
        self._pending_packets = None
        self._make_engine()
        if "packets" in state:
            self._pending_packets = check_saved(state["packets"])
        else:
            self._engine.load(state["engine"])



def _check_device(state, bucket, path):
    """The hook's device rules: every bucket of a model on one device (a bucket that mixes
    devices, or a model with buckets on two devices, raises ConfigError naming both), on the CPU
    or a CUDA device (any other device raises ConfigError), and one path per state ("engine":
    CPU buckets through the C++ pipeline; "packets": the packet path). Checked before anything is
    queued, so a refused bucket leaves the state as it was."""
    buffer = bucket.buffer()
    device = buffer.device
    for p in bucket.parameters():
        if p.device != device:
            raise _C.ConfigError(
                "gradcomp: DDP bucket %d holds parameters on %s and %s; the gradcomp hook takes a "
                "model whose parameters are all on one device" % (bucket.index(), device, p.device))
    if state._device is not None and device != state._device:
        raise _C.ConfigError(
            "gradcomp: the DDP model has parameters on several devices (%s and %s); the gradcomp "
            "hook takes a model whose parameters are all on one device" % (state._device, device))
    if device.type not in ("cpu", "cuda"):
        raise _C.ConfigError(
            "gradcomp: the DDP hook takes CPU buckets (the C++ pipeline) and CUDA buckets (the packet "
            "path: docs/pytorch.md, \"CUDA tensors\"); this model is on %s" % device)
    if state._path is not None and path != state._path:
        raise _C.ConfigError(
            "gradcomp: this GradcompState runs the %s; one state takes one path (gradcomp.hook on CPU "
            "buckets: the C++ pipeline; on CUDA buckets, or through gradcomp.ddp.packet_hook: the "
            "packet path): make a state for each" % (
                "C++ pipeline" if state._path == "engine" else "packet path"))
    if path == "engine" and state._pending_packets is not None:
        raise _C.ConfigError(
            "gradcomp: this GradcompState holds a packet-path state_dict (CUDA buckets, packet_hook) "
            "from load_state_dict; the C++ engine (CPU buckets through gradcomp.hook) cannot take it "
            "over: use a fresh state")
    if path == "packets" and state._packets is None:
        if state._live().iteration > 0:
            # a state_dict loaded into the C++ engine (residuals, iteration) would be dropped
            raise _C.ConfigError(
                "gradcomp: this GradcompState holds the C++ engine's state of %d iterations (from "
                "load_state_dict); the packet path (CUDA buckets, packet_hook) cannot take it over: "
                "use a fresh state" % state._live().iteration)
        # the options are checked against the packet path here (ConfigError listing what it
        # does not run), before the state takes the device or the path
        packets = PacketExchange(state._group(), state._options, device)
        if state._pending_packets is not None:
            packets.load(state._pending_packets)
            state._pending_packets = None
        state._packets = packets
        if device.type != "cpu":
            _bound_group_timeout(state._group(), state._options["timeout_s"], device)
    state._device = device
    state._path = path


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
    (in place). CPU buckets go through the C++ pipeline, on gradcomp's worker thread (autograd
    goes on meanwhile); CUDA buckets through the packet path (gradcomp/packets.py: compressed,
    exchanged and decoded on the bucket's device, on torch's current stream), which runs the
    options ``packets.check_options`` allows and refuses the others with ConfigError. A model
    on one device only (ConfigError otherwise)."""
    state._live()
    if bucket.buffer().device.type == "cuda":
        return packet_hook(state, bucket)
    _check_device(state, bucket, "engine")
    views, shapes, keys = _pieces(state, bucket)
    return state._live().submit(bucket.index(), bucket.buffer(), views, shapes, keys, bucket.is_last())


def packet_hook(state, bucket):
    """The packet path as a DDP communication hook, on buckets of any device the codec API
    takes: what ``hook`` runs on CUDA buckets, here on CPU buckets too (over gloo), to compare
    it with the C++ pipeline or to test it without a GPU. Same options, refusals and future as
    ``hook`` on CUDA buckets."""
    state._live()
    _check_device(state, bucket, "packets")
    views, _, keys = _pieces(state, bucket)
    return state._packets.exchange(bucket.index(), bucket.buffer(), views, keys, bucket.is_last())
