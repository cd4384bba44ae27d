// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// A read-only scan for NaN and infinities: x - x is 0 for every finite x and NaN otherwise,
/// so summing it in a few independent accumulators flags any non-finite element at the speed
/// of a plain read of memory. All levels give the same answer.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <cmath>
#include <cstddef>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

namespace scalar {

/// True if every x[0, n) is finite.
inline bool all_finite(isa_tag, float const* x, std::size_t n) noexcept {
  float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (std::size_t l = 0; l < 4; ++l) a[l] += x[i + l] - x[i + l];
  }
  for (; i < n; ++i) a[0] += x[i] - x[i];
  return (a[0] + a[1]) + (a[2] + a[3]) == 0.0f;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline bool all_finite(isa_tag, float const* x, std::size_t n) noexcept {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 const v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
    __m512 const v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
    a0 = _mm512_add_ps(a0, _mm512_sub_ps(v0, v0));
    a1 = _mm512_add_ps(a1, _mm512_sub_ps(v1, v1));
    a2 = _mm512_add_ps(a2, _mm512_sub_ps(v2, v2));
    a3 = _mm512_add_ps(a3, _mm512_sub_ps(v3, v3));
  }
  __m512 const a = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
  bool const ok = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_EQ_OQ) == 0xffff;
  return ok && scalar::all_finite(scalar_tag{}, x + i, n - i);
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline bool all_finite(isa_tag, float const* x, std::size_t n) noexcept {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 const v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    __m256 const v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
    a0 = _mm256_add_ps(a0, _mm256_sub_ps(v0, v0));
    a1 = _mm256_add_ps(a1, _mm256_sub_ps(v1, v1));
    a2 = _mm256_add_ps(a2, _mm256_sub_ps(v2, v2));
    a3 = _mm256_add_ps(a3, _mm256_sub_ps(v3, v3));
  }
  __m256 const a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  bool const ok = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_EQ_OQ)) == 0xff;
  return ok && scalar::all_finite(scalar_tag{}, x + i, n - i);
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif

/// True if every x[0, n) is finite (neither NaN nor ±infinity).
inline bool all_finite(float const* x, std::size_t n, isa level) noexcept {
  return dispatch(level, [&](auto t) { return all_finite(t, x, n); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
