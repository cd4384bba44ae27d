// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Kernels of the one-byte-per-element codecs: int8 min-max quantization (nearest or
/// stochastic rounding) and natural compression (stochastic rounding to a power of two).
/// Scalar is the reference; AVX2 and AVX-512 give identical bytes. The element math (what one
/// element's code is) lives in core/quant/int8.hpp and core/quant/natural.hpp, shared with the
/// CUDA backend; these kernels apply it over ranges.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/int8.hpp>
#include <gradcomp/core/quant/natural.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/philox.hpp>
#include <gradcomp/cpu/kernels/window.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

using quant::int8_bucket;
using quant::int8_step;
using quant::make_int8_bucket;

/// The sign-faithful zero of a min/max that came out as 0: `scalar::block_minmax` keeps the
/// first element equal to its result (`init` counting as element -1), which for a zero result
/// fixes its sign (+0 and -0 compare equal). The SIMD levels reduce in another order and take
/// the zero from here.
inline float first_zero(float init, float const* x, std::size_t n) noexcept {
  if (init == 0.0f) return init;
  for (std::size_t i = 0; i < n; ++i) {
    if (x[i] == 0.0f) return x[i];
  }
  return init;
}

namespace scalar {

/// min and max of x[0, n); returns false if an element is NaN or infinite.
inline bool block_minmax(isa_tag, float const* x, std::size_t n, float& lo, float& hi) noexcept {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    float const v = x[i];
    bad |= !(std::fabs(v) <= FLT_MAX);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return !bad;
}

/// Largest biased exponent of x[0, n) (255 for NaN/Inf).
inline unsigned block_max_exponent(isa_tag, float const* x, std::size_t n) noexcept {
  unsigned e = 0;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned const v = quant::biased_exponent(x[i]);
    e = v > e ? v : e;
  }
  return e;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline bool block_minmax(isa_tag, float const* x, std::size_t n, float& lo,
                                                float& hi) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  float const lo0 = lo, hi0 = hi;
  __m512 mn = _mm512_set1_ps(lo);
  __m512 mx = _mm512_set1_ps(hi);
  __m512 const big = _mm512_set1_ps(FLT_MAX);
  __mmask16 bad = 0;
  for (std::size_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    __mmask16 const live = live16(n - i);
    __m512 const v = load16(x + i, live);
    bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(v), big, _CMP_NLE_UQ);
    // min(v, m) = v < m ? v : m, as the scalar loop (a NaN element never enters).
    mn = _mm512_mask_min_ps(mn, live, v, mn);
    mx = _mm512_mask_max_ps(mx, live, v, mx);
  }
  float const l = _mm512_reduce_min_ps(mn);
  float const h = _mm512_reduce_max_ps(mx);
  lo = l == 0.0f ? first_zero(lo0, x, n) : l;
  hi = h == 0.0f ? first_zero(hi0, x, n) : h;
  return bad == 0;
}

GRADCOMP_TARGET_AVX512 inline unsigned block_max_exponent(isa_tag, float const* x,
                                                          std::size_t n) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  __m512i m = _mm512_setzero_si512();
  __m512i const ef = _mm512_set1_epi32(0xff);
  for (std::size_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    __m512i const v = load16_bits(x + i, live16(n - i));
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_srli_epi32(v, 23), ef));
  }
  return _mm512_reduce_max_epu32(m);
}

GRADCOMP_TARGET_AVX512 inline __m512 draws_unit(__m512i draws) noexcept {
  return _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(draws), _mm512_set1_ps(0.5f)),
                       _mm512_set1_ps(1.0f / 65536.0f));
}

