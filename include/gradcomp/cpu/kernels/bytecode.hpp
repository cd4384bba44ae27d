// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Kernels of the one-byte-per-element codecs: int8 min-max quantization (nearest or
/// stochastic rounding) and natural compression (stochastic rounding to a power of two).
/// Scalar is the reference; AVX-512 gives identical bytes.
///
/// int8, per bucket [lo, hi]: inv = f32(255 / (hi - lo)) (0 if hi == lo), bias = f32(-lo * inv)
/// (both computed in double), v = fma(x, inv, bias); nearest: q = round-half-even(v),
/// stochastic: q = floor(v + r) with the dither offset r = (draw16 + 0.5) / 2^16; q clamped
/// to [0, 255]. Decode:
/// x̂ = fma(q, step, lo), step = f32((hi - lo) / 255).
///
/// natural, per bucket with E = max biased exponent (< 254) and lo = max(1, E - 125): an
/// element of biased exponent e >= lo and mantissa m rounds up to exponent e + 1 with
/// probability m / 2^23; one with e < lo becomes 2^(lo-127) with probability |x| / 2^(lo-127),
/// else 0. The byte is k | sign << 7 with k = E + 2 - e' (1..127) or 0 for zero.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/bucket.hpp>
#include <gradcomp/cpu/kernels/philox.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// Per-bucket constants of int8 encoding.
struct int8_bucket {
  float inv = 0.0f;
  float bias = 0.0f;
};

/// Encoding constants for a bucket with range [lo, hi] (finite, lo <= hi).
inline int8_bucket make_int8_bucket(float lo, float hi) noexcept {
  int8_bucket b;
  if (hi > lo) {
    double const inv = 255.0 / (static_cast<double>(hi) - static_cast<double>(lo));
    b.inv = static_cast<float>(inv);
    b.bias = static_cast<float>(-static_cast<double>(lo) * static_cast<double>(b.inv));
  }
  return b;
}

/// Decoding step of a bucket with range [lo, hi].
inline float int8_step(float lo, float hi) noexcept {
  return static_cast<float>((static_cast<double>(hi) - static_cast<double>(lo)) / 255.0);
}

