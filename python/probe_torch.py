# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""What python/CMakeLists.txt needs to know of the torch it builds against, one `key=value` a
line: torch's version, its CMake prefix (torch.utils.cmake_prefix_path), its directory, whether
it is a CUDA build and with which CUDA, its C++ ABI, and the interpreter's include directory and
extension suffix. Exits 1 with a one-line reason when torch cannot be imported.

CMake runs it with PYTHONPATH and PYTHONNOUSERSITE unset: under pip's build isolation those hide
the target environment's site-packages, and the package must be built against the torch it will
be imported with, not against one installed into the isolated build environment."""

import os
import sys
import sysconfig


def main():
    try:
        import torch
        import torch.utils
    except Exception as e:  # any import failure is a reason to refuse the build
        print("cannot import torch with %s: %s" % (sys.executable, e), file=sys.stderr)
        return 1
    cuda = torch.version.cuda or ""
    out = {
        "version": torch.__version__.split("+")[0],
        "full_version": torch.__version__,
        "cmake_prefix_path": torch.utils.cmake_prefix_path,
        "dir": os.path.dirname(torch.__file__),
        "cuda": cuda,
        "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "python_include": sysconfig.get_paths()["include"],
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX") or ".so",
        "python_version": "%d.%d" % sys.version_info[:2],
    }
    # torch < 2.9 (pybind11 2.x): the ABI tags of its pybind11 internals; empty from 2.9 on.
    tags = [getattr(torch._C, "_PYBIND11_" + t, None) for t in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")]
    out["pybind11_abi"] = ",".join(tags) if all(tags) else ""
    for k, v in out.items():
        print("%s=%s" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
