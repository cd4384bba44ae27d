#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/netlab.sh: runs a command inside a network namespace of its own whose loopback is rate
# limited, so that MPI programs talking over TCP on loopback see a slow network.
#
#   bench/netlab.sh --rate 1gbit -- mpirun -n 4 build/release/bench/gradcomp_bench_comm_mpi
#
# Options (before `--`):
#   --rate RATE      tc rate of the loopback: 1gbit, 10gbit, 500mbit, ... (required)
#   --burst BYTES    token bucket size (default: what RATE sends in 4 ms, at least 256 KiB;
#                    it must exceed the loopback MTU of 64 KiB or large packets stall)
#   --latency TIME   longest a packet may wait in the queue (default 100ms)
#
# What it does: `ip netns add gradcomp-lab-<pid>`, brings its `lo` up, adds
# `tc qdisc add dev lo root tbf rate RATE burst BURST latency LATENCY`, and runs the command
# with `ip netns exec`. Only loopback traffic inside that namespace is shaped; the host's
# network is not touched. On exit (normal, error, or a signal) it ends the processes still
# running in its namespace and deletes the namespace; it never touches other namespaces.
#
# Inside, the command sees these variables:
#   GRADCOMP_NETLAB_RATE      the rate, as given (e.g. 1gbit), or "unlimited" in fallback mode
#   GRADCOMP_NETLAB_BPS       the rate in bits per second (0 in fallback mode)
#   GRADCOMP_NETLAB_MPIRUN    an mpirun prefix that keeps Open MPI on the shaped loopback:
#                             mpirun --mca btl tcp,self --mca btl_tcp_if_include lo
#                                    --mca oob_tcp_if_include lo --oversubscribe
#
# Note what is shaped: every byte any rank sends crosses the one `lo` device, so the rate is
# shared by all ranks (one switch port for everyone), unlike a cluster where each node has a
# link of its own. bench_comm_mpi.cpp reports both the per-link ring model and this shared one.
#
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 (`ip`, `tc`). If the namespace
# cannot be created (an unprivileged container), the script says why on stderr and runs the
# command WITHOUT a rate limit, with GRADCOMP_NETLAB_RATE=unlimited, so the output is labelled.

set -euo pipefail

usage() {
  sed -n '4,36p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

rate=""
burst=""
latency="100ms"
while (($# > 0)); do
  case $1 in
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --burst) burst=${2:?--burst needs a value}; shift 2 ;;
    --latency) latency=${2:?--latency needs a value}; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "netlab: unknown option '$1' (the command goes after --)" >&2; usage ;;
  esac
done
if [[ -z $rate || $# -eq 0 ]]; then
  usage
fi

# RATE in bits per second (tc units: bit, kbit, mbit, gbit; k/m/g are powers of 1000).
rate_bps() {
  local r=${1,,} n unit
  if [[ ! $r =~ ^([0-9]+)([kmg]?)(bit|bps)?$ ]]; then
    echo "netlab: cannot read the rate '$1' (expected e.g. 1gbit, 500mbit)" >&2
    exit 2
  fi
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
    k) n=$((n * 1000)) ;;
    m) n=$((n * 1000000)) ;;
    g) n=$((n * 1000000000)) ;;
  esac
  if [[ ${BASH_REMATCH[3]} == bps ]]; then n=$((n * 8)); fi  # tc's "bps" is bytes per second
  echo "$n"
}
bps=$(rate_bps "$rate")
if [[ -z $burst ]]; then
  burst=$((bps / 8 / 250))
  if ((burst < 262144)); then burst=262144; fi
fi

export GRADCOMP_NETLAB_MPIRUN="mpirun --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --oversubscribe"
# Open MPI refuses to run as root unless told it may (containers, CI).
if ((EUID == 0)); then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

for tool in ip tc; do
  if ! command -v "$tool" > /dev/null; then
    echo "netlab: '$tool' is missing: install Debian's iproute2 (apt-get install iproute2)" >&2
    exit 1
  fi
done

ns="gradcomp-lab-$$"
created=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if ((created)); then
    # End what still runs in our namespace (each by its id), then remove the namespace.
    local pids
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2> /dev/null || true
      sleep 1
      pids=$(ip netns pids "$ns" 2> /dev/null || true)
      # shellcheck disable=SC2086
      if [[ -n $pids ]]; then kill -KILL $pids 2> /dev/null || true; fi
    fi
    ip netns delete "$ns" 2> /dev/null || echo "netlab: could not delete namespace $ns" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! err=$(ip netns add "$ns" 2>&1); then
  echo "netlab: cannot create a network namespace ($err)." >&2
  echo "netlab: running WITHOUT a rate limit; results are labelled 'unlimited'." >&2
  export GRADCOMP_NETLAB_RATE=unlimited GRADCOMP_NETLAB_BPS=0
  "$@"
  exit $?
fi
created=1
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" latency "$latency"
echo "netlab: namespace $ns, lo shaped to $rate (burst $burst bytes, latency $latency)" >&2

export GRADCOMP_NETLAB_RATE=$rate GRADCOMP_NETLAB_BPS=$bps
# In the background and waited for: bash runs a trap only once a foreground command returns,
# while `wait` returns as soon as a signal arrives, so a TERM cleans up at once. `<&0` keeps
# the command's standard input (a background job would otherwise read /dev/null).
set +e
ip netns exec "$ns" "$@" <&0 &
child=$!
wait "$child"
status=$?
set -e
exit "$status"
