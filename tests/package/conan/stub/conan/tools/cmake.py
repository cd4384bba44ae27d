# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for conan.tools.cmake: CMake, CMakeToolchain, cmake_layout (single-config).

CMakeToolchain records its cache variables on the conanfile instead of writing
conan_toolchain.cmake; CMake.configure passes them as -D options, plus CMAKE_PREFIX_PATH from
the builddirs of the packages the check hands in (what the real toolchain file adds), and the
compiler and generator the check was given.
"""

import os
import subprocess

_options = {"generator": "Ninja", "cxx": None, "prefix_path": []}


def configure_stub(generator=None, cxx=None, prefix_path=None):
    if generator:
        _options["generator"] = generator
    if cxx:
        _options["cxx"] = cxx
    if prefix_path is not None:
        _options["prefix_path"] = list(prefix_path)


def cmake_layout(conanfile, generator=None, src_folder="."):
    conanfile.folders_src = src_folder
    conanfile.cpp.build.bindir = "."


class CMakeToolchain:
    def __init__(self, conanfile):
        self._conanfile = conanfile
        self.cache_variables = {}
        self.variables = {}

    def generate(self):
        self._conanfile._toolchain_cache = dict(self.cache_variables)


class CMakeDeps:
    def __init__(self, conanfile):
        pass

    def generate(self):
        pass


def _value(v):
    if v is True:
        return "ON"
    if v is False:
        return "OFF"
    return str(v)


class CMake:
    def __init__(self, conanfile):
        self._c = conanfile

    def configure(self, variables=None):
        c = self._c
        args = ["cmake", "-S", c.source_folder, "-B", c.build_folder, "-G", _options["generator"],
                "-DCMAKE_BUILD_TYPE=Release"]
        if _options["cxx"]:
            args.append("-DCMAKE_CXX_COMPILER=" + _options["cxx"])
        if _options["prefix_path"]:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(_options["prefix_path"]))
        cache = dict(getattr(c, "_toolchain_cache", {}))
        cache.update(variables or {})
        args += ["-D%s=%s" % (k, _value(v)) for k, v in cache.items()]
        print("+ " + " ".join(args), flush=True)
        subprocess.run(args, check=True)

    def build(self, target=None):
        args = ["cmake", "--build", self._c.build_folder]
        print("+ " + " ".join(args), flush=True)
        subprocess.run(args, check=True)

    def install(self):
        args = ["cmake", "--install", self._c.build_folder, "--prefix", self._c.package_folder]
        print("+ " + " ".join(args), flush=True)
        subprocess.run(args, check=True)
        os.makedirs(self._c.package_folder, exist_ok=True)
