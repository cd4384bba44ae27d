// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_bench_codecs: compress, decompress and decompress_add of every CPU codec on float32
// N(0, 1) input, next to memory baselines measured by the same program on the same buffers.
//
// Benchmarks are named OP/SPEC/n:N/threads:T, where OP is compress, decompress,
// decompress_add or baseline, SPEC a `gradcomp::make_codec` spec (or read, write, update for the
// baselines), N the element count and T the pool size (1, or hardware_concurrency()).
//
// Throughput is input bytes (n * 4) per second for every operation, decompression included, so
// numbers of one codec compare directly. Counters:
//   GB/s       n * 4 / the median time of one call (the same median the ratios use);
//   base_GB/s  the matching baseline (read for compress, write for decompress, update for
//              decompress_add), one call after every codec call, same pool and buffers;
//   ratio      median baseline time / median codec time: 1.0 = the codec runs at the speed
//              of the memory pass it cannot avoid;
//   ratio_traffic (compress and decompress, n a multiple of 16) median time of the traffic
//              kernel that moves exactly this codec's bytes with streaming stores
//              (bench/common.hpp, `run_traffic`) / median codec time;
//   B/elem     packet bytes (32-byte header included) per element.
// Each benchmark runs 3 repetitions of at least 0.3 s; use the `median` aggregate.
//
// Extra options (before Google Benchmark's own, which all work):
//   --sizes=16,20,24   log2 of the element counts to run (default 16,20,24)
//   --threads=1,all    pool sizes to run ("all" = hardware_concurrency(); default 1,all)

#include "harness.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace gb = gradcomp_bench;
namespace gc = gradcomp;


/// The codecs measured with error feedback (ef, ef_3pass): the fused ones and, for comparison,
/// onebit (one scale for the whole tensor) and top-k (a global selection), which run the three
/// passes either way.
constexpr char const* ef_specs[] = {
    "fp16",
    "bf16",
    "int8:bucket=512,rounding=nearest",
    "int8:bucket=512,rounding=stochastic",
    "natural:bucket=512",
    "qsgd:levels=7,bucket=512",
    "terngrad:bucket=512",
    "dithering:levels=8,partition=natural,norm=max,bucket=512",
    "onebit:scaling=mean_abs",
    "topk:ratio=0.01",
};

// ef: one step of residual error feedback through `compressor` (fused with the codec where it
// can, feedback/policies.hpp); ef_3pass: the same step as three passes (stage, compress,
// commit), the reference the fused path replaces. Both against the read baseline (the issue's
// target) and, in the counter ratio_axpy, against y += x (the traffic error feedback cannot
// avoid: read g and the residual, write the residual).
enum class op { compress, decompress, decompress_add, ef, ef_3pass };

constexpr char const* op_name(op o) noexcept {
  switch (o) {
    case op::compress: return "compress";
    case op::decompress: return "decompress";
    case op::decompress_add: return "decompress_add";
    case op::ef: return "ef";
    case op::ef_3pass: return "ef_3pass";
  }
  return "?";
}

constexpr gb::baseline baseline_of(op o) noexcept {
  switch (o) {
    case op::compress: return gb::baseline::read;
    case op::decompress: return gb::baseline::write;
    case op::decompress_add: return gb::baseline::update;
    case op::ef:
    case op::ef_3pass: return gb::baseline::read;
  }
  return gb::baseline::read;
}

// Buffers shared by all benchmarks of one size: the decoded output and the packet buffer (large
// enough for any codec's packet, identity being the largest).
struct size_buffers {
  gb::buffer<float> out;
  gb::buffer<std::byte> packet;
};

size_buffers& buffers_for(std::size_t n) {
  static std::map<std::size_t, size_buffers> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    it = cache.emplace(n, size_buffers{gb::buffer<float>(n), gb::buffer<std::byte>(4 * n + 4096)})
             .first;
  }
  return it->second;
}

// The packet of `spec` for the Gaussian input of n elements, made once.
std::vector<std::byte> const& packet_for(std::string const& spec, std::size_t n) {
  static std::map<std::pair<std::string, std::size_t>, std::vector<std::byte>> cache;
  auto key = std::make_pair(spec, n);
  auto it = cache.find(key);
  if (it == cache.end()) {
    gc::any_codec const codec = gc::make_codec(spec);
    std::vector<std::byte> p(codec.max_compressed_bytes(n));
    std::size_t const bytes =
        codec.compress(gc::tensor_view<float const>(gb::gaussian(n).span()), p, gb::context(1));
    p.resize(bytes);
    it = cache.emplace(std::move(key), std::move(p)).first;
  }
  return it->second;
}

void set_throughput(benchmark::State& state, std::size_t n, std::vector<double>& times) {
  double const t = gb::median(times);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(n * sizeof(float)));
  state.counters["GB/s"] = t > 0 ? static_cast<double>(n * sizeof(float)) / t / 1e9 : 0.0;
}

