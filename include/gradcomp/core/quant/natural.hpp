// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of natural compression, on host and device (shared by
/// cpu/kernels/bytecode.hpp and cuda/natural.cuh).
///
/// Per bucket with E = max biased exponent (< 254) and lo = max(1, E - 125): an element of
/// biased exponent e >= lo and mantissa m rounds up to exponent e + 1 with probability m / 2^23;
/// one with e < lo becomes 2^(lo-127) with probability |x| / 2^(lo-127), else 0. The byte is
/// k | sign << 7 with k = E + 2 - e' (1..127) or 0 for zero.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// The biased float32 exponent of `x` (255 for NaN and infinities).
GRADCOMP_HOST_DEVICE constexpr unsigned biased_exponent(float x) noexcept {
  return (detail::bit_cast<std::uint32_t>(x) >> 23) & 0xffu;
}

/// The natural-compression byte of `x` in a bucket of max exponent `emax`, rounding with the
/// 16-bit uniform draw `draw`.
GRADCOMP_HOST_DEVICE inline std::uint8_t natural_code(float x, unsigned emax,
                                                      std::uint32_t draw) noexcept {
  std::uint32_t const bits = detail::bit_cast<std::uint32_t>(x);
  std::uint32_t const a = bits & 0x7fffffffu;
  unsigned const e = a >> 23;
  unsigned const lo = emax > 126 ? emax - 125 : 1;
  float const d = (static_cast<float>(draw) + 0.5f) * (1.0f / 65536.0f);
  unsigned k;
  if (e >= lo) {
    float const frac = detail::bit_cast<float>((a & 0x7fffffu) | 0x3f800000u) - 1.0f;
    k = emax + 2 - (e + (d < frac ? 1u : 0u));
  } else {
    // |x| * 2^(127 - lo): exact, a power-of-two scaling of a value below 2^(lo - 127)
    float const p = detail::bit_cast<float>(a) * detail::bit_cast<float>((254u - lo) << 23);
    k = d < p ? emax + 2 - lo : 0u;
  }
  return static_cast<std::uint8_t>(k | ((k != 0 && (bits >> 31)) ? 0x80u : 0u));
}

/// Decoded value of a natural-compression byte in a bucket of max exponent `emax`; clears `ok`
/// for a byte the encoder cannot produce.
GRADCOMP_HOST_DEVICE inline float natural_value(std::uint8_t c, unsigned emax, bool& ok) noexcept {
  unsigned const k = c & 0x7fu;
  unsigned const neg = c >> 7;
  unsigned const kmax = emax + 1 < 127 ? emax + 1 : 127;
  if (k == 0) {
    ok &= neg == 0;
    return 0.0f;
  }
  ok &= k <= kmax;
  return detail::bit_cast<float>((neg << 31) | ((emax + 2 - k) << 23));
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
