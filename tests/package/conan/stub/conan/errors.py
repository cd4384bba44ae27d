# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for conan.errors (see conan/__init__.py)."""


class ConanException(Exception):
    pass


class ConanInvalidConfiguration(ConanException):
    pass
