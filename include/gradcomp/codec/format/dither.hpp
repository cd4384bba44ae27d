// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of the random-dithering codecs (`qsgd_codec`, `terngrad_codec`,
/// `dithering_codec`), for every backend. The element math and the canonical norm order are in
/// core/quant/dither.hpp.
///
/// Payload: `nb` f32 bucket scales (the norms), then the code stream — element i's code in bits
/// [i*w, i*w + w) (bit k of the stream is bit k%8 of byte k/8), `w = 1 + bit_width(s)`, the code
/// being the level index q (0..s) with a sign bit above it, set only when x < 0 and q > 0.
/// Unused bits of the last byte are 0. Decoding: linear x̂ = ±q * (scale / s); natural
/// x̂ = ±2^(q-1) * (scale / 2^(s-1)) for q > 0.
///
/// Headers: qsgd param0 = s, param1 = bucket, variant 0 (linear levels, L2 norm); terngrad
/// param0 = 1, param1 = bucket, variant 0 (max norm); dithering param0 = s, param1 = bucket,
/// variant bit 0 = natural levels, bit 1 = L2 norm.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/dither.hpp>
#include <gradcomp/core/wire.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// Level spacing of a dithering quantizer.
enum class dither_partition : std::uint8_t {
  linear = 0,   ///< levels {0, 1/s, ..., 1}
  natural = 1,  ///< levels {0, 2^(1-s), ..., 1/2, 1}
};

/// Norm each bucket is normalised by.
enum class dither_norm : std::uint8_t {
  max = 0,  ///< max |x| of the bucket
  l2 = 1,   ///< Euclidean norm of the bucket
};

namespace detail {

/// Everything that fixes a dither packet's layout.
struct dither_config {
  std::uint32_t s = 1;       ///< levels
  std::uint32_t bucket = 0;  ///< bucket length; 0 = the whole tensor is one bucket
  dither_partition partition = dither_partition::linear;
  dither_norm norm = dither_norm::max;

  [[nodiscard]] constexpr quant::dither_shape shape() const noexcept {
    return {s, 1u + bit_width(s), partition == dither_partition::natural};
  }
  [[nodiscard]] constexpr std::uint64_t bucket_len(std::uint64_t n) const noexcept {
    return bucket_length(bucket, n);
  }
  [[nodiscard]] constexpr std::uint64_t buckets(std::uint64_t n) const noexcept {
    return bucket_count(bucket, n);
  }
  /// Payload bytes for n elements; 0 signals overflow (n too large), checked by callers.
  [[nodiscard]] constexpr std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    std::uint64_t const w = shape().width;
    if (n > (UINT64_MAX / 32)) return 0;
    return 4 * buckets(n) + (n * w + 7) / 8;
  }
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return shape().width + (bucket != 0 ? 32.0 / bucket : 0.0);
  }
};

/// Maximum level count per partition (codes fit in 16 bits; natural levels fit in an int).
inline constexpr std::uint32_t max_linear_levels = 32767;
inline constexpr std::uint32_t max_natural_levels = 30;

inline void check_dither_config(dither_config const& c, char const* who, bool packet) {
  std::uint32_t const limit =
      c.partition == dither_partition::natural ? max_natural_levels : max_linear_levels;
  if (c.s == 0 || c.s > limit) {
    std::string msg = std::string("gradcomp: ") + who +
                      " needs 1 <= levels <= " + std::to_string(limit) + ", got " +
                      std::to_string(c.s);
    if (packet) throw format_error(msg);
    throw config_error(msg);
  }
}

/// Whether a packet may carry bucket scale `scale` (finite, >= +0).
GRADCOMP_HOST_DEVICE constexpr bool valid_dither_scale(float scale) noexcept {
  return scale >= 0.0f && scale <= FLT_MAX && (detail::bit_cast<std::uint32_t>(scale) >> 31) == 0;
}

/// The `format_error` of bucket `k`'s scale when it is not `valid_dither_scale`.
inline void check_dither_scale(codec_id id, std::uint64_t k, float scale) {
  if (!valid_dither_scale(scale)) {
    throw format_error(std::string("gradcomp: ") + codec_name(id) + " packet has bucket scale " +
                       std::to_string(scale) + " at bucket " + std::to_string(k) +
                       " (expected a finite value >= 0)");
  }
}

/// Checks the unused bits of a code stream of `n` codes of `width` bits whose last byte is
/// `last` (throws `format_error`).
inline void check_dither_padding(codec_id id, std::uint64_t n, unsigned width, std::byte last) {
  std::uint64_t const bits = n * width;
  if (bits % 8 != 0 && (static_cast<unsigned>(last) >> (bits % 8)) != 0) {
    throw format_error(std::string("gradcomp: ") + codec_name(id) +
                       " packet has set padding bits after the last code");
  }
}

