// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of the low-bit quantizers, on host and device: symmetric 4-bit integers
/// with an absmax scale per block (`int4_codec`), and the sign-magnitude 2-/4-bit codes of the
/// values of a sparse packet (`chunk_topk_codec`). The CPU kernels (cpu/kernels/int4.hpp) and
/// the codecs call these functions, so no backend can round differently.
///
/// int4 (dense), per block with largest magnitude m: scale s = f32(m / 7), inv = f32(7 / m)
/// (both in double; inv = 0 when m = 0, FLT_MAX when 7 / m overflows), q = round-half-even(x *
/// inv) clamped to [-7, 7], stored as the nibble q + 8 (1..15; nibble 0 is never written).
/// Decoding: x̂ = f32(q) * s. Error |x - x̂| <= s / 2 (plus float rounding) for every element of
/// a block whose m is a normal float above 2^-125.
///
/// Sign-magnitude values (sparse), per chunk with largest kept magnitude m and `bits` = b in
/// {2, 4}: L = 2^(b-1) magnitude levels, step = f32(m / L), inv = f32(L / m) (0 when m = 0,
/// FLT_MAX on overflow); level j = clamp(round-half-even(|v| * inv) - 1, 0, L - 1), code =
/// (v < 0) << (b - 1) | j. Decoding: ±(j + 1) * step. The largest magnitude is exact; every
/// |v| >= step / 2 is within step / 2, smaller ones within step. Top-k values are the large
/// ones of their chunk, so no level is spent on zero.

#include <gradcomp/config.hpp>

#include <cfloat>
#include <cstdint>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// Largest int4 code magnitude: codes are -7..7.
inline constexpr int int4_max_code = 7;

/// Round half to even of `v` (finite or not), independent of the rounding mode.
GRADCOMP_HOST_DEVICE inline float round_half_even(float v) noexcept {
  float const fl = floorf(v);
  float const d = v - fl;
  bool const odd = floorf(fl * 0.5f) * 2.0f != fl;
  return fl + ((d > 0.5f || (d == 0.5f && odd)) ? 1.0f : 0.0f);
}

/// `f32(num / den)` for den > 0, 0 for den == 0, FLT_MAX if the quotient overflows.
GRADCOMP_HOST_DEVICE inline float safe_inverse(double num, float den) noexcept {
  if (!(den > 0.0f)) return 0.0f;
  double const v = num / static_cast<double>(den);
  return v > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(v);
}

/// The scale of an int4 block whose largest magnitude is `m` (finite, >= 0).
GRADCOMP_HOST_DEVICE inline float int4_scale(float m) noexcept {
  return static_cast<float>(static_cast<double>(m) / int4_max_code);
}
/// The encoding multiplier of an int4 block whose largest magnitude is `m`.
GRADCOMP_HOST_DEVICE inline float int4_inverse(float m) noexcept {
  return safe_inverse(int4_max_code, m);
}

/// The nibble (1..15) of element `x` in a block with multiplier `inv`.
GRADCOMP_HOST_DEVICE inline std::uint8_t int4_nibble(float x, float inv) noexcept {
  float q = round_half_even(x * inv);
  q = q >= -7.0f ? (q > 7.0f ? 7.0f : q) : -7.0f;
  return static_cast<std::uint8_t>(static_cast<int>(q) + 8);
}

/// The decoded value of nibble `c` (1..15) in a block of scale `s`.
GRADCOMP_HOST_DEVICE inline float int4_value(std::uint8_t c, float s) noexcept {
  return static_cast<float>(static_cast<int>(c) - 8) * s;
}

/// Magnitude levels of a `bits`-bit sign-magnitude code (bits = 2 or 4).
GRADCOMP_HOST_DEVICE constexpr unsigned magnitude_levels(unsigned bits) noexcept {
  return 1u << (bits - 1);
}
/// The decoding step of sign-magnitude codes in a chunk with largest kept magnitude `m`.
GRADCOMP_HOST_DEVICE inline float magnitude_step(float m, unsigned bits) noexcept {
  return static_cast<float>(static_cast<double>(m) / magnitude_levels(bits));
}
/// The encoding multiplier of sign-magnitude codes in a chunk with largest kept magnitude `m`.
GRADCOMP_HOST_DEVICE inline float magnitude_inverse(float m, unsigned bits) noexcept {
  return safe_inverse(magnitude_levels(bits), m);
}

/// The `bits`-bit sign-magnitude code of kept value `v` with multiplier `inv`.
GRADCOMP_HOST_DEVICE inline std::uint8_t magnitude_code(float v, float inv, unsigned bits) noexcept {
  float const top = static_cast<float>(magnitude_levels(bits) - 1);
  float j = round_half_even(fabsf(v) * inv) - 1.0f;
  j = j >= 0.0f ? (j > top ? top : j) : 0.0f;
  unsigned const sign = v < 0.0f ? 1u : 0u;
  return static_cast<std::uint8_t>((sign << (bits - 1)) | static_cast<unsigned>(j));
}

/// The decoded value of `bits`-bit sign-magnitude code `c` with step `step`.
GRADCOMP_HOST_DEVICE inline float magnitude_value(std::uint8_t c, float step, unsigned bits) noexcept {
  unsigned const levels = magnitude_levels(bits);
  float const mag = static_cast<float>((c & (levels - 1)) + 1) * step;
  return (c & levels) != 0 ? -mag : mag;
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
