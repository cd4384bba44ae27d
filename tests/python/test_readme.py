# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The README's PyTorch usage runs as written: each `<!-- python-example: NAME -->` block is
launched as its comment says (gradcomp.launch, the environment torchrun sets) on 2 gloo
processes."""

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
    out = subprocess.run([sys.executable, "-m", "gradcomp.launch", "-n", "2", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"loss (\S+), (\d+) bytes sent, (\d+)x", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) < 2.3  # it learned something
    assert int(m.group(3)) >= 50    # and sent ~1% of the gradient
