// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of the random-dithering quantizers (QSGD, TernGrad, linear and natural
/// dithering), on host and device: the code stream's shape, the per-bucket constants, the code
/// of one element and its decoded value, and the canonical order of the bucket norms. Shared
/// by cpu/kernels/dither.hpp and cuda/dithering.cuh.
///
/// Per element, with L = s (linear) or 2^(s-1) (natural), `mult = L / (scale * pre)` and `pre`
/// = 2^64 for buckets whose scale is below 2^-60 (else 1), both per bucket, a = |x| * pre
/// (exact) and the dither offset r = (draw16(i) + 0.5) / 2^16 in (0, 1):
///   linear:  q = min(floor(fma(a, mult, r)), s)            (one rounding)
///   natural: u = a * mult; u < 1: q = [u + r >= 1];
///            else, u = (1 + m) 2^e: q = min(e + 1 + [m + r >= 1], s)
/// Since r is uniform, P(round up) equals the fractional part (up to the 2^-17 resolution of r
/// and one float rounding), so E[level] = u. The code is q with a sign bit above it (set only
/// for x < 0 and q > 0), `width = 1 + bit_width(s)` bits, packed LSB first.
///
/// Bucket norms are summed in one canonical order on every backend: the bucket is cut into
/// blocks of `norm_block` elements from its start; in a block, lane l (0..15) accumulates
/// fma(x, x, lane) over elements l, l + 16, ... in ascending order (double); the block's sum
/// adds lanes 0..15 in order; the bucket's sum adds block sums in block order; the L2 norm is
/// f32(sqrt(sum)). The max norm is max |x| (any order gives the same value).

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/quant/rounding.hpp>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// Block length of the canonical norm summation.
inline constexpr std::size_t norm_block = 4096;
/// Lanes of a norm block.
inline constexpr std::size_t norm_lanes = 16;

/// Per-bucket constants of the dither quantizer.
struct dither_bucket {
  float pre = 1.0f;   ///< exact power-of-two pre-scale (2^64 for tiny scales)
  float mult = 0.0f;  ///< levels per unit of |x| * pre
  float step = 0.0f;  ///< decoded value of level 1 (linear) or of level 2^0 (natural)
};

/// Shape of a dither code stream.
struct dither_shape {
  std::uint32_t s = 1;   ///< number of levels
  unsigned width = 2;    ///< bits per code
  bool natural = false;  ///< natural (powers of two) instead of linear levels
};

/// Levels L of a shape: s (linear) or 2^(s-1) (natural, s <= 30).
GRADCOMP_HOST_DEVICE inline float dither_levels(dither_shape const& sh) noexcept {
  return sh.natural ? detail::bit_cast<float>((sh.s + 126u) << 23) : static_cast<float>(sh.s);
}

/// Bucket constants for a bucket of norm `scale` (finite, >= 0).
GRADCOMP_HOST_DEVICE inline dither_bucket make_dither_bucket(float scale,
                                                             dither_shape const& sh) noexcept {
  dither_bucket b;
  float const levels = dither_levels(sh);
  b.step = scale / levels;
  if (scale == 0.0f) return b;
  b.pre = scale < 0x1p-60f ? 0x1p64f : 1.0f;
  b.mult = levels / (scale * b.pre);
  return b;
}

/// The dither offset (draw + 0.5) / 2^16 of a 16-bit draw (exact).
GRADCOMP_HOST_DEVICE inline float dither_offset(std::uint32_t draw) noexcept {
  return fmaf(static_cast<float>(draw), 0x1p-16f, 0x1p-17f);
}

/// One step of a canonical lane sum of squares: `acc + x * x` with one rounding, in double.
GRADCOMP_HOST_DEVICE inline double sumsq_step(double acc, float x) noexcept {
  double const v = x;
  return fma(v, v, acc);
}

/// Quantizes one element (see file comment) and returns its code.
GRADCOMP_HOST_DEVICE inline std::uint32_t dither_code(float x, dither_bucket const& b,
                                                      dither_shape const& sh,
                                                      std::uint32_t draw) noexcept {
  float const r = dither_offset(draw);
  float const a = mul_rn(fabsf(x), b.pre);
  std::uint32_t q;
  if (!sh.natural) {
    q = static_cast<std::uint32_t>(fmaf(a, b.mult, r));
  } else {
    float const u = mul_rn(a, b.mult);
    std::uint32_t const bits = detail::bit_cast<std::uint32_t>(u);
    bool const small = u < 1.0f;
    float const m = detail::bit_cast<float>((bits & 0x7fffffu) | 0x3f800000u) - 1.0f;
    float const p = small ? u : m;
    std::uint32_t const base = small ? 0u : (bits >> 23) - 126u;  // e + 1, e = exponent - 127
    q = base + (p + r >= 1.0f ? 1u : 0u);
  }
  if (q > sh.s) q = sh.s;
  std::uint32_t const neg = (x < 0.0f && q != 0) ? 1u : 0u;
  return q | (neg << (sh.width - 1));
}

/// Decoded value of a code; `ok` is cleared for a code that is not canonical (q > s, or the
/// sign bit set with q = 0).
GRADCOMP_HOST_DEVICE inline float dither_value(std::uint32_t code, float step,
                                               dither_shape const& sh, bool& ok) noexcept {
  std::uint32_t const q = code & ((1u << (sh.width - 1)) - 1u);
  std::uint32_t const neg = code >> (sh.width - 1);
  ok &= q <= sh.s && !(neg && q == 0);
  float level;
  if (!sh.natural) {
    level = static_cast<float>(q);
  } else {
    level = q == 0 ? 0.0f : detail::bit_cast<float>((q + 126u) << 23);  // 2^(q-1)
  }
  float const v = fminf(level * step, FLT_MAX);  // s * (scale / s) may round past FLT_MAX
  return neg ? -v : v;
}

/// Writes the `width`-bit code `c` of element `i` into a zero-initialised stream.
GRADCOMP_HOST_DEVICE inline void put_code(std::byte* codes, std::uint64_t i, unsigned width,
                                          std::uint32_t c) noexcept {
  std::uint64_t const bit = i * width;
  std::uint64_t const byte = bit / 8;
  unsigned const shift = static_cast<unsigned>(bit % 8);
  std::uint32_t const v = c << shift;  // at most 16 + 7 bits
  for (unsigned k = 0; k < 3 && (k * 8) < shift + width; ++k) {
    codes[byte + k] =
        static_cast<std::byte>(static_cast<unsigned>(codes[byte + k]) | ((v >> (8 * k)) & 0xffu));
  }
}

/// Reads the `width`-bit code of element `i`.
GRADCOMP_HOST_DEVICE inline std::uint32_t get_code(std::byte const* codes, std::uint64_t i,
                                                   unsigned width) noexcept {
  std::uint64_t const bit = i * width;
  std::uint64_t const byte = bit / 8;
  unsigned const shift = static_cast<unsigned>(bit % 8);
  std::uint32_t v = 0;
  for (unsigned k = 0; k < 3 && (k * 8) < shift + width; ++k) {
    v |= static_cast<std::uint32_t>(codes[byte + k]) << (8 * k);
  }
  return (v >> shift) & ((1u << width) - 1u);
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
