// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `natural_codec`, for every backend. The element math is in
/// core/quant/natural.hpp.
///
/// Payload: nb bytes E (largest biased float32 exponent of the bucket, at most 253), then n
/// bytes c = k | sign << 7 where k = 0 means zero and k in 1..min(E+1, 127) means magnitude
/// 2^(E + 2 - k - 127). Header: param0 = bucket (0 = whole tensor), variant and param1 0.
/// Encoding raises `numeric_error` for a non-finite input or one with |x| >= 2^127 (rounding
/// up could overflow).

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The natural codec's packets (see file comment).
struct natural_format {
  static constexpr codec_id id = codec_id::natural;
  /// Largest bucket exponent a packet may carry (an encoder refuses larger ones).
  static constexpr unsigned max_exponent = 253;

  std::uint32_t bucket = 512;  ///< elements per exponent byte (0 = whole tensor)

  /// Payload bytes for n elements; 0 when n is too large (checked by callers).
  [[nodiscard]] static constexpr std::uint64_t payload_bytes(std::uint32_t bucket_param,
                                                             std::uint64_t n) noexcept {
    if (n > UINT64_MAX / 4) return 0;
    return detail::bucket_count(bucket_param, n) + n;
  }
  /// Offset in the payload of the codes (after the exponents).
  [[nodiscard]] static constexpr std::uint64_t codes_offset(std::uint32_t bucket_param,
                                                            std::uint64_t n) noexcept {
    return detail::bucket_count(bucket_param, n);
  }
  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(bucket, n));
  }
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return 8.0 + (bucket != 0 ? 8.0 / bucket : 0.0);
  }

  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(bucket, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for a natural packet");
    return {id, t, 0, n, bytes, bucket, 0};
  }

  static void validate(packet_header const& h) {
    if (h.variant != 0 || h.param1 != 0) {
      throw format_error("gradcomp: natural packet has non-zero variant or param1");
    }
    std::uint64_t const bytes = payload_bytes(h.param0, h.count);
    if (h.count != 0 && bytes == 0)
      throw format_error("gradcomp: natural packet count is impossible");
    detail::expect_payload(h, bytes);
  }

  /// The `format_error` of bucket `k`'s exponent byte `e` when it exceeds `max_exponent`.
  static void check_exponent(std::uint64_t k, unsigned e) {
    if (e > max_exponent) {
      throw format_error("gradcomp: natural packet has bucket exponent " + std::to_string(e) +
                         " at bucket " + std::to_string(k) + " (expected at most 253)");
    }
  }
  /// The `format_error` of a packet holding a code its bucket's exponent cannot produce.
  [[noreturn]] static void throw_bad_code() {
    throw format_error("gradcomp: natural packet holds a code its bucket exponent cannot produce");
  }
  /// The `numeric_error` of a finite bucket (starting at element `first`) whose largest
  /// exponent is too large to encode.
  [[noreturn]] static void throw_too_large(std::uint64_t first) {
    throw numeric_error(
        "gradcomp: natural compression cannot encode |x| >= 2^127 (bucket at element " +
        std::to_string(first) + "): rounding up would overflow float32");
  }
};

GRADCOMP_NAMESPACE_END
