// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the error-feedback tests: deterministic gradients, packet decoding through
// the header (what a receiver does), and the bookkeeping of the conservation check.

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace feedback_test {

namespace gc = gradcomp;

/// Deterministic test data (SplitMix64), shared with the codec tests.
using rng = gradcomp_test::test_rng;

/// A gradient of n elements: normal values times a per-step scale of 10^[-1.5, 1.5], with some
/// exact zeros and an occasional spike, like real gradients.
inline std::vector<float> make_gradient(rng& r, std::size_t n) {
  double const scale = std::pow(10.0, 3.0 * r.uniform() - 1.5);
  std::vector<float> g(n);
  for (auto& v : g) {
    double const u = r.uniform();
    if (u < 0.03) {
      v = 0.0f;
    } else if (u < 0.035) {
      v = static_cast<float>(20.0 * scale * r.gaussian());
    } else {
      v = static_cast<float>(scale * r.gaussian());
    }
  }
  return g;
}

/// Converts float values to element type T (round to nearest even for the 16-bit types).
template <gc::element T>
std::vector<T> convert(std::vector<float> const& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = gc::from_float<T>(v[i]);
  return out;
}

/// Widens element values to float (exact).
template <gc::element T>
std::vector<float> widen(std::vector<T> const& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = gc::to_float(v[i]);
  return out;
}

/// Decodes a packet of any codec from its header, into float.
inline std::vector<float> decode_any(std::span<std::byte const> packet, std::size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  gc::decompress_any<float>(packet, out);
  return out;
}

/// Compresses `g` (tensor `id`) with compressor `c` and returns the packet, checking the size
/// contract (the returned size fits the bound and matches the header).
template <class Compressor, gc::element T>
std::vector<std::byte> compress_packet(Compressor& c, std::vector<T> const& g, gc::tensor_id id,
                                       gc::codec_context const& ctx) {
  std::vector<std::byte> buf(c.max_compressed_bytes(g.size()));
  std::size_t const bytes = c.compress(gc::tensor_view<T const>(std::span<T const>(g), id),
                                       std::span<std::byte>(buf), ctx);
  REQUIRE(bytes <= buf.size());
  buf.resize(bytes);
  REQUIRE(gc::read_header(buf).packet_bytes() == bytes);
  return buf;
}

/// The bytes of a saved state, for before/after comparisons.
template <class Compressor>
std::vector<std::byte> snapshot(Compressor const& c) {
  return c.save();
}

/// Float epsilon (2^-23): twice the unit roundoff u of round-to-nearest.
inline constexpr double float_eps = 0x1p-23;

/// Per-element bookkeeping of the mass-conservation check of residual feedback.
///
/// Each step the policy computes, in float, p = fl(e + g) and e' = fl(p - d~), where d~ is the
/// decoded packet as decompress_add produces it internally (which may differ from an
/// independent decompress by a rounding, fma versus multiply-add). With u = eps/2 the step's
/// error in e' + d - (e + g) is then at most u|p| + u|e'| + 2u|d| <= eps (|e| + |g| + |d| + |e'|)
/// (using |p| <= |e| + |g|). Summed over the steps this is the budget below; the check allows
/// 4x that, plus the (much smaller) error of accumulating the sums in double. A lost or doubled
/// packet, or a residual dropped on a codec change, is off by O(|g|) — orders of magnitude
/// more, which `tolerance_is_meaningful` confirms for each run.
struct conservation_ledger {
  explicit conservation_ledger(std::size_t n)
      : sum_g(n, 0.0),
        sum_decoded(n, 0.0),
        budget(n, 0.0),
        sum_abs_g(n, 0.0),
        sum_abs_decoded(n, 0.0),
        prev_residual(n, 0.0f) {}

  void add_step(std::span<float const> g, std::span<float const> decoded,
                std::span<float const> residual) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      sum_g[i] += g[i];
      sum_decoded[i] += decoded[i];
      sum_abs_g[i] += std::fabs(g[i]);
      sum_abs_decoded[i] += std::fabs(decoded[i]);
      budget[i] += std::fabs(prev_residual[i]) + std::fabs(g[i]) + std::fabs(decoded[i]) +
                   std::fabs(residual[i]);
      prev_residual[i] = residual[i];
    }
    ++steps;
  }

  /// Largest |sum g - (sum decoded + residual)| / tolerance over the elements (<= 1 passes).
  double worst_ratio(std::span<float const> residual, std::size_t* where = nullptr) const {
    double worst = 0.0;
    for (std::size_t i = 0; i < sum_g.size(); ++i) {
      double const diff = std::fabs(sum_g[i] - (sum_decoded[i] + residual[i]));
      double const tol = 4.0 * float_eps * budget[i] + 1e-12 * (sum_abs_g[i] + budget[i]) + 1e-30;
      if (diff / tol > worst) {
        worst = diff / tol;
        if (where != nullptr) *where = i;
      }
    }
    return worst;
  }

  /// True when every element's tolerance is below 1% of its average |g| or average |decoded
  /// packet| per step: losing a hundredth of one average step's gradient or packet would then
  /// fail the check. (With a codec whose error exceeds the signal, e.g. QSGD with few levels on
  /// big buckets, the residual and the packets grow large, and so does the rounding budget.)
  [[nodiscard]] bool tolerance_is_meaningful() const {
    for (std::size_t i = 0; i < sum_g.size(); ++i) {
      double const tol = 4.0 * float_eps * budget[i];
      if (tol > 0.01 * std::max(sum_abs_g[i], sum_abs_decoded[i]) / steps) return false;
    }
    return true;
  }

  std::vector<double> sum_g, sum_decoded, budget, sum_abs_g, sum_abs_decoded;
  std::vector<float> prev_residual;
  int steps = 0;
};

}  // namespace feedback_test
