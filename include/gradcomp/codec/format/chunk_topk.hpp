// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of `chunk_topk_codec`, for every backend. The element math of the 2- and 4-bit
/// values is in core/quant/int4.hpp (sign-magnitude codes).
///
/// The tensor is cut into nc = ⌈n / C⌉ chunks of C elements (C a power of two, 2..65536; the
/// last chunk may be short, of length L); each chunk keeps k_c = min(k, its length) elements,
/// K = Σ k_c in all. Payload:
///
///     nc × f32 step                 only for the 2- and 4-bit values (variant 3, 4)
///     ⌈K · w / 8⌉ bytes of values   value j of the packet, w bits each, in chunk order
///     ⌈K · log2(C) / 8⌉ bytes       index of value j inside its chunk, log2(C) bits each
///
/// Fields of w and log2(C) bits are packed least significant bit first (value j occupies bits
/// [j w, (j + 1) w) of its section); the unused bits of a section's last byte are written 0 and
/// ignored. Within a chunk the indices are strictly ascending. Values (variant): 0 f32, 1 f16,
/// 2 bf16 (w = 32 or 16, round to nearest even, finite overflow saturates as `fp16_codec`),
/// 3 2-bit, 4 4-bit sign-magnitude codes (w = b, `quant::magnitude_code`) decoded as
/// ±(level + 1) · step. Header: param0 = C, param1 = k (1 <= k <= C).
///
/// Decoding rejects (format_error) indices that are not strictly ascending or fall past a
/// short last chunk, non-finite f32/f16/bf16 values, and steps that are not finite in
/// [0, FLT_MAX / 2^(b-1)] (none of which an encoder writes); the tensor is untouched then.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/int4.hpp>
#include <gradcomp/core/wire.hpp>

#include <bit>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// Value type of a chunk top-k packet (the header's variant).
enum class chunk_values : std::uint8_t {
  f32 = 0,   ///< exact
  f16 = 1,   ///< IEEE binary16, round to nearest even, finite overflow saturates
  bf16 = 2,  ///< bfloat16, round to nearest even, finite overflow saturates
  int2 = 3,  ///< 2-bit sign-magnitude code with one step per chunk (SparseLoCo)
  int4 = 4,  ///< 4-bit sign-magnitude code with one step per chunk
};

/// The chunk top-k codec's packets (see file comment): its parameters and their layout.
struct chunk_topk_format {
  static constexpr codec_id id = codec_id::chunk_topk;

  std::uint32_t chunk = 4096;                ///< C, elements per chunk (a power of two)
  std::uint32_t k = 64;                      ///< elements kept per chunk
  chunk_values values = chunk_values::f32;  ///< value type

  /// Largest chunk length (indices of at most 16 bits).
  static constexpr std::uint32_t max_chunk = 65536;

  /// Bits per value.
  GRADCOMP_HOST_DEVICE static constexpr unsigned value_bits(chunk_values v) noexcept {
    switch (v) {
      case chunk_values::f32: return 32;
      case chunk_values::f16:
      case chunk_values::bf16: return 16;
      case chunk_values::int2: return 2;
      case chunk_values::int4: return 4;
    }
    return 32;
  }
  /// Whether values are quantized codes with a step per chunk.
  GRADCOMP_HOST_DEVICE static constexpr bool quantized(chunk_values v) noexcept {
    return v == chunk_values::int2 || v == chunk_values::int4;
  }
  /// Bits per index: log2(chunk).
  GRADCOMP_HOST_DEVICE static constexpr unsigned index_bits(std::uint32_t chunk_param) noexcept {
    return detail::trailing_zeros(chunk_param);
  }
  /// Whether (chunk, k, variant) are parameters a packet may carry.
  GRADCOMP_HOST_DEVICE static constexpr bool valid_params(std::uint32_t chunk_param,
                                                          std::uint32_t k_param,
                                                          unsigned variant) noexcept {
    return chunk_param >= 2 && chunk_param <= max_chunk && detail::single_bit(chunk_param) &&
           k_param >= 1 && k_param <= chunk_param && variant <= 4;
  }
  /// Chunks of an n-element tensor.
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t chunk_count(std::uint32_t chunk_param,
                                                                  std::uint64_t n) noexcept {
    return (n + chunk_param - 1) / chunk_param;
  }
  /// Elements kept from an n-element tensor (K).
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t kept(std::uint32_t chunk_param,
                                                           std::uint32_t k_param,
                                                           std::uint64_t n) noexcept {
    if (n == 0) return 0;
    std::uint64_t const nc = chunk_count(chunk_param, n);
    std::uint64_t const last = n - (nc - 1) * chunk_param;
    return (nc - 1) * k_param + (last < k_param ? last : k_param);
  }
  /// Offset in the payload of the values (after the steps).
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t values_offset(std::uint32_t chunk_param,
                                                                    chunk_values v,
                                                                    std::uint64_t n) noexcept {
    return quantized(v) ? 4 * chunk_count(chunk_param, n) : 0;
  }
  /// Offset in the payload of the indices (after the values).
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t indices_offset(std::uint32_t chunk_param,
                                                                     std::uint32_t k_param,
                                                                     chunk_values v,
                                                                     std::uint64_t n) noexcept {
    return values_offset(chunk_param, v, n) + (kept(chunk_param, k_param, n) * value_bits(v) + 7) / 8;
  }
  /// Payload bytes for n elements (parameters valid); 0 when n is too large.
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t payload_bytes(std::uint32_t chunk_param,
                                                                    std::uint32_t k_param,
                                                                    chunk_values v,
                                                                    std::uint64_t n) noexcept {
    if (n > UINT64_MAX / 64) return 0;
    return indices_offset(chunk_param, k_param, v, n) +
           (kept(chunk_param, k_param, n) * index_bits(chunk_param) + 7) / 8;
  }

