# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The README's PyTorch usage runs as written: each `<!-- python-example: NAME -->` block is
launched as its comment says (the environment's torchrun) on 2 gloo processes; the install
block pins the torch that the project's own environment installs (python/requirements.txt) and
uses the commands scripts/test runs (`pip install .`)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.environ.get("GRADCOMP_SOURCE_DIR",
                      os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"<!-- python-example: (\S+) -->\s*```python\n(.*?)```", text, re.S)


def test_readme_has_the_ddp_example():
    names = [name for name, _ in blocks()]
    assert "ddp" in names


@pytest.mark.parametrize("name,code", blocks(), ids=lambda v: v if len(v) < 40 else "code")
def test_readme_python_example_runs(name, code, tmp_path):
    assert "register_comm_hook(state, gradcomp.hook)" in code
    script = tmp_path / (name + ".py")
    script.write_text(code)
    # as the comment says: the environment's torchrun (torch 2.x), two processes
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    assert "torchrun --standalone --nproc_per_node 2 this.py" in code
    assert os.path.exists(torchrun), torchrun
    out = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"loss (\S+), (\d+) bytes sent, (\d+)x", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) < 2.3  # it learned something
    assert int(m.group(3)) >= 50    # and sent ~1% of the gradient


def test_readme_install_block_matches_the_tested_setup():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- install: pip -->\s*```sh\n(.*?)```", text, re.S)
    assert m, "README has no install block"
    block = m.group(1)
    pinned = re.search(r"^torch==(\S+)$",
                       open(os.path.join(ROOT, "python", "requirements.txt"), encoding="utf-8").read(), re.M)
    assert pinned and "pip install torch==%s" % pinned.group(1) in block
    assert "v/bin/pip install ." in block and "import gradcomp" in block
    # the torch the suite runs with is the pinned one
    import torch
    assert torch.__version__.split("+")[0] == pinned.group(1)