GRADCOMP_TARGET_AVX512 inline __m128i int8_codes16(__m512 x, __m512 inv, __m512 bias, bool stochastic,
                                                  __m512 r) noexcept {
  __m512 const v = _mm512_fmadd_ps(x, inv, bias);
  // min(255, .) keeps +inf (from an infinite inv) in range and passes NaN on, which converts
  // to INT_MIN and so clamps to 0, as the scalar code does.
  __m512 const top = _mm512_set1_ps(255.0f);
  __m512i q;
  if (stochastic) {
    q = _mm512_cvt_roundps_epi32(_mm512_min_ps(top, _mm512_add_ps(v, r)),
                                 _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  } else {
    q = _mm512_cvt_roundps_epi32(_mm512_min_ps(top, v),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  return _mm512_cvtusepi32_epi8(_mm512_max_epi32(q, _mm512_setzero_si512()));
}

GRADCOMP_TARGET_AVX512 inline __m512 offsets16(philox16 const& g, unsigned k) noexcept {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(philox_window(g, k)), _mm512_set1_ps(0x1p-16f),
                         _mm512_set1_ps(0x1p-17f));
}

// Codes of windows K..7 of a full 128-element group in one bucket (K a template parameter, so
// that each window's draws are picked at compile time).
template <bool Stochastic, unsigned K = 0>
GRADCOMP_TARGET_AVX512 inline void int8_group_fast(float const* x, __m512 inv, __m512 bias,
                                                   philox16 const& g, std::uint8_t* codes,
                                                   bool stream) noexcept {
  __m512 const r = Stochastic ? offsets16(g, K) : _mm512_setzero_ps();
  store_codes16(codes + 16 * K, int8_codes16(_mm512_loadu_ps(x + 16 * K), inv, bias, Stochastic, r),
                stream);
  if constexpr (K + 1 < 8) int8_group_fast<Stochastic, K + 1>(x, inv, bias, g, codes, stream);
}

// int8 codes of [begin, end) (begin multiple of 128, end multiple of 128 or tensor end).
template <bool Stochastic>
GRADCOMP_TARGET_AVX512 inline void int8_encode_rounding(float const* x, std::size_t begin,
                                                        std::size_t end, std::size_t bucket_len,
                                                        int8_bucket const* buckets,
                                                        random_stream const& rs,
                                                        std::uint8_t* codes, bool stream) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  __m512 const zero = _mm512_setzero_ps();
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 g{};
    if constexpr (Stochastic) g = draws.group(g0 / 128);
    if (g0 + 128 <= end && cur.advance(g0, 128)) {
      int8_group_fast<Stochastic>(x + g0, _mm512_set1_ps(buckets[cur.index()].inv),
                                  _mm512_set1_ps(buckets[cur.index()].bias), g, codes + g0, stream);
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      __mmask16 const live = live16(valid);
      window_buckets const w = window_at(cur, bucket_len, w0, valid);
      __m512 const inv = lanes_ps(w, [&](std::size_t b) { return buckets[b].inv; });
      __m512 const bias = lanes_ps(w, [&](std::size_t b) { return buckets[b].bias; });
      __m128i const c = int8_codes16(load16(x + w0, live), inv, bias, Stochastic,
                                     Stochastic ? offsets16(g, k) : zero);
      store_bytes16(codes + w0, live, c);
    }
  }
}

GRADCOMP_TARGET_AVX512 inline void int8_encode(isa_tag, float const* x, std::size_t begin,
                                               std::size_t end, std::size_t bucket_len,
                                               int8_bucket const* buckets, bool stochastic,
                                               random_stream const& rs, std::uint8_t* codes,
                                               bool stream) noexcept {
  if (stochastic) {
    int8_encode_rounding<true>(x, begin, end, bucket_len, buckets, rs, codes, stream);
  } else {
    int8_encode_rounding<false>(x, begin, end, bucket_len, buckets, rs, codes, stream);
  }
}

GRADCOMP_TARGET_AVX512 inline void int8_decode(isa_tag, std::uint8_t const* codes,
                                               std::size_t begin, std::size_t end,
                                               std::size_t bucket_len, float const* los,
                                               float const* steps, float* out, float alpha,
                                               bool add, bool stream) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    std::size_t const valid = window_valid(w0, end);
    __mmask16 const live = live16(valid);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    __m512 const lo = lanes_ps(w, [&](std::size_t b) { return los[b]; });
    __m512 const st = lanes_ps(w, [&](std::size_t b) { return steps[b]; });
    __m512 const q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load_bytes16(codes + w0, live)));
    store_or_add16(out + w0, live, _mm512_fmadd_ps(q, st, lo), a, add, stream);
  }
}

