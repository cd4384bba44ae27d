// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `threshold_codec`: every element with |x| >= v, for a fixed v >= 0 (finite). One pass per
/// chunk on the pool collects each chunk's indices; the chunks are joined in order, so the
/// packet does not depend on the thread count.
///
/// Payload: the sparse payload (`detail/sparse.hpp`, docs/wire-format.md); the number of
/// selected elements m depends on the data. Biased; aggregation kind gather. A NaN or infinity
/// is a `numeric_error` naming the first one.

#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <cmath>
#include <cstring>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Threshold sparsifier (see file comment).
class threshold_codec : public detail::sparse_codec_base<threshold_codec> {
 public:
  static constexpr codec_id id = codec_id::threshold;

  /// Keeps |x| >= `value` (finite, >= 0); values sent as `values`.
  explicit threshold_codec(float value = 0.0f, sparse_values values = sparse_values::f32)
      : value_(value), values_(values) {
    if (!std::isfinite(value) || value < 0.0f) {
      throw config_error("gradcomp: threshold value must be finite and >= 0, got " + std::to_string(value));
    }
    if (static_cast<unsigned>(values) > 2) {
      throw config_error("gradcomp: sparse value type must be f32, f16 or bf16");
    }
  }

  [[nodiscard]] float value() const noexcept { return value_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Worst case: every element selected, absolute indices.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + n * static_cast<std::size_t>(4 + detail::sparse::value_bytes(values_));
  }

  /// The cost per *selected* element, 32 + value bits (the fraction selected depends on the
  /// data), assuming absolute u32 indices.
  [[nodiscard]] double bits_per_element() const noexcept {
    return detail::sparse::nominal_bits(false, 1.0, values_, 32.0);
  }

  /// Ascending indices of the elements of `x` with |x| >= value().
  void select(float const* x, std::size_t n, std::vector<std::uint32_t>& idx,
              codec_context const& ctx) const {
    idx.clear();
    std::uint32_t tk;
    std::memcpy(&tk, &value_, 4);
    tk &= 0x7fffffffu;  // -0 threshold reads as 0
    std::size_t const chunks = cpu::chunk_count(n, 64);
    std::vector<std::vector<std::uint32_t>> part(chunks);
    std::vector<unsigned char> bad(chunks);
    cpu::for_each_chunk(n, 64, ctx, [&](std::size_t c, std::size_t b, std::size_t e) {
      std::vector<std::uint32_t>& out = part[c];
      std::uint32_t nonfinite = 0;
      for (std::size_t i = b; i < e; ++i) {
        std::uint32_t u;
        std::memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        nonfinite |= u >= 0x7f800000u;
        if (u >= tk) out.push_back(static_cast<std::uint32_t>(i));
      }
      bad[c] = nonfinite != 0;
    });
    for (std::size_t c = 0; c < chunks; ++c) {
      if (bad[c]) {
        std::size_t const at = detail::first_nonfinite(x, n);
        detail::throw_nonfinite(id, at, x[at]);
      }
    }
    std::size_t m = 0;
    for (auto const& p : part) m += p.size();
    idx.reserve(m);
    for (auto const& p : part) idx.insert(idx.end(), p.begin(), p.end());
  }

 private:
  float value_;
  sparse_values values_;
};

GRADCOMP_NAMESPACE_END
