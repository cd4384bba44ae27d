// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of the onebit codec, on host and device: the canonical order of the scale's
/// summation, the sign and magnitude of an element, and the scale itself. Shared by the CPU
/// codec and kernels (codec/onebit.hpp, cpu/kernels/onebit.hpp) and cuda/onebit.cuh.
///
/// The sign and |x| are taken from the float's bits and the scale is rounded to float with an
/// integer path when it is a float subnormal, so device code built with flush-to-zero
/// (`-ftz=true`, `--use_fast_math`) still gives the packets of the CPU.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <cstddef>
#include <cstdint>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN

/// The canonical order in which onebit (and any backend) sums |x| for its scale:
/// blocks of `block` elements; in a block, lane l (0..15) sums elements l, l + 16, l + 32, ...
/// in double, in ascending order; the block's sum adds lanes 0..15 in order; the total adds
/// block sums in block order.
struct onebit_sum_order {
  static constexpr std::size_t block = 4096;
  static constexpr std::size_t lanes = 16;
};

namespace quant {

/// `x < 0` for a float, from its bits: negative, not zero, not NaN. Unlike a float compare it
/// also holds for negative subnormals in code built with flush-to-zero.
GRADCOMP_HOST_DEVICE constexpr bool is_negative(float v) noexcept {
  std::uint32_t const u = detail::bit_cast<std::uint32_t>(v);
  std::uint32_t const a = u & 0x7fffffffu;
  return (u >> 31) != 0 && a != 0 && a <= 0x7f800000u;
}

/// |v| as a double, exactly, also for subnormal `v` under flush-to-zero (where the float to
/// double conversion would give 0).
GRADCOMP_HOST_DEVICE constexpr double abs_as_double(float v) noexcept {
  std::uint32_t const a = detail::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
  if (a < 0x00800000u) return static_cast<double>(a) * 0x1p-149;  // zero or subnormal: a 2^-149
  return static_cast<double>(detail::bit_cast<float>(a));
}

/// `static_cast<float>(q)` for a non-negative `q`, rounding to nearest even, also where the
/// result is a float subnormal under flush-to-zero. Such a result is k 2^-149 with k the
/// integer nearest q 2^149 (ties to even); k = 2^23 is FLT_MIN, whose bits are also k.
GRADCOMP_HOST_DEVICE inline float to_float_nearest(double q) noexcept {
  if (q < 0x1p-126) {
    return detail::bit_cast<float>(static_cast<std::uint32_t>(rint(q * 0x1p149)));
  }
  return static_cast<float>(q);
}

/// The scale a onebit packet carries: mean |x| = f32(total / n) (0 for n = 0) when `scaled`,
/// else 1. `total` is the canonical sum of |x|.
GRADCOMP_HOST_DEVICE inline float onebit_scale(double total, std::size_t n, bool scaled) noexcept {
  if (!scaled) return 1.0f;
  return n == 0 ? 0.0f : to_float_nearest(total / static_cast<double>(n));
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
