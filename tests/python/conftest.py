# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
# pytest configuration of the Python package's tests: they import `gradcomp` as installed for
# the interpreter (scripts/test: `pip install .` into build/venv) or from PYTHONPATH (a CMake
# build with GRADCOMP_BUILD_PYTHON=ON), and `ranks` from here.
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
