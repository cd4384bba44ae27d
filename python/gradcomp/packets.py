# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The packet path of the DDP hook: the exchange the hook runs on CUDA buckets.

It is written in torch operations and ``gradcomp.Codec`` calls only, so the same code runs on
any device the codec API takes: on a CUDA bucket every step below is a kernel on torch's current
stream of the bucket's device and the payload never leaves the device; on a CPU bucket (through
``gradcomp.ddp.packet_hook``) it runs over gloo, which is how it is tested without a GPU.

One DDP bucket is one message. For a bucket of pieces (each parameter's gradient, a view of the
bucket's buffer, keyed by the parameter's index as the CPU hook keys them):

1. each piece of at least ``min_compress_elements`` elements is compressed with
   ``Codec(codec)``: ``x = g`` (``feedback="none"``) or ``x = g + residual``
   (``feedback="residual"``, the residual a float32 tensor on the bucket's device), in float32
   for a 16-bit bucket; its packet is written into a fixed slot of this rank's region of the
   message (slot size ``max_compressed_bytes``); the smaller pieces are copied raw (the bucket's
   dtype) after the slots; a table at the front holds this rank's status and packet sizes;
2. one all-gather (``all_gather_single``; ``all_gather_into_tensor`` before torch 2.14) of the
   regions over the process group (NCCL carries the CUDA
   uint8 tensor as it is), asynchronous; the hook returns a future completed by the work's callback;
3. when it completes: the table of every rank is read (W x (P + 1) int64, the only device to
   host copy), every rank's packet of each piece is added into a float32 accumulator with
   ``Codec.decompress_add`` in rank order, as are the raw pieces, the sums are multiplied by
   1/W and written into the bucket (a 16-bit bucket rounded once);
4. error feedback: the new residual is ``x - decode(own packet)``, computed before the
   exchange and kept only when the message's exchange and decoding succeeded.

The random streams agree with the CPU pipeline's: tensor id = the piece's key, step = the count
of compressed iterations, seed = ``seed`` for shared-support codecs (random-k: every rank keeps
the same coordinates) and ``seed + rank`` for the others; a packet is decoded with its sender's
seed. A rank whose compression fails (a NaN gradient, say) still sends its region, flagged
failed, so that no peer waits for it: every rank's future then fails with that kind of error,
and no residual of that message changes.

What the packet path runs and refuses is ``check_options``'s business (docs/pytorch.md, "CUDA
tensors"): codecs of ``gradcomp.cuda_codecs`` (any ``make_codec`` codec but PowerSGD on a CPU
bucket), feedback ``none`` / ``residual``, ``seed``, ``start_iter``, ``min_compress_elements``,
``log_every``, ``timeout_s``; statistics (``last_stats``, ``totals``, ``iteration``); checkpoints
(``save`` / ``load``: the counters and the residuals, which a resumed run continues bit for bit).
"""

import sys
import threading
import time

import torch
import torch.distributed as dist

from . import _C

# Options the packet path refuses unless they have these values, with the reason given.
_REFUSED = (
    ("controller", "", "controllers (GraVAC, Accordion, ...) run in the C++ pipeline only"),
    ("guard", "off", "the divergence guard runs in the C++ pipeline only: pass guard=\"off\""),
    ("two_way", False, "two-way compression runs in the C++ pipeline only"),
    ("measure_gain", False, "measure_gain runs in the C++ pipeline only"),
)

# What the packet path does not run, for messages and docs (kept in step with check_options).
NOT_ON_PACKET_PATH = ("controller", "guard (pass guard=\"off\")", "two_way", "measure_gain",
                      "PowerSGD", "feedback other than none/residual (ef21, dgc)")

_KINDS = {1: "ConfigError", 2: "FormatError", 3: "NumericError", 4: "CommError", 5: "Error"}


def _kind_of(error):
    for code, name in _KINDS.items():
        if type(error) is getattr(_C, name):
            return code
    return 5


def _align(n, to=8):
    return (n + to - 1) // to * to


def check_options(options, device):
    """Raises ConfigError naming every option the packet path does not run on ``device`` (a
    torch.device), and what it takes instead; returns the codec."""
    problems = []
    for name, wanted, why in _REFUSED:
        if options[name] != wanted:
            problems.append("%s=%r (%s)" % (name, options[name], why))
    if options["feedback"] not in ("none", "residual"):
        problems.append("feedback=%r (the packet path keeps a plain residual: feedback \"none\" or "
                        "\"residual\"; ef21 and dgc run in the C++ pipeline only)" % options["feedback"])
    spec = options["codec"]
    codec = _C.Codec(spec)  # a bad spec: make_codec's ConfigError
    if codec.name == "powersgd":
        problems.append("codec=%r (PowerSGD runs in the C++ pipeline only)" % spec)
    elif device.type == "cuda":
        carried = [c.strip() for c in _C.cuda_codecs.split(",") if c.strip()]
        family = spec.split(":", 1)[0].strip()
        if not _C.has_cuda:
            problems.append("the package has no CUDA part (gradcomp.has_cuda is False: it was built "
                            "against a CPU-only torch or without nvcc)")
        elif family not in carried and not (family == "random_k" and "randomk" in carried):
            problems.append("codec=%r (on CUDA tensors the codecs are %s)" % (spec, _C.cuda_codecs))
    if problems:
        raise _C.ConfigError(
            "gradcomp: the DDP hook on %s buckets (its packet path, docs/pytorch.md \"CUDA tensors\") "
            "does not run: %s. It runs codec (%s), feedback none/residual, seed, start_iter, "
            "min_compress_elements, log_every, timeout_s and state_dict; it does not run %s"
            % (device, "; ".join(problems),
               _C.cuda_codecs if device.type == "cuda" else "any codec but PowerSGD",
               ", ".join(NOT_ON_PACKET_PATH)))
    return codec


def _chain(fut, fn, device):
    """A future completed with ``fn(fut)`` once ``fut`` is, or failed with what ``fn`` raised, as
    that exception (``Future.then`` would wrap it in a RuntimeError). ``fn`` runs as a ``then``
    callback does: for CUDA work, on current streams synchronized with ``fut``'s; the result
    records its tensors' events on them (``devices``), so a waiter sees the finished bucket."""
    out = torch.futures.Future(devices=[device]) if device.type == "cuda" else torch.futures.Future()

    def callback(done):
        try:
            value = fn(done)
        except BaseException as e:  # noqa: B902 - handed to the waiter
            out.set_exception(e)
            return
        out.set_result(value)

    fut.add_done_callback(callback)
    return out


