// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The command line and registration shared by the Google Benchmark programs: `--sizes=` and
// `--threads=` lists, one registration style (median of 3 repetitions, wall time, ms), and the
// run with gradcomp's context in the report.

#include "common.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradcomp_bench {

/// Parses "--name=a,b,c" from argv (removing it); returns the items, or `fallback`.
inline std::vector<std::string> take_list(int& argc, char** argv, std::string_view name,
                                          std::vector<std::string> fallback) {
  std::string const prefix = "--" + std::string(name) + "=";
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    if (a.substr(0, prefix.size()) != prefix) continue;
    std::vector<std::string> items;
    std::string_view rest = a.substr(prefix.size());
    while (!rest.empty()) {
      std::size_t const comma = rest.find(',');
      items.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    return items;
  }
  return fallback;
}

/// `--sizes=` as log2 element counts in [lo, hi]; exits with status 2 on a bad value.
inline std::vector<std::size_t> take_sizes(int& argc, char** argv, char const* program,
                                           std::vector<std::string> fallback, int lo, int hi) {
  std::vector<std::size_t> sizes;
  for (std::string const& s : take_list(argc, argv, "sizes", std::move(fallback))) {
    int const log2n = std::atoi(s.c_str());
    if (log2n < lo || log2n > hi) {
      std::fprintf(stderr, "%s: --sizes takes log2 element counts in %d..%d\n", program, lo, hi);
      std::exit(2);
    }
    sizes.push_back(std::size_t{1} << log2n);
  }
  return sizes;
}

/// `--threads=` as positive counts or `all`, without repeats; exits with status 2 on a bad value.
inline std::vector<unsigned> take_threads(int& argc, char** argv, char const* program,
                                          std::vector<std::string> fallback) {
  std::vector<unsigned> out;
  for (std::string const& s : take_list(argc, argv, "threads", std::move(fallback))) {
    unsigned const t = s == "all" ? all_threads() : static_cast<unsigned>(std::atoi(s.c_str()));
    if (t == 0) {
      std::fprintf(stderr, "%s: --threads takes positive counts or 'all'\n", program);
      std::exit(2);
    }
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  return out;
}

/// Registers a benchmark: 3 repetitions, aggregates only, wall time in ms.
template <class Fn>
void add(std::string const& name, Fn&& fn, double min_time = 0.5) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn))
      ->MinTime(min_time)
      ->Repetitions(3)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

/// Runs what was registered, with the machine's SIMD level (and `extra` key/value pairs) in the
/// report's context; returns the exit status.
inline int run_benchmarks(int& argc, char** argv,
                          std::vector<std::pair<std::string, std::string>> const& extra = {}) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("gradcomp_isa", gc::cpu::isa_name(gc::cpu::machine_isa()));
  for (auto const& [k, v] : extra) benchmark::AddCustomContext(k, v);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace gradcomp_bench
