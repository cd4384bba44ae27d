// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Where the summable values of a packet are, as the collective layer asks for them.
/// Summable packets (identity, fp16, bf16) and shared-support packets (random-k with a shared
/// seed) are all-reduced in the compressed domain: the bytes before and after the values (the
/// header, a check word) are identical on all ranks and stay as they are, the values are summed
/// element-wise in their own type.
///
/// The codec owns that knowledge: it states where its values are with a member
/// `gradcomp::value_section value_section(std::span<std::byte const> packet) const`
/// (codec/value_section.hpp; `any_codec` forwards it). There is no per-codec table here.

#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

constexpr comm_type comm_type_of_dtype(dtype t) noexcept {
  switch (t) {
    case dtype::f16: return comm_type::f16;
    case dtype::bf16: return comm_type::bf16;
    default: return comm_type::f32;
  }
}

/// The value section of `packet`, written by `codec` (or a compressor around it). Throws
/// `config_error` for a codec that declares none, `format_error` for a malformed packet.
template <class Codec>
value_section section_of(Codec const& codec, std::span<std::byte const> packet) {
  if constexpr (requires { { codec.value_section(packet) } -> std::same_as<value_section>; }) {
    return codec.value_section(packet);
  } else {
    throw config_error(std::string("gradcomp: codec '") + codec_name(id_of_codec(codec)) +
                       "' declares summable or shared-support aggregation, but has no "
                       "value_section(packet) member saying where its values are");
  }
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
