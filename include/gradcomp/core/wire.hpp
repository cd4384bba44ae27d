// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format v1: the 32-byte little-endian packet header every codec writes, the codec ids,
/// and checked readers. The payload layouts are specified in docs/wire-format.md.
///
/// | offset | size | field                                             |
/// |-------:|-----:|---------------------------------------------------|
/// |      0 |    4 | magic "GCPK" (0x47 0x43 0x50 0x4B)                |
/// |      4 |    1 | format version (2; 1 is still read)               |
/// |      5 |    1 | codec id (`codec_id`)                             |
/// |      6 |    1 | dtype of the compressed tensor (`dtype`)          |
/// |      7 |    1 | codec variant (codec-specific, 0 when unused)     |
/// |      8 |    8 | element count n (u64)                             |
/// |     16 |    8 | payload bytes (u64), exactly the bytes after this header |
/// |     24 |    4 | codec parameter 0 (u32, codec-specific)           |
/// |     28 |    4 | codec parameter 1 (u32, codec-specific)           |

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// Codec identifiers as stored in byte 5 of the header. Values are never reused.
enum class codec_id : std::uint8_t {
  identity = 1,
  fp16 = 2,
  bf16 = 3,
  int8 = 4,
  onebit = 5,
  qsgd = 6,
  terngrad = 7,
  natural = 8,
  dithering = 9,
  topk = 10,
  threshold = 11,
  random_k = 12,
  approx_topk = 13,
  powersgd = 14,
  int4 = 15,
  chunk_topk = 16,
  dct_sign = 17,
};

/// Lower-case name of a codec id, or "unknown".
constexpr char const* codec_name(codec_id id) noexcept {
  switch (id) {
    case codec_id::identity: return "identity";
    case codec_id::fp16: return "fp16";
    case codec_id::bf16: return "bf16";
    case codec_id::int8: return "int8";
    case codec_id::onebit: return "onebit";
    case codec_id::qsgd: return "qsgd";
    case codec_id::terngrad: return "terngrad";
    case codec_id::natural: return "natural";
    case codec_id::dithering: return "dithering";
    case codec_id::topk: return "topk";
    case codec_id::threshold: return "threshold";
    case codec_id::random_k: return "random_k";
    case codec_id::approx_topk: return "approx_topk";
    case codec_id::powersgd: return "powersgd";
    case codec_id::int4: return "int4";
    case codec_id::chunk_topk: return "chunk_topk";
    case codec_id::dct_sign: return "dct_sign";
  }
  return "unknown";
}

/// The wire format version this library writes. Version 2 changed only how stochastic codecs
/// draw their randomness (core/philox.hpp: one Philox draw shared by four elements), so the
/// packets of int8 (stochastic rounding), QSGD, TernGrad, natural and dithering differ from
/// version 1 and those of every other codec differ only in this byte.
inline constexpr std::uint8_t wire_version = 2;
/// The oldest version this library reads. A version-1 packet has the same layout and
/// decodes to the same values: decoding uses no randomness.
inline constexpr std::uint8_t oldest_wire_version = 1;

/// Whether this library reads packets of format version `v`.
constexpr bool readable_wire_version(std::uint8_t v) noexcept {
  return v >= oldest_wire_version && v <= wire_version;
}
/// Size of the packet header in bytes.
inline constexpr std::size_t header_bytes = 32;
/// The four magic bytes that start every packet.
inline constexpr unsigned char wire_magic[4] = {0x47, 0x43, 0x50, 0x4B};

/// Decoded packet header.
struct packet_header {
  codec_id codec{};
  dtype type = dtype::f32;
  std::uint8_t variant = 0;
  std::uint64_t count = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t param0 = 0;
  std::uint32_t param1 = 0;

  /// Header plus payload.
  [[nodiscard]] constexpr std::uint64_t packet_bytes() const noexcept {
    return header_bytes + payload_bytes;
  }
  friend constexpr bool operator==(packet_header const&, packet_header const&) = default;
};

namespace detail {

template <class U>
GRADCOMP_HOST_DEVICE constexpr U byteswap(U v) noexcept {
  if constexpr (sizeof(U) == 1) {
    return v;
  } else if constexpr (sizeof(U) == 2) {
    return static_cast<U>(__builtin_bswap16(static_cast<std::uint16_t>(v)));
  } else if constexpr (sizeof(U) == 4) {
    return static_cast<U>(__builtin_bswap32(static_cast<std::uint32_t>(v)));
  } else {
    return static_cast<U>(__builtin_bswap64(static_cast<std::uint64_t>(v)));
  }
}

template <class U>
GRADCOMP_HOST_DEVICE inline void store_le(std::byte* p, U v) noexcept {
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  std::memcpy(p, &v, sizeof(U));
}

template <class U>
GRADCOMP_HOST_DEVICE inline U load_le(std::byte const* p) noexcept {
  U v;
  std::memcpy(&v, p, sizeof(U));
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  return v;
}

inline void store_f32(std::byte* p, float f) noexcept {
  store_le(p, std::bit_cast<std::uint32_t>(f));
}
inline float load_f32(std::byte const* p) noexcept {
  return std::bit_cast<float>(load_le<std::uint32_t>(p));
}

}  // namespace detail

