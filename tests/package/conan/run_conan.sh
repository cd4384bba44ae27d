#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# run_conan.sh --source <repo> --work <scratch> --expected-version x.y.z [--conan <conan>]
#              [--cxx <compiler>] [--registry <dist/conan of scripts/release>]
#
# package.conan: the recipe through the real Conan 2 client, as a user runs it. Conan comes
# from PyPI: python/requirements.txt pins it, and without --conan the project's virtual
# environment (gradcomp_venv, scripts/lib/common.sh: build/venv, made once and stamped) provides
# it. Everything Conan writes stays under <scratch>: CONAN_HOME=<scratch>/conan-home, a fresh
# one each run, so ~/.conan2 plays no part. The default remote is removed first: nothing may
# come from ConanCenter, the package has no requirements, and the CMake tool requirement only
# applies where the build machine's cmake is older than 3.23.
#
#   1. conan profile detect               the profile a user gets (GCC 12: compiler.cppstd=gnu17)
#   2. conan inspect                      Conan Center's header-only attributes
#   3. conan create <copy of the recipe>  with that profile, no -s: package, then test_package/
#                                         built through CMakeDeps + CMakeToolchain and run
#   4. the package in the cache           headers, CMake package, licence; no lib/ or bin/
#   5. conan create -s compiler.version=11  refused by validate() (compiler minimum)
#   6. conan export                       the recipe and its sources in the cache
#   7. with --registry: conan create <registry>/all --version x.y.z, the recipe as a registry
#      holds it (no exports_sources): source() downloads the release archive of its
#      conandata.yml (package.release: a file:// URL) and Conan checks its SHA-256
#
# The recipe is copied (with what exports_sources names and test_package/) into <scratch>/src,
# so test_package's build folder does not land in the checkout.

set -euo pipefail

source_dir='' work='' expected='' conan='' cxx='' registry=''
while (($#)); do
  case $1 in
    --source) source_dir=$2 ;;
    --work) work=$2 ;;
    --expected-version) expected=$2 ;;
    --conan) conan=$2 ;;
    --cxx) cxx=$2 ;;
    --registry) registry=$2 ;;
    *) echo "run_conan.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
if [[ -z $source_dir || -z $work || -z $expected ]]; then
  echo "usage: run_conan.sh --source <repo> --work <scratch> --expected-version x.y.z [--conan <conan>]" >&2
  exit 2
fi

fail() { echo "package.conan: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

if [[ -z $conan ]]; then
  # shellcheck source=scripts/lib/common.sh
  source "$source_dir/scripts/lib/common.sh"
  python=$(gradcomp_venv) || fail "cannot set up the virtual environment (gradcomp_venv)"
  conan=$(dirname "$python")/conan
fi
[[ -x $conan ]] || fail "no Conan client at $conan (python/requirements.txt should install it)"
if [[ -n $cxx ]]; then
  export CXX=$cxx  # conan profile detect reads CC/CXX
fi

rm -rf "$work"
mkdir -p "$work/src"
for item in conanfile.py conandata.yml test_package CMakeLists.txt LICENSE cmake include; do
  if [[ -e $source_dir/$item ]]; then
    cp -R "$source_dir/$item" "$work/src/"
  fi
done
rm -rf "$work/src/test_package/build" "$work/src/test_package/CMakeUserPresets.json"
export CONAN_HOME=$work/conan-home
ref=gradcomp/$expected
"$conan" --version

step "conan profile detect"
"$conan" profile detect --force
"$conan" remote remove conancenter
remotes=$("$conan" remote list)
[[ -z $remotes ]] || fail "remotes left: $remotes"

step "conan inspect"
"$conan" inspect "$work/src" --format=json >"$work/inspect.json"
/usr/bin/python3 - "$work/inspect.json" "$expected" <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
expect = {"name": "gradcomp", "version": sys.argv[2], "package_type": "header-library",
          "license": "Apache-2.0"}
problems = ["%s = %r, expected %r" % (k, info.get(k), v) for k, v in expect.items() if info.get(k) != v]
for attr in ("url", "homepage", "description", "topics"):
    if not info.get(attr):
        problems.append("%s is missing" % attr)
settings = info.get("settings") or []
for setting in ("os", "arch", "compiler", "build_type"):
    if setting not in settings:
        problems.append("settings lack %s" % setting)
if problems:
    sys.exit("package.conan: conan inspect: " + "; ".join(problems))
print("conan inspect: %s/%s, %s, url %s, homepage %s" % (info["name"], info["version"],
      info["package_type"], info["url"], info["homepage"]))
PY

step "conan create (detected profile)"
"$conan" create "$work/src" 2>&1 | tee "$work/create.log"
grep -q "^gradcomp $expected: " "$work/create.log" || fail "test_package did not run (no 'gradcomp $expected: ' line)"
grep -q "CMakeDeps" "$work/create.log" || fail "test_package did not use CMakeDeps"
if grep -qE "^ *cmake/[0-9]" "$work/create.log"; then
  fail "a cmake tool requirement was added although $(cmake --version | head -n 1) is >= 3.23"
fi

step "the package in the cache"
pkg=$("$conan" cache path "$ref:$("$conan" list "$ref:*" --format=json | /usr/bin/python3 -c '
import json, sys
data = json.load(sys.stdin)["Local Cache"]
revisions = next(iter(data.values()))["revisions"]
packages = next(iter(revisions.values()))["packages"]
print(next(iter(packages)))')")
for file in include/gradcomp/gradcomp.hpp include/gradcomp/config.hpp licenses/LICENSE \
  share/cmake/gradcomp/gradcompConfig.cmake share/cmake/gradcomp/gradcompConfigVersion.cmake \
  share/cmake/gradcomp/gradcompTargets.cmake share/pkgconfig/gradcomp.pc; do
  [[ -f $pkg/$file ]] || fail "the package lacks $file ($pkg)"
done
for dir in lib bin share/doc; do
  [[ ! -e $pkg/$dir ]] || fail "the package has $dir/ ($pkg)"
done
echo "package folder $pkg: headers, CMake package, gradcomp.pc, licence"

step "conan create -s compiler.version=11 (must be refused)"
if "$conan" create "$work/src" -s compiler=gcc -s compiler.version=11 >"$work/old.log" 2>&1; then
  fail "validate() accepted GCC 11"
fi
grep -q "needs C++20: gcc 12 or newer" "$work/old.log" || { cat "$work/old.log"; fail "GCC 11 was refused, but not by validate()"; }
grep "needs C++20" "$work/old.log" | head -n 1

step "conan export"
"$conan" export "$work/src" 2>&1 | tee "$work/export.log"
grep -q "$ref" "$work/export.log" || fail "conan export did not export $ref"
export_sources=$("$conan" cache path "$ref" --folder export_source)
[[ -f $export_sources/include/gradcomp/gradcomp.hpp && -f $export_sources/CMakeLists.txt ]] ||
  fail "the exported sources lack the headers or CMakeLists.txt ($export_sources)"
if [[ -n $registry ]]; then
  step "conan create <registry copy> --version $expected (sources from the release archive)"
  "$conan" create "$registry/all" --version "$expected" 2>&1 | tee "$work/registry.log"
  grep -q "^gradcomp $expected: " "$work/registry.log" || fail "the registry recipe's test_package did not run"
  url=$(sed -n "s/^    url: \"\(.*\)\"$/\1/p" "$registry/all/conandata.yml" | head -n 1)
  grep -qF "$(basename "$url")" "$work/registry.log" || fail "the registry recipe did not download $url"
fi
echo "package.conan: $ref created, tested and exported with Conan $("$conan" --version | awk '{print $3}')"