namespace scalar {

/// min and max of x[0, n); returns false if an element is NaN or infinite.
inline bool block_minmax(float const* x, std::size_t n, float& lo, float& hi) noexcept {
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
inline unsigned block_max_exponent(float const* x, std::size_t n) noexcept {
  unsigned e = 0;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned const v = (std::bit_cast<std::uint32_t>(x[i]) >> 23) & 0xffu;
    e = v > e ? v : e;
  }
  return e;
}

inline std::uint8_t int8_code(float x, int8_bucket const& b, bool stochastic, std::uint32_t draw) noexcept {
  float const v = std::fma(x, b.inv, b.bias);
  float const fl = std::floor(v);
  float const d = v - fl;
  float q;
  if (stochastic) {
    q = std::floor(v + std::fma(static_cast<float>(draw), 0x1p-16f, 0x1p-17f));
  } else {
    bool const odd = std::fmod(fl, 2.0f) != 0.0f;
    q = fl + ((d > 0.5f || (d == 0.5f && odd)) ? 1.0f : 0.0f);
  }
  q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
  return static_cast<std::uint8_t>(q);
}

inline std::uint8_t natural_code(float x, unsigned emax, std::uint32_t draw) noexcept {
  std::uint32_t const bits = std::bit_cast<std::uint32_t>(x);
  std::uint32_t const a = bits & 0x7fffffffu;
  unsigned const e = a >> 23;
  unsigned const lo = emax > 126 ? emax - 125 : 1;
  float const d = (static_cast<float>(draw) + 0.5f) * (1.0f / 65536.0f);
  unsigned k;
  if (e >= lo) {
    float const frac = std::bit_cast<float>((a & 0x7fffffu) | 0x3f800000u) - 1.0f;
    k = emax + 2 - (e + (d < frac ? 1u : 0u));
  } else {
    float const p = std::bit_cast<float>(a) * std::bit_cast<float>((254u - lo) << 23);  // * 2^(127-lo)
    k = d < p ? emax + 2 - lo : 0u;
  }
  return static_cast<std::uint8_t>(k | ((k != 0 && (bits >> 31)) ? 0x80u : 0u));
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline bool block_minmax(float const* x, std::size_t n, float& lo, float& hi) noexcept {
  __m512 mn = _mm512_set1_ps(lo);
  __m512 mx = _mm512_set1_ps(hi);
  __m512 const big = _mm512_set1_ps(FLT_MAX);
  __mmask16 bad = 0;
  for (std::size_t i = 0; i < n; i += 16) {
    __mmask16 const live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    __m512 const v = _mm512_maskz_loadu_ps(live, x + i);
    bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(v), big, _CMP_NLE_UQ);
    mn = _mm512_mask_min_ps(mn, live, mn, v);
    mx = _mm512_mask_max_ps(mx, live, mx, v);
  }
  lo = _mm512_reduce_min_ps(mn);
  hi = _mm512_reduce_max_ps(mx);
  return bad == 0;
}

GRADCOMP_TARGET_AVX512 inline unsigned block_max_exponent(float const* x, std::size_t n) noexcept {
  __m512i m = _mm512_setzero_si512();
  __m512i const ef = _mm512_set1_epi32(0xff);
  for (std::size_t i = 0; i < n; i += 16) {
    __mmask16 const live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    __m512i const v = _mm512_maskz_loadu_epi32(live, x + i);
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
  __m512i q;
  if (stochastic) {
    q = _mm512_cvt_roundps_epi32(_mm512_add_ps(v, r), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  } else {
    q = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  return _mm512_cvtusepi32_epi8(_mm512_max_epi32(q, _mm512_setzero_si512()));
}

GRADCOMP_TARGET_AVX512 inline __m512 offsets16(philox16 const& g, unsigned k) noexcept {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(philox_window(g, k)), _mm512_set1_ps(0x1p-16f),
                         _mm512_set1_ps(0x1p-17f));
}

// int8 codes of [begin, end) (begin multiple of 128, end multiple of 128 or tensor end).
GRADCOMP_TARGET_AVX512 inline void int8_encode(float const* x, std::size_t begin, std::size_t end,
                                               std::size_t bucket_len, int8_bucket const* buckets,
                                               bool stochastic, random_stream const& rs,
                                               std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_schedule const ks = philox_prepare(rs);
  __m512 const zero = _mm512_setzero_ps();
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 g{};
    if (stochastic) g = philox_generate(ks, g0 / 128);
    if (g0 + 128 <= end && cur.advance(g0, 128)) {
      __m512 const inv = _mm512_set1_ps(buckets[cur.index()].inv);
      __m512 const bias = _mm512_set1_ps(buckets[cur.index()].bias);
      for (unsigned k = 0; k < 8; ++k) {
        __m128i const c = int8_codes16(_mm512_loadu_ps(x + g0 + 16 * k), inv, bias, stochastic,
                                       stochastic ? offsets16(g, k) : zero);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + g0 + 16 * k), c);
      }
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = end - w0 < 16 ? end - w0 : 16;
      __mmask16 const live = valid == 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
      bool const single = cur.advance(w0, valid);
      std::size_t const b0 = cur.index();
      __m512 inv, bias;
      if (single) {
        inv = _mm512_set1_ps(buckets[b0].inv);
        bias = _mm512_set1_ps(buckets[b0].bias);
      } else {
        alignas(64) float a[16], b[16];
        for (unsigned l = 0; l < 16; ++l) {
          std::size_t const bk = l < valid ? (w0 + l) / bucket_len : b0;
          a[l] = buckets[bk].inv;
          b[l] = buckets[bk].bias;
        }
        inv = _mm512_load_ps(a);
        bias = _mm512_load_ps(b);
      }
      __m128i const c = int8_codes16(_mm512_maskz_loadu_ps(live, x + w0), inv, bias, stochastic,
                                     stochastic ? offsets16(g, k) : zero);
      _mm_mask_storeu_epi8(codes + w0, live, c);
    }
  }
}

GRADCOMP_TARGET_AVX512 inline void int8_decode(std::uint8_t const* codes, std::size_t begin,
                                               std::size_t end, std::size_t bucket_len,
                                               float const* los, float const* steps, float* out,
                                               float alpha, bool add) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    std::size_t const valid = end - w0 < 16 ? end - w0 : 16;
    __mmask16 const live = valid == 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
    bool const single = cur.advance(w0, valid);
    std::size_t const b0 = cur.index();
    __m512 lo, st;
    if (single) {
      lo = _mm512_set1_ps(los[b0]);
      st = _mm512_set1_ps(steps[b0]);
    } else {
      alignas(64) float l_[16], s_[16];
      for (unsigned l = 0; l < 16; ++l) {
        std::size_t const bk = l < valid ? (w0 + l) / bucket_len : b0;
        l_[l] = los[bk];
        s_[l] = steps[bk];
      }
      lo = _mm512_load_ps(l_);
      st = _mm512_load_ps(s_);
    }
    __m512 const q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, codes + w0)));
    __m512 v = _mm512_fmadd_ps(q, st, lo);
    if (add) v = _mm512_fmadd_ps(a, v, _mm512_maskz_loadu_ps(live, out + w0));
    _mm512_mask_storeu_ps(out + w0, live, v);
  }
}

