// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `value_section`: where the element-wise summable values of a packet are. A codec whose
/// packets can be all-reduced in the compressed domain (aggregation kind summable or shared
/// support) owns that knowledge and states it with a member
/// `gradcomp::value_section value_section(std::span<std::byte const> packet) const`: the
/// bytes before and after the values (header, check word) are identical on all ranks, the
/// values are summed element-wise in their own type (collective/sections.hpp). identity, fp16,
/// bf16 and random-k declare it, and `any_codec` forwards it.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN

/// The element-wise summable part of a packet.
struct value_section {
  std::size_t offset = 0;   ///< byte offset of the first value in the packet
  std::size_t bytes = 0;    ///< bytes of values
  dtype type = dtype::f32;  ///< their element type (f32, f16 or bf16)

  friend constexpr bool operator==(value_section const&, value_section const&) = default;
};

GRADCOMP_NAMESPACE_END
