# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The hook's options are one table (gradcomp/_options.py): GradcompState's keyword arguments,
its docstring, the C++ engine's defaults and docs/pytorch.md's option table all agree with it;
what the engine does without an option is the table's default (start_iter 0: compression from
the first iteration); a value of the wrong type is a ConfigError naming the option and the type
it takes."""

import inspect
import os
import re

import pytest
import torch

import gradcomp
from gradcomp import _options
from ranks import run_ranks

ROOT = os.environ.get("GRADCOMP_SOURCE_DIR",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def test_table_is_well_formed():
    assert len(set(_options.NAMES)) == len(_options.NAMES)
    for o in _options.OPTIONS:
        assert o.type in ("str", "bool", "int", "float"), o
        expected = {"str": str, "bool": bool, "int": int, "float": float}[o.type]
        assert type(o.default) is expected, o  # noqa: E721 - bool is not an int here
        assert o.doc and not o.doc.endswith(".")


def test_state_takes_exactly_the_table_as_keyword_arguments():
    sig = inspect.signature(gradcomp.GradcompState.__init__)
    keywords = [(p.name, p.default) for p in sig.parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keywords == [(o.name, o.default) for o in _options.OPTIONS]


def test_docstring_describes_every_option():
    doc = gradcomp.GradcompState.__doc__
    for o in _options.OPTIONS:
        assert "  %s (%s, default %r): " % (o.name, o.type, o.default) in doc


def test_engine_defaults_are_the_table():
    # the C++ engine's own defaults (engine_options, pipeline_options): start_iter was 1 there
    # while ddp.py and the docs said 0
    assert gradcomp._C.engine_defaults() == _options.DEFAULTS


def _docs_rows():
    text = open(os.path.join(ROOT, "docs", "pytorch.md"), encoding="utf-8").read()
    m = re.search(r"\| option \| default \| meaning \|\n\|---\|---\|---\|\n((?:\|.*\|\n)+)", text)
    assert m, "docs/pytorch.md has no option table"
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        rows.append(cells)
    return rows


def test_docs_option_table_is_the_table():
    rows = _docs_rows()
    assert [r[0] for r in rows] == ["`%s`" % n for n in _options.NAMES]
    for (name, default, meaning), o in zip(rows, _options.OPTIONS):
        assert default == "`%s`" % ('"%s"' % o.default if o.type == "str" else repr(o.default)), name
        assert meaning == o.doc, name


def test_every_controller_is_in_the_table():
    # the controllers any_controller.hpp parses (its `name == "..."` branches)
    src = open(os.path.join(ROOT, "include", "gradcomp", "adapt", "any_controller.hpp"),
               encoding="utf-8").read()
    names = set(re.findall(r'if \(name == "(\w+)"\)', src))
    assert {"gravac", "accordion", "ef_window", "static", "schedule", "dgc_warmup", "dense"} <= names
    doc = _options.OPTIONS[_options.NAMES.index("controller")].doc
    for n in names:
        assert "`%s" % n in doc, n


# ---------------------------------------------------------------------------------------------
# behaviour: the engine without options takes the table's defaults; wrong types are named

def _engine_without_options(rank, world):
    import torch.distributed as dist
    pg = dist.distributed_c10d._get_default_group()
    engine = gradcomp._C.Engine(pg, {})  # every option from the table
    g = torch.randn(20000, generator=torch.Generator().manual_seed(rank))
    engine.submit(0, g, [], [], [], True).wait()
    return engine.last_stats()


def test_engine_default_start_iter_compresses_from_the_first_iteration():
    # start_iter 0 (the table's): the first iteration already sends top-k 1 %, not the dense
    # all-reduce of a warm-up iteration
    for stats in run_ranks(_engine_without_options, 2):
        assert stats["sent"] != "dense"
        assert stats["bytes_sent"] < 20000 * 4 / 10
        assert stats["factor"] > 10


WRONG = [
    ("codec", 3, "a string"),
    ("feedback", None, "a string"),
    ("controller", b"gravac", "a string"),
    ("guard", ["raise"], "a string"),
    ("two_way", 1, "a bool"),
    ("seed", "1", "a non-negative int"),
    ("seed", -1, "a non-negative int"),
    ("seed", 1.5, "a non-negative int"),
    ("start_iter", True, "a non-negative int"),
    ("batch_size", "64", "a non-negative int"),
    ("measure_gain", "yes", "a bool"),
    ("measured_timing", 0, "a bool"),
    ("min_compress_elements", 4096.0, "a non-negative int"),
    ("bucket_mb", "25", "a number"),
    ("log_every", [], "a non-negative int"),
    ("timeout_s", "300", "a number"),
]


def _wrong_types(rank, world):
    got = []
    for name, value, _ in WRONG:
        try:
            gradcomp.GradcompState(**{name: value})
            got.append((name, None))
        except gradcomp.ConfigError as e:
            got.append((name, str(e)))
        except Exception as e:  # noqa: BLE001 - reported: anything but ConfigError is a failure
            got.append((name, "%s: %s" % (type(e).__name__, e)))
    # numbers that are not Python's own int or float but stand for one are taken
    s = gradcomp.GradcompState(seed=torch.tensor(3).item(), bucket_mb=1, timeout_s=30)
    ok = s.options["seed"] == 3
    s.close()
    return got, ok


def test_wrong_types_name_the_option_and_the_type():
    got, ok = run_ranks(_wrong_types, 1)[0]
    assert ok
    for (name, value, word), (name2, message) in zip(WRONG, got):
        assert name == name2
        assert message is not None, "%s=%r was accepted" % (name, value)
        assert "Unable to cast" not in message, message
        assert "option '%s' must be %s" % (name, word) in message, message