GRADCOMP_TARGET_AVX512 inline void natural_encode(float const* x, std::size_t begin, std::size_t end,
                                                  std::size_t bucket_len, std::uint8_t const* emax,
                                                  random_stream const& rs, std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_schedule const ks = philox_prepare(rs);
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 const g = philox_generate(ks, g0 / 128);
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = end - w0 < 16 ? end - w0 : 16;
      __mmask16 const live = valid == 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
      bool const single = cur.advance(w0, valid);
      std::size_t const b0 = cur.index();
      __m512i em;
      if (single) {
        em = _mm512_set1_epi32(emax[b0]);
      } else {
        alignas(64) std::int32_t e_[16];
        for (unsigned l = 0; l < 16; ++l) e_[l] = emax[l < valid ? (w0 + l) / bucket_len : b0];
        em = _mm512_load_si512(e_);
      }
      // lo = max(1, E - 125)
      __m512i const lo = _mm512_max_epi32(_mm512_sub_epi32(em, _mm512_set1_epi32(125)), _mm512_set1_epi32(1));
      __m512i const bits = _mm512_maskz_loadu_epi32(live, x + w0);
      __m512i const a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
      __m512i const e = _mm512_srli_epi32(a, 23);
      __m512 const d = draws_unit(philox_window(g, k));
      __m512 const frac = _mm512_sub_ps(
          _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7fffff)),
                                              _mm512_set1_epi32(0x3f800000))),
          _mm512_set1_ps(1.0f));
      __m512 const p = _mm512_mul_ps(_mm512_castsi512_ps(a),
                                     _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), lo), 23)));
      __mmask16 const normal = _mm512_cmp_epi32_mask(e, lo, _MM_CMPINT_NLT);
      __mmask16 const up = _mm512_cmp_ps_mask(d, _mm512_mask_blend_ps(normal, p, frac), _CMP_LT_OQ);
      __m512i const two = _mm512_add_epi32(em, _mm512_set1_epi32(2));
      __m512i const ep = _mm512_mask_add_epi32(e, up, e, _mm512_set1_epi32(1));
      __m512i const kn = _mm512_sub_epi32(two, ep);
      __m512i const ks = _mm512_maskz_sub_epi32(up, two, lo);
      __m512i kk = _mm512_mask_blend_epi32(normal, ks, kn);
      kk = _mm512_maskz_mov_epi32(live, kk);
      __mmask16 const neg = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(static_cast<int>(0x80000000u))) &
                            _mm512_test_epi32_mask(kk, kk);
      kk = _mm512_mask_or_epi32(kk, neg, kk, _mm512_set1_epi32(0x80));
      _mm_mask_storeu_epi8(codes + w0, live, _mm512_cvtepi32_epi8(kk));
    }
  }
}

GRADCOMP_TARGET_AVX512 inline bool natural_decode(std::uint8_t const* codes, std::size_t begin,
                                                  std::size_t end, std::size_t bucket_len,
                                                  std::uint8_t const* emax, float* out, float alpha,
                                                  bool add) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  __mmask16 bad = 0;
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += 16) {
    std::size_t const valid = end - w0 < 16 ? end - w0 : 16;
    __mmask16 const live = valid == 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
    bool const single = cur.advance(w0, valid);
    std::size_t const b0 = cur.index();
    __m512i em;
    if (single) {
      em = _mm512_set1_epi32(emax[b0]);
    } else {
      alignas(64) std::int32_t e_[16];
      for (unsigned l = 0; l < 16; ++l) e_[l] = emax[l < valid ? (w0 + l) / bucket_len : b0];
      em = _mm512_load_si512(e_);
    }
    __m512i const c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, codes + w0));
    __m512i const k = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
    __m512i const neg = _mm512_srli_epi32(c, 7);
    __mmask16 const zero = _mm512_testn_epi32_mask(k, k);
    __m512i const kmax = _mm512_min_epi32(_mm512_add_epi32(em, _mm512_set1_epi32(1)), _mm512_set1_epi32(127));
    bad |= (zero & _mm512_test_epi32_mask(neg, neg)) | _mm512_cmp_epi32_mask(k, kmax, _MM_CMPINT_NLE);
    __m512i const e = _mm512_sub_epi32(_mm512_add_epi32(em, _mm512_set1_epi32(2)), k);
    __m512i const bits = _mm512_or_si512(_mm512_slli_epi32(neg, 31), _mm512_slli_epi32(e, 23));
    __m512 v = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), bits));
    if (add) v = _mm512_fmadd_ps(a, v, _mm512_maskz_loadu_ps(live, out + w0));
    _mm512_mask_storeu_ps(out + w0, live, v);
  }
  return (bad & 0xffff) == 0;
}

}  // namespace avx512
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// min/max of one block (updates lo/hi); false if it holds NaN or infinity.
inline bool block_minmax(float const* x, std::size_t n, float& lo, float& hi, isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::block_minmax(x, n, lo, hi);
#endif
  (void)level;
  return scalar::block_minmax(x, n, lo, hi);
}

