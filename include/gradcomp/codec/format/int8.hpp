// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `int8_codec`, for every backend. The element math is in core/quant/int8.hpp.
///
/// Payload: nb pairs (f32 lo, f32 hi), one per bucket, then n bytes q; x̂ = fma(q,
/// f32((hi - lo)/255), lo). Header: param0 = bucket (0 = whole tensor), variant 0 = nearest,
/// 1 = stochastic, param1 = 0. Decoding rejects a bucket whose range is not finite lo <= hi.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// Rounding of `int8_codec`.
enum class int8_rounding : std::uint8_t {
  nearest = 0,     ///< round half to even; biased, error at most half a step
  stochastic = 1,  ///< round up with probability equal to the fraction; unbiased
};

/// The int8 codec's packets (see file comment): its parameters and their layout.
struct int8_format {
  static constexpr codec_id id = codec_id::int8;

  std::uint32_t bucket = 512;                       ///< elements per range (0 = whole tensor)
  int8_rounding rounding = int8_rounding::nearest;  ///< the variant

  /// Payload bytes for n elements; 0 when n is too large (checked by callers).
  [[nodiscard]] static constexpr std::uint64_t payload_bytes(std::uint32_t bucket_param,
                                                             std::uint64_t n) noexcept {
    if (n > UINT64_MAX / 16) return 0;
    return 8 * detail::bucket_count(bucket_param, n) + n;
  }
  /// Offset in the payload of the codes (after the ranges).
  [[nodiscard]] static constexpr std::uint64_t codes_offset(std::uint32_t bucket_param,
                                                            std::uint64_t n) noexcept {
    return 8 * detail::bucket_count(bucket_param, n);
  }

  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(bucket, n));
  }
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return 8.0 + (bucket != 0 ? 64.0 / bucket : 0.0);
  }

  /// The header of `n` elements of type `t`; `config_error` if n is too large.
  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(bucket, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for an int8 packet");
    return {id, t, static_cast<std::uint8_t>(rounding), n, bytes, bucket, 0};
  }

  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    if (h.variant > 1 || h.param1 != 0) {
      throw format_error("gradcomp: int8 packet has variant " + std::to_string(h.variant) +
                         " (expected 0 or 1) or a non-zero param1");
    }
    std::uint64_t const bytes = payload_bytes(h.param0, h.count);
    if (h.count != 0 && bytes == 0) throw format_error("gradcomp: int8 packet count is impossible");
    detail::expect_payload(h, bytes);
  }

  /// `r`, unless it is neither nearest nor stochastic (`config_error`).
  static int8_rounding checked_rounding(int8_rounding r) {
    if (r != int8_rounding::nearest && r != int8_rounding::stochastic) {
      throw config_error("gradcomp: int8 rounding must be nearest or stochastic");
    }
    return r;
  }

  /// Whether bucket range [lo, hi] is one a packet may carry (finite, lo <= hi).
  GRADCOMP_HOST_DEVICE static constexpr bool valid_range(float lo, float hi) noexcept {
    return (lo >= -FLT_MAX && lo <= FLT_MAX) && (hi >= -FLT_MAX && hi <= FLT_MAX) && lo <= hi;
  }
  /// The `format_error` of bucket `k`'s range [lo, hi] when it is not `valid_range`.
  static void check_range(std::uint64_t k, float lo, float hi) {
    if (!valid_range(lo, hi)) {
      throw format_error("gradcomp: int8 packet has bucket range [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "] at bucket " + std::to_string(k) +
                         " (expected finite lo <= hi)");
    }
  }
};

GRADCOMP_NAMESPACE_END
