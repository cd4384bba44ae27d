# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Conan test_package: builds and runs a find_package(gradcomp CONFIG) consumer; with the option
`tool` (the package is then the gradcomp-bench application), runs the program instead."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class TestPackageConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def _tool(self):
        return bool(self.dependencies["gradcomp"].options.get_safe("tool"))

    def build(self):
        if self._tool():
            return  # an application: nothing to compile against it
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        if self._tool():
            # The requirement of an application carries the run trait: conanrun puts its bin/
            # on PATH. fp16 of 4096 N(0, 1) values, no timing: a quick, deterministic row.
            self.run("gradcomp-bench --synthetic gauss --size 4096 --codec fp16 --threads 1 "
                     "--no-timing", env="conanrun")
            return
        bin_path = os.path.join(self.cpp.build.bindir, "test_package")
        self.run(bin_path, env="conanrun")