/// Largest biased exponent of one block.
inline unsigned block_max_exponent(float const* x, std::size_t n, isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::block_max_exponent(x, n);
#endif
  (void)level;
  return scalar::block_max_exponent(x, n);
}

/// int8 codes of elements [begin, end) (begin a multiple of 128).
inline void int8_encode(float const* x, std::size_t begin, std::size_t end, std::size_t bucket_len,
                        int8_bucket const* buckets, bool stochastic, random_stream const& rs,
                        std::uint8_t* codes, isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::int8_encode(x, begin, end, bucket_len, buckets, stochastic, rs, codes);
#endif
  (void)level;
  philox_group g;
  for (std::size_t i = begin; i < end; ++i) {
    if (stochastic && (i % 128 == 0 || i == begin)) scalar::philox_fill(rs, i / 128, g);
    codes[i] = scalar::int8_code(x[i], buckets[i / bucket_len], stochastic,
                                 stochastic ? g.draw(static_cast<unsigned>(i % 128)) : 0u);
  }
}

/// Decodes int8 codes [begin, end) (begin a multiple of 16).
inline void int8_decode(std::uint8_t const* codes, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* los, float const* steps, float* out,
                        float alpha, bool add, isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::int8_decode(codes, begin, end, bucket_len, los, steps, out, alpha, add);
#endif
  (void)level;
  for (std::size_t i = begin; i < end; ++i) {
    std::size_t const b = i / bucket_len;
    float const v = std::fma(static_cast<float>(codes[i]), steps[b], los[b]);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
}

/// Natural-compression codes of elements [begin, end) (begin a multiple of 128).
inline void natural_encode(float const* x, std::size_t begin, std::size_t end, std::size_t bucket_len,
                           std::uint8_t const* emax, random_stream const& rs, std::uint8_t* codes,
                           isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::natural_encode(x, begin, end, bucket_len, emax, rs, codes);
#endif
  (void)level;
  philox_group g;
  for (std::size_t i = begin; i < end; ++i) {
    if (i % 128 == 0 || i == begin) scalar::philox_fill(rs, i / 128, g);
    codes[i] = scalar::natural_code(x[i], emax[i / bucket_len], g.draw(static_cast<unsigned>(i % 128)));
  }
}

/// Decoded value of a natural-compression byte in a bucket of max exponent `emax`; clears `ok`
/// for a byte the encoder cannot produce.
inline float natural_value(std::uint8_t c, unsigned emax, bool& ok) noexcept {
  unsigned const k = c & 0x7fu;
  unsigned const neg = c >> 7;
  unsigned const kmax = emax + 1 < 127 ? emax + 1 : 127;
  if (k == 0) {
    ok &= neg == 0;
    return 0.0f;
  }
  ok &= k <= kmax;
  return std::bit_cast<float>((neg << 31) | ((emax + 2 - k) << 23));
}

/// Decodes natural-compression bytes [begin, end) (begin a multiple of 16); false if a byte is
/// not one the encoder can produce (out is then unspecified).
inline bool natural_decode(std::uint8_t const* codes, std::size_t begin, std::size_t end,
                           std::size_t bucket_len, std::uint8_t const* emax, float* out,
                           float alpha, bool add, isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == isa::avx512) return avx512::natural_decode(codes, begin, end, bucket_len, emax, out, alpha, add);
#endif
  (void)level;
  bool ok = true;
  for (std::size_t i = begin; i < end; ++i) {
    float const v = natural_value(codes[i], emax[i / bucket_len], ok);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
  return ok;
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
