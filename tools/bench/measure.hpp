// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The measurements of `gradcomp-bench`: for one codec and one gradient tensor, what the codec
/// sends, how much it distorts and how fast it runs next to the memory pass it cannot avoid.
///
/// - **Size**: the packet bytes of `compress` (header included) and 4n / bytes, "× smaller than
///   float32".
/// - **Distortion** of the decoded tensor d = D(C(x)) against x: relative L2 error
///   ‖d − x‖ / ‖x‖ and cosine similarity ⟨d, x⟩ / (‖d‖ ‖x‖), in double precision. Stochastic
///   codecs use the context of step 0 (seed `measure_seed`).
/// - **Bias** (codecs that declare themselves unbiased): the tensor is compressed at S steps
///   (S random streams); `bias` = ‖mean_s d_s − x‖ / ‖x‖. For an unbiased codec,
///   E‖mean − x‖² = E‖d − x‖² / S, so `bias_bound` = sqrt(mean_s ‖d_s − x‖² / S) / ‖x‖ is what the
///   bias should be from noise alone; a ratio bias / bias_bound well above 1 is a real bias.
/// - **Error feedback** (`settings::feedback`): the tensor's steps go through the library's
///   `compressor<any_codec, residual_feedback>`; the residual after step t is
///   e_t = e_{t−1} + g_t − d_t (what residual feedback keeps: the sum of the decoded packets plus
///   the residual is the sum of the gradients). Reported: ‖e_T‖ / ‖g_T‖ after the last step and
///   the delay Σ‖e_t‖² / Σ‖d_t‖² in steps (as `ef_window_controller` measures it).
/// - **Speed**, per thread count: the median time of `compress`, `decompress` and
///   `decompress_add`, each call followed (untimed against the codec) by one call of its memory
///   baseline from bench/common.hpp (read for compress, write for decompress, update for
///   decompress_add) on the same pool and buffers, as `gradcomp_bench_codecs` does; throughput
///   is input bytes (4n) per second and the ratio is baseline time / codec time (1.0: the codec
///   runs at the speed of the memory pass).

#include "../../bench/common.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <iterator>
#include <string>
#include <vector>

namespace gradcomp_tool {

namespace gc = gradcomp;
namespace gb = gradcomp_bench;

/// Seed of the codec context of every measurement (random codecs).
inline constexpr std::uint64_t measure_seed = 20261122;

/// One gradient tensor: its name and its values at one or more steps (all the same length).
struct tensor_input {
  std::string name;
  std::vector<std::vector<float>> steps;
  [[nodiscard]] std::size_t size() const { return steps.empty() ? 0 : steps.front().size(); }
  /// The values measured for size, distortion, bias and speed: the last step.
  [[nodiscard]] std::vector<float> const& latest() const { return steps.back(); }
};

/// How much to measure.
struct settings {
  std::vector<unsigned> threads{1};  ///< pool sizes of the speed measurements
  bool timing = true;                ///< measure speed at all
  double min_time = 0.2;             ///< seconds of codec calls per operation (at least)
  unsigned min_reps = 3;             ///< timed calls per operation (at least)
  unsigned seeds = 8;                ///< random streams of the bias measurement
  bool feedback = false;             ///< run the steps through residual error feedback
};

/// Speed of one codec on one tensor with one pool size.
struct speed {
  unsigned threads = 1;
  double compress_s = 0, decompress_s = 0, decompress_add_s = 0;  ///< median seconds per call
  double read_s = 0, write_s = 0, update_s = 0;  ///< median seconds of the matching baselines
};

/// Everything measured for one codec on one tensor.
struct row {
  std::string tensor;
  std::string codec;
  std::size_t n = 0;
  std::size_t bytes = 0;
  double smaller = 0;  ///< 4n / bytes
  double rel_l2 = 0;
  double cosine = 0;
  bool unbiased = false;
  unsigned seeds = 0;  ///< 0: no bias measurement
  double bias = std::numeric_limits<double>::quiet_NaN();
  double bias_bound = std::numeric_limits<double>::quiet_NaN();
  unsigned ef_steps = 0;  ///< 0: no error-feedback measurement
  double ef_residual = std::numeric_limits<double>::quiet_NaN();
  double ef_delay = std::numeric_limits<double>::quiet_NaN();
  std::vector<speed> speeds;
};

/// Throughput in GB/s of a call over n floats taking `seconds`.
inline double gbps(std::size_t n, double seconds) {
  return seconds > 0 ? static_cast<double>(n) * 4.0 / seconds / 1e9 : 0.0;
}

/// Distortion of `d` against `x`.
struct distortion {
  double rel_l2 = 0;
  double cosine = 0;
};

/// Relative L2 error and cosine similarity of `d` against `x` (in double). An all-zero `x`
/// gives an error of 0 when `d` is zero too, else infinity; a zero vector's cosine is 1 when
/// both are zero, else 0.
inline distortion distort(std::span<float const> x, std::span<float const> d) {
  double xx = 0, dd = 0, xd = 0, ee = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const a = x[i], b = d[i];
    xx += a * a;
    dd += b * b;
    xd += a * b;
    ee += (b - a) * (b - a);
  }
  distortion out;
  if (xx > 0) {
    out.rel_l2 = std::sqrt(ee / xx);
  } else {
    out.rel_l2 = ee > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  }
  if (xx > 0 && dd > 0) {
    out.cosine = xd / std::sqrt(xx * dd);
  } else {
    out.cosine = (xx == 0 && dd == 0) ? 1.0 : 0.0;
  }
  return out;
}