// Natural codes of 16 elements whose buckets have maximum exponents `em`.
GRADCOMP_TARGET_AVX512 inline __m512i natural_codes16(__m512i bits, __m512i em, __m512 d) noexcept {
  // lo = max(1, E - 125)
  __m512i const lo = _mm512_max_epi32(_mm512_sub_epi32(em, _mm512_set1_epi32(125)), _mm512_set1_epi32(1));
  __m512i const a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  __m512i const e = _mm512_srli_epi32(a, 23);
  __m512 const frac = _mm512_sub_ps(
      _mm512_castsi512_ps(_mm512_ternarylogic_epi32(a, _mm512_set1_epi32(0x7fffff),
                                                    _mm512_set1_epi32(0x3f800000), 0xEA)),
      _mm512_set1_ps(1.0f));
  __m512 const p = _mm512_mul_ps(_mm512_castsi512_ps(a),
                                 _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), lo), 23)));
  __mmask16 const normal = _mm512_cmp_epi32_mask(e, lo, _MM_CMPINT_NLT);
  __mmask16 const up = _mm512_cmp_ps_mask(d, _mm512_mask_blend_ps(normal, p, frac), _CMP_LT_OQ);
  __m512i const two = _mm512_add_epi32(em, _mm512_set1_epi32(2));
  __m512i const ep = _mm512_mask_add_epi32(e, up, e, _mm512_set1_epi32(1));
  __m512i const kn = _mm512_sub_epi32(two, ep);
  __m512i const ksub = _mm512_maskz_sub_epi32(up, two, lo);
  __m512i const kk = _mm512_mask_blend_epi32(normal, ksub, kn);
  // The sign bit of x (finite; -0 gives kk = 0, which the test drops).
  __mmask16 const neg = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(bits), kk, kk);
  return _mm512_mask_or_epi32(kk, neg, kk, _mm512_set1_epi32(0x80));
}

// Windows K..7 of a full 128-element group in one bucket.
template <unsigned K = 0>
GRADCOMP_TARGET_AVX512 inline void natural_group_fast(float const* x, __m512i em, philox16 const& g,
                                                      std::uint8_t* codes) noexcept {
  __m512i const c = natural_codes16(_mm512_loadu_si512(x + 16 * K), em, draws_unit(philox_window(g, K)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16 * K), _mm512_cvtepi32_epi8(c));
  if constexpr (K + 1 < 8) natural_group_fast<K + 1>(x, em, g, codes);
}

GRADCOMP_TARGET_AVX512 inline void natural_encode(isa_tag, float const* x, std::size_t begin,
                                                  std::size_t end, std::size_t bucket_len,
                                                  std::uint8_t const* emax, random_stream const& rs,
                                                  std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 const g = draws.group(g0 / 128);
    if (g0 + 128 <= end && cur.advance(g0, 128)) {
      natural_group_fast(x + g0, _mm512_set1_epi32(emax[cur.index()]), g, codes + g0);
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      __mmask16 const live = live16(valid);
      __m512i const em = lanes_epi32(window_at(cur, bucket_len, w0, valid),
                                     [&](std::size_t b) { return emax[b]; });
      __m512i const kk =
          _mm512_maskz_mov_epi32(live, natural_codes16(load16_bits(x + w0, live), em,
                                                       draws_unit(philox_window(g, k))));
      store_bytes16(codes + w0, live, _mm512_cvtepi32_epi8(kk));
    }
  }
}

