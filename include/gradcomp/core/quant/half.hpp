// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The codecs' rounding of a float to a 16-bit wire value (binary16, bfloat16), shared by the
/// host kernels (cpu/kernels/convert.hpp), the sparse value sections and the CUDA codecs.
///
/// A codec *saturates*: a finite value beyond the format's largest finite value (65504 for
/// binary16, about 3.39e38 for bfloat16) is sent as that value with its sign, where the plain
/// conversions of core/dtype.hpp (`half`, `bfloat16`) round it to an infinity. Infinities and
/// NaNs are kept as they are. Under error feedback the excess stays in the residual (the
/// residual is p − D(C(p)), finite when p is), so the gradient mass is conserved and the state
/// stays finite; a finite gradient never puts an infinity on the wire.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// Largest finite binary16 value.
inline constexpr float half_max = 65504.0f;
/// Largest finite bfloat16 value (bits 0x7f7f, as a float 0x7f7f0000).
inline constexpr float bfloat16_max = 3.38953139e38f;

/// `float_to_half_bits`, except that a finite `f` with |f| >= 65520 (which rounds to an
/// infinity) gives ±65504 (0x7bff with the sign).
GRADCOMP_HOST_DEVICE constexpr std::uint16_t half_bits_saturated(float f) noexcept {
  std::uint32_t const x = gradcomp::detail::bit_cast<std::uint32_t>(f);
  std::uint32_t const ax = x & 0x7fffffffu;
  if (ax >= 0x477ff000u && ax < 0x7f800000u) {
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7bffu);
  }
  return float_to_half_bits(f);
}

/// `float_to_bfloat16_bits`, except that a finite `f` that rounds to an infinity gives the
/// largest finite bfloat16 with its sign (0x7f7f).
GRADCOMP_HOST_DEVICE constexpr std::uint16_t bfloat16_bits_saturated(float f) noexcept {
  std::uint32_t const x = gradcomp::detail::bit_cast<std::uint32_t>(f);
  std::uint32_t const ax = x & 0x7fffffffu;
  if (ax >= 0x7f7f8000u && ax < 0x7f800000u) {
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7f7fu);
  }
  return float_to_bfloat16_bits(f);
}

/// `f * s` for a value a codec scales before sending it (scaled random-k): a finite f whose
/// product overflows float32 gives ±FLT_MAX instead of an infinity (then saturated further
/// by a 16-bit value type), so that a finite gradient never puts an infinity on the wire.
GRADCOMP_HOST_DEVICE constexpr float scale_saturated(float f, float s) noexcept {
  float const y = f * s;
  std::uint32_t const yb = gradcomp::detail::bit_cast<std::uint32_t>(y);
  std::uint32_t const fb = gradcomp::detail::bit_cast<std::uint32_t>(f);
  if ((yb & 0x7fffffffu) == 0x7f800000u && (fb & 0x7fffffffu) < 0x7f800000u) {
    return gradcomp::detail::bit_cast<float>((yb & 0x80000000u) | 0x7f7fffffu);
  }
  return y;
}

static_assert(half_bits_saturated(65504.0f) == 0x7bffu &&
              half_bits_saturated(65520.0f) == 0x7bffu && half_bits_saturated(-1e30f) == 0xfbffu &&
              half_bits_saturated(1.0f) == 0x3c00u);
static_assert(bfloat16_bits_saturated(3.4e38f) == 0x7f7fu &&
              bfloat16_bits_saturated(-3.4e38f) == 0xff7fu &&
              gradcomp::detail::bit_cast<std::uint32_t>(bfloat16_max) == 0x7f7f0000u);

}  // namespace quant
GRADCOMP_NAMESPACE_END
