#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# run_conan.sh --source <repo> --work <scratch> --expected-version x.y.z [--conan <conan>]
#              [--cxx <compiler>] [--registry <dist/conan of scripts/release>] [--tool]
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
# package.conan_tool (--tool): the option tool=True, which packages the gradcomp-bench program.
# Conan Center's cli11 is out of reach, so a stand-in made from Debian's libcli11-dev
# (tests/package/conan/cli11, version from its Version.hpp) is created first in the same
# CONAN_HOME; without libcli11-dev the test is skipped (exit 77).
#
#   1. conan create <cli11 stand-in>      cli11/<Debian's version>: headers, CLI11::CLI11
#   2. conan create -o gradcomp/*:tool=True  the recipe's cli11 range resolves to it, CMakeDeps
#                                         declares CLI11::CLI11, the program is built; then
#                                         test_package runs it through conanrun (run trait)
#   3. the package in the cache           bin/gradcomp-bench, the licences (CLI11's too); no
#                                         include/, lib/, share/; settings and cli11 in conaninfo
#   4. conan graph info                   package types and ids: header-library with one id for
#                                         Release and Debug, application with one id each
#   5. conan install --tool-requires ... -o:b gradcomp/*:tool=True  (no build: the binary of 2)
#                                         then conanbuild.sh's PATH: gradcomp-bench --help and
#                                         a synthetic fp16 run whose --json report is checked
#
# The recipe is copied (with what exports_sources names and test_package/) into <scratch>/src,
# so test_package's build folder does not land in the checkout.

set -euo pipefail