// One 128-element group of natural codes inside one bucket (largest exponent `emax`): eight
// full windows with the bucket's constants in registers. Returns the lanes with a bad code.
GRADCOMP_TARGET_AVX512 inline __mmask16 natural_decode_group_fast(std::uint8_t const* codes, int emax,
                                                                  float* out, __m512 a, bool add,
                                                                  bool stream) noexcept {
  __m512i const low7 = _mm512_set1_epi32(0x7f);
  __m512i const kmax = _mm512_set1_epi32(emax + 1 < 127 ? emax + 1 : 127);
  __m512i const top = _mm512_set1_epi32(emax + 2);
  __mmask16 bad = 0;
  for (unsigned k = 0; k < 8; ++k) {
    __m512i const c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<__m128i const*>(codes + 16 * k)));
    __m512i const kk = _mm512_and_si512(c, low7);
    __m512i const neg = _mm512_srli_epi32(c, 7);
    __mmask16 const zero = _mm512_testn_epi32_mask(kk, kk);
    bad = static_cast<__mmask16>(bad | (zero & _mm512_test_epi32_mask(neg, neg)) |
                                 _mm512_cmp_epi32_mask(kk, kmax, _MM_CMPINT_NLE));
    __m512i const bits =
        _mm512_or_si512(_mm512_slli_epi32(neg, 31), _mm512_slli_epi32(_mm512_sub_epi32(top, kk), 23));
    store_or_add16(out + 16 * k, full_window16,
                   _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), bits)), a, add,
                   stream);
  }
  return bad;
}

GRADCOMP_TARGET_AVX512 inline bool natural_decode(isa_tag, std::uint8_t const* codes,
                                                  std::size_t begin, std::size_t end,
                                                  std::size_t bucket_len, std::uint8_t const* emax,
                                                  float* out, float alpha, bool add, bool stream) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  __mmask16 bad = 0;
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    // whole 128-element groups inside one bucket: the bucket's constants once per group
    while (w0 % 128 == 0 && w0 + 128 <= end && cur.advance(w0, 128)) {
      bad = static_cast<__mmask16>(bad | natural_decode_group_fast(codes + w0, emax[cur.index()], out + w0, a,
                                                                   add, stream));
      w0 += 128;
    }
    if (w0 >= end) break;
    std::size_t const valid = window_valid(w0, end);
    __mmask16 const live = live16(valid);
    __m512i const em =
        lanes_epi32(window_at(cur, bucket_len, w0, valid), [&](std::size_t b) { return emax[b]; });
    __m512i const c = _mm512_cvtepu8_epi32(load_bytes16(codes + w0, live));
    __m512i const k = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
    __m512i const neg = _mm512_srli_epi32(c, 7);
    __mmask16 const zero = _mm512_testn_epi32_mask(k, k);
    __m512i const kmax = _mm512_min_epi32(_mm512_add_epi32(em, _mm512_set1_epi32(1)), _mm512_set1_epi32(127));
    bad = static_cast<__mmask16>(bad | (zero & _mm512_test_epi32_mask(neg, neg)) |
                                 _mm512_cmp_epi32_mask(k, kmax, _MM_CMPINT_NLE));
    __m512i const e = _mm512_sub_epi32(_mm512_add_epi32(em, _mm512_set1_epi32(2)), k);
    __m512i const bits = _mm512_or_si512(_mm512_slli_epi32(neg, 31), _mm512_slli_epi32(e, 23));
    __m512 const v =
        _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), bits));
    store_or_add16(out + w0, live, v, a, add, stream);
  }
  return (bad & 0xffff) == 0;
}

}  // namespace avx512

namespace avx2 {

// 16 int32 lanes (c0: 0..7, c1: 8..15), each in [0, 255], as 16 bytes in order.
GRADCOMP_TARGET_AVX2 inline __m128i bytes16(__m256i c0, __m256i c1) noexcept {
  __m256i const h = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), _MM_SHUFFLE(3, 1, 2, 0));
  return _mm_packus_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

