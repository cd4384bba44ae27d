#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/run_comm_mpi.sh [RATE...]
#
# Dense all-reduce of a 64 MiB float32 gradient on 4 MPI ranks through the MPI adapter, inside
# the network lab (bench/netlab.sh) at each RATE (default: 1gbit 10gbit), sent as f32 and as f16
# (half the bytes), and once without shaping. Prints one markdown row per run. Needs root
# (network namespaces) and MPI.
# Environment: BUILD_DIR (default build/release; the program is built there if missing),
# RANKS (default 4), MIB (default 64), ITERS (default 3).

set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/release}
ranks=${RANKS:-4}
mib=${MIB:-64}
iters=${ITERS:-3}
rates=("$@")
if ((${#rates[@]} == 0)); then rates=(1gbit 10gbit); fi

program=$build/bench/gradcomp_bench_comm_mpi
if [[ ! -x $program ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_BENCH=ON >&2
  fi
  cmake --build "$build" --target gradcomp_bench_comm_mpi >&2
fi

echo "| rate | type | ranks | bytes | median s | best s | bus Gbit/s | per-link ring model s | shared-lo model s |"
echo "|---|---|---|---|---|---|---|---|---|"
row() {  # row RATE BPS TYPE OUTPUT
  local line bytes median best bus per shared
  line=$(grep '^RESULT' <<< "$4")
  bytes=$(sed -E 's/.*bytes=([0-9]+).*/\1/' <<< "$line")
  median=$(sed -E 's/.*median_s=([0-9.]+).*/\1/' <<< "$line")
  best=$(sed -E 's/.*best_s=([0-9.]+).*/\1/' <<< "$line")
  bus=$(sed -E 's/.*bus_gbps=([0-9.]+).*/\1/' <<< "$line")
  if [[ $2 == 0 ]]; then
    per="-"
    shared="-"
  else
    per=$(awk -v n="$ranks" -v b="$bytes" -v r="$2" 'BEGIN { printf "%.3f", 2 * (n - 1) / n * b * 8 / r }')
    shared=$(awk -v n="$ranks" -v b="$bytes" -v r="$2" 'BEGIN { printf "%.3f", 2 * (n - 1) * b * 8 / r }')
  fi
  echo "| $1 | $3 | $ranks | $bytes | $median | $best | $bus | $per | $shared |"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for type in f32 f16; do
  out=$(mpirun --mca btl tcp,self --oversubscribe -n "$ranks" "$program" --mib "$mib" --iters "$iters" --type "$type")
  row "unshaped" 0 "$type" "$out"
  for rate in "${rates[@]}"; do
    out=$("$root/bench/netlab.sh" --rate "$rate" -- bash -c \
      "\$GRADCOMP_NETLAB_MPIRUN -n $ranks '$program' --mib $mib --iters $iters --type $type" 2> /dev/null)
    bps=$(grep -o 'rate=[^ ]*' <<< "$(grep '^RESULT' <<< "$out")" | cut -d= -f2)
    if [[ $bps == unlimited ]]; then
      row "$rate (NOT shaped: no namespaces)" 0 "$type" "$out"
    else
      bits=$(awk -v r="${rate,,}" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1, 1);
        m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : 1; printf "%.0f", n * m }')
      row "$rate" "$bits" "$type" "$out"
    fi
  done
done
