# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""``gradcomp.OneBitAdam``: the library's calibrated 1-bit Adam (include/gradcomp/optim/
calibrated_onebit_adam.hpp) as a ``torch.optim.Optimizer`` over a process group.

Every step is synchronous: each rank keeps its own exact Adam momentum and sends it through the
library's two-way compressed all-reduce (the ``codec``, ``onebit`` by default, with worker and
server error feedback); the second moment is factored (row and column statistics for a matrix)
and averaged over the ranks at the steps of the ``sync_first`` / ``sync_every`` schedule, and
calibrated to the mean gradient by a count sketch of ``sketch`` buckets. The header's comment
says why each piece is there, and docs/training.md what it measured. The C++ optimizer does the
work (one per parameter, over ``gc::c10d_communicator``); this class gives it torch's interface.
"""

import math

import torch
import torch.distributed as dist

from . import _C

_DEFAULTS = _C.calibrated_onebit_adam_defaults()
_FLOATS = ("lr", "beta1", "beta2", "eps", "weight_decay")
_INTS = ("sync_first", "sync_every", "sketch", "sketch_first", "seed")
_NAMES = ("codec", "decay") + _FLOATS + _INTS


def _fail(option, message):
    raise _C.ConfigError("gradcomp.OneBitAdam: %s %s" % (option, message))


def _options(group):
    """The C++ options of a parameter group (checked: types here, ranges by the C++ code)."""
    for name in _FLOATS:
        v = group[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _fail(name, "must be a finite number, got %r" % (v,))
    for name in _INTS:
        v = group[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
            _fail(name, "must be an int >= 0, got %r" % (v,))
    if group["decay"] not in ("l2", "decoupled"):
        _fail("decay", "must be 'l2' (Adam) or 'decoupled' (AdamW), got %r" % (group["decay"],))
    if not isinstance(group["codec"], str):
        _fail("codec", "must be a codec spec (a string), got %r" % (group["codec"],))
    options = {name: group[name] for name in _NAMES if name != "codec"}
    for name in _FLOATS:
        options[name] = float(options[name])
    try:
        _C.check_calibrated_onebit_adam(group["codec"], options)
    except _C.ConfigError as e:
        raise _C.ConfigError("gradcomp.OneBitAdam: %s" % e) from None
    return options


def _rows(p):
    """Rows of a parameter's factored second moment: its first dimension (0 for a vector)."""
    return int(p.shape[0]) if p.dim() >= 2 else 0


