// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_sparse: the sparsifiers (exact and approximate top-k, random-k) and
// multi-level re-compression on float32 N(0, 1) input, next to the streaming-read baseline
// (bench/common.hpp) measured in the same program on the same buffer.
//
// Benchmarks are named OP/SPEC/n:N/threads:T:
//   compress/SPEC     a `gradcomp::make_codec` spec's compress (random-k: seed 20261122, step 3)
//   recompress/SPEC>k:K  `recompress_sparse` of SPEC's packet to K elements (cost O(m))
//   baseline/read     the streaming read of the n input floats
// Counters:
//   GB/s       n * 4 / the median time of one call ("input covered": random-k reads only k of
//              the n elements, yet is credited with all n, as the target states);
//   base_GB/s  the read baseline, one call after every measured call, same pool and buffer;
//   ratio      median baseline time / median time: 1.0 = the speed of one streaming read;
//   B/elem     packet bytes per element; m = elements in the packet.
// Each benchmark runs 3 repetitions of at least 0.3 s; use the `median` aggregate.
//
// Extra options: --sizes=20,24 (log2 element counts; default 24), --threads=1,all (default 1).

#include "harness.hpp"

#include <benchmark/benchmark.h>

#include <gradcomp/codec/recompress.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace gb = gradcomp_bench;
namespace gc = gradcomp;

constexpr char const* compress_specs[] = {
    "approx_topk:ratio=0.01",
    "approx_topk:ratio=0.001",
    "approx_topk:ratio=0.01,sample=0.01",
    "approx_topk:ratio=0.001,sample=0.01",
    "approx_topk:ratio=0.01,tolerance=0",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "randomk:ratio=0.01",
    "randomk:ratio=0.001",
    "randomk:ratio=0.01,scale=true,values=f16",
};

struct recompress_case {
  char const* spec;
  double ratio;  ///< target k as a fraction of n
};
constexpr recompress_case recompress_cases[] = {
    {"topk:ratio=0.01", 0.001},
    {"randomk:ratio=0.01", 0.001},
};

/// Times `call` (returns packet bytes) with the read baseline after each call.
template <class Call>
void timed(benchmark::State& state, std::size_t n, unsigned threads, Call&& call) {
  gc::codec_context const ctx = gb::context(threads);
  float const* x = gb::gaussian(n).data();
  std::size_t bytes = 0;
  try {
    bytes = call();
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<double> times, base;
  for (auto _ : state) {
    double const t0 = gb::now_seconds();
    bytes = call();
    times.push_back(gb::now_seconds() - t0);
    benchmark::DoNotOptimize(bytes);
    benchmark::ClobberMemory();
    state.PauseTiming();
    double const t1 = gb::now_seconds();
    benchmark::DoNotOptimize(gb::run_baseline(gb::baseline::read, x, nullptr, n, ctx));
    base.push_back(gb::now_seconds() - t1);
    state.ResumeTiming();
  }
  double const t = gb::median(times), tb = gb::median(base);
  double const in_bytes = static_cast<double>(n * sizeof(float));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(n * sizeof(float)));
  state.counters["GB/s"] = t > 0 ? in_bytes / t / 1e9 : 0.0;
  state.counters["base_GB/s"] = tb > 0 ? in_bytes / tb / 1e9 : 0.0;
  state.counters["ratio"] = t > 0 ? tb / t : 0.0;
  state.counters["B/elem"] = static_cast<double>(bytes) / static_cast<double>(n);
}

void bm_compress(benchmark::State& state, std::string const& spec, std::size_t n,
                 unsigned threads) {
  gc::any_codec const codec = gc::make_codec(spec);
  gc::codec_context const ctx = gb::context(threads);
  gb::buffer<std::byte> out(codec.max_compressed_bytes(n));
  gc::tensor_view<float const> const in(gb::gaussian(n).span());
  std::size_t bytes = 0;
  timed(state, n, threads, [&] { return bytes = codec.compress(in, out.span(), ctx); });
  if (bytes >= gc::header_bytes) {
    state.counters["m"] = gc::read_header(std::span<std::byte const>(out.data(), bytes)).param0;
  }
}

void bm_recompress(benchmark::State& state, recompress_case rc, std::size_t n, unsigned threads) {
  gc::any_codec const codec = gc::make_codec(rc.spec);
  gc::codec_context const ctx = gb::context(threads);
  std::vector<std::byte> packet(codec.max_compressed_bytes(n));
  packet.resize(codec.compress(gc::tensor_view<float const>(gb::gaussian(n).span()), packet, ctx));
  auto const k = static_cast<std::uint64_t>(rc.ratio * static_cast<double>(n));
  std::vector<std::byte> out(gc::max_recompressed_bytes(packet, k));
  timed(state, n, threads, [&] { return gc::recompress_sparse(packet, k, out, ctx); });
  state.counters["m"] = static_cast<double>(k);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> const sizes = gb::take_sizes(argc, argv, "gradcomp_bench_sparse", {"24"}, 10, 30);
  std::vector<unsigned> const threads = gb::take_threads(argc, argv, "gradcomp_bench_sparse", {"1"});
  for (std::size_t n : sizes) {
    for (unsigned t : threads) {
      std::string const tail = "/n:" + std::to_string(n) + "/threads:" + std::to_string(t);
      gb::add("baseline/read" + tail, [n, t](benchmark::State& s) {
        timed(s, n, t, [&] {
          return static_cast<std::size_t>(gb::run_baseline(gb::baseline::read,
                                                           gb::gaussian(n).data(), nullptr, n,
                                                           gb::context(t)) != 0.0f);
        });
      });
      for (char const* spec : compress_specs) {
        std::string const sp = spec;
        gb::add("compress/" + sp + tail, [sp, n, t](benchmark::State& s) { bm_compress(s, sp, n, t); });
      }
      for (recompress_case const& rc : recompress_cases) {
        std::string const name =
            std::string("recompress/") + rc.spec +
            ">k:" + std::to_string(static_cast<std::uint64_t>(rc.ratio * static_cast<double>(n)));
        gb::add(name + tail, [rc, n, t](benchmark::State& s) { bm_recompress(s, rc, n, t); });
      }
    }
  }
  return gb::run_benchmarks(argc, argv);
}