source_dir='' work='' expected='' conan='' cxx='' registry='' tool=0
while (($#)); do
  case $1 in
    --tool) tool=1; shift; continue ;;
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

test_name=package.conan
((tool)) && test_name=package.conan_tool
fail() { echo "$test_name: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

if ((tool)) && [[ ! -f /usr/include/CLI/Version.hpp ]]; then
  echo "skipped: Debian's libcli11-dev is not installed (the stand-in cli11 package is made from it)"
  exit 77
fi

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
for item in conanfile.py conandata.yml test_package CMakeLists.txt LICENSE cmake include tools; do
  if [[ -e $source_dir/$item ]]; then
    cp -R "$source_dir/$item" "$work/src/"
  fi
done
mkdir -p "$work/src/bench"
cp "$source_dir/bench/common.hpp" "$work/src/bench/"  # the one file of bench/ that tools/ uses
rm -rf "$work/src/test_package/build" "$work/src/test_package/CMakeUserPresets.json"
export CONAN_HOME=$work/conan-home
ref=gradcomp/$expected
"$conan" --version

step "conan profile detect"
"$conan" profile detect --force
"$conan" remote remove conancenter
remotes=$("$conan" remote list)
[[ -z $remotes ]] || fail "remotes left: $remotes"

if ((tool)); then
  step "conan create <cli11 stand-in> (Debian's libcli11-dev)"
  cp -R "$source_dir/tests/package/conan/cli11" "$work/cli11"
  cli11_version=$(sed -n 's/^#define CLI11_VERSION "\([0-9.]*\)"$/\1/p' /usr/include/CLI/Version.hpp)
  "$conan" create "$work/cli11" 2>&1 | tee "$work/cli11.log"
  "$conan" list "cli11/$cli11_version" --format=json | grep -q "\"cli11/$cli11_version\"" ||
    fail "cli11/$cli11_version is not in the cache"

  step "conan create -o gradcomp/*:tool=True (builds gradcomp-bench)"
  "$conan" create "$work/src" -o "gradcomp/*:tool=True" 2>&1 | tee "$work/create-tool.log"
  grep -qE "cli11/\[>=[^]]*\]: cli11/$cli11_version" "$work/create-tool.log" ||
    fail "the recipe's cli11 range did not resolve to the stand-in cli11/$cli11_version"
  grep -qE "^gauss +fp16 +4096 " "$work/create-tool.log" ||
    fail "test_package did not run gradcomp-bench (no fp16 row for 4096 values)"

  step "the application package in the cache"
  pkg_id=$("$conan" list "$ref:*" --format=json | /usr/bin/python3 -c '
import json, sys
data = json.load(sys.stdin)["Local Cache"]
revisions = next(iter(data.values()))["revisions"]
packages = next(iter(revisions.values()))["packages"]
tool = [p for p, v in packages.items() if v["info"].get("options", {}).get("tool") == "True"]
if len(tool) != 1:
    sys.exit("expected one package with tool=True, found %d" % len(tool))
print(tool[0])')
  pkg=$("$conan" cache path "$ref:$pkg_id")
  [[ -x $pkg/bin/gradcomp-bench ]] || fail "the package lacks an executable bin/gradcomp-bench ($pkg)"
  for file in licenses/LICENSE licenses/cli11/copyright; do
    [[ -f $pkg/$file ]] || fail "the package lacks $file ($pkg)"
  done
  for dir in include lib share; do
    [[ ! -e $pkg/$dir ]] || fail "the application package has $dir/ ($pkg)"
  done
  for line in "compiler=" "build_type=" "tool=True" "cli11/$cli11_version"; do
    grep -q "$line" "$pkg/conaninfo.txt" || fail "conaninfo.txt lacks '$line' ($pkg)"
  done
  # CLI11 came from the cli11 package through CMakeDeps, not from /usr/share/cmake/CLI11.
  build=$("$conan" cache path "$ref:$pkg_id" --folder build)
  cache=$(find "$build" -name CMakeCache.txt -print -quit)
  cli11_dir=$(sed -n 's/^CLI11_DIR:PATH=//p' "$cache")
  [[ -f $cli11_dir/CLI11Config.cmake && -f $cli11_dir/cmakedeps_macros.cmake ]] ||
    fail "CLI11 was found in '$cli11_dir', not in the generators folder of CMakeDeps ($cache)"
  echo "package folder $pkg: bin/gradcomp-bench, licences; id over settings, tool and cli11"
  echo "CLI11 from CMakeDeps: $cli11_dir/CLI11Config.cmake"

  step "conan graph info: package types and ids"
  graph_node() {  # <label> <conan graph info arguments>: prints "<package_type> <package_id>"
    local label=$1
    shift
    "$conan" graph info --requires="$ref" "$@" --format=json 2>"$work/graph-$label.err" |
      /usr/bin/python3 -c '
import json, sys
nodes = json.load(sys.stdin)["graph"]["nodes"].values()
node = next(n for n in nodes if n.get("name") == "gradcomp")
print(node["package_type"], node["package_id"])' || { cat "$work/graph-$label.err"; fail "conan graph info ($label) failed"; }
  }
  header_release=$(graph_node header-release -s build_type=Release)
  header_debug=$(graph_node header-debug -s build_type=Debug)
  tool_release=$(graph_node tool-release -s build_type=Release -o "gradcomp/*:tool=True")
  tool_debug=$(graph_node tool-debug -s build_type=Debug -o "gradcomp/*:tool=True")
  printf '  tool=False Release: %s\n  tool=False Debug:   %s\n  tool=True Release:  %s\n  tool=True Debug:    %s\n' \
    "$header_release" "$header_debug" "$tool_release" "$tool_debug"
  [[ ${header_release%% *} == header-library ]] || fail "tool=False: package type ${header_release%% *}, expected header-library"
  [[ ${tool_release%% *} == application ]] || fail "tool=True: package type ${tool_release%% *}, expected application"
  [[ $header_release == "$header_debug" ]] || fail "tool=False: the header package id depends on build_type"
  [[ $tool_release != "$tool_debug" ]] || fail "tool=True: Release and Debug share a package id"
  [[ ${tool_release#* } == "$pkg_id" ]] || fail "tool=True Release: id ${tool_release#* }, but conan create made $pkg_id"

  step "conan install --tool-requires $ref -o:b gradcomp/*:tool=True, then conanbuild.sh"
  mkdir -p "$work/consumer"
  "$conan" install --tool-requires="$ref" -o:b "gradcomp/*:tool=True" \
    --output-folder="$work/consumer" 2>&1 | tee "$work/install-tool.log"
  [[ -f $work/consumer/conanbuild.sh ]] || fail "conan install wrote no conanbuild.sh"
  (
    # shellcheck disable=SC1091
    source "$work/consumer/conanbuild.sh"
    program=$(command -v gradcomp-bench) || fail "gradcomp-bench is not on conanbuild.sh's PATH"
    [[ $program == "$pkg/bin/gradcomp-bench" ]] || fail "PATH finds $program, not the package's ($pkg)"
    gradcomp-bench --help >"$work/help.txt" || fail "gradcomp-bench --help failed"
    head -n 1 "$work/help.txt"
    grep -q "^Usage: gradcomp-bench " "$work/help.txt" || fail "gradcomp-bench --help printed no usage line"
    gradcomp-bench --synthetic gauss --size 4096 --codec fp16 --threads 1 --no-timing -q \
      --json "$work/report.json" || fail "gradcomp-bench on synthetic data failed"
  ) || exit 1
  /usr/bin/python3 - "$work/report.json" "$expected" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
problems = []
if report.get("tool") != "gradcomp-bench" or report.get("version") != sys.argv[2]:
    problems.append("tool %r version %r, expected gradcomp-bench %s"
                    % (report.get("tool"), report.get("version"), sys.argv[2]))
rows = report.get("rows") or []
if len(rows) != 1 or rows[0].get("codec") != "fp16" or rows[0].get("n") != 4096:
    problems.append("expected one fp16 row of 4096 values, got %r" % rows)
else:
    row = rows[0]
    # Two bytes a value plus a header, fp16's relative rounding error (2^-11) at most.
    if not 8192 < row["bytes"] <= 8192 + 256:
        problems.append("fp16 packet of %d bytes for 4096 values" % row["bytes"])
    if not 0 < row["rel_l2"] < 2.0 ** -11 or row["cosine"] < 0.9999:
        problems.append("fp16 rel_l2 %r, cosine %r" % (row["rel_l2"], row["cosine"]))
if problems:
    sys.exit("package.conan_tool: the report: " + "; ".join(problems))
row = rows[0]
print("gradcomp-bench %s from the package: fp16, %d values, %d bytes, rel_l2 %.3g"
      % (report["version"], row["n"], row["bytes"], row["rel_l2"]))
PY
  echo "package.conan_tool: $ref with tool=True created, tested and run from Conan's build environment (Conan $("$conan" --version | awk '{print $3}'))"
  exit 0
fi

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