  [[nodiscard]] constexpr std::size_t max_compressed_bytes(std::size_t n) const {
    detail::check_packet_elements(id, n);
    return header_bytes + static_cast<std::size_t>(payload_bytes(chunk, k, values, n));
  }
  /// Bits per element of a tensor of whole chunks.
  [[nodiscard]] constexpr double bits_per_element() const noexcept {
    return (static_cast<double>(k) * (value_bits(values) + index_bits(chunk)) +
            (quantized(values) ? 32.0 : 0.0)) /
           chunk;
  }

  /// The header of `n` elements of type `t`; `config_error` if n is too large.
  [[nodiscard]] packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(chunk, k, values, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for a chunk_topk packet");
    return {id, t, static_cast<std::uint8_t>(values), n, bytes, chunk, k};
  }

  /// Codec fields and payload size (throws `format_error`).
  static void validate(packet_header const& h) {
    if (!valid_params(h.param0, h.param1, h.variant)) {
      throw format_error("gradcomp: chunk_topk packet has chunk " + std::to_string(h.param0) +
                         ", k " + std::to_string(h.param1) + ", variant " +
                         std::to_string(h.variant) +
                         " (expected a power-of-two chunk in 2..65536, 1 <= k <= chunk, variant "
                         "0..4)");
    }
    std::uint64_t const bytes =
        payload_bytes(h.param0, h.param1, static_cast<chunk_values>(h.variant), h.count);
    if (h.count != 0 && bytes == 0) throw format_error("gradcomp: chunk_topk packet count is impossible");
    detail::expect_payload(h, bytes);
  }

  /// `(chunk, k, v)` as given, unless invalid (`config_error` naming the option).
  static chunk_topk_format checked(std::uint32_t chunk_param, std::uint32_t k_param, chunk_values v) {
    if (chunk_param < 2 || chunk_param > max_chunk || !std::has_single_bit(chunk_param)) {
      throw config_error("gradcomp: chunk_topk chunk must be a power of two in 2..65536, got " +
                         std::to_string(chunk_param));
    }
    if (k_param < 1 || k_param > chunk_param) {
      throw config_error("gradcomp: chunk_topk k must be in 1..chunk (" + std::to_string(chunk_param) +
                         "), got " + std::to_string(k_param));
    }
    if (static_cast<unsigned>(v) > 4) {
      throw config_error("gradcomp: chunk_topk values must be f32, f16, bf16, int2 or int4");
    }
    return {chunk_param, k_param, v};
  }

  /// Whether `step` is one a packet with b-bit codes may carry (finite, 0 <= step <=
  /// FLT_MAX / 2^(b-1), so that every level decodes to a finite value).
  GRADCOMP_HOST_DEVICE static bool valid_step(float step, unsigned bits) noexcept {
    return step >= 0.0f && step <= FLT_MAX / static_cast<float>(quant::magnitude_levels(bits));
  }
};

namespace detail {

/// Writes fields of up to 32 bits, least significant bit first, from a byte-aligned start.
struct bit_writer {
  std::byte* p;
  std::uint64_t acc = 0;
  unsigned held = 0;

  void put(std::uint32_t v, unsigned bits) noexcept {
    acc |= static_cast<std::uint64_t>(v) << held;
    held += bits;
    while (held >= 8) {
      *p++ = static_cast<std::byte>(acc & 0xff);
      acc >>= 8;
      held -= 8;
    }
  }
  /// Writes the last partial byte (its unused bits 0).
  void flush() noexcept {
    if (held != 0) *p++ = static_cast<std::byte>(acc & 0xff);
    acc = 0;
    held = 0;
  }
};

/// Reads fields of up to 32 bits, least significant bit first, from a byte-aligned start;
/// never reads a byte past the last field's.
struct bit_reader {
  std::byte const* p;
  std::uint64_t acc = 0;
  unsigned held = 0;

  std::uint32_t get(unsigned bits) noexcept {
    while (held < bits) {
      acc |= static_cast<std::uint64_t>(*p++) << held;
      held += 8;
    }
    auto const v = static_cast<std::uint32_t>(acc & ((std::uint64_t{1} << bits) - 1));
    acc >>= bits;
    held -= bits;
    return v;
  }
};

}  // namespace detail

GRADCOMP_NAMESPACE_END