GRADCOMP_TARGET_AVX2 inline float hmin8(__m256 v) noexcept {
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_min_ps(h, _mm_movehl_ps(h, h));
  h = _mm_min_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

GRADCOMP_TARGET_AVX2 inline float hmax8(__m256 v) noexcept {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

GRADCOMP_TARGET_AVX2 inline bool block_minmax(isa_tag, float const* x, std::size_t n, float& lo,
                                              float& hi) noexcept {
  float const lo0 = lo, hi0 = hi;
  __m256 const absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 const big = _mm256_set1_ps(FLT_MAX);
  __m256 mn0 = _mm256_set1_ps(lo), mn1 = mn0;
  __m256 mx0 = _mm256_set1_ps(hi), mx1 = mx0;
  __m256 bad = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 const v0 = _mm256_loadu_ps(x + i);
    __m256 const v1 = _mm256_loadu_ps(x + i + 8);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v0, absmask), big, _CMP_NLE_UQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v1, absmask), big, _CMP_NLE_UQ));
    // min(v, m) = v < m ? v : m, as the scalar loop (a NaN element never enters).
    mn0 = _mm256_min_ps(v0, mn0);
    mn1 = _mm256_min_ps(v1, mn1);
    mx0 = _mm256_max_ps(v0, mx0);
    mx1 = _mm256_max_ps(v1, mx1);
  }
  float l = hmin8(_mm256_min_ps(mn0, mn1));
  float h = hmax8(_mm256_max_ps(mx0, mx1));
  bool const ok =
      scalar::block_minmax(scalar_tag{}, x + i, n - i, l, h) && _mm256_movemask_ps(bad) == 0;
  lo = l == 0.0f ? first_zero(lo0, x, n) : l;
  hi = h == 0.0f ? first_zero(hi0, x, n) : h;
  return ok;
}

GRADCOMP_TARGET_AVX2 inline unsigned block_max_exponent(isa_tag, float const* x,
                                                        std::size_t n) noexcept {
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  __m256i const ef = _mm256_set1_epi32(0xff);
  for (std::size_t i = 0; i < n; i += 16) {
    i32x16 const v = load16_bits(x + i, window_valid(i, n));  // missing lanes: exponent 0
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_srli_epi32(v.lo, 23), ef));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_srli_epi32(v.hi, 23), ef));
  }
  __m256i const m = _mm256_max_epu32(m0, m1);
  __m128i r = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  r = _mm_max_epu32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
  r = _mm_max_epu32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<unsigned>(_mm_cvtsi128_si32(r));
}

// The 8 dither offsets (draw + 0.5) / 2^16 of lanes 8h..8h+7 of window k (exact).
GRADCOMP_TARGET_AVX2 inline __m256 offsets8(philox16 const& g, unsigned k, unsigned h) noexcept {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(philox_window(g, k, h)), _mm256_set1_ps(0x1p-16f),
                         _mm256_set1_ps(0x1p-17f));
}

