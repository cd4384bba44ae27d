// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// What every codec's wire format shares, for every backend: the checks of a packet's codec
/// id, payload size and element count, the bucket arithmetic of the bucketed codecs, and the
/// error a codec raises for an input it cannot encode. The CPU codecs (codec/detail/
/// codec_base.hpp) and the CUDA codecs (cuda/) both call these, so a packet is rejected with
/// the same exception and message wherever it is decoded.
///
/// The headers of codec/format/ hold each codec's header fields, payload layout and packet
/// validation; they depend on core/ only (no kernels, no thread pool).

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
/// The largest element count a codec sizes a packet for (`max_compressed_bytes`): 2^56. Every
/// codec spends at most 8 bytes (64 bits) per element, so every packet size of at most this
/// many elements, and every intermediate of its computation, fits in 64 bits.
inline constexpr std::uint64_t max_packet_elements = std::uint64_t{1} << 56;

namespace detail {

/// Throws `config_error` when `n` elements are more than any packet can be sized for
/// (`max_packet_elements`): `max_compressed_bytes` would otherwise wrap around.
constexpr void check_packet_elements(codec_id id, std::uint64_t n) {
  if (n > max_packet_elements) {
    throw config_error(std::string("gradcomp: ") + codec_name(id) + ": cannot size a packet of " +
                       std::to_string(n) + " elements (at most 2^56; the size would overflow)");
  }
}

/// Throws `format_error` unless the packet's payload size equals `expected`.
inline void expect_payload(packet_header const& h, std::uint64_t expected) {
  if (h.payload_bytes != expected) {
    throw format_error(std::string("gradcomp: ") + codec_name(h.codec) + " packet of " +
                       std::to_string(h.count) + " elements declares " +
                       std::to_string(h.payload_bytes) + " payload bytes, its parameters imply " +
                       std::to_string(expected));
  }
}

/// Throws `format_error` unless the packet was written by codec `id`.
inline void expect_codec(packet_header const& h, codec_id id) {
  if (h.codec != id) {
    throw format_error(
        std::string("gradcomp: packet was written by codec '") + codec_name(h.codec) + "' (id " +
        std::to_string(static_cast<unsigned>(h.codec)) + "), expected '" + codec_name(id) + "'");
  }
}

/// Throws `config_error` unless a packet of codec `id` holding `h.count` elements is decoded
/// into an output of `n` elements.
inline void expect_count(packet_header const& h, codec_id id, std::uint64_t n) {
  if (h.count != n) {
    throw config_error(std::string("gradcomp: ") + codec_name(id) + " packet holds " +
                       std::to_string(h.count) + " elements, the output span has " +
                       std::to_string(n));
  }
}

/// Throws the `numeric_error` of a codec that cannot represent a non-finite input.
[[noreturn]] inline void throw_nonfinite(codec_id id, std::size_t index, float value) {
  throw numeric_error(std::string("gradcomp: ") + codec_name(id) +
                      " cannot encode the non-finite value " + std::to_string(value) +
                      " at element " + std::to_string(index) +
                      "; only identity, fp16 and bf16 carry NaN/Inf (check the gradient or "
                      "the loss scale)");
}

/// Bits needed to store `v` (0 for 0).
GRADCOMP_HOST_DEVICE constexpr unsigned bit_width(std::uint32_t v) noexcept {
  unsigned w = 0;
  while (v != 0) {
    ++w;
    v >>= 1;
  }
  return w;
}

/// Whether `v` is a power of two: `std::has_single_bit`, which device code cannot call.
GRADCOMP_HOST_DEVICE constexpr bool single_bit(std::uint32_t v) noexcept {
  return v != 0 && (v & (v - 1)) == 0;
}

/// Trailing zero bits of `v` (32 for 0): `std::countr_zero`, which device code cannot call.
GRADCOMP_HOST_DEVICE constexpr unsigned trailing_zeros(std::uint32_t v) noexcept {
  if (v == 0) return 32;
  unsigned n = 0;
  while ((v & 1u) == 0) {
    ++n;
    v >>= 1;
  }
  return n;
}

/// Length of the buckets of an n-element tensor for a `bucket` parameter (0 = one bucket
/// holding the whole tensor; an empty tensor still gets length 1 so divisions stay defined).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t bucket_length(std::uint32_t bucket,
                                                           std::uint64_t n) noexcept {
  return bucket != 0 ? bucket : (n == 0 ? 1 : n);
}

/// Number of buckets of an n-element tensor (0 for an empty one; the last may be short).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t bucket_count(std::uint32_t bucket,
                                                          std::uint64_t n) noexcept {
  return n == 0 ? 0 : (n + bucket_length(bucket, n) - 1) / bucket_length(bucket, n);
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
