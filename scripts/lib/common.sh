# shellcheck shell=bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# Sourced by scripts/test, scripts/fuzz, scripts/demo and scripts/gpu-check.

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

# gradcomp_venv: makes sure the project's virtual environment build/venv exists with the
# packages of python/requirements.txt (torch from PyPI, pytest, the build tools of
# pyproject.toml), and prints its interpreter's path. The environment is made once per checkout
# from Debian's /usr/bin/python3 (python3-venv, python3-dev: the headers the extension compiles
# against) and reused; it is brought up to date when python/requirements.txt changes (a stamp
# holds the file's checksum). pip keeps its download cache (~/.cache/pip), so a new checkout on
# the same machine installs torch without downloading it again. GRADCOMP_VENV names another
# directory. Progress goes to stderr; the return status is non-zero when it cannot be set up.
gradcomp_venv() {
  local venv=${GRADCOMP_VENV:-$gradcomp_root/build/venv}
  local requirements=$gradcomp_root/python/requirements.txt stamp sum
  gradcomp_need_packages python3 python3-venv python3-dev >&2 || return 1
  if [[ ! -x $venv/bin/python ]]; then
    gradcomp_log "creating the virtual environment $venv" >&2
    /usr/bin/python3 -m venv "$venv" >&2 || return 1
  fi
  stamp=$venv/.gradcomp-requirements
  sum=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
    gradcomp_log "installing python/requirements.txt into $venv (torch is a large download the first time)" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$requirements" >&2 || return 1
    echo "$sum" >"$stamp"
  fi
  echo "$venv/bin/python"
}
