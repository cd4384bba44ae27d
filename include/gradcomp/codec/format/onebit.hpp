// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `onebit_codec`, for every backend. The element math and the canonical
/// summation order of the scale are in core/quant/onebit.hpp.
///
/// Payload: f32 scale, u32 reserved (0), then ceil(n/8) bytes of sign bits (bit i%8 of byte
/// i/8 is 1 iff x_i < 0; -0 and +0 are positive; unused high bits of the last byte are 0).
/// Variant 0: the scale is mean|x| (finite, >= +0); variant 1: unscaled, the scale is 1.
/// Parameters 0.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The onebit codec's packets (see file comment).
struct onebit_format {
  static constexpr codec_id id = codec_id::onebit;
  /// Bytes before the sign bits: scale and reserved word.
  static constexpr std::size_t prefix_bytes = 8;

  /// Scale choice of the decoded signs.
  enum class scaling : std::uint8_t {
    mean_abs = 0,  ///< ±mean|x| (BytePS "scaling on")
    none = 1,      ///< ±1 (signSGD, majority vote when summed and re-signed)
  };

  scaling mode = scaling::mean_abs;  ///< the variant

  /// Payload bytes for `n` elements.
  [[nodiscard]] static constexpr std::uint64_t payload_bytes(std::uint64_t n) noexcept {
    return prefix_bytes + (n + 7) / 8;
  }
  [[nodiscard]] static constexpr std::size_t max_compressed_bytes(std::size_t n) {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(n));
  }

  [[nodiscard]] constexpr packet_header header_for(std::size_t n, dtype t) const noexcept {
    return {id, t, static_cast<std::uint8_t>(mode), n, payload_bytes(n), 0, 0};
  }

  static void validate(packet_header const& h) {
    if (h.variant > 1 || h.param0 != 0 || h.param1 != 0) {
      throw format_error("gradcomp: onebit packet has variant " + std::to_string(h.variant) +
                         " (expected 0 or 1) or non-zero parameters");
    }
    if (h.count > UINT64_MAX - 64) throw format_error("gradcomp: onebit count is impossible");
    detail::expect_payload(h, payload_bytes(h.count));
  }

  /// Checks the first 8 payload bytes (scale and reserved word) of a packet with header `h`
  /// and returns the scale; throws `format_error`.
  static float checked_scale(packet_header const& h, std::byte const* payload) {
    float const scale = detail::load_f32(payload);
    if (!std::isfinite(scale) || std::signbit(scale)) {
      throw format_error("gradcomp: onebit packet has scale " + std::to_string(scale) +
                         " (expected a finite value >= +0)");
    }
    if (h.variant == static_cast<std::uint8_t>(scaling::none) && scale != 1.0f) {
      throw format_error("gradcomp: unscaled onebit packet has scale " + std::to_string(scale) +
                         " (expected 1)");
    }
    if (detail::load_le<std::uint32_t>(payload + 4) != 0) {
      throw format_error("gradcomp: onebit packet has a non-zero reserved word");
    }
    return scale;
  }

  /// Checks that the unused high bits of the last sign byte `last` of an n-element packet are 0.
  static void check_padding(std::uint64_t n, std::byte last) {
    if (n % 8 != 0 && (static_cast<unsigned>(last) >> (n % 8)) != 0) {
      throw format_error("gradcomp: onebit packet has set padding bits after element " +
                         std::to_string(n));
    }
  }
};

GRADCOMP_NAMESPACE_END
