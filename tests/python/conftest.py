# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
# pytest configuration of the Python package's tests: they import `gradcomp` from PYTHONPATH
# (scripts/build-python prints it; the ctest `python.pytest` sets it) and `ranks` from here.
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
