#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/run_model_check.sh [RATE...]
#
# Runs gradcomp_model_check_mpi (bench/model_check.cpp) on RANKS MPI ranks inside the network
# lab (bench/netlab.sh) at each RATE (default: 1gbit), and prints its table: the runtime model's
# predicted time per step against the measured one for every collective, gossip topology and
# overlapped training step, and how many cases land within TOL. Writes
# $OUT/model_check_<rate>.csv when OUT is set. Needs root (network namespaces) and MPI;
# without namespaces the lab runs unshaped and says so, and the check is meaningless.
#
# Environment: BUILD_DIR (default build/release; the program is built there if missing),
# RANKS (4), MIB (16), REPS (5), STEPS (8), COMPUTE_MS (300 at 1 Gbit/s and below, 60 above),
# STDDEV_MS (a tenth of COMPUTE_MS), TOL (0.25), OUT (unset).
# Exit status: 1 if a case at some rate is outside TOL, else 0.

set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/release}
ranks=${RANKS:-4}
rates=("$@")
if ((${#rates[@]} == 0)); then rates=(1gbit); fi

program=$build/bench/gradcomp_model_check_mpi
if [[ ! -x $program ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_BENCH=ON >&2
  fi
  cmake --build "$build" --target gradcomp_model_check_mpi >&2
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
for rate in "${rates[@]}"; do
  # A step of compute comparable to the communication: 300 ms at <= 1 Gbit/s, 60 ms above.
  fast=$(awk -v r="${rate,,}" 'BEGIN { n = r + 0; print (r ~ /gbit$/ && n > 1) ? 1 : 0 }')
  compute=${COMPUTE_MS:-$([[ $fast == 1 ]] && echo 60 || echo 300)}
  stddev=${STDDEV_MS:-$(awk -v c="$compute" 'BEGIN { print c / 10 }')}
  args=(--mib "${MIB:-16}" --reps "${REPS:-5}" --steps "${STEPS:-8}" --compute-ms "$compute"
        --stddev-ms "$stddev" --tolerance "${TOL:-0.25}")
  if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    args+=(--csv "$OUT/model_check_$rate.csv")
  fi
  echo "## network lab at $rate, $ranks ranks"
  out=$("$root/bench/netlab.sh" --rate "$rate" -- bash -c \
    "\$GRADCOMP_NETLAB_MPIRUN -n $ranks '$program' ${args[*]}" 2>&1 || true)
  sed -n '/^gradcomp model check/,/^model check:/p' <<< "$out"
  verdict=$(grep '^model check:' <<< "$out" || true)
  if [[ -z $verdict ]]; then
    echo "run_model_check: the check did not finish at $rate; its output:" >&2
    echo "$out" >&2
    status=1
  elif [[ ! $verdict =~ ^model\ check:\ ([0-9]+)\ cases,\ ([0-9]+)\ within ]] ||
    [[ ${BASH_REMATCH[1]} != "${BASH_REMATCH[2]}" ]]; then
    status=1
  fi
done
exit $status
