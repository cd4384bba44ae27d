// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Element-wise kernels of error feedback: out = state + sign * g with a finiteness check, in
/// one pass. All levels give identical results (one rounding per element: sign is ±1).

#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/feedback.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

namespace scalar {

/// out[i] = (state ? state[i] : 0) + sign * g[i]; returns false if any result is not finite.
inline bool combine(isa_tag, float const* state, float const* g, float sign, float* out,
                    std::size_t n) noexcept {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    float const v = quant::feedback_combine(state != nullptr ? state[i] : 0.0f, g[i], sign);
    out[i] = v;
    bad |= !(std::fabs(v) <= FLT_MAX);
  }
  return !bad;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline bool combine(isa_tag, float const* state, float const* g, float sign,
                                           float* out, std::size_t n) noexcept {
  __m512 const sg = _mm512_set1_ps(sign);
  __m512 const big = _mm512_set1_ps(FLT_MAX);
  __mmask16 bad = 0;
  std::size_t i = 0;
  // Full windows with plain loads and stores (masked ones are slow on AMD Zen 5), then the tail.
  for (; i + 16 <= n; i += 16) {
    __m512 const e = state != nullptr ? _mm512_loadu_ps(state + i) : _mm512_setzero_ps();
    __m512 const v = _mm512_add_ps(e, _mm512_mul_ps(sg, _mm512_loadu_ps(g + i)));
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(v), big, _CMP_NLE_UQ);
    _mm512_storeu_ps(out + i, v);
  }
  if (i < n) {
    __mmask16 const live = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 const e = state != nullptr ? _mm512_maskz_loadu_ps(live, state + i) : _mm512_setzero_ps();
    __m512 const v = _mm512_add_ps(e, _mm512_mul_ps(sg, _mm512_maskz_loadu_ps(live, g + i)));
    bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(v), big, _CMP_NLE_UQ);
    _mm512_mask_storeu_ps(out + i, live, v);
  }
  return bad == 0;
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline bool combine(isa_tag, float const* state, float const* g, float sign,
                                         float* out, std::size_t n) noexcept {
  __m256 const sg = _mm256_set1_ps(sign);
  __m256 const big = _mm256_set1_ps(FLT_MAX);
  __m256 const absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 bad = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 const e = state != nullptr ? _mm256_loadu_ps(state + i) : _mm256_setzero_ps();
    __m256 const v = _mm256_add_ps(e, _mm256_mul_ps(sg, _mm256_loadu_ps(g + i)));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, absmask), big, _CMP_NLE_UQ));
    _mm256_storeu_ps(out + i, v);
  }
  bool const ok = _mm256_movemask_ps(bad) == 0;
  return scalar::combine(scalar_tag{}, state != nullptr ? state + i : nullptr, g + i, sign, out + i,
                         n - i) &&
         ok;
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif

/// out = state + sign * g (state may be null: zero); false if any result is not finite.
inline bool combine(float const* state, float const* g, float sign, float* out, std::size_t n,
                    isa level) noexcept {
  return dispatch(level, [&](auto t) { return combine(t, state, g, sign, out, n); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
