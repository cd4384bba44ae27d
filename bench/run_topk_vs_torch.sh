#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/run_topk_vs_torch.sh [BENCHMARK-ARG...]
#
# Builds gradcomp_bench_topk (Release, -O2, no -march: the SIMD kernels are picked at run time)
# in build/bench, runs it with JSON output (default: n = 2^24, one thread, k = 1% and 0.1%,
# three input distributions), then runs bench/torch_topk.py on the same sizes, distributions and
# thread count, and prints the table of gradcomp's top-k select / compress against torch.topk.
# Arguments go to the benchmark program, e.g.
#   bench/run_topk_vs_torch.sh --benchmark_filter='normal|baseline'
#   bench/run_topk_vs_torch.sh --sizes=20,24
# The torch part is skipped with a message when no Python with PyTorch is found.
# Results: build/bench/topk.json (raw) and build/bench/topk.md (table).
# Environment: BUILD_DIR (default build/bench), JSON (default $BUILD_DIR/topk.json),
#   PYTHON (the interpreter with torch; default: the first of build/venv/bin/python (the
#   project's environment, scripts/build-python) and python3 that imports torch).

set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/bench}
json=${JSON:-$build/topk.json}
jobs=$(nproc 2>/dev/null || echo 2)

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

mkdir -p "$build"
echo "==> configure $build" >&2
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DGRADCOMP_BUILD_BENCH=ON \
  -DGRADCOMP_BUILD_TESTS=OFF \
  -DGRADCOMP_BUILD_EXAMPLES=OFF \
  -DGRADCOMP_INSTALL=OFF \
  -DGRADCOMP_ENABLE_CUDA=OFF >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log" >&2
  exit 1
}
echo "==> build gradcomp_bench_topk" >&2
cmake --build "$build" --target gradcomp_bench_topk -j "$jobs" >&2

bin=$(find "$build" -type f -name gradcomp_bench_topk -perm -u+x -print -quit)
if [[ -z $bin ]]; then
  echo "run_topk_vs_torch.sh: gradcomp_bench_topk was not built (is libbenchmark-dev installed?)" >&2
  exit 1
fi

# Thread count of the run, for the torch side (the benchmark's default is 1).
threads=1
for a in "$@"; do
  case $a in
    --threads=*)
      threads=${a#--threads=}
      if [[ $threads == *,* || $threads == all ]]; then
        echo "run_topk_vs_torch.sh: give one numeric --threads for the torch comparison" >&2
        exit 2
      fi
      ;;
  esac
done

echo "==> $(uptime)" >&2
echo "==> run $bin $*" >&2
"$bin" --benchmark_out="$json" --benchmark_out_format=json "$@" >&2
echo "==> $(uptime)" >&2

python=${PYTHON:-}
if [[ -z $python ]]; then
  for p in "$root/build/venv/bin/python" python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then
      python=$p
      break
    fi
  done
fi
if [[ -z $python ]]; then
  echo "run_topk_vs_torch.sh: torch part skipped: no python3 that imports torch" \
    "(install Debian's python3-torch, or set PYTHON); gradcomp's figures are in $json" |
    tee "$build/topk.md"
  exit 0
fi
echo "==> torch side: $python bench/torch_topk.py (threads $threads)" >&2
"$python" "$root/bench/torch_topk.py" "$json" --threads "$threads" | tee "$build/topk.md"
echo "==> $(uptime)" >&2
