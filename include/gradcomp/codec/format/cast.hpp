// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of the element-type codecs (identity, fp16, bf16), for every backend.
///
/// - identity: payload = the n elements in the input's own type (the header's dtype), little
///   endian; variant and parameters 0.
/// - fp16 / bf16: payload = n little-endian 16-bit floats of the codec's type, each the input
///   element rounded to nearest even (an input already of that type is copied bit for bit);
///   the header's dtype is the input's type; variant and parameters 0.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The identity codec's packets (see file comment).
struct identity_format {
  static constexpr codec_id id = codec_id::identity;

  /// Largest packet for `n` elements (of f32 input).
  [[nodiscard]] static constexpr std::size_t max_compressed_bytes(std::size_t n) {
    detail::check_packet_elements(id, n);
    return header_bytes + 4 * n;
  }
  /// The header of `n` elements of type `t`.
  [[nodiscard]] static constexpr packet_header header_for(std::size_t n, dtype t) noexcept {
    return {id, t, 0, n, n * dtype_size(t), 0, 0};
  }
  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    if (h.variant != 0 || h.param0 != 0 || h.param1 != 0) {
      throw format_error("gradcomp: identity packet has non-zero variant or parameters");
    }
    if (h.count > (UINT64_MAX - header_bytes) / 4) {
      throw format_error("gradcomp: identity packet declares an impossible element count");
    }
    detail::expect_payload(h, h.count * dtype_size(h.type));
  }
};

/// The fp16 (`Wire` = `dtype::f16`) and bf16 (`dtype::bf16`) codecs' packets.
template <dtype Wire>
struct half_cast_format {
  static_assert(Wire == dtype::f16 || Wire == dtype::bf16);
  static constexpr codec_id id = Wire == dtype::f16 ? codec_id::fp16 : codec_id::bf16;
  /// The payload's element type.
  static constexpr dtype wire = Wire;

  [[nodiscard]] static constexpr std::size_t max_compressed_bytes(std::size_t n) {
    detail::check_packet_elements(id, n);
    return header_bytes + 2 * n;
  }
  [[nodiscard]] static constexpr packet_header header_for(std::size_t n, dtype t) noexcept {
    return {id, t, 0, n, 2 * n, 0, 0};
  }
  static void validate(packet_header const& h) {
    if (h.variant != 0 || h.param0 != 0 || h.param1 != 0) {
      throw format_error(std::string("gradcomp: ") + codec_name(id) +
                         " packet has non-zero variant or parameters");
    }
    if (h.count > (UINT64_MAX - header_bytes) / 2) {
      throw format_error("gradcomp: 16-bit packet declares an impossible element count");
    }
    detail::expect_payload(h, 2 * h.count);
  }
};

/// The fp16 codec's packets.
using fp16_format = half_cast_format<dtype::f16>;
/// The bf16 codec's packets.
using bf16_format = half_cast_format<dtype::bf16>;

GRADCOMP_NAMESPACE_END