/// The `format_error` of a packet holding a code above `s` levels or a negative zero code.
[[noreturn]] inline void throw_bad_dither_code(codec_id id, std::uint32_t s) {
  throw format_error(std::string("gradcomp: ") + codec_name(id) + " packet holds a code above " +
                     std::to_string(s) + " levels or a negative zero code");
}

/// The `numeric_error` of a finite bucket (starting at element `first`) whose norm overflows.
[[noreturn]] inline void throw_norm_overflow(codec_id id, std::uint64_t first) {
  throw numeric_error(std::string("gradcomp: ") + codec_name(id) + " bucket at element " +
                      std::to_string(first) + " has a norm beyond the float32 range");
}

}  // namespace detail

/// The packets of the dithering codec whose format is `Format` (one of the three below) with
/// configuration `cfg`: a format object like `int8_format`.
template <class Format>
struct dither_packets {
  static constexpr codec_id id = Format::id;

  detail::dither_config cfg;

  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(cfg.payload_bytes(n));
  }
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return cfg.bits_per_element();
  }
  /// The header of `n` elements of type `t`; `config_error` if n is too large.
  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = cfg.payload_bytes(n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for a dither packet");
    return {id, t, Format::variant_of(cfg), n, bytes, cfg.s, cfg.bucket};
  }
  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    detail::dither_config const c = Format::config_of(h);
    detail::check_dither_config(c, codec_name(id), true);
    std::uint64_t const bytes = c.payload_bytes(h.count);
    if (h.count != 0 && bytes == 0) {
      throw format_error("gradcomp: dither packet declares an impossible element count");
    }
    detail::expect_payload(h, bytes);
  }
};

/// QSGD packets: linear levels, L2 norm.
struct qsgd_format {
  static constexpr codec_id id = codec_id::qsgd;
  static detail::dither_config config_of(packet_header const& h) {
    if (h.variant != 0) throw format_error("gradcomp: qsgd packet has non-zero variant");
    return {h.param0, h.param1, dither_partition::linear, dither_norm::l2};
  }
  static constexpr std::uint8_t variant_of(detail::dither_config const&) noexcept { return 0; }
  /// A QSGD codec's configuration: `levels` = s in [1, 32767] (else `config_error`), `bucket`
  /// elements per norm (0 = whole tensor).
  static detail::dither_config configure(std::uint32_t levels, std::uint32_t bucket) {
    detail::dither_config const c{levels, bucket, dither_partition::linear, dither_norm::l2};
    detail::check_dither_config(c, "qsgd", false);
    return c;
  }
};

/// TernGrad packets: one linear level, max norm.
struct terngrad_format {
  static constexpr codec_id id = codec_id::terngrad;
  static detail::dither_config config_of(packet_header const& h) {
    if (h.variant != 0 || h.param0 != 1) {
      throw format_error("gradcomp: terngrad packet must have variant 0 and param0 = 1");
    }
    return {1, h.param1, dither_partition::linear, dither_norm::max};
  }
  static constexpr std::uint8_t variant_of(detail::dither_config const&) noexcept { return 0; }
  /// A TernGrad codec's configuration: `bucket` elements per scale (0 = whole tensor).
  static constexpr detail::dither_config configure(std::uint32_t bucket) noexcept {
    return {1, bucket, dither_partition::linear, dither_norm::max};
  }
};

/// Random dithering packets: linear or natural levels, max or L2 norm.
struct dithering_format {
  static constexpr codec_id id = codec_id::dithering;
  static detail::dither_config config_of(packet_header const& h) {
    if (h.variant > 3) throw format_error("gradcomp: dithering packet has unknown variant bits");
    return {h.param0, h.param1, static_cast<dither_partition>(h.variant & 1u),
            static_cast<dither_norm>((h.variant >> 1) & 1u)};
  }
  static constexpr std::uint8_t variant_of(detail::dither_config const& c) noexcept {
    return static_cast<std::uint8_t>(static_cast<unsigned>(c.partition) |
                                     (static_cast<unsigned>(c.norm) << 1));
  }
  /// A dithering codec's configuration: `levels` = s (linear: 1..32767, natural: 1..30; else
  /// `config_error`), `bucket` elements per norm (0 = whole tensor).
  static detail::dither_config configure(std::uint32_t levels, dither_partition partition,
                                         dither_norm norm, std::uint32_t bucket) {
    detail::dither_config const c{levels, bucket, partition, norm};
    detail::check_dither_config(c, "dithering", false);
    return c;
  }
};

GRADCOMP_NAMESPACE_END
