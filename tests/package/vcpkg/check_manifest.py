#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""package.vcpkg_manifest: ports/gradcomp/vcpkg.json against the manifest schema.

    check_manifest.py <vcpkg.json> <schema.json>

Uses python3-jsonschema (Debian); exits 77 (ctest: skipped) without it. Besides the schema, it
checks what a port of gradcomp needs: the host tools vcpkg-cmake and vcpkg-cmake-config, the
features mpi and cuda, and the feature tool (gradcomp-bench) with its dependency cli11. The
schema is a faithful subset written for gradcomp (see its $comment), not vcpkg's official file. A few deliberately broken manifests must be rejected, so a schema that
accepts everything cannot pass.
"""

import copy
import json
import sys

sys.dont_write_bytecode = True

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed (apt-get install python3-jsonschema); skipped")
    sys.exit(77)


def main():
    manifest_path, schema_path = sys.argv[1], sys.argv[2]
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)

    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))
    for error in errors:
        print("%s: %s: %s" % (manifest_path, "/".join(map(str, error.path)) or "(top)", error.message))
    if errors:
        return 1

    problems = []
    hosts = {d["name"] for d in manifest.get("dependencies", [])
             if isinstance(d, dict) and d.get("host")}
    for tool in ("vcpkg-cmake", "vcpkg-cmake-config"):
        if tool not in hosts:
            problems.append("dependency %s should be a host dependency" % tool)
    for feature in ("mpi", "cuda", "tool"):
        if feature not in manifest.get("features", {}):
            problems.append("feature %s is missing" % feature)
    tool_deps = manifest.get("features", {}).get("tool", {}).get("dependencies", [])
    if "cli11" not in [d if isinstance(d, str) else d.get("name") for d in tool_deps]:
        problems.append("feature tool does not depend on cli11 (gradcomp-bench parses with CLI11)")

    # The schema must reject what vcpkg rejects.
    broken = {
        "unknown field": dict(manifest, **{"homepage-url": "x"}),
        "upper-case name": dict(manifest, name="GradComp"),
        "two version fields": dict(manifest, **{"version-string": "0.1"}),
        "negative port-version": dict(manifest, **{"port-version": -1}),
        "feature without description": dict(manifest, features={"mpi": {"dependencies": ["mpi"]}}),
    }
    no_version = copy.deepcopy(manifest)
    no_version.pop("version", None)
    broken["no version field"] = no_version
    for what, candidate in broken.items():
        if validator.is_valid(candidate):
            problems.append("the schema accepts a manifest with %s" % what)
    for problem in problems:
        print("%s: %s" % (manifest_path, problem))
    if problems:
        return 1
    print("%s: valid (%s %s, features: %s)" % (manifest_path, manifest["name"], manifest["version"],
                                              ", ".join(sorted(manifest.get("features", {})))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
