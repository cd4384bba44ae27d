# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for conan.tools.build: check_min_cppstd and can_run, as Conan 2 defines them."""

from conan.errors import ConanInvalidConfiguration


def _year(cppstd):
    value = str(cppstd).replace("gnu", "")
    year = int(value)
    return year + 2000 if year < 90 else year + 1900


def check_min_cppstd(conanfile, cppstd, gnu_extensions=False):
    current = conanfile.settings.get_safe("compiler.cppstd")
    if current is None:
        return  # Conan then checks the compiler's default standard; the stub cannot.
    if _year(current) < _year(cppstd):
        raise ConanInvalidConfiguration(
            "Current cppstd (%s) is lower than the required C++ standard (%s)." % (current, cppstd))


def can_run(conanfile):
    return True