def check_saved(saved):
    """``saved`` if it is a packet path's state (``PacketExchange.save``), else FormatError saying
    what is wrong with it."""
    def bad(why):
        raise _C.FormatError("gradcomp: not a packet-path state: %s" % why)

    if not isinstance(saved, dict) or set(saved) != {"iteration", "step", "residuals"}:
        bad("expected a dict of iteration, step and residuals")
    it, step, residuals = saved["iteration"], saved["step"], saved["residuals"]
    if not (isinstance(it, int) and isinstance(step, int) and 0 <= step <= it):
        bad("iteration and step must be ints with 0 <= step <= iteration")
    if not isinstance(residuals, dict):
        bad("residuals must be a dict")
    for k, r in residuals.items():
        if not isinstance(k, int) or k < 0:
            bad("a residual's key is %r, not a parameter index" % (k,))
        if not isinstance(r, torch.Tensor) or r.dtype != torch.float32 or r.dim() != 1:
            bad("the residual of parameter %d is not a 1-D float32 tensor" % k)
    return saved


def _stats_template():
    nan = float("nan")
    return {"step": 0, "sent": "candidate", "factor": 1.0, "gain": nan, "bytes_sent": 0, "wire_bytes": 0,
            "tensors": 0, "compressed_tensors": 0, "messages": 0, "compress_s": nan, "communicate_s": nan,
            "decode_s": nan, "total_s": nan, "guard": "none", "gradient_norm": nan, "residual_norm": nan,
            "loss": nan}


