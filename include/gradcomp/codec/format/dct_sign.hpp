// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `dct_sign_codec` (DeMo's transform codec), for every backend.
///
/// The tensor is cut into nc = ⌈n / C⌉ chunks of C elements (C a power of two, 2..1024; the
/// last chunk is zero-padded to C). Each chunk's orthonormal DCT-II coefficients
/// c_u = Σ_i φ_u(i) x_i, φ_u(i) = a_u cos(π (2i + 1) u / (2C)), a_0 = √(1/C), a_u = √(2/C),
/// are computed; the k largest |c_u| (ties to the lower u) are kept, K = nc · k in all. Payload:
///
///     f32 s                         mean |c| over the K kept coefficients; finite, >= 0
///     ⌈K / 8⌉ bytes of signs        bit j (least significant first) = 1 iff kept c_j < 0
///     ⌈K · log2(C) / 8⌉ bytes       u of kept coefficient j, log2(C) bits, least significant
///                                   bit first; strictly ascending inside a chunk
///
/// Decoding is the inverse transform (DCT-III) of the sparse spectrum ±s at the kept u:
/// x̂_i = s Σ_j sign_j φ_{u_j}(i), for the chunk's real (unpadded) elements. Header:
/// param0 = C, param1 = k (1 <= k <= C), variant 0. The unused bits of each section's last byte
/// are written 0 and ignored. Decoding rejects a bad scale and indices that are not strictly
/// ascending before writing anything.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <bit>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The DCT-sign codec's packets (see file comment).
struct dct_sign_format {
  static constexpr codec_id id = codec_id::dct_sign;

  std::uint32_t chunk = 64;  ///< C, elements per transform (a power of two)
  std::uint32_t k = 8;       ///< coefficients kept per chunk

  /// Largest chunk length.
  static constexpr std::uint32_t max_chunk = 1024;

  /// Bits per index: log2(chunk).
  GRADCOMP_HOST_DEVICE static constexpr unsigned index_bits(std::uint32_t chunk_param) noexcept {
    return detail::trailing_zeros(chunk_param);
  }
  /// Whether (chunk, k) are parameters a packet may carry.
  GRADCOMP_HOST_DEVICE static constexpr bool valid_params(std::uint32_t chunk_param,
                                                          std::uint32_t k_param) noexcept {
    return chunk_param >= 2 && chunk_param <= max_chunk && detail::single_bit(chunk_param) &&
           k_param >= 1 && k_param <= chunk_param;
  }
  /// Coefficients kept from an n-element tensor (K).
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t kept(std::uint32_t chunk_param,
                                                           std::uint32_t k_param,
                                                           std::uint64_t n) noexcept {
    return (n + chunk_param - 1) / chunk_param * k_param;
  }
  /// Offset in the payload of the indices (after the scale and the signs).
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t indices_offset(std::uint32_t chunk_param,
                                                                     std::uint32_t k_param,
                                                                     std::uint64_t n) noexcept {
    return 4 + (kept(chunk_param, k_param, n) + 7) / 8;
  }
  /// Payload bytes for n elements (parameters valid); 0 when n is too large.
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t payload_bytes(std::uint32_t chunk_param,
                                                                    std::uint32_t k_param,
                                                                    std::uint64_t n) noexcept {
    if (n > UINT64_MAX / 64) return 0;
    return indices_offset(chunk_param, k_param, n) +
           (kept(chunk_param, k_param, n) * index_bits(chunk_param) + 7) / 8;
  }

  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(chunk, k, n));
  }
  /// Bits per element of a tensor of whole chunks.
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return static_cast<double>(k) * (1 + index_bits(chunk)) / chunk;
  }

  /// The header of `n` elements of type `t`; `config_error` if n is too large.
  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(chunk, k, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for a dct_sign packet");
    return {id, t, 0, n, bytes, chunk, k};
  }

  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    if (h.variant != 0 || !valid_params(h.param0, h.param1)) {
      throw format_error("gradcomp: dct_sign packet has chunk " + std::to_string(h.param0) + ", k " +
                         std::to_string(h.param1) + ", variant " + std::to_string(h.variant) +
                         " (expected a power-of-two chunk in 2..1024, 1 <= k <= chunk, variant 0)");
    }
    std::uint64_t const bytes = payload_bytes(h.param0, h.param1, h.count);
    if (h.count != 0 && bytes == 0) throw format_error("gradcomp: dct_sign packet count is impossible");
    detail::expect_payload(h, bytes);
  }

  /// `(chunk, k)` as given, unless invalid (`config_error` naming the option).
  static dct_sign_format checked(std::uint32_t chunk_param, std::uint32_t k_param) {
    if (chunk_param < 2 || chunk_param > max_chunk || !std::has_single_bit(chunk_param)) {
      throw config_error("gradcomp: dct_sign chunk must be a power of two in 2..1024, got " +
                         std::to_string(chunk_param));
    }
    if (k_param < 1 || k_param > chunk_param) {
      throw config_error("gradcomp: dct_sign k must be in 1..chunk (" + std::to_string(chunk_param) +
                         "), got " + std::to_string(k_param));
    }
    return {chunk_param, k_param};
  }

  /// Whether `s` is a scale a packet may carry (finite, >= 0).
  GRADCOMP_HOST_DEVICE static constexpr bool valid_scale(float s) noexcept {
    return s >= 0.0f && s <= FLT_MAX;
  }
};

GRADCOMP_NAMESPACE_END
