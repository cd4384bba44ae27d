// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Packet plumbing shared by the CUDA codecs: little-endian stores and loads usable in device
/// code, the header image a kernel copies into the packet, and host-side validation of a packet
/// that lives in backend memory (its first bytes are copied back and checked with the same
/// functions the CPU codecs use).

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

// Byte-wise little-endian stores and loads: no alignment assumptions, same result on any host
// byte order, and no library calls, so they run unchanged in kernels.

GRADCOMP_HOST_DEVICE inline void store_u16_le(std::byte* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::byte>(v & 0xffu);
  p[1] = static_cast<std::byte>(v >> 8);
}

GRADCOMP_HOST_DEVICE inline std::uint16_t load_u16_le(std::byte const* p) noexcept {
  return static_cast<std::uint16_t>(static_cast<unsigned>(p[0]) |
                                    (static_cast<unsigned>(p[1]) << 8));
}

GRADCOMP_HOST_DEVICE inline void store_u32_le(std::byte* p, std::uint32_t v) noexcept {
  for (int k = 0; k < 4; ++k) p[k] = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}

GRADCOMP_HOST_DEVICE inline std::uint32_t load_u32_le(std::byte const* p) noexcept {
  std::uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= static_cast<std::uint32_t>(p[k]) << (8 * k);
  return v;
}

GRADCOMP_HOST_DEVICE inline void store_f32_le(std::byte* p, float v) noexcept {
  store_u32_le(p, gradcomp::detail::bit_cast<std::uint32_t>(v));
}

GRADCOMP_HOST_DEVICE inline float load_f32_le(std::byte const* p) noexcept {
  return gradcomp::detail::bit_cast<float>(load_u32_le(p));
}

/// The 32 header bytes of a packet, built on the host by `gradcomp::write_header` and passed
/// by value to the kernel that writes the packet.
struct header_image {
  std::byte bytes[header_bytes];

  /// Copies the image to `out[0, header_bytes)`.
  GRADCOMP_HOST_DEVICE void store(std::byte* out) const noexcept {
    for (std::size_t i = 0; i < header_bytes; ++i) out[i] = bytes[i];
  }
};

/// Work item that stores a header image at `out` (run once, stream-ordered with the payload's
/// passes).
struct header_store_fn {
  header_image img;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const { img.store(out); }
};

/// The header image of `h`, exactly as the CPU codecs write it.
inline header_image make_header_image(packet_header const& h) {
  header_image img{};
  write_header(std::span<std::byte>(img.bytes, header_bytes), h);
  return img;
}

/// Bytes of a packet that host-side validation needs: the header plus the first
/// `probe_payload_bytes` bytes of the payload, and the packet's last byte.
inline constexpr std::size_t probe_payload_bytes = 8;

/// A host copy of the parts of a backend-memory packet that decoding checks.
struct packet_probe {
  std::byte head[header_bytes + probe_payload_bytes] = {};
  std::size_t head_size = 0;  ///< valid bytes in `head`: min(packet size, its capacity)
  std::byte last{};           ///< the packet's last byte (unset for an empty packet)
};

/// Copies the probed bytes of `d_packet` (`packet_bytes` long) to the host. One synchronization
/// of `stream`, which also orders the check after whatever produced the packet on that stream.
inline packet_probe probe_packet(std::byte const* d_packet, std::size_t packet_bytes,
                                 cudaStream_t stream) {
  packet_probe p;
  p.head_size = packet_bytes < sizeof(p.head) ? packet_bytes : sizeof(p.head);
  if (packet_bytes == 0) return p;
  copy_to_host(p.head, d_packet, p.head_size, stream);
  copy_to_host(&p.last, d_packet + (packet_bytes - 1), 1, stream);
  synchronize(stream);
  return p;
}

/// `gradcomp::read_header` for a packet whose header was copied to the host but whose payload
/// was not: the same checks, in the same order, with the same messages. The declared payload
/// size is compared with `packet_bytes - header_bytes`.
inline packet_header read_probed_header(packet_probe const& p, std::size_t packet_bytes) {
  if (packet_bytes < header_bytes) {
    return read_header(std::span<std::byte const>(p.head, packet_bytes));  // throws
  }
  // read_header checks magic, version and dtype, then the payload size against the span it is
  // given. Hand it the header alone with a declared payload of 0, then check the real one.
  std::byte hdr[header_bytes];
  std::memcpy(hdr, p.head, header_bytes);
  std::uint64_t const declared = gradcomp::detail::load_le<std::uint64_t>(hdr + 16);
  gradcomp::detail::store_le<std::uint64_t>(hdr + 16, 0);
  packet_header h = read_header(std::span<std::byte const>(hdr, header_bytes));
  h.payload_bytes = declared;
  std::uint64_t const actual = packet_bytes - header_bytes;
  if (declared != actual) {
    throw format_error("gradcomp: packet header declares " + std::to_string(declared) +
                       " payload bytes but the buffer holds " + std::to_string(actual) +
                       " after the header");
  }
  return h;
}

/// The validated header of a probed packet of wire format `Format` (codec/format/): `read_header`,
/// the codec id, `Format::validate`, and the element count against `n`. Throws what the CPU
/// codec's `decompress` throws for the same packet.
template <class Format>
packet_header checked_header(packet_probe const& p, std::size_t packet_bytes, std::size_t n) {
  packet_header const h = read_probed_header(p, packet_bytes);
  gradcomp::detail::expect_codec(h, Format::id);
  Format::validate(h);
  gradcomp::detail::expect_count(h, Format::id, n);
  return h;
}

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
