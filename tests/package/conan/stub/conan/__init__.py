# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""A stand-in for the parts of Conan 2's Python API that gradcomp's recipes use.

Not Conan: just enough for tests/package/conan/check_recipe.py to import conanfile.py and
test_package/conanfile.py and replay their methods in the order `conan create` calls them, with
real file operations and real CMake runs. Where the real client would do more (profiles, the
cache, CMakeDeps files), the stub does the part that matters for a header-only package and the
check says what it skipped.
"""


class _Node:
    """Attribute bag: settings.compiler.cppstd and the like; missing attributes are None."""

    def __init__(self, value=None, **children):
        self._value = value
        for key, child in children.items():
            setattr(self, key, child)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def __eq__(self, other):
        return self._value == other

    def __hash__(self):
        return hash(self._value)

    def __str__(self):
        return str(self._value)

    def __contains__(self, item):
        return False

    def get_safe(self, path):
        node = self
        for key in path.split("."):
            node = getattr(node, key)
            if node is None:
                return None
        return node._value if isinstance(node, _Node) else node


class _Info:
    def __init__(self):
        self.cleared = False

    def clear(self):
        self.cleared = True


class _CppInfo:
    def __init__(self):
        self.includedirs = ["include"]
        self.libdirs = ["lib"]
        self.bindirs = ["bin"]
        self.builddirs = []
        self.system_libs = []
        self.libs = []
        self.defines = []
        self.cxxflags = []
        self.properties = {}

    def set_property(self, name, value):
        self.properties[name] = value

    def get_property(self, name):
        return self.properties.get(name)


class _CppLayout:
    def __init__(self):
        self.build = _Node()
        self.source = _Node()


class ConanFile:
    name = None
    version = None
    settings = ()
    generators = ()

    def __init__(self):
        self.recipe_folder = None
        self.source_folder = None
        self.build_folder = None
        self.package_folder = None
        self.generators_folder = None
        self.settings = _Node()
        self.info = _Info()
        self.cpp_info = _CppInfo()
        self.cpp = _CppLayout()
        self.conf = {}
        self.tested_reference_str = None
        self.required = []
        self.ran = []
        self.output = _Output()

    def requires(self, reference, **kwargs):
        self.required.append(reference)

    def run(self, command, env=None, cwd=None):
        import subprocess

        self.ran.append(command)
        subprocess.run(command, shell=True, check=True, cwd=cwd or self.build_folder)


class _Output:
    def info(self, text):
        print(text)

    warning = info
    success = info
