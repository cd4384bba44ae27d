// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Where the summable values of a packet are. Summable packets (identity, fp16, bf16) and
/// shared-support packets (random-k with a shared seed) are all-reduced in the compressed
/// domain: the bytes before and after the values (the header, a check word) are identical on
/// all ranks and stay as they are, the values are summed element-wise in their own type.
///
/// A codec states where its values are with a member
/// `value_section value_section(std::span<std::byte const> packet) const`; identity, fp16 and
/// bf16 packets, and random-k packets (`codec_id::random_k`: values after a 4-byte check word), are
/// known here from their header, so they (and `any_codec`s holding them) need none.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <span>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// The element-wise summable part of a packet.
struct value_section {
  std::size_t offset = 0;              ///< byte offset of the first value in the packet
  std::size_t bytes = 0;               ///< bytes of values
  comm_type type = comm_type::f32;     ///< their element type

  friend constexpr bool operator==(value_section const&, value_section const&) = default;
};

namespace detail {

constexpr comm_type comm_type_of_dtype(dtype t) noexcept {
  switch (t) {
    case dtype::f16: return comm_type::f16;
    case dtype::bf16: return comm_type::bf16;
    default: return comm_type::f32;
  }
}

/// The value section of `packet`, written by `codec` (or a compressor around it). Throws
/// `config_error` for a codec whose values gradcomp cannot locate, `format_error` for a
/// packet that is malformed.
template <class Codec>
value_section section_of(Codec const& codec, std::span<std::byte const> packet) {
  if constexpr (requires { { codec.value_section(packet) } -> std::same_as<value_section>; }) {
    return codec.value_section(packet);
  } else {
    packet_header const h = read_header(packet);
    // random_k: a 4-byte check word, then the values in the type of
    // variant bits 0-1 (0 f32, 1 f16, 2 bf16), so any_codec holding it needs no member hook.
    if (h.codec == codec_id::random_k) {
      unsigned const v = h.variant & 3u;
      if (h.payload_bytes < 4 || v > 2) {
        throw format_error("gradcomp: random_k packet has no value section (payload " +
                           std::to_string(h.payload_bytes) + " bytes, value type " + std::to_string(v) + ")");
      }
      return {header_bytes + 4, static_cast<std::size_t>(h.payload_bytes) - 4,
              v == 0 ? comm_type::f32 : v == 1 ? comm_type::f16 : comm_type::bf16};
    }
    switch (h.codec) {
      case codec_id::identity:
        return {header_bytes, static_cast<std::size_t>(h.payload_bytes), comm_type_of_dtype(h.type)};
      case codec_id::fp16: return {header_bytes, static_cast<std::size_t>(h.payload_bytes), comm_type::f16};
      case codec_id::bf16: return {header_bytes, static_cast<std::size_t>(h.payload_bytes), comm_type::bf16};
      default: break;
    }
    throw config_error(std::string("gradcomp: codec '") + codec_name(h.codec) +
                       "' declares summable or shared-support aggregation, but the collective "
                       "layer does not know where its values are (give the codec a "
                       "value_section(packet) member)");
  }
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
