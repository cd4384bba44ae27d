// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Gradient element types: `float`, `gradcomp::half` (IEEE binary16) and `gradcomp::bfloat16`,
/// with bit-exact conversions usable on host and device. Float to 16-bit conversion rounds to
/// nearest, ties to even; infinities stay infinite; NaNs stay NaN (quieted, with as much of the
/// payload as fits); values too large for binary16 become infinities of the same sign.

#include <gradcomp/config.hpp>

#include <concepts>
#include <cstdint>
#include <string_view>

GRADCOMP_NAMESPACE_BEGIN

/// Element type tag as stored in the wire header (one byte).
enum class dtype : std::uint8_t {
  f32 = 1,   ///< IEEE binary32
  f16 = 2,   ///< IEEE binary16
  bf16 = 3,  ///< bfloat16 (the upper half of a binary32)
};

/// Size in bytes of one element of `t`; 0 for a value that is not a dtype.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
  }
  return 0;
}

/// Lower-case name of `t` ("f32", "f16", "bf16"), or "invalid".
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "invalid";
}

namespace detail {

template <class To, class From>
GRADCOMP_HOST_DEVICE constexpr To bit_cast(From const& v) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, v);
}

}  // namespace detail

/// Converts a binary32 to binary16 bits, rounding to nearest even (see file comment).
GRADCOMP_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  std::uint32_t const x = detail::bit_cast<std::uint32_t>(f);
  std::uint32_t const sign = (x >> 16) & 0x8000u;
  std::uint32_t const ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // infinity or NaN
    if (ax == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (ax >= 0x38800000u) {  // result is a normal binary16 (|f| >= 2^-14)
    std::uint32_t const odd = (ax >> 13) & 1u;
    // Re-bias the exponent (127 -> 15) and round; a carry out of the mantissa bumps the
    // exponent, which is the correct rounding up to the next binade.
    return static_cast<std::uint16_t>(sign | ((ax - (112u << 23) + 0xfffu + odd) >> 13));
  }
  // Subnormal or zero result: value = m * 2^(e - 150); the binary16 unit is 2^-24.
  std::uint32_t const e = ax >> 23;
  if (e < 102u) return static_cast<std::uint16_t>(sign);  // |f| < 2^-25: rounds to zero
  std::uint32_t const m = (ax & 0x7fffffu) | 0x800000u;
  std::uint32_t const shift = 126u - e;  // in [14, 24]
  std::uint32_t q = m >> shift;
  std::uint32_t const rem = m & ((1u << shift) - 1u);
  std::uint32_t const halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

/// Converts binary16 bits to binary32 (exact for numbers; a NaN comes back quiet with its
/// payload, as F16C and CUDA conversions do).
GRADCOMP_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t const e = (h >> 10) & 0x1fu;
  std::uint32_t const m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return detail::bit_cast<float>(sign);
    float const v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return detail::bit_cast<float>(sign | detail::bit_cast<std::uint32_t>(v));
  }
  // Infinity, or a NaN made quiet (as hardware conversions do), payload kept.
  if (e == 31) return detail::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  return detail::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

/// Converts a binary32 to bfloat16 bits, rounding to nearest even; NaNs are quieted.
GRADCOMP_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  std::uint32_t const x = detail::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// Converts bfloat16 bits to binary32 (exact).
GRADCOMP_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return detail::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// IEEE binary16 storage type. Arithmetic is done by converting to `float`.
struct half {
  std::uint16_t bits = 0;  ///< raw binary16 bits

  half() = default;
  /// Rounds `f` to nearest even.
  GRADCOMP_HOST_DEVICE constexpr explicit half(float f) noexcept : bits(float_to_half_bits(f)) {}
  /// Wraps raw bits without conversion.
  GRADCOMP_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
  GRADCOMP_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return half_bits_to_float(bits);
  }
  friend constexpr bool operator==(half, half) = default;
};

/// bfloat16 storage type. Arithmetic is done by converting to `float`.
struct bfloat16 {
  std::uint16_t bits = 0;  ///< raw bfloat16 bits

  bfloat16() = default;
  /// Rounds `f` to nearest even.
  GRADCOMP_HOST_DEVICE constexpr explicit bfloat16(float f) noexcept
      : bits(float_to_bfloat16_bits(f)) {}
  /// Wraps raw bits without conversion.
  GRADCOMP_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  GRADCOMP_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return bfloat16_bits_to_float(bits);
  }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

/// The gradient element types gradcomp reads and writes.
template <class T>
concept element = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;

/// The `dtype` tag of element type `T`.
template <element T>
inline constexpr dtype dtype_of = std::same_as<T, float> ? dtype::f32
                                  : std::same_as<T, half> ? dtype::f16
                                                          : dtype::bf16;

/// Converts any element to `float` (exact).
template <element T>
GRADCOMP_HOST_DEVICE constexpr float to_float(T v) noexcept {
  if constexpr (std::same_as<T, float>) {
    return v;
  } else {
    return static_cast<float>(v);
  }
}

/// Converts a `float` to element type `T` (round to nearest even for the 16-bit types).
template <element T>
GRADCOMP_HOST_DEVICE constexpr T from_float(float v) noexcept {
  if constexpr (std::same_as<T, float>) {
    return v;
  } else {
    return T(v);
  }
}

GRADCOMP_NAMESPACE_END
