// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_topk: exact top-k (`topk_codec`) at k = 1% and 0.1%, the selection alone
// (`topk_codec::select`: ascending indices) and the whole `compress` (selection plus packet
// writing), next to the read baseline measured by the same program on the same input.
// bench/run_topk_vs_torch.sh runs it and bench/torch_topk.py, which times torch.topk on the
// same sizes and distributions, and prints the ratio table.
//
// Benchmarks are named OP/DIST/ratio=R/n:N/threads:T, where OP is select or compress, DIST the
// input distribution, R the kept fraction; and baseline/read/n:N/threads:T. Distributions
// (fixed seeds):
//   normal   N(0, 1) (the codec benchmark's input);
//   uniform  U(-1, 1);
//   laplace  Laplace(0, 1), heavier tails, like real gradients.
// Counters: ms (median call time), GB/s (n * 4 / ms), ratio (read baseline time / call time),
// B/elem (compress: packet bytes per element), k (elements selected).
// Each benchmark runs 3 repetitions of at least 0.5 s; use the `median` aggregate.
//
// Extra options (before Google Benchmark's own):
//   --sizes=20,24        log2 of the element counts (default 24)
//   --threads=1,all      pool sizes (default 1)

#include "harness.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace gb = gradcomp_bench;
namespace gc = gradcomp;

constexpr char const* distributions[] = {"normal", "uniform", "laplace"};
constexpr double ratios[] = {0.01, 0.001};

/// n floats of distribution `dist`, generated once and kept ("normal" is the shared input).
gb::buffer<float> const& input(std::string const& dist, std::size_t n) {
  if (dist == "normal") return gb::gaussian(n);
  static std::mutex m;
  static std::map<std::pair<std::string, std::size_t>, gb::buffer<float>> cache;
  std::lock_guard lock(m);
  auto key = std::make_pair(dist, n);
  auto it = cache.find(key);
  if (it == cache.end()) {
    gb::buffer<float> b(n);
    std::mt19937_64 rng(gb::input_seed + (dist == "uniform" ? 1 : 2));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::exponential_distribution<float> e(1.0f);
    std::bernoulli_distribution sign(0.5);
    for (std::size_t i = 0; i < n; ++i) {
      b.data()[i] = dist == "uniform" ? u(rng) : (sign(rng) ? e(rng) : -e(rng));
    }
    it = cache.emplace(std::move(key), std::move(b)).first;
  }
  return it->second;
}

std::string ratio_label(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ratio=%g", r);
  return buf;
}

enum class op { select, compress };

void bm_topk(benchmark::State& state, op o, std::string const& dist, double r, std::size_t n,
             unsigned threads) {
  gc::topk_codec const codec = gc::topk_codec::ratio(r);
  gc::codec_context const ctx = gb::context(threads);
  gb::buffer<float> const& x = input(dist, n);
  gb::buffer<std::byte> packet(codec.max_compressed_bytes(n));
  std::vector<std::uint32_t> idx;
  idx.reserve(codec.k_for(n));
  gc::tensor_view<float const> const in(x.span());

  auto call = [&]() -> std::size_t {
    if (o == op::select) {
      codec.select(x.data(), n, idx, ctx);
      return idx.size();
    }
    return codec.compress(in, packet.span(), ctx);
  };
  std::size_t out = 0;
  try {
    out = call();  // warm-up
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<double> times, base_times;
  for (auto _ : state) {
    double const t0 = gb::now_seconds();
    out = call();
    times.push_back(gb::now_seconds() - t0);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
    state.PauseTiming();
    double const t1 = gb::now_seconds();
    benchmark::DoNotOptimize(gb::run_baseline(gb::baseline::read, x.data(), nullptr, n, ctx));
    base_times.push_back(gb::now_seconds() - t1);
    state.ResumeTiming();
  }
  double const t = gb::median(times);
  double const tb = gb::median(base_times);
  state.counters["ms"] = t * 1e3;
  state.counters["GB/s"] = t > 0 ? static_cast<double>(n * sizeof(float)) / t / 1e9 : 0.0;
  state.counters["ratio"] = t > 0 ? tb / t : 0.0;
  state.counters["k"] = static_cast<double>(codec.k_for(n));
  if (o == op::compress)
    state.counters["B/elem"] = static_cast<double>(out) / static_cast<double>(n);
}

void bm_read(benchmark::State& state, std::size_t n, unsigned threads) {
  gc::codec_context const ctx = gb::context(threads);
  float const* x = gb::gaussian(n).data();
  std::vector<double> times;
  for (auto _ : state) {
    double const t0 = gb::now_seconds();
    benchmark::DoNotOptimize(gb::run_baseline(gb::baseline::read, x, nullptr, n, ctx));
    times.push_back(gb::now_seconds() - t0);
  }
  double const t = gb::median(times);
  state.counters["ms"] = t * 1e3;
  state.counters["GB/s"] = t > 0 ? static_cast<double>(n * sizeof(float)) / t / 1e9 : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> const sizes = gb::take_sizes(argc, argv, "gradcomp_bench_topk", {"24"}, 4, 31);
  std::vector<unsigned> const thread_counts = gb::take_threads(argc, argv, "gradcomp_bench_topk", {"1"});

  for (std::size_t n : sizes) {
    for (unsigned t : thread_counts) {
      std::string const tail = "/n:" + std::to_string(n) + "/threads:" + std::to_string(t);
      gb::add("baseline/read" + tail, [n, t](benchmark::State& s) { bm_read(s, n, t); });
      for (char const* d : distributions) {
        for (double r : ratios) {
          for (op o : {op::select, op::compress}) {
            std::string const dist = d;
            gb::add(std::string(o == op::select ? "select/" : "compress/") + dist + "/" +
                    ratio_label(r) + tail,
                [o, dist, r, n, t](benchmark::State& s) { bm_topk(s, o, dist, r, n, t); });
          }
        }
      }
    }
  }

  return gb::run_benchmarks(argc, argv);
}
