// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `approx_topk_codec`: DGC-style approximate top-k. A threshold is estimated from a
/// fixed-stride sample of the tensor, one pass collects the elements above a safe lower
/// bound, and the bound is then refined on those candidates only, until the selected count m
/// lies within `tolerance` of k: ⌈(1 − tol) k⌉ ≤ m ≤ ⌊(1 + tol) k⌋ (`detail/select.hpp`).
///
/// **What is guaranteed.** The selected set is always the *exact* top-m of the tensor for its
/// own m (ranked by |x|, ties toward the lower index), so its energy Σ x² is at least that of
/// the exact top-k when m ≥ k and at least (m / k) of it when m < k — never below (1 − tol)
/// times the exact top-k's energy. With tolerance 0 the result is exactly `topk_codec`'s set.
/// Packets do not depend on the thread count.
///
/// **Accuracy / speed trade-off.** The cost is one streaming pass over the tensor plus work on
/// about k + 4√(k s / n) · n / s + 8 n / s candidates (s the sample size): the sample fraction
/// trades the sample's cost (s keys read at random-ish addresses and partially sorted)
/// against the candidate overshoot; the tolerance decides how early the refinement may stop
/// (at the first boundary of a 2048-bin histogram over the candidates' key range whose count
/// lands in the window — usually the first histogram; with a narrow window or many ties it
/// narrows further and resolves the exact k-th key, one more pass over the candidates per
/// level). A misleading sample (periodic data) costs two more passes over the
/// tensor, never a wrong count. Compared with exact `topk_codec`, which already runs a
/// sample-bracketed single pass for large tensors, the gain is the early stop; it matters
/// most for large k and on GPUs.
///
/// Payload: the sparse payload (`detail/sparse.hpp`, docs/wire-format.md), codec id
/// approx_topk; decoding is that of top-k. Biased; aggregation kind gather. A NaN or infinity
/// is a `numeric_error` naming the first one.

#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/detail/select.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/config.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Approximate top-k sparsifier (see file comment).
class approx_topk_codec : public detail::sparse_codec_base<approx_topk_codec> {
 public:
  static constexpr codec_id id = codec_id::approx_topk;

  /// Keeps 1% of the elements within ±10%, sample fraction 0.001, values in f32.
  approx_topk_codec() noexcept = default;

  /// Aims at min(k, n) elements (k = 0: none).
  static approx_topk_codec count(std::uint64_t k, double sample = 0.001, double tolerance = 0.1,
                                 sparse_values values = sparse_values::f32) {
    approx_topk_codec c = make(sample, tolerance, values);
    c.by_ratio_ = false;
    c.k_ = k;
    return c;
  }

  /// Aims at max(1, floor(r n)) elements of n > 0; 0 < r <= 1.
  static approx_topk_codec ratio(double r, double sample = 0.001, double tolerance = 0.1,
                                 sparse_values values = sparse_values::f32) {
    detail::sparse::check_ratio(r, "approx_topk");
    approx_topk_codec c = make(sample, tolerance, values);
    c.ratio_ = r;
    return c;
  }

  /// This codec with another target size; sample fraction, tolerance and value type kept.
  [[nodiscard]] approx_topk_codec with_budget(sparse_budget b) const {
    return b.by_count() ? count(b.count_value(), sample_, tolerance_, values_)
                        : ratio(b.ratio(), sample_, tolerance_, values_);
  }

  [[nodiscard]] bool by_ratio() const noexcept { return by_ratio_; }
  [[nodiscard]] double ratio_value() const noexcept { return ratio_; }
  [[nodiscard]] std::uint64_t count_value() const noexcept { return k_; }
  [[nodiscard]] double sample_fraction() const noexcept { return sample_; }
  [[nodiscard]] double tolerance() const noexcept { return tolerance_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Target count k for a tensor of n (the same rule as `topk_codec::k_for`).
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return detail::sparse::kept_count(by_ratio_, ratio_, k_, n);
  }

  /// The window [lo, hi] the selected count lands in for a target k (lo >= 1 when k >= 1).
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> window(std::uint64_t k) const noexcept {
    if (k == 0) return {0, 0};
    auto const kd = static_cast<double>(k);
    auto const lo = static_cast<std::uint64_t>(std::ceil(kd * (1.0 - tolerance_) - 1e-9));
    auto const hi = static_cast<std::uint64_t>(std::floor(kd * (1.0 + tolerance_) + 1e-9));
    return {std::clamp<std::uint64_t>(lo, 1, k), std::max(hi, k)};
  }

  /// Header plus absolute indices plus values for the most elements the window allows.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    std::size_t const m =
        std::min<std::size_t>(n, static_cast<std::size_t>(window(k_for(n)).second));
    return header_bytes + m * static_cast<std::size_t>(4 + detail::sparse::value_bytes(values_));
  }

  /// Nominal wire bits per element at the target k (as `topk_codec::bits_per_element`).
  [[nodiscard]] double bits_per_element() const noexcept {
    double const per = 32.0 + 8.0 * static_cast<double>(detail::sparse::value_bytes(values_));
    return by_ratio_ ? ratio_ * per : per;
  }

  /// The selection request for a target of k elements.
  [[nodiscard]] detail::select::request request_for(std::uint64_t k) const noexcept {
    auto const [lo, hi] = window(k);
    return {k, lo, hi, sample_, 4096};
  }

  /// Ascending indices of the selected elements of `x` (the exact top-m, m within the window).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              codec_context const& ctx) const {
    detail::select::segment const seg{x, n};
    auto r = detail::select::top(std::span<detail::select::segment const>(&seg, 1),
                                 request_for(k_for(n)), id, ctx);
    idx = std::move(r[0]);
  }

 private:
  static approx_topk_codec make(double sample, double tolerance, sparse_values values) {
    if (!(sample > 0.0 && sample <= 1.0)) {
      throw config_error("gradcomp: approx_topk sample fraction must be in (0, 1], got " +
                         std::to_string(sample));
    }
    if (!(tolerance >= 0.0 && tolerance < 1.0)) {
      throw config_error("gradcomp: approx_topk tolerance must be in [0, 1), got " +
                         std::to_string(tolerance));
    }
    if (static_cast<unsigned>(values) > 2)
      throw config_error("gradcomp: sparse value type must be f32, f16 or bf16");
    approx_topk_codec c;
    c.sample_ = sample;
    c.tolerance_ = tolerance;
    c.values_ = values;
    return c;
  }

  bool by_ratio_ = true;
  double ratio_ = 0.01;
  std::uint64_t k_ = 0;
  double sample_ = 0.001;
  double tolerance_ = 0.1;
  sparse_values values_ = sparse_values::f32;
};

GRADCOMP_NAMESPACE_END
