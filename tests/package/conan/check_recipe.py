#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""package.conan: the Conan recipe and its test_package, exercised without the Conan client.

    check_recipe.py --source <repo> --work <scratch dir> [--cxx <compiler>] [--generator Ninja]
                    [--expected-version x.y.z]

1. conanfile.py and test_package/conanfile.py compile as Python (py_compile).
2. Both import against a stand-in for Conan's API (stub/conan) and keep Conan Center's
   header-only conventions: package_type, no_copy_source, settings, a C++20 validate(),
   package_id() that clears the settings, test_type "explicit", requires(tested_reference_str).
3. The recipe's methods run in `conan create` order (set_version, layout, validate, package_id,
   generate, build, package, package_info) with real CMake, into <work>/package, and the package
   is checked: headers, licence, the CMake config at the builddir package_info() names, nothing in
   bin/ or lib/.
4. test_package is configured, built and run with plain CMake against that package, with
   CMAKE_PREFIX_PATH set to the package's builddirs as CMakeToolchain would set it.

What the stub cannot check is listed at the end of the output.
"""

import argparse
import importlib.util
import os
import py_compile
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree


def fail(message):
    print("package.conan: " + message, file=sys.stderr)
    sys.exit(1)


def load_recipe(path, module_name):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from conan import ConanFile

    classes = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, ConanFile) and v is not ConanFile]
    if len(classes) != 1:
        fail("%s defines %d ConanFile classes, expected 1" % (path, len(classes)))
    return module, classes[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--cxx")
    parser.add_argument("--generator", default="Ninja")
    parser.add_argument("--expected-version")
    args = parser.parse_args()
    source = os.path.abspath(args.source)
    work = os.path.abspath(args.work)
    recipe_path = os.path.join(source, "conanfile.py")
    test_recipe_path = os.path.join(source, "test_package", "conanfile.py")

    # 1. Both recipes are valid Python.
    for path in (recipe_path, test_recipe_path):
        try:
            py_compile.compile(path, cfile=os.path.join(work, "pyc", os.path.basename(path) + "c"),
                               doraise=True)
        except py_compile.PyCompileError as e:
            fail("%s does not compile: %s" % (path, e))
    print("recipes compile as Python")

    # 2. Conventions.
    sys.path.insert(0, os.path.join(HERE, "stub"))
    import conan.tools.cmake as stub_cmake
    from conan.errors import ConanInvalidConfiguration

    module, Recipe = load_recipe(recipe_path, "gradcomp_conanfile")
    if not getattr(module, "required_conan_version", "").startswith(">=2"):
        fail("required_conan_version should ask for Conan 2")
    expect = {"name": "gradcomp", "package_type": "header-library", "no_copy_source": True,
              "license": "Apache-2.0"}
    for attr, value in expect.items():
        if getattr(Recipe, attr, None) != value:
            fail("%s = %r, expected %r" % (attr, getattr(Recipe, attr, None), value))
    for setting in ("os", "arch", "compiler", "build_type"):
        if setting not in Recipe.settings:
            fail("settings lack %r" % setting)
    for method in ("set_version", "layout", "package_id", "validate", "package", "package_info"):
        if not callable(getattr(Recipe, method, None)):
            fail("the recipe has no %s()" % method)

    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    stub_cmake.configure_stub(generator=args.generator, cxx=args.cxx)

    # 3. conan create's order, on the exported sources.
    export = os.path.join(work, "export")
    from conan.tools.files import copy

    recipe = Recipe()
    recipe.recipe_folder = source
    for pattern in Recipe.exports_sources:
        copy(recipe, pattern, src=source, dst=export)
    recipe.set_version()
    if args.expected_version and recipe.version != args.expected_version:
        fail("set_version() gives %s, CMake's project version is %s"
             % (recipe.version, args.expected_version))
    print("version %s" % recipe.version)
    recipe.source_folder = export  # no_copy_source: build() reads the exported sources
    recipe.build_folder = os.path.join(work, "build")
    recipe.package_folder = os.path.join(work, "package")
    recipe.layout()

    from conan import _Node

    for cppstd, ok in (("17", False), ("gnu17", False), ("20", True), ("gnu20", True), ("23", True)):
        recipe.settings = _Node(os=_Node("Linux"), compiler=_Node("gcc", cppstd=_Node(cppstd)))
        try:
            recipe.validate()
            accepted = True
        except ConanInvalidConfiguration:
            accepted = False
        if accepted != ok:
            fail("validate() %s compiler.cppstd=%s" % ("accepts" if accepted else "rejects", cppstd))
    print("validate(): rejects C++17, accepts C++20 and later")
    recipe.package_id()
    if not recipe.info.cleared:
        fail("package_id() does not clear the package id (self.info.clear())")

    recipe.generate()
    cache = getattr(recipe, "_toolchain_cache", {})
    for option in ("GRADCOMP_BUILD_TESTS", "GRADCOMP_BUILD_BENCH", "GRADCOMP_BUILD_EXAMPLES",
                   "GRADCOMP_BUILD_PYTHON"):
        if cache.get(option) is not False:
            fail("generate() should turn %s off" % option)
    recipe.build()
    recipe.package()
    recipe.package_info()

    package = recipe.package_folder
    info = recipe.cpp_info
    problems = []
    if info.properties.get("cmake_find_mode") != "none":
        problems.append("cmake_find_mode should be 'none' (the package keeps its own config)")
    if info.bindirs or info.libdirs:
        problems.append("bindirs/libdirs should be empty for a header-only package")
    configs = [d for d in info.builddirs
               if os.path.isfile(os.path.join(package, d, "gradcompConfig.cmake"))]
    if not configs:
        problems.append("no builddir holds gradcompConfig.cmake: %r" % info.builddirs)
    for d in info.includedirs:
        if not os.path.isfile(os.path.join(package, d, "gradcomp", "gradcomp.hpp")):
            problems.append("includedir %s has no gradcomp/gradcomp.hpp" % d)
    if not os.path.isfile(os.path.join(package, "licenses", "LICENSE")):
        problems.append("licenses/LICENSE is missing")
    for d in ("bin", "lib"):
        if os.path.exists(os.path.join(package, d)):
            problems.append("the package has a %s/ directory" % d)
    headers_in = sum(len(f) for _, _, f in os.walk(os.path.join(source, "include")))
    headers_out = sum(len(f) for _, _, f in os.walk(os.path.join(package, "include")))
    if headers_in != headers_out:
        problems.append("%d files under include/ in the source, %d in the package"
                        % (headers_in, headers_out))
    if problems:
        fail("package problems:\n  " + "\n  ".join(problems))
    print("package: %d headers, licence, CMake config in %s" % (headers_out, configs[0]))

    # 4. test_package, as `conan create` runs it after packaging.
    _, TestRecipe = load_recipe(test_recipe_path, "gradcomp_test_package")
    if getattr(TestRecipe, "test_type", None) != "explicit":
        fail("test_package: test_type should be 'explicit'")
    for generator in ("CMakeDeps", "CMakeToolchain"):
        if generator not in TestRecipe.generators:
            fail("test_package: generators lack %s" % generator)
    test = TestRecipe()
    test.tested_reference_str = "gradcomp/%s" % recipe.version
    test.requirements()
    if test.required != [test.tested_reference_str]:
        fail("test_package requires %r, expected [tested_reference_str]" % test.required)
    test.source_folder = os.path.join(source, "test_package")
    test.build_folder = os.path.join(work, "test_package_build")
    test.recipe_folder = test.source_folder
    test.layout()
    stub_cmake.configure_stub(prefix_path=[os.path.join(package, d) for d in info.builddirs])
    test.build()
    test.test()
    if not test.ran:
        fail("test_package's test() ran nothing")
    print("test_package built and ran against the package")
    print("not checked without the client: profiles and settings resolution, the Conan cache and "
          "export, CMakeDeps/CMakeToolchain files themselves (the stub passes CMAKE_PREFIX_PATH), "
          "hooks of conan-center-index, and `conan create` on other platforms")


if __name__ == "__main__":
    main()
