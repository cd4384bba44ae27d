#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""package.versions: every place that states gradcomp's version agrees.

    check_versions.py --source <repo> --cmake-version x.y.z [--pc <installed gradcomp.pc>]

The library version is written once, in include/gradcomp/version.hpp; CMake reads it from there
(--cmake-version is the project version CMake ended up with), the Conan recipe's set_version()
reads it too (no literal version in conanfile.py; package.conan runs the real client), and the
vcpkg manifest, the installed gradcomp.pc and CHANGELOG.md's latest release must repeat it. The wire-format version
(core/wire.hpp) must be the one docs/wire-format.md documents and the one the changelog entry of
that release names. Policy: docs/packaging.md, "Versions".
"""

import argparse
import json
import os
import re
import sys

sys.dont_write_bytecode = True


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--cmake-version", required=True)
    parser.add_argument("--pc")
    args = parser.parse_args()
    src = os.path.abspath(args.source)
    problems = []

    header = read(os.path.join(src, "include", "gradcomp", "version.hpp"))
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define GRADCOMP_VERSION_%s +(\d+) *$" % part, header, re.M)
        if not m:
            print("version.hpp: no GRADCOMP_VERSION_%s line" % part)
            return 1
        parts.append(m.group(1))
    version = ".".join(parts)
    found = {"version.hpp": version, "CMake project()": args.cmake_version}

    # The recipe has no version of its own: set_version() reads version.hpp (package.conan checks
    # what the real client makes of it with `conan inspect`); a literal one would drift.
    recipe = read(os.path.join(src, "conanfile.py"))
    if re.search(r"^    version *=", recipe, re.M):
        problems.append("conanfile.py sets a literal version; set_version() reads version.hpp")
    if "version.hpp" not in recipe:
        problems.append("conanfile.py's set_version() does not read version.hpp")

    found["ports/gradcomp/vcpkg.json"] = json.loads(
        read(os.path.join(src, "ports", "gradcomp", "vcpkg.json")))["version"]

    if args.pc:
        m = re.search(r"^Version: *(\S+)", read(args.pc), re.M)
        found["installed gradcomp.pc"] = m.group(1) if m else "(none)"

    changelog = read(os.path.join(src, "CHANGELOG.md"))
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\][^\n]*$", changelog, re.M)
    found["CHANGELOG.md latest release"] = releases[0] if releases else "(none)"

    for where, value in found.items():
        if value != version:
            problems.append("%s says %s, version.hpp says %s" % (where, value, version))

    wire = re.search(r"wire_version = (\d+);", read(os.path.join(src, "include", "gradcomp", "core", "wire.hpp")))
    doc = re.search(r"^# Wire format, version (\d+)", read(os.path.join(src, "docs", "wire-format.md")), re.M)
    if not wire or not doc:
        problems.append("cannot find wire_version in core/wire.hpp or the title of docs/wire-format.md")
    else:
        if wire.group(1) != doc.group(1):
            problems.append("core/wire.hpp has wire_version %s, docs/wire-format.md documents %s"
                            % (wire.group(1), doc.group(1)))
        entry = re.search(r"^## \[%s\][^\n]*\n(.*?)(?=^## |\Z)" % re.escape(version), changelog,
                          re.M | re.S)
        if not entry or not re.search(r"[Ww]ire format version %s\b" % wire.group(1), entry.group(1)):
            problems.append("CHANGELOG.md's entry for %s does not name wire format version %s"
                            % (version, wire.group(1)))

    for problem in problems:
        print("package.versions: " + problem)
    if problems:
        return 1
    print("gradcomp %s everywhere (%s); wire format version %s"
          % (version, ", ".join(found), wire.group(1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
