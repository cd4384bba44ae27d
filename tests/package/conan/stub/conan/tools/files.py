# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for conan.tools.files: copy, load, rmdir with Conan 2's signatures."""

import fnmatch
import os
import shutil


def load(conanfile, path, encoding="utf-8"):
    with open(path, encoding=encoding) as f:
        return f.read()


def copy(conanfile, pattern, src, dst, keep_path=True, excludes=None):
    copied = []
    for root, _, files in os.walk(src):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, src)
            if not fnmatch.fnmatch(rel, pattern):
                continue
            target = os.path.join(dst, rel if keep_path else name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(full, target)
            copied.append(target)
    return copied


def rmdir(conanfile, path):
    shutil.rmtree(path, ignore_errors=True)
