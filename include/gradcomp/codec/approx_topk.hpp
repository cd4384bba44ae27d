// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `approx_topk_codec`: DGC-style approximate top-k, whose selected count m may differ from the
/// target k by a tolerance: ⌈(1 − tol) k⌉ ≤ m ≤ ⌊(1 + tol) k⌋ (`window`).
///
/// **One tensor: exact top-k inside the window (since 0.2.0).** The approximate selection (a
/// sampled threshold, one pass collecting candidates, a refinement that stops at the first
/// histogram boundary inside the window) was measured slower than exact top-k's sample-bracketed
/// single pass at both 1 % and 0.1 % — on the Intel Xeon (0.32 against 0.36 of the read kernel
/// at 1 %, 0.44 against 0.61 at 0.1 %) and on the AMD EPYC (14.3 against 8.4 ms and 8.5 against
/// 6.4 ms at 2^24, one thread), docs/performance.md: the early stop saves less than the sample
/// and candidate passes cost. So `select` returns exactly the top k_for(n) elements, a set that
/// lies inside every tolerance window, with `topk_codec`'s kernel: the packet is top-k's with
/// the approx_topk id, and `sample` and `tolerance` only size `max_compressed_bytes` (the
/// window's top, so that buffers sized by older versions still fit).
///
/// **Whole-model selection** (`whole_model.hpp`) over several tensors keeps the windowed
/// selection (`detail/select.hpp`): there exact and approximate requests run the same
/// multi-segment engine, and the early stop is what the tolerance buys. Its guarantee: the
/// selected set is the exact top-m of the concatenated tensors for its own m, so its energy is
/// at least (1 − tol) times the exact top-k's.
///
/// Payload: the sparse payload (`detail/sparse.hpp`, docs/wire-format.md), codec id
/// approx_topk; decoding is that of top-k. Biased; aggregation kind gather. A NaN or infinity
/// is a `numeric_error` naming the first one.

#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/detail/select.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/codec/topk.hpp>
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
    return detail::sparse::approx_window(k, tolerance_);
  }

  /// Header plus absolute indices plus values for the most elements the window allows.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    std::size_t const m =
        std::min<std::size_t>(n, static_cast<std::size_t>(window(k_for(n)).second));
    return header_bytes + m * static_cast<std::size_t>(4 + detail::sparse::value_bytes(values_));
  }

  /// Nominal wire bits per element at the target k (as `topk_codec::bits_per_element`).
  [[nodiscard]] double bits_per_element() const noexcept {
    return detail::sparse::nominal_bits(by_ratio_, ratio_, values_, 32.0);
  }

  /// The selection request for a target of k elements.
  [[nodiscard]] detail::select::request request_for(std::uint64_t k) const noexcept {
    auto const [lo, hi] = window(k);
    return {k, lo, hi, sample_, 4096};
  }

  /// Ascending indices of the exact top k_for(n) elements of `x` by |x| (ties: lower index
  /// first), and their values: `topk_codec`'s selection (see the file comment).
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              std::vector<float>& values, codec_context const& ctx) const {
    topk_codec::count(k_for(n), values_).select(x, n, idx, values, ctx, id);
  }

 private:
  static approx_topk_codec make(double sample, double tolerance, sparse_values values) {
    detail::sparse::check_approx(sample, tolerance);
    detail::sparse::check_values(values);
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