class OneBitAdam(torch.optim.Optimizer):
    """The library's calibrated 1-bit Adam over a process group (see the module docstring).

    Arguments (the C++ names and defaults of ``calibrated_onebit_adam_options``):
      params: the parameters (or parameter groups): contiguous float32 CPU tensors. A matrix's
        second moment is factored over its first dimension (rows) and the rest (columns).
      lr, beta1, beta2, eps, weight_decay: Adam's (lr 1e-3, 0.9, 0.999, 1e-8, 0).
      decay: ``"l2"`` (Adam: wd * x joins the gradient) or ``"decoupled"`` (AdamW).
      sync_first, sync_every: the ranks average their second-moment statistics at every step
        t <= sync_first, then every sync_every steps (4 and 4; sync_every 0: never again).
      sketch, sketch_first: buckets of the count sketch that calibrates v to the mean gradient
        (64, and 1024 at the steps t <= sync_first; sketch 0: no calibration).
      seed: of the sketch's signs (and of the codec's random stream); the same on every rank.
      codec: the spec of the momentum's two-way compressed all-reduce (``onebit``;
        ``identity`` sends float32, which makes it Adam with a factored second moment).
      process_group: default: the default group (torch.distributed must be initialized; one
        process: a 1-rank gloo group).
      timeout_s: the longest wait for one exchange before it fails with ``CommError``.

    Every option is per parameter group; only ``lr`` may change after the first step (the
    learning-rate schedulers' way), another change raises ``ConfigError``. A parameter without
    a gradient steps with a zero gradient (every rank must step every parameter). Bad options
    raise ``ConfigError`` naming the option. A non-finite gradient on any rank raises
    ``NumericError`` on every rank and the step changes nothing; a failed exchange
    (``CommError``) can leave the parameters stepped up to the one whose exchange failed (the
    process group is unusable then anyway). ``state_dict`` holds each parameter's C++ state
    (``save``: "GCCA" v2, a uint8 tensor under ``"calibrated_onebit_adam"``);
    ``load_state_dict`` restores it, and a resumed run matches an uninterrupted one bit for bit.
    ``last_stats``: this step's bytes (``packet_bytes``: what this rank sends, ``wire_bytes``:
    its modeled ring traffic, ``dense_bytes``: float32 gradients); ``bytes_sent``: the sum of
    ``packet_bytes`` over the steps.
    """

    def __init__(self, params, lr=_DEFAULTS["lr"], beta1=_DEFAULTS["beta1"], beta2=_DEFAULTS["beta2"],
                 eps=_DEFAULTS["eps"], weight_decay=_DEFAULTS["weight_decay"], decay=_DEFAULTS["decay"],
                 sync_first=_DEFAULTS["sync_first"], sync_every=_DEFAULTS["sync_every"],
                 sketch=_DEFAULTS["sketch"], sketch_first=_DEFAULTS["sketch_first"], seed=_DEFAULTS["seed"],
                 codec=_DEFAULTS["codec"], process_group=None, timeout_s=300.0):
        defaults = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, decay=decay,
                        sync_first=sync_first, sync_every=sync_every, sketch=sketch,
                        sketch_first=sketch_first, seed=seed, codec=codec)
        _options(defaults)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                math.isfinite(timeout_s) and timeout_s > 0):
            _fail("timeout_s", "must be a finite number > 0, got %r" % (timeout_s,))
        super().__init__(params, defaults)
        self.process_group = process_group
        self.timeout_s = float(timeout_s)
        self._engine = None
        self._built = None  # per parameter: the options its C++ optimizer was made with
        self.last_stats = {}
        self.bytes_sent = 0

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            if self._engine_made():
                _fail("params", "cannot grow after the first step (every rank's optimizers are made then)")
            _options(group)
            for p in group["params"]:
                if p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous():
                    _fail("params", "must be contiguous float32 CPU tensors, got a %s tensor on %s%s"
                          % (p.dtype, p.device, "" if p.is_contiguous() else ", not contiguous"))
        except Exception:
            self.param_groups.pop()
            raise

    def _engine_made(self):
        return getattr(self, "_engine", None) is not None

    def _params(self):
        return [(g, p) for g in self.param_groups for p in g["params"]]

    def _make_engine(self):
        """A new C++ engine with an optimizer per parameter, from the groups' options."""
        group = self.process_group
        if group is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise _C.ConfigError(
                    "gradcomp.OneBitAdam: torch.distributed is not initialized; pass process_group= or call "
                    "dist.init_process_group first (one process: a 1-rank gloo group)")
            group = dist.group.WORLD
        engine = _C.CalibratedOnebitAdamGroup(group, self.timeout_s)
        built = []
        for g, p in self._params():
            options = _options(g)
            engine.add(g["codec"], options, _rows(p))
            built.append(dict(options, codec=g["codec"]))
        return engine, built

    def _check_unchanged(self):
        for (g, _), made in zip(self._params(), self._built):
            for name, value in made.items():
                if name != "lr" and g[name] != value:
                    _fail(name, "changed from %r to %r after the first step; only lr may change" % (value, g[name]))

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter (a collective: every rank calls it). Returns the
        closure's loss, if one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._engine is None:
            self._engine, self._built = self._make_engine()
        self._check_unchanged()
        pairs = self._params()
        grads = []
        for _, p in pairs:
            if p.grad is None:
                grads.append(torch.zeros_like(p))
            elif p.grad.is_sparse:
                _fail("params", "got a sparse gradient; OneBitAdam takes dense gradients")
            else:
                grads.append(p.grad.detach().to(torch.float32).contiguous())
        lrs = [float(g["lr"]) for g, _ in pairs]
        stats = self._engine.step([p.detach() for _, p in pairs], grads, lrs)
        for i, (_, p) in enumerate(pairs):
            self.state[p]["step"] = self._engine.steps(i)
        stats["ratio"] = stats["dense_bytes"] / stats["packet_bytes"] if stats["packet_bytes"] else 0.0
        self.last_stats = stats
        self.bytes_sent += stats["packet_bytes"]
        return loss

    def calibration(self, param):
        """rho, the calibration of the parameter's second moment (1 before the first step)."""
        for i, (_, p) in enumerate(self._params()):
            if p is param:
                return self._engine.calibration(i) if self._engine is not None else 1.0
        raise _C.ConfigError("gradcomp.OneBitAdam: not one of this optimizer's parameters")

    def state_dict(self):
        """torch's state_dict; each parameter's state holds its C++ optimizer's ``save``."""
        if self._engine is not None:
            for i, (_, p) in enumerate(self._params()):
                blob = bytearray(self._engine.save(i))
                self.state[p]["calibrated_onebit_adam"] = torch.frombuffer(blob, dtype=torch.uint8)
                self.state[p]["step"] = self._engine.steps(i)
        return super().state_dict()

    def load_state_dict(self, state_dict):
        """torch's load_state_dict, then each parameter's C++ state; a state that does not fit
        (other options, sizes, a damaged blob) raises ``FormatError`` or ``ConfigError`` and
        changes nothing."""
        groups = state_dict.get("param_groups", [])
        ids = [i for g in groups for i in g["params"]]
        pairs = self._params()
        if len(groups) != len(self.param_groups) or len(ids) != len(pairs):
            raise _C.FormatError("gradcomp.OneBitAdam: the state_dict has %d groups of %d parameters, this "
                                 "optimizer %d of %d" % (len(groups), len(ids), len(self.param_groups), len(pairs)))
        for g in groups:
            _options({**self.defaults, **g})
        blobs = []
        for key in ids:
            s = state_dict.get("state", {}).get(key, {})
            blob = s.get("calibrated_onebit_adam") if isinstance(s, dict) else None
            blobs.append(None if blob is None else bytes(blob.detach().cpu().to(torch.uint8).numpy().tobytes()))
        if any(b is None for b in blobs) and not all(b is None for b in blobs):
            raise _C.FormatError("gradcomp.OneBitAdam: the state_dict has the C++ state of some parameters only")
        saved_groups = self.param_groups
        # the groups' options as saved, to make the new engine with (restored if anything fails)
        self.param_groups = [dict(g, **{k: v for k, v in sg.items() if k != "params"})
                             for g, sg in zip(self.param_groups, groups)]
        try:
            engine, built = (None, None)
            if blobs and blobs[0] is not None:
                engine, built = self._make_engine()
                for i, b in enumerate(blobs):
                    engine.load(i, b)
        finally:
            self.param_groups = saved_groups
        super().load_state_dict(state_dict)
        self._engine, self._built = engine, built