/// Writes `h` into the first `header_bytes` of `out`. Throws `config_error` if `out` is short.
inline void write_header(std::span<std::byte> out, packet_header const& h) {
  if (out.size() < header_bytes) {
    throw config_error("gradcomp: output buffer of " + std::to_string(out.size()) +
                       " bytes cannot hold the " + std::to_string(header_bytes) +
                       "-byte packet header");
  }
  std::byte* p = out.data();
  std::memcpy(p, wire_magic, 4);
  p[4] = std::byte{wire_version};
  p[5] = static_cast<std::byte>(h.codec);
  p[6] = static_cast<std::byte>(h.type);
  p[7] = std::byte{h.variant};
  detail::store_le<std::uint64_t>(p + 8, h.count);
  detail::store_le<std::uint64_t>(p + 16, h.payload_bytes);
  detail::store_le<std::uint32_t>(p + 24, h.param0);
  detail::store_le<std::uint32_t>(p + 28, h.param1);
}

/// Reads and validates the header of `packet`: magic, version, dtype, and that the payload size
/// it declares is exactly what follows it in `packet`. Codec-specific fields are checked by the
/// codec. Throws `format_error` with a description of the first problem.
inline packet_header read_header(std::span<std::byte const> packet) {
  if (packet.size() < header_bytes) {
    throw format_error("gradcomp: packet of " + std::to_string(packet.size()) +
                       " bytes is shorter than the " + std::to_string(header_bytes) +
                       "-byte header");
  }
  std::byte const* p = packet.data();
  if (std::memcmp(p, wire_magic, 4) != 0) {
    throw format_error("gradcomp: packet does not start with the magic bytes \"GCPK\"");
  }
  if (!readable_wire_version(static_cast<std::uint8_t>(p[4]))) {
    throw format_error("gradcomp: packet has wire format version " +
                       std::to_string(static_cast<unsigned>(p[4])) + ", this library reads " +
                       std::to_string(oldest_wire_version) + " to " +
                       std::to_string(wire_version));
  }
  packet_header h;
  h.codec = static_cast<codec_id>(p[5]);
  h.type = static_cast<dtype>(p[6]);
  h.variant = static_cast<std::uint8_t>(p[7]);
  h.count = detail::load_le<std::uint64_t>(p + 8);
  h.payload_bytes = detail::load_le<std::uint64_t>(p + 16);
  h.param0 = detail::load_le<std::uint32_t>(p + 24);
  h.param1 = detail::load_le<std::uint32_t>(p + 28);
  if (dtype_size(h.type) == 0) {
    throw format_error("gradcomp: packet has unknown dtype code " +
                       std::to_string(static_cast<unsigned>(h.type)) +
                       " (expected 1 = f32, 2 = f16, 3 = bf16)");
  }
  if (h.payload_bytes != packet.size() - header_bytes) {
    throw format_error("gradcomp: packet header declares " + std::to_string(h.payload_bytes) +
                       " payload bytes but the buffer holds " +
                       std::to_string(packet.size() - header_bytes) + " after the header");
  }
  return h;
}

/// Total size (header + payload) a packet declares, read from its first `header_bytes`, for
/// framing packets in a stream. Validates magic and version only.
inline std::uint64_t declared_packet_bytes(std::span<std::byte const> prefix) {
  if (prefix.size() < header_bytes) {
    throw format_error("gradcomp: need " + std::to_string(header_bytes) +
                       " bytes to read a packet size, got " + std::to_string(prefix.size()));
  }
  if (std::memcmp(prefix.data(), wire_magic, 4) != 0 ||
      !readable_wire_version(static_cast<std::uint8_t>(prefix[4]))) {
    throw format_error("gradcomp: not a gradcomp packet of a version this library reads (bad "
                       "magic or version)");
  }
  std::uint64_t const payload = detail::load_le<std::uint64_t>(prefix.data() + 16);
  if (payload > UINT64_MAX - header_bytes) {
    throw format_error("gradcomp: packet declares an impossible payload size");
  }
  return header_bytes + payload;
}

GRADCOMP_NAMESPACE_END
