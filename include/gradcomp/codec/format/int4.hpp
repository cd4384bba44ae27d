// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `int4_codec`, for every backend. The element math is in core/quant/int4.hpp.
///
/// Payload: nb f32 scales s, one per bucket, then ceil(n / 2) bytes of 4-bit codes, element 2i
/// in the low nibble of byte i and element 2i + 1 in the high one (the high nibble of the last
/// byte of an odd n is written 0 and ignored). x̂ = (c - 8) * s, s = f32(max |x| / 7) over the
/// bucket (+0 for a bucket of zeros of either sign; decoders accept -0 too). Header: param0 =
/// bucket (0 = whole tensor), variant 0 (nearest rounding; other values are reserved), param1 =
/// 0.
/// Decoding rejects a scale that is not finite in [0, f32(FLT_MAX / 7)] (no encoder writes
/// one) and accepts every nibble (0, never written, decodes to -8 s).

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/int4.hpp>
#include <gradcomp/core/wire.hpp>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The int4 codec's packets (see file comment): its parameter and their layout.
struct int4_format {
  static constexpr codec_id id = codec_id::int4;

  std::uint32_t bucket = 64;  ///< elements per scale (0 = whole tensor)

  /// Payload bytes for n elements; 0 when n is too large (checked by callers).
  [[nodiscard]] static constexpr std::uint64_t payload_bytes(std::uint32_t bucket_param,
                                                             std::uint64_t n) noexcept {
    if (n > UINT64_MAX / 16) return 0;
    return 4 * detail::bucket_count(bucket_param, n) + (n + 1) / 2;
  }
  /// Offset in the payload of the codes (after the scales).
  [[nodiscard]] static constexpr std::uint64_t codes_offset(std::uint32_t bucket_param,
                                                            std::uint64_t n) noexcept {
    return 4 * detail::bucket_count(bucket_param, n);
  }

  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(bucket, n));
  }
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return 4.0 + (bucket != 0 ? 32.0 / bucket : 0.0);
  }

  /// The header of `n` elements of type `t`; `config_error` if n is too large.
  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(bucket, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for an int4 packet");
    return {id, t, 0, n, bytes, bucket, 0};
  }

  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    if (h.variant != 0 || h.param1 != 0) {
      throw format_error("gradcomp: int4 packet has variant " + std::to_string(h.variant) +
                         " (expected 0) or a non-zero param1");
    }
    std::uint64_t const bytes = payload_bytes(h.param0, h.count);
    if (h.count != 0 && bytes == 0) throw format_error("gradcomp: int4 packet count is impossible");
    detail::expect_payload(h, bytes);
  }

  /// The largest scale an encoder writes: that of a bucket holding FLT_MAX.
  GRADCOMP_HOST_DEVICE static float max_scale() noexcept { return quant::int4_scale(FLT_MAX); }
  /// Whether `s` is a scale a packet may carry (finite, 0 <= s <= `max_scale()`).
  GRADCOMP_HOST_DEVICE static bool valid_scale(float s) noexcept {
    return s >= 0.0f && s <= max_scale();
  }
  /// The `format_error` of bucket `k`'s scale `s` when it is not `valid_scale`.
  static void check_scale(std::uint64_t k, float s) {
    if (!valid_scale(s)) {
      throw format_error("gradcomp: int4 packet has scale " + std::to_string(s) + " at bucket " +
                         std::to_string(k) + " (expected finite, 0 <= scale <= FLT_MAX / 7)");
    }
  }
};

GRADCOMP_NAMESPACE_END
