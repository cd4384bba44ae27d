# shellcheck shell=bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# Sourced by scripts/test, scripts/fuzz and scripts/demo.

# The repository root, whatever directory the script was started from.
gradcomp_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Parallel jobs for builds and ctest.
gradcomp_jobs=$(nproc 2>/dev/null || echo 2)

gradcomp_log() { printf '\n==> %s\n' "$*"; }

# gradcomp_need_packages PACKAGE...
# Installs, with apt-get, the Debian packages among PACKAGE that are not installed yet. Runs
# `apt-get update` once before the first install, and uses sudo when not root. On a system
# without dpkg it installs nothing and leaves it to the build to say what is missing.
gradcomp_need_packages() {
  if ! command -v dpkg >/dev/null 2>&1; then
    echo "note: no dpkg here; make sure these (or their equivalents) are installed: $*" >&2
    return 0
  fi
  local missing=() package
  for package in "$@"; do
    if ! dpkg -s "$package" 2>/dev/null | grep -q '^Status: install ok installed'; then
      missing+=("$package")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  local as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      as_root=(sudo)
    else
      echo "error: missing packages (${missing[*]}), and neither root nor sudo to install them" >&2
      return 1
    fi
  fi
  gradcomp_log "installing missing packages: ${missing[*]}"
  if [[ -z ${gradcomp_apt_updated:-} ]]; then
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    gradcomp_apt_updated=1
  fi
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# gradcomp_leak_detection: prints 1 when LeakSanitizer works here, else 0 with a note on stderr.
# LeakSanitizer cannot run under ptrace (some containers and debuggers); the sanitizer builds
# then go on without leak checks rather than fail every program.
gradcomp_leak_detection() {
  local probe works=1
  probe=$(mktemp -d)
  if echo 'int main() { return 0; }' >"$probe/probe.cpp" &&
    c++ -fsanitize=address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>/dev/null &&
    ! "$probe/probe" >/dev/null 2>&1; then
    echo "note: LeakSanitizer does not work here; running ASan without leak detection" >&2
    works=0
  fi
  rm -rf "$probe"
  echo "$works"
}