namespace detail {

inline double norm_sq(std::span<float const> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

inline gc::codec_context context_at(std::uint32_t step, unsigned threads) {
  gc::codec_context ctx = gb::context(threads);
  ctx.seed = measure_seed;
  ctx.step = step;
  return ctx;
}

// Packet of `x` and its decoding into `d`; returns the packet size.
inline std::size_t round_trip(gc::any_codec const& codec, std::span<float const> x, std::vector<std::byte>& packet,
                              std::vector<float>& d, gc::codec_context const& ctx) {
  packet.resize(codec.max_compressed_bytes(x.size()));
  std::size_t const bytes = codec.compress(gc::tensor_view<float const>(x), packet, ctx);
  d.assign(x.size(), 0.0f);
  codec.decompress(std::span<std::byte const>(packet.data(), bytes), std::span<float>(d), ctx);
  return bytes;
}

inline volatile float sink = 0.0f;

}  // namespace detail

/// Size, distortion, bias and error feedback of `codec` on `t` (no speed).
inline row measure_quality(gc::any_codec const& codec, std::string const& spec, tensor_input const& t,
                           settings const& s) {
  row r;
  r.tensor = t.name;
  r.codec = spec;
  r.n = t.size();
  r.unbiased = codec.unbiased();
  std::span<float const> const x(t.latest());
  std::vector<std::byte> packet;
  std::vector<float> d;
  r.bytes = detail::round_trip(codec, x, packet, d, detail::context_at(0, 1));
  r.smaller = static_cast<double>(4 * r.n) / static_cast<double>(r.bytes);
  distortion const q = distort(x, d);
  r.rel_l2 = q.rel_l2;
  r.cosine = q.cosine;

  if (r.unbiased && s.seeds > 0) {
    std::vector<double> mean(r.n, 0.0);
    double sq_err = 0;
    for (unsigned k = 0; k < s.seeds; ++k) {
      detail::round_trip(codec, x, packet, d, detail::context_at(k, 1));
      for (std::size_t i = 0; i < r.n; ++i) {
        mean[i] += d[i];
        double const e = static_cast<double>(d[i]) - x[i];
        sq_err += e * e;
      }
    }
    double const xx = detail::norm_sq(x);
    double bias_sq = 0;
    for (std::size_t i = 0; i < r.n; ++i) {
      double const e = mean[i] / s.seeds - x[i];
      bias_sq += e * e;
    }
    double const bound_sq = sq_err / s.seeds / s.seeds;  // mean per-stream error / S
    r.seeds = s.seeds;
    r.bias = xx > 0 ? std::sqrt(bias_sq / xx) : std::sqrt(bias_sq);
    r.bias_bound = xx > 0 ? std::sqrt(bound_sq / xx) : std::sqrt(bound_sq);
  }

  if (s.feedback) {
    gc::compressor<gc::any_codec, gc::residual_feedback> ef(codec);
    std::vector<float> e(r.n, 0.0f);
    double residual_energy = 0, sent_energy = 0;
    packet.resize(codec.max_compressed_bytes(r.n));
    for (std::size_t k = 0; k < t.steps.size(); ++k) {
      std::span<float const> const g(t.steps[k]);
      gc::codec_context const ctx = detail::context_at(static_cast<std::uint32_t>(k), 1);
      std::size_t const bytes = ef.compress(gc::tensor_view<float const>(g), packet, ctx);
      d.assign(r.n, 0.0f);
      codec.decompress(std::span<std::byte const>(packet.data(), bytes), std::span<float>(d), ctx);
      for (std::size_t i = 0; i < r.n; ++i) e[i] = (e[i] + g[i]) - d[i];
      residual_energy += detail::norm_sq(e);
      sent_energy += detail::norm_sq(d);
    }
    double const gg = detail::norm_sq(t.steps.back());
    r.ef_steps = static_cast<unsigned>(t.steps.size());
    r.ef_residual = gg > 0 ? std::sqrt(detail::norm_sq(e) / gg) : std::sqrt(detail::norm_sq(e));
    r.ef_delay = sent_energy > 0 ? residual_energy / sent_energy : std::numeric_limits<double>::infinity();
  }
  return r;
}

/// Median seconds of `call` and of `base` run after each call: at least `min_reps` calls and
/// `min_time` seconds of codec calls, after one warm-up call.
template <class Call, class Base>
std::pair<double, double> time_pair(Call&& call, Base&& base, settings const& s) {
  call();
  base();
  std::vector<double> tc, tb;
  double spent = 0;
  while (tc.size() < s.min_reps || spent < s.min_time) {
    double const t0 = gb::now_seconds();
    call();
    double const t1 = gb::now_seconds();
    base();
    double const t2 = gb::now_seconds();
    tc.push_back(t1 - t0);
    tb.push_back(t2 - t1);
    spent += t1 - t0;
    if (tc.size() >= 100000) break;
  }
  return {gb::median(tc), gb::median(tb)};
}

/// Speed of `codec` on the latest step of `t` with a pool of `threads`.
inline speed measure_speed(gc::any_codec const& codec, tensor_input const& t, unsigned threads, settings const& s) {
  std::size_t const n = t.size();
  gb::buffer<float> x(n), out(n), acc(n);
  std::copy(t.latest().begin(), t.latest().end(), x.data());
  gb::buffer<std::byte> packet(codec.max_compressed_bytes(n));
  gc::codec_context const ctx = detail::context_at(3, threads);
  gc::tensor_view<float const> const in(x.span());
  std::size_t const bytes = codec.compress(in, packet.span(), ctx);
  std::vector<std::byte> const sent(packet.data(), packet.data() + bytes);
  std::span<std::byte const> const p(sent);

  speed sp;
  sp.threads = threads;
  auto base = [&](gb::baseline b, float* y) { return [&, b, y] { detail::sink = gb::run_baseline(b, x.data(), y, n, ctx); }; };
  std::tie(sp.compress_s, sp.read_s) = time_pair(
      [&] { detail::sink = static_cast<float>(codec.compress(in, packet.span(), ctx)); },
      base(gb::baseline::read, out.data()), s);
  std::tie(sp.decompress_s, sp.write_s) = time_pair(
      [&] { codec.decompress(p, out.span(), ctx); }, base(gb::baseline::write, out.data()), s);
  std::tie(sp.decompress_add_s, sp.update_s) = time_pair(
      [&] { codec.decompress_add(p, acc.span(), 1.0f, ctx); }, base(gb::baseline::update, acc.data()), s);
  return sp;
}

/// Everything for `codec` (built from `spec`) on `t`.
inline row measure(gc::any_codec const& codec, std::string const& spec, tensor_input const& t, settings const& s) {
  row r = measure_quality(codec, spec, t, s);
  if (s.timing) {
    for (unsigned th : s.threads) r.speeds.push_back(measure_speed(codec, t, th, s));
  }
  return r;
}

/// The codecs of `--codec all`: the configurations bench/bench_codecs.cpp measures
/// (`gradcomp_bench::codec_specs`) and the sparsifiers at 1 % and 0.1 %. (`threshold` is left
/// out: its cut-off depends on the gradient's scale; `powersgd` is not an `any_codec`.)
inline std::vector<std::string> all_codec_specs() {
  std::vector<std::string> specs(std::begin(gradcomp_bench::codec_specs), std::end(gradcomp_bench::codec_specs));
  for (char const* s : {"topk:ratio=0.01", "topk:ratio=0.001", "approx_topk:ratio=0.01", "randomk:ratio=0.01,scale=true"}) {
    specs.emplace_back(s);
  }
  return specs;
}

}  // namespace gradcomp_tool