class PacketExchange:
    """The packet path of one GradcompState (see the module's docstring)."""

    def __init__(self, group, options, device):
        self.group = group
        self.device = device
        self.options = dict(options)
        self.codec = check_options(self.options, device)
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.feedback = self.options["feedback"] == "residual"
        self.plain = self.codec.name == "identity" and not self.feedback
        self.shared = self.codec.aggregation == "shared support"
        self.min_elements = self.options["min_compress_elements"]
        self.residuals = {}        # key -> float32 residual on the device
        self.iteration = 0         # DDP iterations (warm-up included)
        self.step = 0              # compressed iterations (the codecs' step)
        self._lock = threading.Lock()
        self._open = None          # the statistics of the iteration being exchanged
        self._started = None
        self._pending = 0          # messages of the current iteration not yet done
        self._closing = False      # the last bucket of the iteration has been handed over
        self.last = _stats_template()
        self.totals = {"iterations": 0, "bytes_sent": 0, "hook_s": 0.0, "layout_changes": 0}
        self._futures = []

    def seed_of(self, rank):
        return self.options["seed"] + (0 if self.shared else rank)

    # -- one bucket ------------------------------------------------------------------------------

    def exchange(self, index, buffer, views, keys, is_last):
        """Starts the exchange of one bucket and returns the future DDP waits for."""
        with self._lock:
            if self._open is None:
                self._open = _stats_template()
                self._open["step"] = self.iteration
                self._started = time.perf_counter()
                self._futures = []
            self._pending += 1
            self._closing = self._closing or is_last
        warm_up = self.iteration < self.options["start_iter"] or self.plain
        if is_last:
            # the counters move at hand-over, so that every bucket of the iteration has its step
            step = self.step
            self.iteration += 1
            if not warm_up:
                self.step += 1
        else:
            step = self.step
        if warm_up:
            fut = self._all_reduce(buffer)
        else:
            fut = self._compressed(buffer, views, keys, step)
        self._futures.append(fut)
        return fut

    def _all_reduce(self, buffer):
        # DDP's own arithmetic: sum, then divide by the world size.
        work = dist.all_reduce(buffer, group=self.group, async_op=True)
        nbytes = buffer.numel() * buffer.element_size()

        def done(fut):
            try:
                fut.value()
                buffer.div_(self.world)
                # a ring all-reduce sends 2 (W - 1) / W of the buffer per rank
                self._message_done(nbytes, 2 * nbytes * (self.world - 1) // self.world, nbytes, 0, True)
                return buffer
            except BaseException:
                self._message_done(0, 0, 0, 0, False)
                raise

        return _chain(work.get_future(), done, buffer.device)

    def _compressed(self, buffer, views, keys, step):
        codec, world, device = self.codec, self.world, buffer.device
        large = [(v, k) for v, k in zip(views, keys) if v.numel() >= self.min_elements]
        small = [v for v in views if v.numel() < self.min_elements]
        npk = len(large)
        table_bytes = 8 * (npk + 1)
        offsets, at = [], _align(table_bytes)
        caps = []
        for v, _ in large:
            cap = codec.max_compressed_bytes(v)
            offsets.append(at)
            caps.append(cap)
            at = _align(at + cap)
        dense_at = at
        dense_count = sum(v.numel() for v in small)
        dense_bytes = dense_count * buffer.element_size()
        region = _align(dense_at + dense_bytes)
        send = torch.zeros(region, dtype=torch.uint8, device=device)
        recv = torch.empty(world * region, dtype=torch.uint8, device=device)

        seed = self.seed_of(self.rank)
        sizes, staged, status, local_error = [], {}, 0, None
        try:
            for (v, key), off, cap in zip(large, offsets, caps):
                x = v if v.dtype == torch.float32 else v.float()
                if self.feedback:
                    r = self.residuals.get(key)
                    if r is not None and r.numel() == v.numel() and r.device == device:
                        x = x + r
                p = codec.compress(x, out=send.narrow(0, off, cap), seed=seed, step=step, id=key)
                sizes.append(p.numel())
                if self.feedback:
                    nr = x.clone() if x.data_ptr() == v.data_ptr() else x
                    codec.decompress_add(p, nr, alpha=-1.0, seed=seed, step=step)
                    staged[key] = nr
            if small:
                raw = torch.cat(small) if len(small) > 1 else small[0]
                send.narrow(0, dense_at, dense_bytes).copy_(raw.view(torch.uint8))
        except _C.Error as e:
            status, local_error, staged = _kind_of(e), e, {}
        table = torch.zeros(npk + 1, dtype=torch.int64)
        table[0] = status
        if sizes and status == 0:
            table[1:] = torch.tensor(sizes, dtype=torch.int64)
        send.narrow(0, 0, table_bytes).view(torch.int64).copy_(table.to(device))

        work = self._all_gather(recv, send)
        wire = region * (world - 1)
        dense_equiv = sum(v.numel() for v, _ in large) * buffer.element_size() + dense_bytes

        def done(fut):
            try:
                fut.value()  # the collective's own error, if any
                if device.type == "cuda":
                    # the decoding below runs on this callback's stream (synchronized with the
                    # collective's), not on the one recv was allocated on: keep its memory from
                    # being reused before that stream is done with it
                    recv.record_stream(torch.cuda.current_stream(device))
                tables = recv.view(world, region)[:, :table_bytes].cpu().contiguous().view(torch.int64)
                failed = [r for r in range(world) if int(tables[r, 0]) != 0]
                if failed:
                    if local_error is not None:
                        raise type(local_error)("%s (on rank %d; the step failed on every rank, nothing was "
                                                "committed)" % (local_error, self.rank))
                    kind = _KINDS.get(int(tables[failed[0], 0]), "Error")
                    raise getattr(_C, kind)(
                        "gradcomp: the DDP hook's step failed on rank(s) %s (a %s there; its message is on that "
                        "rank); the step failed on every rank, nothing was committed"
                        % (", ".join(map(str, failed)), kind))
                scale = 1.0 / world
                for i, (v, key) in enumerate(large):
                    acc = torch.zeros(v.numel(), dtype=torch.float32, device=device)
                    for r in range(world):
                        n = int(tables[r, i + 1])
                        if n > caps[i]:
                            raise _C.FormatError("gradcomp: rank %d declares a %d-byte packet in a %d-byte slot"
                                                 % (r, n, caps[i]))
                        codec.decompress_add(recv.narrow(0, r * region + offsets[i], n), acc, alpha=1.0,
                                             seed=self.seed_of(r), step=step)
                    acc.mul_(scale)
                    v.copy_(acc)
                if small:
                    acc = None
                    for r in range(world):
                        part = recv.narrow(0, r * region + dense_at, dense_bytes).view(buffer.dtype)
                        part = part.float()
                        acc = part.clone() if acc is None else acc.add_(part)
                    acc.mul_(scale)
                    at = 0
                    for v in small:
                        v.copy_(acc.narrow(0, at, v.numel()))
                        at += v.numel()
                sent = sum(int(tables[self.rank, i + 1]) for i in range(npk)) + dense_bytes
                with self._lock:
                    self.residuals.update(staged)
                self._message_done(sent, wire, dense_equiv, npk, True, tensors=len(views))
                return buffer
            except BaseException:
                self._message_done(0, 0, 0, 0, False)
                raise

        return _chain(work.get_future(), done, device)

    def _all_gather(self, recv, send):
        # torch 2.14 renamed all_gather_into_tensor to all_gather_single (the old name warns)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return gather(recv, send, group=self.group, async_op=True)

    def _message_done(self, sent, wire, dense_equiv, compressed, ok, tensors=0):
        with self._lock:
            s = self._open
            if s is not None:
                s["bytes_sent"] += sent
                s["wire_bytes"] += wire
                s["messages"] += 1
                s["tensors"] += tensors
                s["compressed_tensors"] += compressed
                s["_dense"] = s.get("_dense", 0) + dense_equiv
                if not ok:
                    s["_failed"] = True
            self._pending -= 1
            if self._pending > 0 or not self._closing:
                return
            # the last message of the iteration
            hook_s = time.perf_counter() - self._started
            if s is not None and s.pop("_failed", False):
                # a failed iteration counts, with empty statistics (as the C++ engine's)
                step, s = s["step"], _stats_template()
                s["step"] = step
                s["total_s"] = hook_s
            if s is not None:
                dense = s.pop("_dense", 0)
                s["factor"] = dense / s["bytes_sent"] if s["bytes_sent"] > 0 else 1.0
                s["total_s"] = hook_s
                if s["compressed_tensors"] == 0:
                    s["sent"] = "dense"
                self.last = s
                self.totals["iterations"] += 1
                self.totals["bytes_sent"] += s["bytes_sent"]
                self.totals["hook_s"] += hook_s
            self._open = None
            self._closing = False
            every = self.options["log_every"]
            if every > 0 and self.rank == 0 and s is not None and self.totals["iterations"] % every == 0:
                print("gradcomp: iteration %d (packet path, %s): %d bytes sent, factor %.1f, hook %.2f ms"
                      % (s["step"], self.device, s["bytes_sent"], s["factor"], 1e3 * hook_s), file=sys.stderr)

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self):
        """The packet path's state: counters and every residual (a CPU copy)."""
        self.wait()
        with self._lock:
            return {"iteration": self.iteration, "step": self.step,
                    "residuals": {k: r.detach().to("cpu", copy=True) for k, r in sorted(self.residuals.items())}}

    def load(self, saved):
        """Restores ``save``'s dict (checked by ``check_saved`` first: FormatError, nothing
        changed); the residuals are copied to this path's device."""
        saved = check_saved(saved)
        self.wait()
        residuals = {k: r.to(self.device, copy=True) for k, r in saved["residuals"].items()}
        with self._lock:
            self.iteration, self.step, self.residuals = saved["iteration"], saved["step"], residuals

    def wait(self):
        """Waits for every future handed out so far (their errors are DDP's to report)."""
        futures, self._futures = self._futures, []
        for f in futures:
            try:
                f.wait()
            except Exception:  # noqa: BLE001 - reported through DDP's own wait on the future
                pass
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


__all__ = ["PacketExchange", "check_options", "check_saved", "NOT_ON_PACKET_PATH"]
