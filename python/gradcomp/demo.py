# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""``gradcomp.DeMo``: Decoupled Momentum Optimization (Peng, Quesnelle, Kingma, 2024) as a
``torch.optim.Optimizer``, on the library's ``dct_sign`` codec (codec/dct_sign.hpp).

Every rank keeps its own momentum and exchanges only its fast components, every step:

    m <- beta * m + g                          this rank's momentum (never averaged)
    P  = dct_sign(m)                           chunked DCT-II, top-k per chunk, signs + one scale
    q  = decode(P)                             what the packet carries, decoded locally
    m <- m - q                                 the rest stays in the momentum (error feedback)
    Q  = (1 / W) * sum_r decode(P_r)           every rank's packet, all-gathered, in rank order
    p <- p * (1 - lr * weight_decay) - lr * sign(Q)

The ranks decode the same packets in the same order, so they apply the same update and their
parameters stay identical bit for bit. All the parameters' packets of a step travel in one
all-gather (``Communicator.all_gather_v``); ``last_stats`` says how many bytes.

Where it differs from the paper's public code (docs/pytorch.md, "DeMo"): the codec sends the
signs of the kept coefficients with one scale per tensor (not their values), and chunks the
flattened tensor in one dimension (the public code takes 64 x 64 blocks of a matrix); the
momentum adds g, not lr * g (the paper's Algorithm 1; the two differ only when lr changes).
A tensor whose size is not a multiple of ``chunk``: the codec zero-pads its last chunk, keeps
``topk`` coefficients of it too, and decodes only the tensor's own elements; the momentum keeps
exactly m - q, so nothing of it is lost.
"""

import math

import torch
import torch.distributed as dist

from . import _C


def _fail(option, message):
    raise _C.ConfigError("gradcomp.DeMo: %s %s" % (option, message))


def _check_group(group):
    lr, beta, wd = group["lr"], group["momentum_decay"], group["weight_decay"]
    chunk, topk = group["chunk"], group["topk"]
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
        _fail("lr", "must be a finite number >= 0, got %r" % (lr,))
    if not isinstance(beta, (int, float)) or not (0.0 <= beta < 1.0):
        _fail("momentum_decay", "must be in [0, 1), got %r" % (beta,))
    if not isinstance(wd, (int, float)) or not math.isfinite(wd) or wd < 0:
        _fail("weight_decay", "must be a finite number >= 0, got %r" % (wd,))
    if (not isinstance(chunk, int) or isinstance(chunk, bool) or not 2 <= chunk <= 1024
            or chunk & (chunk - 1)):
        _fail("chunk", "must be a power of two in 2..1024 (the dct_sign codec's), got %r" % (chunk,))
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= chunk:
        _fail("topk", "must be an int in 1..chunk (%r), got %r" % (chunk, topk))


class DeMo(torch.optim.Optimizer):
    """DeMo over a process group, on the library's ``dct_sign`` codec (see the module docstring).

    Arguments:
      params: the parameters (or parameter groups); CPU tensors of float32, float16 or bfloat16
        (the momentum is float32 whatever their type).
      lr: the learning rate: each step moves every element by lr (sign update) plus the decay.
      momentum_decay: beta, the decay of the local momentum (the paper's 0.999).
      chunk: elements per DCT chunk, a power of two in 2..1024 (the paper's 64).
      topk: DCT coefficients kept per chunk, 1..chunk (8 by default: the codec's
        ``dct_sign:chunk=64,k=8``; docs/pytorch.md compares it with the paper's setting).
      weight_decay: decoupled weight decay (p <- p * (1 - lr * weight_decay)), >= 0.
      process_group: the group to exchange over; default: the default group where
        torch.distributed is initialized, else none (one process: no exchange).
      timeout_s: the longest wait for one exchange before it fails with ``CommError``.

    ``lr``, ``momentum_decay``, ``chunk``, ``topk`` and ``weight_decay`` are per parameter group.
    Every rank must give gradients to the same parameters (checked every step: a mismatch is a
    ``ConfigError`` on every rank, and the step then changes nothing). Bad options raise
    ``ConfigError`` naming the option. ``state_dict`` / ``load_state_dict`` (torch's) resume bit
    for bit: the state is each parameter's momentum (float32) and step count.
    """

    def __init__(self, params, lr, momentum_decay=0.999, chunk=64, topk=8, weight_decay=0.0,
                 process_group=None, timeout_s=300.0):
        defaults = dict(lr=lr, momentum_decay=momentum_decay, chunk=chunk, topk=topk,
                        weight_decay=weight_decay)
        _check_group(defaults)
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
            _fail("timeout_s", "must be a finite number > 0, got %r" % (timeout_s,))
        self._codecs = {}
        super().__init__(params, defaults)
        self.process_group = process_group
        self.timeout_s = float(timeout_s)
        self._comm = None
        self.last_stats = {}
        self.bytes_sent = 0  # this rank's packet bytes over all steps

    # -- options -------------------------------------------------------------------------
    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_group(group)
            for p in group["params"]:
                if p.device.type != "cpu":
                    _fail("params", "must be CPU tensors (the exchange runs over the CPU "
                          "Communicator), got one on %s" % p.device)
                if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    _fail("params", "must be float32, float16 or bfloat16, got %s" % p.dtype)
        except Exception:
            self.param_groups.pop()
            raise

    @staticmethod
    def spec(chunk, topk):
        """The codec spec of a chunk and top-k: ``dct_sign:chunk=C,k=K``."""
        return "dct_sign:chunk=%d,k=%d" % (chunk, topk)

    def _codec(self, group):
        key = (group["chunk"], group["topk"])
        codec = self._codecs.get(key)
        if codec is None:
            codec = self._codecs[key] = _C.Codec(self.spec(*key))
        return codec

    def _communicator(self):
        """The Communicator of the process group; None where there is no exchange (one rank)."""
        if self._comm is None:
            group = self.process_group
            if group is None:
                if not (dist.is_available() and dist.is_initialized()):
                    return None
                group = dist.group.WORLD
            if dist.get_world_size(group) == 1:
                return None
            self._comm = _C.Communicator(group, self.timeout_s)
        return self._comm

    # -- the step ------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One DeMo step (module docstring); returns the closure's loss, if one is given. An
        error (a rank without the same gradients, a failed exchange, a non-finite momentum)
        leaves the parameters and the state as they were."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # 1. every parameter's new momentum and packet, nothing committed yet
        work = []  # (group, p, new momentum (flat), packet)
        for group in self.param_groups:
            codec = self._codec(group)
            beta = float(group["momentum_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    _fail("params", "got a sparse gradient; DeMo takes dense gradients")
                m = self.state[p].get("momentum")
                g = p.grad.detach().reshape(-1).to(torch.float32)
                new_m = g.clone() if m is None else m.reshape(-1) * beta + g
                packet = codec.compress(new_m)
                new_m -= codec.decompress(packet, torch.empty_like(new_m))
                work.append((group, p, new_m, packet))

        # 2. one all-gather of this rank's packets (checked: every rank sends the same layout)
        sizes = [int(w[3].numel()) for w in work]
        total = sum(sizes)
        local = torch.cat([w[3] for w in work]) if work else torch.empty(0, dtype=torch.uint8)
        comm = self._communicator()
        world = 1 if comm is None else comm.size
        if comm is not None:
            layout = torch.tensor([total, len(work), -total, -len(work)], dtype=torch.int64)
            comm.all_reduce(layout, "max")
            if layout[0] != total or layout[1] != len(work) or layout[2] != -total or layout[3] != -len(work):
                _fail("params", "with gradients differ between the ranks: this rank sends %d packets "
                      "of %d bytes, another %d of %d or %d of %d (give every rank's parameters "
                      "gradients, zeros where a parameter was unused)"
                      % (len(work), total, int(layout[1]), int(layout[0]), -int(layout[3]),
                         -int(layout[2])))
            gathered = comm.all_gather_v(local, [total] * world)
        else:
            gathered = local

        # 3. the mean of every rank's decoded packets, in rank order (the same on every rank)
        updates = []
        offset = 0
        for (group, p, new_m, packet), size in zip(work, sizes):
            codec = self._codec(group)
            mean = torch.zeros_like(new_m)
            for r in range(world):
                start = r * total + offset
                codec.decompress_add(gathered[start:start + size], mean, 1.0 / world)
            updates.append(torch.sign(mean))
            offset += size

        # 4. commit
        for (group, p, new_m, _), direction in zip(work, updates):
            state = self.state[p]
            state["momentum"] = new_m.reshape(p.shape)
            state["step"] = state.get("step", 0) + 1
            lr, wd = float(group["lr"]), float(group["weight_decay"])
            if wd != 0.0:
                p.mul_(1.0 - lr * wd)
            p.add_(direction.reshape(p.shape).to(p.dtype), alpha=-lr)
        elements = sum(w[1].numel() for w in work)
        self.bytes_sent += total
        self.last_stats = {
            "packet_bytes": total,  # what this rank sends: its packets (headers included)
            "received_bytes": total * (world - 1),  # the other ranks' packets
            "dense_bytes": 4 * elements,  # the same gradients as float32
            "ratio": (4.0 * elements / total) if total else 0.0,
            "tensors": len(work),
            "elements": elements,
            "world": world,
        }
        return loss

    # -- state ---------------------------------------------------------------------------
    def load_state_dict(self, state_dict):
        """torch's ``load_state_dict``, keeping the momenta float32 (torch casts a state tensor
        to its parameter's dtype, which would round a float16 or bfloat16 model's momenta)."""
        saved = {}
        for key, value in state_dict.get("state", {}).items():
            m = value.get("momentum") if isinstance(value, dict) else None
            if m is not None:
                saved[key] = m.detach().to(torch.float32).clone()
        ids = [i for g in state_dict.get("param_groups", []) for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for key, m in saved.items():
            if key in ids and ids.index(key) < len(params) and m.shape != params[ids.index(key)].shape:
                raise _C.FormatError("gradcomp.DeMo: the saved momentum of parameter %r has shape %s, "
                                     "the parameter %s" % (key, tuple(m.shape),
                                                           tuple(params[ids.index(key)].shape)))
        for group in state_dict.get("param_groups", []):
            _check_group({**self.defaults, **group})
        super().load_state_dict(state_dict)
        for key, m in saved.items():
            self.state[params[ids.index(key)]]["momentum"] = m