// int8 codes of 8 elements as int32 lanes in [0, 255]. The rounding modes are explicit (never
// the MXCSR one); min(255, .) keeps +inf in range and passes NaN on, which converts to
// INT_MIN and so clamps to 0, as the scalar code does.
GRADCOMP_TARGET_AVX2 inline __m256i int8_codes8(__m256 x, __m256 inv, __m256 bias, bool stochastic,
                                                __m256 r) noexcept {
  __m256 const v = _mm256_fmadd_ps(x, inv, bias);
  __m256 const top = _mm256_set1_ps(255.0f);
  __m256 q;
  if (stochastic) {
    q = _mm256_round_ps(_mm256_min_ps(top, _mm256_add_ps(v, r)),
                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  } else {
    q = _mm256_round_ps(_mm256_min_ps(top, v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  return _mm256_max_epi32(_mm256_cvttps_epi32(q), _mm256_setzero_si256());
}

// int8 codes of [begin, end) (begin multiple of 128, end multiple of 128 or tensor end).
GRADCOMP_TARGET_AVX2 inline void int8_encode(isa_tag, float const* x, std::size_t begin,
                                             std::size_t end, std::size_t bucket_len,
                                             int8_bucket const* buckets, bool stochastic,
                                             random_stream const& rs, std::uint8_t* codes,
                                             bool stream) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  __m256 const zero = _mm256_setzero_ps();
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 g{};
    if (stochastic) g = draws.group(g0 / 128);
    if (g0 + 128 <= end && cur.advance(g0, 128)) {
      __m256 const inv = _mm256_set1_ps(buckets[cur.index()].inv);
      __m256 const bias = _mm256_set1_ps(buckets[cur.index()].bias);
      for (unsigned k = 0; k < 8; ++k) {
        float const* xs = x + g0 + 16 * k;
        __m256i const c0 = int8_codes8(_mm256_loadu_ps(xs), inv, bias, stochastic,
                                       stochastic ? offsets8(g, k, 0) : zero);
        __m256i const c1 = int8_codes8(_mm256_loadu_ps(xs + 8), inv, bias, stochastic,
                                       stochastic ? offsets8(g, k, 1) : zero);
        store_codes16(codes + g0 + 16 * k, bytes16(c0, c1), stream);
      }
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      window_buckets const w = window_at(cur, bucket_len, w0, valid);
      f32x16 const inv = lanes_ps(w, [&](std::size_t b) { return buckets[b].inv; });
      f32x16 const bias = lanes_ps(w, [&](std::size_t b) { return buckets[b].bias; });
      f32x16 const xv = load16(x + w0, valid);
      __m256i const c0 =
          int8_codes8(xv.lo, inv.lo, bias.lo, stochastic, stochastic ? offsets8(g, k, 0) : zero);
      __m256i const c1 =
          int8_codes8(xv.hi, inv.hi, bias.hi, stochastic, stochastic ? offsets8(g, k, 1) : zero);
      store_bytes16(codes + w0, valid, bytes16(c0, c1));
    }
  }
}

GRADCOMP_TARGET_AVX2 inline void int8_decode(isa_tag, std::uint8_t const* codes, std::size_t begin,
                                             std::size_t end, std::size_t bucket_len,
                                             float const* los, float const* steps, float* out,
                                             float alpha, bool add, bool stream) noexcept {
  __m256 const a = _mm256_set1_ps(alpha);
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    std::size_t const valid = window_valid(w0, end);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    f32x16 const lo = lanes_ps(w, [&](std::size_t b) { return los[b]; });
    f32x16 const st = lanes_ps(w, [&](std::size_t b) { return steps[b]; });
    __m128i const c = load_bytes16(codes + w0, valid);
    __m256 const q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
    __m256 const q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(c, c)));
    store_or_add16(out + w0, valid,
                   {_mm256_fmadd_ps(q0, st.lo, lo.lo), _mm256_fmadd_ps(q1, st.hi, lo.hi)}, a, add, stream);
  }
}

// Natural-compression bytes of 8 elements (as int32 lanes in [0, 255]); see the file comment.
GRADCOMP_TARGET_AVX2 inline __m256i natural_codes8(__m256i bits, __m256i em, __m256 d) noexcept {
  // lo = max(1, E - 125)
  __m256i const lo =
      _mm256_max_epi32(_mm256_sub_epi32(em, _mm256_set1_epi32(125)), _mm256_set1_epi32(1));
  __m256i const a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  __m256i const e = _mm256_srli_epi32(a, 23);
  __m256 const frac = _mm256_sub_ps(
      _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7fffff)),
                                          _mm256_set1_epi32(0x3f800000))),
      _mm256_set1_ps(1.0f));
  __m256 const p = _mm256_mul_ps(
      _mm256_castsi256_ps(a),
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(254), lo), 23)));
  __m256i const below = _mm256_cmpgt_epi32(lo, e);  // e < lo
  __m256 const t = _mm256_blendv_ps(frac, p, _mm256_castsi256_ps(below));
  __m256i const up = _mm256_castps_si256(_mm256_cmp_ps(d, t, _CMP_LT_OQ));  // 0 or -1
  __m256i const two = _mm256_add_epi32(em, _mm256_set1_epi32(2));
  __m256i const kn = _mm256_add_epi32(_mm256_sub_epi32(two, e), up);  // E + 2 - (e + up)
  __m256i const kl = _mm256_and_si256(up, _mm256_sub_epi32(two, lo));
  __m256i k = _mm256_blendv_epi8(kn, kl, below);
  __m256i const sign = _mm256_and_si256(_mm256_srai_epi32(bits, 31), _mm256_set1_epi32(0x80));
  k = _mm256_or_si256(k, _mm256_andnot_si256(_mm256_cmpeq_epi32(k, _mm256_setzero_si256()), sign));
  return _mm256_and_si256(k, _mm256_set1_epi32(0xff));  // the byte, as the scalar cast keeps
}

