#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/run_time_to_accuracy.sh [RATE]
#
# Time to accuracy in the network lab (bench/netlab.sh): the training example
# (examples/03_train_mlp, SGD on the synthetic task) on RANKS MPI ranks over a loopback shaped to
# RATE (default 1gbit), once per row: dense, static top-k at each factor of STATIC, GraVAC,
# Accordion and ef_window (the specs of docs/training.md's tables). Every curve point scores the
# whole test set. Then bench/time_to_accuracy.py prints, per row, the training time (evaluation
# excluded) until the run first reaches the dense run's final accuracy, and the final accuracy.
#
# Environment: BUILD_DIR (default build/release; gradcomp_train is built there if missing),
# RANKS (4), STEPS (600), EVAL_EVERY (25), STATIC ("10 100 1000"), SEED (1),
# OUT (default build/time_to_accuracy: one directory per row, and table.md).
# Needs root (network namespaces), iproute2 and Open MPI; without namespaces the lab runs
# unshaped and says so, and the times are not those of RATE.

set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/release}
rate=${1:-1gbit}
ranks=${RANKS:-4}
steps=${STEPS:-600}
every=${EVAL_EVERY:-25}
statics=${STATIC:-10 100 1000}
seed=${SEED:-1}
out=${OUT:-$root/build/time_to_accuracy}

program=$build/examples/03_train_mlp/gradcomp_train
if [[ ! -x $program ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >&2
  fi
  cmake --build "$build" --target gradcomp_train >&2
fi

# name|arguments: one training run each (the rows of docs/training.md, "Time to accuracy").
rows=("dense|--codec dense")
for f in $statics; do rows+=("static-x$f|--codec topk --controller static:factor=$f"); done
rows+=(
  "gravac|--codec topk --controller gravac:policy=exponential,theta_min=10,theta_max=1000,epsilon=0.1,window=60"
  "accordion|--codec topk --controller accordion:low=10,high=1000,interval=60,accumulation=12"
  "ef_window|--codec topk --controller ef_window"
)

mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dirs=()
for row in "${rows[@]}"; do
  name=${row%%|*}
  args=${row#*|}
  echo "== $name: $args ($ranks ranks, $rate)" >&2
  rm -rf "${out:?}/$name"
  # shellcheck disable=SC2016 # expanded inside the lab, where GRADCOMP_NETLAB_MPIRUN is set
  "$root/bench/netlab.sh" --rate "$rate" -- bash -c '$GRADCOMP_NETLAB_MPIRUN --mca btl_tcp_progress_thread 1 -n '"$ranks $program --steps $steps --eval-every $every --eval-subset 0 --seed $seed --out $out/$name $args" \
    > "$out/$name.log" 2>&1 || { echo "run $name failed: see $out/$name.log" >&2; exit 1; }
  dirs+=("$name=$out/$name")
done
python3 "$root/bench/time_to_accuracy.py" --rate "$rate" --ranks "$ranks" "${dirs[@]}" | tee "$out/table.md"
