#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# bench/run_codecs.sh [BENCHMARK-ARG...]
#
# Builds gradcomp_bench_codecs (Release, -O2, no -march: the SIMD kernels are picked at run
# time) in build/bench, runs it with JSON output, and prints the markdown tables of
# bench/summarize.py. Arguments go to the benchmark program, e.g.
#   bench/run_codecs.sh --sizes=24 --threads=1
#   bench/run_codecs.sh --benchmark_filter='qsgd|baseline'
# Results: build/bench/codecs.json (raw) and build/bench/codecs.md (tables).
# Environment: BUILD_DIR (default build/bench), JSON (default $BUILD_DIR/codecs.json).

set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/bench}
json=${JSON:-$build/codecs.json}
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
echo "==> build gradcomp_bench_codecs" >&2
cmake --build "$build" --target gradcomp_bench_codecs -j "$jobs" >&2

bin=$(find "$build" -type f -name gradcomp_bench_codecs -perm -u+x -print -quit)
if [[ -z $bin ]]; then
  echo "run_codecs.sh: gradcomp_bench_codecs was not built (is libbenchmark-dev installed?)" >&2
  exit 1
fi

echo "==> $(uptime)" >&2
echo "==> run $bin $*" >&2
"$bin" --benchmark_out="$json" --benchmark_out_format=json "$@" >&2
echo "==> $(uptime)" >&2

python3 "$root/bench/summarize.py" "$json" | tee "$build/codecs.md"

# PyTorch reference points (prints one "skipped" line when PyTorch is not installed).
echo
# Debian's interpreter has torch; the python3 first on PATH may not (docs/pytorch.md).
"$root/build/venv/bin/python" "$root/bench/torch_baseline.py" "$json" | tee -a "$build/codecs.md"
