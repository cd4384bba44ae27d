// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Kernels of `dct_sign_codec` (and of the short rows of chunk-wise top-k):
///
/// - `add_signed_row`, the decoder's signed sum of a few basis rows in double, acc[i] +=
///   ±f64(row[i]) for i in [0, C). AVX2 (4 lanes) and AVX-512 (8 lanes) perform the same double
///   additions element by element as the scalar loop, so every level gives the same bits
///   (a + (−b) and a − b are the same IEEE operation).
/// - `kth_largest_key`, the kc-th largest of a short row of 31-bit keys (magnitudes as bits),
///   found bit by bit from the top: t is the largest value with at least kc keys >= t. Counting
///   is exact at every level, so the result is too; no branch depends on the data, which is
///   what makes it faster than a selection on rows of 64 (DeMo's chunks).

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <cstddef>
#include <cstdint>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

namespace scalar {

/// The reference loop of `add_signed_row`.
inline void add_signed_row(isa_tag, double* acc, float const* row, std::size_t C,
                           bool negative) noexcept {
  for (std::size_t i = 0; i < C; ++i) {
    double const v = static_cast<double>(row[i]);
    acc[i] = negative ? acc[i] - v : acc[i] + v;
  }
}

/// The reference loop of `kth_largest_key`.
inline std::uint32_t kth_largest_key(isa_tag, std::uint32_t const* keys, std::size_t L,
                                     std::size_t kc, std::size_t& greater) noexcept {
  auto count_ge = [&](std::uint32_t v) {
    std::size_t c = 0;
    for (std::size_t i = 0; i < L; ++i) c += keys[i] >= v ? 1 : 0;
    return c;
  };
  std::uint32_t t = 0;
  for (int bit = 30; bit >= 0; --bit) {
    std::uint32_t const cand = t | (std::uint32_t{1} << bit);
    if (count_ge(cand) >= kc) t = cand;
  }
  greater = t == 0x7fffffffu ? 0 : count_ge(t + 1);
  return t;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline void add_signed_row(isa_tag t, double* acc, float const* row,
                                                std::size_t C, bool negative) noexcept {
  std::size_t i = 0;
  for (; i + 4 <= C; i += 4) {
    __m256d const v = _mm256_cvtps_pd(_mm_loadu_ps(row + i));
    __m256d const a = _mm256_loadu_pd(acc + i);
    _mm256_storeu_pd(acc + i, negative ? _mm256_sub_pd(a, v) : _mm256_add_pd(a, v));
  }
  scalar::add_signed_row(t, acc + i, row + i, C - i, negative);
}

}  // namespace avx2

namespace avx512 {

GRADCOMP_TARGET_AVX512 inline void add_signed_row(isa_tag t, double* acc, float const* row,
                                                  std::size_t C, bool negative) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8) {
    __m512d const v = _mm512_cvtps_pd(_mm256_loadu_ps(row + i));
    __m512d const a = _mm512_loadu_pd(acc + i);
    _mm512_storeu_pd(acc + i, negative ? _mm512_sub_pd(a, v) : _mm512_add_pd(a, v));
  }
  scalar::add_signed_row(t, acc + i, row + i, C - i, negative);
}

GRADCOMP_TARGET_AVX512 inline std::uint32_t kth_largest_key(isa_tag, std::uint32_t const* keys,
                                                            std::size_t L, std::size_t kc,
                                                            std::size_t& greater) noexcept {
  auto count_ge = [&](std::uint32_t v) GRADCOMP_TARGET_AVX512 {
    __m512i const c = _mm512_set1_epi32(static_cast<int>(v));
    std::size_t n = 0, i = 0;
    for (; i + 16 <= L; i += 16) {
      __m512i const k = _mm512_loadu_si512(keys + i);
      n += static_cast<std::size_t>(__builtin_popcount(_mm512_cmpge_epu32_mask(k, c)));
    }
    if (i < L) {
      __mmask16 const live = static_cast<__mmask16>((1u << (L - i)) - 1u);
      __m512i const k = _mm512_maskz_loadu_epi32(live, keys + i);
      n += static_cast<std::size_t>(__builtin_popcount(_mm512_mask_cmpge_epu32_mask(live, k, c)));
    }
    return n;
  };
  std::uint32_t t = 0;
  for (int bit = 30; bit >= 0; --bit) {
    std::uint32_t const cand = t | (std::uint32_t{1} << bit);
    t = count_ge(cand) >= kc ? cand : t;
  }
  greater = t == 0x7fffffffu ? 0 : count_ge(t + 1);
  return t;
}

}  // namespace avx512

GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// acc[i] = acc[i] − f64(row[i]) (`negative`) or acc[i] + f64(row[i]), i in [0, C); the same
/// bits at every ISA level.
inline void add_signed_row(double* acc, float const* row, std::size_t C, bool negative,
                           isa level) noexcept {
  dispatch(level, [&](auto t) { add_signed_row(t, acc, row, C, negative); });
}

/// The kc-th largest of keys[0, L) (1 <= kc <= L, every key < 2^31), and in `greater` how
/// many keys exceed it; the same at every ISA level (AVX2 runs the scalar loop).
inline std::uint32_t kth_largest_key(std::uint32_t const* keys, std::size_t L, std::size_t kc,
                                     std::size_t& greater, isa level) noexcept {
  return dispatch(level, [&](auto t) { return kth_largest_key(t, keys, L, kc, greater); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
