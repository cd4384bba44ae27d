// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `sparse_budget`: how many elements a sparsifier keeps, as a compression factor (keep
/// n / factor of n, the ratio 1 / factor) or as a count. A controller that chooses a factor per
/// step turns it into a codec with `codec.with_budget(sparse_budget::factor(f))`, which keeps
/// every other parameter of the codec (value type, sample fraction, tolerance): no spec-string
/// round trip. `topk_codec`, `approx_topk_codec`, `random_k_codec` and `scaled_random_k_codec`
/// have `with_budget`; `any_codec::with_budget` forwards to them and rejects other codecs.

#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// A sparsifier's selection size (see file comment). Value type.
class sparse_budget {
 public:
  /// Keep n / f elements (the ratio 1 / f; at least one of a non-empty tensor); f finite and
  /// >= 1. Throws `config_error` otherwise.
  static sparse_budget factor(double f) {
    if (!(std::isfinite(f) && f >= 1.0)) {
      throw config_error("gradcomp: a sparse budget's compression factor must be finite and >= 1, got " +
                         std::to_string(f));
    }
    sparse_budget b;
    b.factor_ = f;
    return b;
  }
  /// Keep min(k, n) elements.
  static sparse_budget count(std::uint64_t k) noexcept {
    sparse_budget b;
    b.by_count_ = true;
    b.count_ = k;
    return b;
  }

  /// True for a count, false for a factor.
  [[nodiscard]] bool by_count() const noexcept { return by_count_; }
  /// The factor (1 for a count budget).
  [[nodiscard]] double factor_value() const noexcept { return factor_; }
  /// The ratio 1 / factor.
  [[nodiscard]] double ratio() const noexcept { return 1.0 / factor_; }
  /// The count (0 for a factor budget).
  [[nodiscard]] std::uint64_t count_value() const noexcept { return count_; }
  /// Elements kept of a tensor of n (the sparsifiers' rule: min(k, n), or max(1, floor(n /
  /// factor)) for n > 0).
  [[nodiscard]] std::size_t kept(std::size_t n) const noexcept {
    return detail::sparse::kept_count(!by_count_, ratio(), count_, n);
  }

 private:
  sparse_budget() = default;
  double factor_ = 1.0;
  std::uint64_t count_ = 0;
  bool by_count_ = false;
};

GRADCOMP_NAMESPACE_END