GRADCOMP_TARGET_AVX2 inline __m256 draws_unit(__m256i draws) noexcept {
  return _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(draws), _mm256_set1_ps(0.5f)),
                       _mm256_set1_ps(1.0f / 65536.0f));
}

GRADCOMP_TARGET_AVX2 inline void natural_encode(isa_tag, float const* x, std::size_t begin,
                                                std::size_t end, std::size_t bucket_len,
                                                std::uint8_t const* emax, random_stream const& rs,
                                                std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 const g = draws.group(g0 / 128);
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      i32x16 const em = lanes_epi32(window_at(cur, bucket_len, w0, valid),
                                    [&](std::size_t b) { return emax[b]; });
      i32x16 const bits = load16_bits(x + w0, valid);
      __m256i const c0 = natural_codes8(bits.lo, em.lo, draws_unit(philox_window(g, k, 0)));
      __m256i const c1 = natural_codes8(bits.hi, em.hi, draws_unit(philox_window(g, k, 1)));
      store_bytes16(codes + w0, valid, bytes16(c0, c1));
    }
  }
}

// Decoded values of 8 natural-compression bytes; accumulates bytes the encoder cannot produce.
GRADCOMP_TARGET_AVX2 inline __m256 natural_values8(__m256i c, __m256i em, __m256i& bad) noexcept {
  __m256i const k = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  __m256i const neg = _mm256_srli_epi32(c, 7);
  __m256i const zero = _mm256_cmpeq_epi32(k, _mm256_setzero_si256());
  __m256i const kmax =
      _mm256_min_epi32(_mm256_add_epi32(em, _mm256_set1_epi32(1)), _mm256_set1_epi32(127));
  bad = _mm256_or_si256(bad, _mm256_and_si256(zero, _mm256_cmpeq_epi32(neg, _mm256_set1_epi32(1))));
  bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(k, kmax));
  __m256i const e = _mm256_sub_epi32(_mm256_add_epi32(em, _mm256_set1_epi32(2)), k);
  __m256i const bits = _mm256_or_si256(_mm256_slli_epi32(neg, 31), _mm256_slli_epi32(e, 23));
  return _mm256_castsi256_ps(_mm256_andnot_si256(zero, bits));
}

GRADCOMP_TARGET_AVX2 inline bool natural_decode(isa_tag, std::uint8_t const* codes,
                                                std::size_t begin, std::size_t end,
                                                std::size_t bucket_len, std::uint8_t const* emax,
                                                float* out, float alpha, bool add, bool stream) noexcept {
  __m256 const a = _mm256_set1_ps(alpha);
  __m256i bad = _mm256_setzero_si256();
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    std::size_t const valid = window_valid(w0, end);
    i32x16 const em =
        lanes_epi32(window_at(cur, bucket_len, w0, valid), [&](std::size_t b) { return emax[b]; });
    __m128i const c = load_bytes16(codes + w0, valid);  // dead lanes: code 0 (valid, value 0)
    __m256 const v0 = natural_values8(_mm256_cvtepu8_epi32(c), em.lo, bad);
    __m256 const v1 = natural_values8(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(c, c)), em.hi, bad);
    store_or_add16(out + w0, valid, {v0, v1}, a, add, stream);
  }
  return _mm256_testz_si256(bad, bad) != 0;
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

namespace scalar {

/// The reference loop of `int8_encode`.
inline void int8_encode(isa_tag, float const* x, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, int8_bucket const* buckets, bool stochastic,
                        random_stream const& rs, std::uint8_t* codes, bool = false) noexcept {
  philox_group g;
  for (std::size_t i = begin; i < end; ++i) {
    if (stochastic && (i % 128 == 0 || i == begin)) philox_fill(rs, i / 128, g);
    codes[i] = quant::int8_code(x[i], buckets[i / bucket_len], stochastic,
                         stochastic ? g.draw(static_cast<unsigned>(i % 128)) : 0u);
  }
}

/// The reference loop of `int8_decode`.
inline void int8_decode(isa_tag, std::uint8_t const* codes, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* los, float const* steps, float* out,
                        float alpha, bool add, bool = false) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    std::size_t const b = i / bucket_len;
    float const v = quant::int8_value(codes[i], los[b], steps[b]);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
}

