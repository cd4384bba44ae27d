# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The options of ``GradcompState``: the one table of their names, types, defaults and meanings.

Everything else follows from it: the binding (``_C.Engine``) converts each option with the type
given here and takes the default given here for one it is not given; ``GradcompState``'s
docstring is generated from it (its keyword arguments are checked against it by
tests/python/test_options.py, as are docs/pytorch.md's option table and the defaults the C++
engine reports, ``_C.engine_defaults()``).

A type is one of "str", "bool", "int" (a non-negative integer), "float".
"""

import collections

Option = collections.namedtuple("Option", "name type default doc")

OPTIONS = (
    Option("codec", "str", "topk:ratio=0.01",
           "any `make_codec` spec (`fp16`, `onebit`, `qsgd:levels=15`, `randomk:ratio=0.01`, ...) "
           "or `powersgd:rank=R`"),
    Option("feedback", "str", "residual",
           "`none`, `residual` (EF-SGD), `ef21`, `dgc[:momentum=0.9,...]`; PowerSGD: `residual` or "
           "`none`"),
    Option("controller", "str", "",
           "`gravac:...`, `accordion:...`, `ef_window[:...]`, `static:factor=F`, `dense`, "
           "`schedule:...`, `dgc_warmup:stage_steps=N,...` (docs/adaptive.md); needs a sparsifier "
           "codec"),
    Option("guard", "str", "raise",
           "the divergence guard ([pipeline.md](pipeline.md#divergence-guard)): `raise`, `skip`, "
           "`dense` or `off`, optionally "
           "`:factor=F,residual_factor=R,loss_span=L,window=W,warmup=N,max_skips=S`"),
    Option("two_way", "bool", False, "BytePS-Compress two-way compression"),
    Option("seed", "int", 0, "seed of the codecs' random streams"),
    Option("start_iter", "int", 0,
           "iterations of plain all-reduce before compression starts (a warm-up)"),
    Option("batch_size", "int", 0, "samples per worker per step (GraVAC's throughput)"),
    Option("measure_gain", "bool", False, "compute the compression gain every step"),
    Option("measured_timing", "bool", True,
           "give the controller measured times; `False` makes runs reproducible bit for bit"),
    Option("min_compress_elements", "int", 4096, "smaller tensors (biases, norms) go dense"),
    Option("bucket_mb", "float", 25.0,
           "the pipeline groups packets into messages of up to this many MiB of gradient"),
    Option("log_every", "int", 0, "print a statistics line on rank 0 every N iterations"),
    Option("timeout_s", "float", 300.0,
           "longest wait for one exchange before it fails with `CommError`; a longer timeout "
           "of the process group is lowered to it (a frozen peer cannot hold the process)"),
)

NAMES = tuple(o.name for o in OPTIONS)
DEFAULTS = {o.name: o.default for o in OPTIONS}

_TYPE_WORDS = {"str": "a string", "bool": "a bool", "int": "a non-negative int", "float": "a number"}


def type_word(kind):
    """How an option's type reads in an error message ("a string", ...)."""
    return _TYPE_WORDS[kind]


def _plain(text):
    """A meaning cell of the table as plain docstring text (no Markdown links)."""
    import re
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")


def docstring(intro):
    """``intro`` followed by one paragraph per option: name (type, default) and meaning."""
    lines = [intro.rstrip(), "", "Arguments:",
             "  process_group: the process group to exchange over (default: the default group)."]
    for o in OPTIONS:
        lines.append("  %s (%s, default %r): %s." % (o.name, o.type, o.default, _plain(o.doc)))
    return "\n".join(lines) + "\n"