void bm_codec(benchmark::State& state, std::string const& spec, op o, std::size_t n,
              unsigned threads) {
  gc::any_codec const codec = gc::make_codec(spec);
  gc::codec_context const ctx = gb::context(threads);
  size_buffers& bufs = buffers_for(n);
  std::vector<std::byte> const& packet = packet_for(spec, n);
  gc::tensor_view<float const> const input(gb::gaussian(n).span());
  std::span<std::byte const> const in_packet(packet);
  std::span<std::byte> const out_packet = bufs.packet.span();
  std::span<float> const out = bufs.out.span();

  gc::compressor<gc::any_codec, gc::residual_feedback> ef(codec);
  gc::residual_feedback const fb;
  gc::residual_feedback::state ef_state;
  auto call = [&] {
    switch (o) {
      case op::compress: return codec.compress(input, out_packet, ctx);
      case op::ef: return ef.compress(input, out_packet, ctx);
      case op::ef_3pass: return gc::detail::stage_compress_commit(fb, codec, ef_state, input, out_packet, ctx);
      case op::decompress: codec.decompress(in_packet, out, ctx); break;
      case op::decompress_add: codec.decompress_add(in_packet, out, 1.0f, ctx); break;
    }
    return packet.size();
  };

  std::size_t bytes = 0;
  try {
    bytes = call();  // warm-up: first touch of code and data, pool threads awake
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  // Each codec call is followed (untimed) by one call of its baseline on the same pool and
  // buffers, so both medians come from the same moments of a machine whose load may drift.
  gb::baseline const base = baseline_of(o);
  float const* bx = gb::gaussian(n).data();
  float* by = bufs.out.data();
  bool const is_ef = o == op::ef || o == op::ef_3pass;
  bool const has_traffic = (o == op::compress || o == op::decompress) && n % 16 == 0;
  std::vector<double> times, base_times, axpy_times, traffic_times;
  times.reserve(4096);
  base_times.reserve(4096);
  for (auto _ : state) {
    double const t0 = gb::now_seconds();
    bytes = call();
    times.push_back(gb::now_seconds() - t0);
    benchmark::DoNotOptimize(bytes);
    benchmark::ClobberMemory();
    state.PauseTiming();
    double const t1 = gb::now_seconds();
    benchmark::DoNotOptimize(gb::run_baseline(base, bx, by, n, ctx));
    base_times.push_back(gb::now_seconds() - t1);
    if (is_ef) {
      double const t2 = gb::now_seconds();
      benchmark::DoNotOptimize(gb::run_baseline(gb::baseline::axpy, bx, by, n, ctx));
      axpy_times.push_back(gb::now_seconds() - t2);
    }
    if (has_traffic) {
      double const t3 = gb::now_seconds();
      gb::run_traffic(o == op::compress ? gb::traffic::in : gb::traffic::out, bx, by,
                      bufs.packet.data(), n, packet.size(), ctx);
      traffic_times.push_back(gb::now_seconds() - t3);
    }
    benchmark::ClobberMemory();
    state.ResumeTiming();
  }
  set_throughput(state, n, times);
  double const t_codec = gb::median(times);
  double const t_base = gb::median(base_times);
  state.counters["base_GB/s"] =
      t_base > 0 ? static_cast<double>(n * sizeof(float)) / t_base / 1e9 : 0.0;
  state.counters["ratio"] = t_codec > 0 ? t_base / t_codec : 0.0;
  state.counters["B/elem"] = static_cast<double>(bytes) / static_cast<double>(n);
  if (is_ef) {
    double const t_axpy = gb::median(axpy_times);
    state.counters["ratio_axpy"] = t_codec > 0 ? t_axpy / t_codec : 0.0;
  }
  if (has_traffic) {
    double const t_traffic = gb::median(traffic_times);
    state.counters["ratio_traffic"] = t_codec > 0 ? t_traffic / t_codec : 0.0;
  }
}

void bm_baseline(benchmark::State& state, gb::baseline b, std::size_t n, unsigned threads) {
  gc::codec_context const ctx = gb::context(threads);
  float const* x = gb::gaussian(n).data();
  float* y = buffers_for(n).out.data();
  benchmark::DoNotOptimize(gb::run_baseline(b, x, y, n, ctx));
  std::vector<double> times;
  times.reserve(4096);
  for (auto _ : state) {
    double const t0 = gb::now_seconds();
    benchmark::DoNotOptimize(gb::run_baseline(b, x, y, n, ctx));
    times.push_back(gb::now_seconds() - t0);
    benchmark::ClobberMemory();
  }
  set_throughput(state, n, times);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> const sizes = gb::take_sizes(argc, argv, "gradcomp_bench_codecs", {"16", "20", "24"}, 4, 30);
  std::vector<unsigned> const thread_counts = gb::take_threads(argc, argv, "gradcomp_bench_codecs", {"1", "all"});

  for (std::size_t n : sizes) {
    for (unsigned t : thread_counts) {
      std::string const tail = "/n:" + std::to_string(n) + "/threads:" + std::to_string(t);
      for (gb::baseline b : {gb::baseline::read, gb::baseline::write, gb::baseline::update, gb::baseline::axpy}) {
        gb::add(std::string("baseline/") + gb::baseline_name(b) + tail,
            [b, n, t](benchmark::State& s) { bm_baseline(s, b, n, t); });
      }
      for (char const* spec : gb::codec_specs) {
        for (op o : {op::compress, op::decompress, op::decompress_add}) {
          std::string const s = spec;
          gb::add(std::string(op_name(o)) + "/" + s + tail,
              [s, o, n, t](benchmark::State& st) { bm_codec(st, s, o, n, t); });
        }
      }
      for (char const* spec : ef_specs) {
        for (op o : {op::ef, op::ef_3pass}) {
          std::string const s = spec;
          gb::add(std::string(op_name(o)) + "/" + s + tail,
              [s, o, n, t](benchmark::State& st) { bm_codec(st, s, o, n, t); });
        }
      }
    }
  }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("gradcomp_version", std::to_string(GRADCOMP_VERSION_MAJOR) + "." +
                                                      std::to_string(GRADCOMP_VERSION_MINOR) + "." +
                                                      std::to_string(GRADCOMP_VERSION_PATCH));
  benchmark::AddCustomContext("gradcomp_isa", gc::cpu::isa_name(gc::cpu::machine_isa()));
  benchmark::AddCustomContext("all_threads", std::to_string(gb::all_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