/// The reference loop of `natural_encode`.
inline void natural_encode(isa_tag, float const* x, std::size_t begin, std::size_t end,
                           std::size_t bucket_len, std::uint8_t const* emax,
                           random_stream const& rs, std::uint8_t* codes) noexcept {
  philox_group g;
  for (std::size_t i = begin; i < end; ++i) {
    if (i % 128 == 0 || i == begin) philox_fill(rs, i / 128, g);
    codes[i] =
        quant::natural_code(x[i], emax[i / bucket_len], g.draw(static_cast<unsigned>(i % 128)));
  }
}

/// The reference loop of `natural_decode`.
inline bool natural_decode(isa_tag, std::uint8_t const* codes, std::size_t begin, std::size_t end,
                           std::size_t bucket_len, std::uint8_t const* emax, float* out,
                           float alpha, bool add, bool = false) noexcept {
  bool ok = true;
  for (std::size_t i = begin; i < end; ++i) {
    float const v = quant::natural_value(codes[i], emax[i / bucket_len], ok);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
  return ok;
}

}  // namespace scalar

/// min/max of one block (updates lo/hi); false if it holds NaN or infinity.
inline bool block_minmax(float const* x, std::size_t n, float& lo, float& hi, isa level) noexcept {
  return dispatch(level, [&](auto t) { return block_minmax(t, x, n, lo, hi); });
}

/// Largest biased exponent of one block.
inline unsigned block_max_exponent(float const* x, std::size_t n, isa level) noexcept {
  return dispatch(level, [&](auto t) { return block_max_exponent(t, x, n); });
}

/// int8 codes of elements [begin, end) (begin a multiple of 128); `stream`: whole 16-byte
/// windows go out with streaming stores when `codes + begin` is 16-byte aligned.
inline void int8_encode(float const* x, std::size_t begin, std::size_t end, std::size_t bucket_len,
                        int8_bucket const* buckets, bool stochastic, random_stream const& rs,
                        std::uint8_t* codes, isa level, bool stream = false) noexcept {
  stream = stream && bytes_to_alignment(codes + begin, 16) == 0;
  dispatch(level, [&](auto t) {
    int8_encode(t, x, begin, end, bucket_len, buckets, stochastic, rs, codes, stream);
  });
  if (stream) stream_fence();
}

/// Decodes int8 codes [begin, end) (begin a multiple of 16).
inline void int8_decode(std::uint8_t const* codes, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* los, float const* steps, float* out,
                        float alpha, bool add, isa level,
                        bool stream = false) noexcept {
  dispatch(level, [&](auto t) {
    int8_decode(t, codes, begin, end, bucket_len, los, steps, out, alpha, add, stream);
  });
  if (stream) stream_fence();
}

/// Natural-compression codes of elements [begin, end) (begin a multiple of 128).
inline void natural_encode(float const* x, std::size_t begin, std::size_t end, std::size_t bucket_len,
                           std::uint8_t const* emax, random_stream const& rs, std::uint8_t* codes,
                           isa level) noexcept {
  dispatch(level, [&](auto t) { natural_encode(t, x, begin, end, bucket_len, emax, rs, codes); });
}

/// Decodes natural-compression bytes [begin, end) (begin a multiple of 16); false if a byte is
/// not one the encoder can produce (out is then unspecified).
inline bool natural_decode(std::uint8_t const* codes, std::size_t begin, std::size_t end,
                           std::size_t bucket_len, std::uint8_t const* emax, float* out,
                           float alpha, bool add, isa level,
                        bool stream = false) noexcept {
  bool const ok = dispatch(level, [&](auto t) {
    return natural_decode(t, codes, begin, end, bucket_len, emax, out, alpha, add, stream);
  });
  if (stream) stream_fence();
  return ok;
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
