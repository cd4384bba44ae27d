// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Kernels of the stochastic quantizers built on random dithering (QSGD, TernGrad, linear and
/// natural dithering): canonical bucket norms, quantize-and-pack, unpack-and-scale.
/// Scalar, AVX2 and AVX-512 levels produce identical bytes; the scalar code is the reference.
/// The element math and the canonical norm order are specified (and implemented once, for the
/// CPU and the CUDA backend) in core/quant/dither.hpp.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/dither.hpp>
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
#include <utility>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

using quant::dither_bucket;
using quant::dither_levels;
using quant::dither_shape;
using quant::make_dither_bucket;
using quant::norm_block;

namespace scalar {

/// Canonical sum of squares of x[0, n) (n <= norm_block): 16 double lanes, lane l holding
/// elements l, l + 16, ... in ascending order, then lanes added 0..15.
inline double block_sumsq(isa_tag, float const* x, std::size_t n) noexcept {
  double lane[16] = {};
  for (std::size_t i = 0; i < n; ++i) {
    lane[i % 16] = quant::sumsq_step(lane[i % 16], x[i]);
  }
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

/// The canonical sums of squares (`block_sumsq`) of the four blocks of `n` elements at x,
/// x + stride, x + 2 stride and x + 3 stride, into out[0..3]: four calls at the level of
/// `Tag`, the version of every level without a kernel of its own.
template <class Tag>
  requires is_isa_tag<Tag>
inline void block_sumsq4(Tag t, float const* x, std::size_t stride, std::size_t n, double* out) noexcept {
  for (std::size_t j = 0; j < 4; ++j) out[j] = block_sumsq(t, x + j * stride, n);
}

/// max |x| over x[0, n), or NaN if any element is NaN or infinite.
inline float block_absmax(isa_tag, float const* x, std::size_t n) noexcept {
  float m = 0.0f;
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    float const a = std::fabs(x[i]);
    bad |= !(a <= FLT_MAX);
    m = a > m ? a : m;
  }
  return bad ? NAN : m;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace bitpack {

// The two 4W-bit runs a (codes 0..3 or 8..11) and b (4..7 or 12..15) of a W-bit code window,
// 8 < W <= 16, as the 8W-bit little-endian value of the W bytes at dst (no 128-bit integers:
// ISO C++ has none).
template <unsigned W>
inline void store_runs(std::uint64_t a, std::uint64_t b, std::byte* dst) noexcept {
  constexpr unsigned h = 4 * W;
  std::uint64_t lo = a, hi = b;
  if constexpr (h < 64) {
    lo = a | (b << h);
    hi = b >> (64 - h);
  }
  std::memcpy(dst, &lo, 8);
  std::memcpy(dst + 8, &hi, W - 8);
}

// Inverse of store_runs: the two 4W-bit runs of the W bytes at src.
template <unsigned W>
inline void load_runs(std::byte const* src, std::uint64_t& a, std::uint64_t& b) noexcept {
  constexpr unsigned h = 4 * W;
  std::uint64_t lo = 0, hi = 0;
  std::memcpy(&lo, src, 8);
  std::memcpy(&hi, src + 8, W - 8);
  a = lo;
  b = hi;
  if constexpr (h < 64) {
    a = lo & ((std::uint64_t{1} << h) - 1u);
    b = (lo >> h) | (hi << (64 - h));
  }
}

}  // namespace bitpack

namespace avx512 {

// One window of a canonical sum of squares: lanes 0-7 into lo, 8-15 into hi.
GRADCOMP_TARGET_AVX512 inline void sumsq_window(__m512 v, __m512d& lo, __m512d& hi) noexcept {
  __m512d const a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  __m512d const b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  lo = _mm512_fmadd_pd(a, a, lo);
  hi = _mm512_fmadd_pd(b, b, hi);
}

// The canonical total of the 16 lanes: lanes 0..15 added in order.
GRADCOMP_TARGET_AVX512 inline double sumsq_total(__m512d lo, __m512d hi) noexcept {
  alignas(64) double lane[16];
  _mm512_store_pd(lane, lo);
  _mm512_store_pd(lane + 8, hi);
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

GRADCOMP_TARGET_AVX512 inline double block_sumsq(isa_tag, float const* x, std::size_t n) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  __m512d lo = _mm512_setzero_pd();
  __m512d hi = _mm512_setzero_pd();
  for (std::size_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    sumsq_window(load16(x + i, live16(n - i)), lo, hi);
  }
  return sumsq_total(lo, hi);
}

// Four blocks at once: each block's two chains of double FMAs (lanes 0-7 and 8-15, the
// canonical order) wait on the FMA's latency; eight independent chains keep both FMA pipes
// busy. Each block's result is `block_sumsq`'s, bit for bit.
GRADCOMP_TARGET_AVX512 inline void block_sumsq4(isa_tag, float const* x, std::size_t stride, std::size_t n,
                                                double* out) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  float const* x1 = x + stride;
  float const* x2 = x1 + stride;
  float const* x3 = x2 + stride;
  __m512d lo0 = _mm512_setzero_pd(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
  __m512d lo2 = lo0, hi2 = lo0, lo3 = lo0, hi3 = lo0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // four lines a window, `ahead` bytes on, in address order: for adjacent blocks (stride
    // == n, as bucket_scales calls it) one sequential stream, as the single-block kernel's
    // (the hardware prefetcher alone falls behind here, cpu/tuning.hpp)
    char const* pf = reinterpret_cast<char const*>(x) + ahead + 16 * i;
    _mm_prefetch(pf, _MM_HINT_T0);
    _mm_prefetch(pf + 64, _MM_HINT_T0);
    _mm_prefetch(pf + 128, _MM_HINT_T0);
    _mm_prefetch(pf + 192, _MM_HINT_T0);
    sumsq_window(_mm512_loadu_ps(x + i), lo0, hi0);
    sumsq_window(_mm512_loadu_ps(x1 + i), lo1, hi1);
    sumsq_window(_mm512_loadu_ps(x2 + i), lo2, hi2);
    sumsq_window(_mm512_loadu_ps(x3 + i), lo3, hi3);
  }
  if (i < n) {
    __mmask16 const live = live16(n - i);
    sumsq_window(_mm512_maskz_loadu_ps(live, x + i), lo0, hi0);
    sumsq_window(_mm512_maskz_loadu_ps(live, x1 + i), lo1, hi1);
    sumsq_window(_mm512_maskz_loadu_ps(live, x2 + i), lo2, hi2);
    sumsq_window(_mm512_maskz_loadu_ps(live, x3 + i), lo3, hi3);
  }
  out[0] = sumsq_total(lo0, hi0);
  out[1] = sumsq_total(lo1, hi1);
  out[2] = sumsq_total(lo2, hi2);
  out[3] = sumsq_total(lo3, hi3);
}

GRADCOMP_TARGET_AVX512 inline float block_absmax(isa_tag, float const* x, std::size_t n) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  __m512 m = _mm512_setzero_ps();
  __m512 const big = _mm512_set1_ps(FLT_MAX);
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    __m512 const a = _mm512_abs_ps(load16(x + i, live16(n - i)));
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);
    m = _mm512_max_ps(m, a);
  }
  return bad ? NAN : _mm512_reduce_max_ps(m);
}

// Packs 16 codes of `width` bits (in 32-bit lanes) into 2 * width bytes at dst.
template <unsigned W>
GRADCOMP_TARGET_AVX512 inline void pack16(__m512i codes, std::byte* dst) noexcept {
  if constexpr (W <= 8) {
    __m128i const b = _mm512_cvtepi32_epi8(codes);
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    std::uint64_t const p0 = _pext_u64(static_cast<std::uint64_t>(_mm_cvtsi128_si64(b)), mask);
    std::uint64_t const p1 = _pext_u64(static_cast<std::uint64_t>(_mm_extract_epi64(b, 1)), mask);
    std::memcpy(dst, &p0, W);
    std::memcpy(dst + W, &p1, W);
  } else {
    __m256i const h = _mm512_cvtepi32_epi16(codes);
    std::uint64_t const mask = 0x0001000100010001ull * ((1u << W) - 1u);
    alignas(32) std::uint64_t q[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), h);
    bitpack::store_runs<W>(_pext_u64(q[0], mask), _pext_u64(q[1], mask), dst);
    bitpack::store_runs<W>(_pext_u64(q[2], mask), _pext_u64(q[3], mask), dst + W);
  }
}

// Unpacks 16 codes of `width` bits from 2 * width bytes at src.
template <unsigned W>
GRADCOMP_TARGET_AVX512 inline __m512i unpack16(std::byte const* src) noexcept {
  if constexpr (W <= 8) {
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, src, W);
    std::memcpy(&b, src + W, W);
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    __m128i const v = _mm_set_epi64x(static_cast<long long>(_pdep_u64(b, mask)),
                                     static_cast<long long>(_pdep_u64(a, mask)));
    return _mm512_cvtepu8_epi32(v);
  } else {
    std::uint64_t r0, r1, r2, r3;
    bitpack::load_runs<W>(src, r0, r1);
    bitpack::load_runs<W>(src + W, r2, r3);
    std::uint64_t const mask = 0x0001000100010001ull * ((1u << W) - 1u);
    std::uint64_t const c0 = _pdep_u64(r0, mask);
    std::uint64_t const c1 = _pdep_u64(r1, mask);
    std::uint64_t const c2 = _pdep_u64(r2, mask);
    std::uint64_t const c3 = _pdep_u64(r3, mask);
    __m256i const v = _mm256_set_epi64x(static_cast<long long>(c3), static_cast<long long>(c2),
                                        static_cast<long long>(c1), static_cast<long long>(c0));
    return _mm512_cvtepu16_epi32(v);
  }
}

#define GRADCOMP_DITHER_WIDTH_CASES(F) \
  F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15) F(16)

GRADCOMP_TARGET_AVX512 inline void pack16(unsigned width, __m512i codes, std::byte* dst) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: pack16<W>(codes, dst); return;
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return;
  }
}

GRADCOMP_TARGET_AVX512 inline __m512i unpack16(unsigned width, std::byte const* src) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: return unpack16<W>(src);
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return _mm512_setzero_si512();
  }
}

// Packs with full-width stores that may write up to 16 bytes past the 2 * W bytes of the
// window; only for windows whose following bytes are rewritten later by the same thread.
template <unsigned W>
GRADCOMP_TARGET_AVX512 inline void pack16_overlapping(__m512i codes, std::byte* dst) noexcept {
  if constexpr (W == 4) {
    // nibbles: each byte pair (c, d) becomes c + 16 d in one multiply-add, then 8 bytes
    __m128i const b = _mm512_cvtepi32_epi8(codes);
    __m128i const pairs = _mm_maddubs_epi16(b, _mm_set1_epi16(0x1001));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(pairs, pairs));
  } else if constexpr (W <= 8) {
    __m128i const b = _mm512_cvtepi32_epi8(codes);
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    std::uint64_t const p0 = _pext_u64(static_cast<std::uint64_t>(_mm_cvtsi128_si64(b)), mask);
    std::uint64_t const p1 = _pext_u64(static_cast<std::uint64_t>(_mm_extract_epi64(b, 1)), mask);
    std::memcpy(dst, &p0, 8);
    std::memcpy(dst + W, &p1, 8);
  } else {
    pack16<W>(codes, dst);
  }
}

// Unpacks with full-width loads that may read up to 16 bytes past the window.
template <unsigned W>
GRADCOMP_TARGET_AVX512 inline __m512i unpack16_overlapping(std::byte const* src) noexcept {
  if constexpr (W <= 8) {
    std::uint64_t a, b;
    std::memcpy(&a, src, 8);
    std::memcpy(&b, src + W, 8);
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    __m128i const v = _mm_set_epi64x(static_cast<long long>(_pdep_u64(b, mask)),
                                     static_cast<long long>(_pdep_u64(a, mask)));
    return _mm512_cvtepu8_epi32(v);
  } else {
    return unpack16<W>(src);
  }
}

// The 16 dither offsets (draw + 0.5) / 2^16 of window k of a group.
GRADCOMP_TARGET_AVX512 inline __m512 dither_offsets(philox16 const& g, unsigned k) noexcept {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(philox_window(g, k)), _mm512_set1_ps(0x1p-16f),
                         _mm512_set1_ps(0x1p-17f));
}

// The constants of one code stream, broadcast once per call.
struct dither_lanes {
  __m512i s;     // the top level
  __m512i sign;  // the sign bit of a code
};

GRADCOMP_TARGET_AVX512 inline dither_lanes make_dither_lanes(dither_shape const& sh) noexcept {
  return {_mm512_set1_epi32(static_cast<int>(sh.s)),
          _mm512_set1_epi32(static_cast<int>(1u << (sh.width - 1)))};
}

// Codes of 16 elements (see the file comment for the math). `Pre`: the bucket's pre-scale is
// not 1 (|x| * 1 is |x|, so skipping the multiply changes no bit).
template <bool Natural, bool Pre>
GRADCOMP_TARGET_AVX512 inline __m512i dither_codes16(__m512 xv, __m512 pre, __m512 mult, __m512 r,
                                                     dither_lanes const& c) noexcept {
  __m512 a = _mm512_abs_ps(xv);
  if constexpr (Pre) a = _mm512_mul_ps(a, pre);
  __m512i q;
  if constexpr (!Natural) {
    q = _mm512_cvttps_epi32(_mm512_fmadd_ps(a, mult, r));
  } else {
    __m512 const u = _mm512_mul_ps(a, mult);
    __m512 const one = _mm512_set1_ps(1.0f);
    __mmask16 const small = _mm512_cmp_ps_mask(u, one, _CMP_LT_OQ);
    __m512i const bits = _mm512_castps_si512(u);
    __m512 const m = _mm512_sub_ps(
        _mm512_castsi512_ps(_mm512_ternarylogic_epi32(bits, _mm512_set1_epi32(0x7fffff),
                                                      _mm512_set1_epi32(0x3f800000), 0xEA)),
        one);
    __m512 const p = _mm512_mask_blend_ps(small, m, u);
    __mmask16 const up = _mm512_cmp_ps_mask(_mm512_add_ps(p, r), one, _CMP_GE_OQ);
    __m512i const base = _mm512_maskz_sub_epi32(static_cast<__mmask16>(~small),
                                                _mm512_srli_epi32(bits, 23), _mm512_set1_epi32(126));
    q = _mm512_mask_add_epi32(base, up, base, _mm512_set1_epi32(1));
  }
  q = _mm512_min_epu32(q, c.s);
  // The sign bit of x (x is finite here; -0 gives q = 0, which the test below drops).
  __mmask16 const neg = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(_mm512_castps_si512(xv)), q, q);
  return _mm512_mask_or_epi32(q, neg, q, c.sign);
}

// Encodes windows K..7 of a full 128-element group lying in a single bucket, using overlapping
// stores (K a template parameter, so that each window's draws are picked at compile time).
template <unsigned W, bool Natural, bool Pre, unsigned K = 0>
GRADCOMP_TARGET_AVX512 inline void dither_group_fast(float const* x, __m512 pre, __m512 mult,
                                                     dither_lanes const& c, philox16 const& g,
                                                     std::byte* dst) noexcept {
  pack16_overlapping<W>(
      dither_codes16<Natural, Pre>(_mm512_loadu_ps(x + 16 * K), pre, mult, dither_offsets(g, K), c),
      dst + 2 * W * K);
  if constexpr (K + 1 < 8) dither_group_fast<W, Natural, Pre, K + 1>(x, pre, mult, c, g, dst);
}

template <unsigned W, bool Natural>
GRADCOMP_TARGET_AVX512 inline void dither_encode_shape(float const* x, std::size_t begin,
                                                       std::size_t end, std::size_t bucket_len,
                                                       dither_bucket const* buckets,
                                                       dither_shape const& sh,
                                                       random_stream const& rs,
                                                       std::byte* codes) noexcept {
  dither_lanes const c = make_dither_lanes(sh);
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 const g = draws.group(g0 / 128);
    // Fast path: a full group inside one bucket, not the last group of this range (its
    // overlapping stores spill into the next group, which this thread writes afterwards).
    if (g0 + 256 <= end && cur.advance(g0, 128)) {
      dither_bucket const& bk = buckets[cur.index()];
      std::byte* dst = codes + (g0 / 16) * 2 * W;
      __m512 const pre = _mm512_set1_ps(bk.pre);
      __m512 const mult = _mm512_set1_ps(bk.mult);
      if (bk.pre == 1.0f) {
        dither_group_fast<W, Natural, false>(x + g0, pre, mult, c, g, dst);
      } else {
        dither_group_fast<W, Natural, true>(x + g0, pre, mult, c, g, dst);
      }
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      __mmask16 const live = live16(valid);
      window_buckets const w = window_at(cur, bucket_len, w0, valid);
      __m512 const pre = lanes_ps(w, [&](std::size_t b) { return buckets[b].pre; });
      __m512 const mult = lanes_ps(w, [&](std::size_t b) { return buckets[b].mult; });
      __m512 const xv = load16(x + w0, live);
      __m512i const q = _mm512_maskz_mov_epi32(
          live, dither_codes16<Natural, true>(xv, pre, mult, dither_offsets(g, k), c));
      std::byte* dst = codes + (w0 / 16) * 2 * W;
      if (valid == window_lanes) {
        pack16<W>(q, dst);
      } else {
        std::byte tmp[32];
        pack16<W>(q, tmp);
        std::memcpy(dst, tmp, packed_bytes(valid, W));
      }
    }
  }
}

GRADCOMP_TARGET_AVX512 inline void dither_encode(isa_tag, float const* x, std::size_t begin,
                                                 std::size_t end, std::size_t bucket_len,
                                                 dither_bucket const* buckets,
                                                 dither_shape const& sh, random_stream const& rs,
                                                 std::byte* codes) noexcept {
  switch (sh.width) {
#define GRADCOMP_CASE(W)                                                                        \
  case W:                                                                                       \
    if (sh.natural) {                                                                           \
      dither_encode_shape<W, true>(x, begin, end, bucket_len, buckets, sh, rs, codes);          \
    } else {                                                                                    \
      dither_encode_shape<W, false>(x, begin, end, bucket_len, buckets, sh, rs, codes);         \
    }                                                                                           \
    return;
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return;
  }
}

// Decoded values of 16 codes; accumulates non-canonical lanes into `bad`.
GRADCOMP_TARGET_AVX512 inline __m512 dither_values16(__m512i c, __m512 step, dither_shape const& sh,
                                                     __mmask16& bad) noexcept {
  __m512i const q = _mm512_and_si512(c, _mm512_set1_epi32(static_cast<int>((1u << (sh.width - 1)) - 1u)));
  __mmask16 const neg = _mm512_test_epi32_mask(c, _mm512_set1_epi32(static_cast<int>(1u << (sh.width - 1))));
  __mmask16 const zero = _mm512_testn_epi32_mask(q, q);
  bad = static_cast<__mmask16>(
      bad | _mm512_cmp_epu32_mask(q, _mm512_set1_epi32(static_cast<int>(sh.s)), _MM_CMPINT_NLE) |
      (neg & zero));
  __m512 level_v;
  if (!sh.natural) {
    level_v = _mm512_cvtepi32_ps(q);
  } else {
    level_v = _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero),
                                  _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_add_epi32(q, _mm512_set1_epi32(126)), 23)));
  }
  __m512 const v = _mm512_min_ps(_mm512_mul_ps(level_v, step), _mm512_set1_ps(FLT_MAX));
  return _mm512_mask_xor_ps(v, neg, v, _mm512_set1_ps(-0.0f));
}

// Codes of width <= 5 (sign and a level below 16: QSGD s <= 15, TernGrad, dithering with at
// most 15 levels) decode by table: the 32 possible codes' magnitudes and signs are set once
// per call, each group scales them by its bucket's step (the same product and clamp
// dither_value computes, so the values are the same bits), and a window is one two-register
// permute. A 32-bit mask marks the canonical codes.
inline constexpr unsigned dither_table_width = 5;

struct dither_decode_table {
  __m512 mag_lo, mag_hi;     // level of codes 0..15 and 16..31
  __mmask16 neg_lo, neg_hi;  // codes with the sign bit set
  __m512i canonical;         // bit c set: code c is canonical
};

GRADCOMP_TARGET_AVX512 inline dither_decode_table make_dither_decode_table(dither_shape const& sh) noexcept {
  alignas(64) float mag[32] = {};
  std::uint32_t neg = 0, canonical = 0;
  for (std::uint32_t c = 0; c < (1u << sh.width) && c < 32; ++c) {
    std::uint32_t const q = c & ((1u << (sh.width - 1)) - 1u);
    bool const n = (c >> (sh.width - 1)) != 0;
    if (q <= sh.s && !(n && q == 0)) canonical |= 1u << c;
    if (n) neg |= 1u << c;
    mag[c] = !sh.natural ? static_cast<float>(q)
                         : (q == 0 ? 0.0f : std::bit_cast<float>((q + 126u) << 23));
  }
  return {_mm512_load_ps(mag), _mm512_load_ps(mag + 16), static_cast<__mmask16>(neg & 0xffffu),
          static_cast<__mmask16>(neg >> 16), _mm512_set1_epi32(static_cast<int>(canonical))};
}

// The 16 codes of a window of width W <= 8 from one 16-byte load: each dword gathers the two
// bytes holding its bits (a byte shuffle inside the broadcast 128-bit lanes), then shifts and
// masks. Reads 16 bytes from src, like unpack16_overlapping.
template <unsigned W>
struct unpack_shuffle {
  static_assert(W >= 2 && W <= 8);
  alignas(64) std::uint8_t bytes[64];
  alignas(64) std::uint32_t shifts[16];
  constexpr unpack_shuffle() : bytes{}, shifts{} {
    for (unsigned i = 0; i < 16; ++i) {
      unsigned const bit = i * W;
      bytes[4 * i] = static_cast<std::uint8_t>(bit / 8);
      bytes[4 * i + 1] = bit % 8 + W > 8 ? static_cast<std::uint8_t>(bit / 8 + 1) : 0x80;
      bytes[4 * i + 2] = 0x80;
      bytes[4 * i + 3] = 0x80;
      shifts[i] = bit % 8;
    }
  }
};
template <unsigned W>
inline constexpr unpack_shuffle<W> unpack_shuffle_v{};

template <unsigned W>
GRADCOMP_TARGET_AVX512 inline __m512i unpack16_shuffle(std::byte const* src) noexcept {
  __m512i const v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<__m128i const*>(src)));
  __m512i const g = _mm512_shuffle_epi8(v, _mm512_load_si512(unpack_shuffle_v<W>.bytes));
  return _mm512_and_si512(_mm512_srlv_epi32(g, _mm512_load_si512(unpack_shuffle_v<W>.shifts)),
                          _mm512_set1_epi32(static_cast<int>((1u << W) - 1u)));
}

template <unsigned W>
GRADCOMP_TARGET_AVX512 inline __mmask16 dither_decode_group_table(std::byte const* src, float step_s,
                                                                  dither_decode_table const& t,
                                                                  float* out, float alpha, bool add,
                                                                  bool stream) noexcept {
  __m512 const step = _mm512_set1_ps(step_s);
  __m512 const big = _mm512_set1_ps(FLT_MAX);
  __m512 const sign = _mm512_set1_ps(-0.0f);
  __m512 lo = _mm512_min_ps(_mm512_mul_ps(t.mag_lo, step), big);
  __m512 hi = _mm512_min_ps(_mm512_mul_ps(t.mag_hi, step), big);
  lo = _mm512_mask_xor_ps(lo, t.neg_lo, lo, sign);
  hi = _mm512_mask_xor_ps(hi, t.neg_hi, hi, sign);
  __m512 const a = _mm512_set1_ps(alpha);
  __m512i const one = _mm512_set1_epi32(1);
  __mmask16 bad = 0;
  for (unsigned k = 0; k < 8; ++k) {
    __m512i const c = unpack16_shuffle<W>(src + 2 * W * k);
    bad = static_cast<__mmask16>(bad | _mm512_testn_epi32_mask(_mm512_srlv_epi32(t.canonical, c), one));
    store_or_add16(out + 16 * k, full_window16, _mm512_permutex2var_ps(lo, c, hi), a, add, stream);
  }
  return bad;
}

template <unsigned W>
GRADCOMP_TARGET_AVX512 inline __mmask16 dither_decode_group_fast(std::byte const* src, float step_s,
                                                                 dither_shape const& sh, float* out,
                                                                 float alpha, bool add, bool stream) noexcept {
  __mmask16 bad = 0;
  __m512 const step = _mm512_set1_ps(step_s);
  __m512 const a = _mm512_set1_ps(alpha);
  for (unsigned k = 0; k < 8; ++k) {
    store_or_add16(out + 16 * k, full_window16,
                   dither_values16(unpack16_overlapping<W>(src + 2 * W * k), step, sh, bad), a, add,
                   stream);
  }
  return bad;
}

GRADCOMP_TARGET_AVX512 inline __mmask16 dither_decode_group_fast(unsigned width, std::byte const* src,
                                                                 float step, dither_shape const& sh,
                                                                 float* out, float alpha, bool add, bool stream) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: return dither_decode_group_fast<W>(src, step, sh, out, alpha, add, stream);
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return 0xffff;
  }
}

GRADCOMP_TARGET_AVX512 inline bool dither_decode(isa_tag, std::byte const* codes, std::size_t begin,
                                                 std::size_t end, std::size_t bucket_len,
                                                 float const* steps, dither_shape const& sh,
                                                 float* out, float alpha, bool add, bool stream) noexcept {
  __mmask16 bad = 0;
  __m512 const a = _mm512_set1_ps(alpha);
  bucket_cursor cur(bucket_len, begin);
  std::size_t w0 = begin;
  // The group path streams only from an aligned start (then every group is aligned).
  stream = stream && !add && bytes_to_alignment(out + begin, 64) == 0;
  // Fast path: whole 128-element groups in one bucket with a full group after them (the
  // overlapping loads stay inside the code stream).
  if (sh.width <= dither_table_width) {
    dither_decode_table const t = make_dither_decode_table(sh);
    while (w0 % 128 == 0 && w0 + 256 <= end && cur.advance(w0, 128)) {
      std::byte const* src = codes + (w0 / 16) * 2 * sh.width;
      float const step = steps[cur.index()];
      switch (sh.width) {
        case 2: bad |= dither_decode_group_table<2>(src, step, t, out + w0, alpha, add, stream); break;
        case 3: bad |= dither_decode_group_table<3>(src, step, t, out + w0, alpha, add, stream); break;
        case 4: bad |= dither_decode_group_table<4>(src, step, t, out + w0, alpha, add, stream); break;
        default: bad |= dither_decode_group_table<5>(src, step, t, out + w0, alpha, add, stream); break;
      }
      w0 += 128;
    }
  }
  while (w0 % 128 == 0 && w0 + 256 <= end && cur.advance(w0, 128)) {
    bad |= dither_decode_group_fast(sh.width, codes + (w0 / 16) * 2 * sh.width, steps[cur.index()],
                                    sh, out + w0, alpha, add, stream);
    w0 += 128;
  }
  for (; w0 < end; w0 += 16) {
    std::size_t const valid = window_valid(w0, end);
    __mmask16 const live = live16(valid);
    std::byte const* src = codes + (w0 / 16) * 2 * sh.width;
    __m512i c;
    if (valid == window_lanes) {
      c = unpack16(sh.width, src);
    } else {
      std::byte tmp[32] = {};
      std::memcpy(tmp, src, packed_bytes(valid, sh.width));
      c = unpack16(sh.width, tmp);
    }
    c = _mm512_maskz_mov_epi32(live, c);
    __m512 const step =
        lanes_ps(window_at(cur, bucket_len, w0, valid), [&](std::size_t b) { return steps[b]; });
    store_or_add16(out + w0, live, dither_values16(c, step, sh, bad), a, add, stream);
  }
  return bad == 0;
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline double block_sumsq(isa_tag, float const* x, std::size_t n) noexcept {
  // accJ holds lanes 4J..4J+3 of the canonical 16 lanes.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  std::size_t i = 0;
  for (; i < n; i += 16) {
    // Missing lanes read as 0: fma(0, 0, acc) = acc, acc being >= +0.
    f32x16 const v = load16(x + i, window_valid(i, n));
    __m256d const a = _mm256_cvtps_pd(_mm256_castps256_ps128(v.lo));
    __m256d const b = _mm256_cvtps_pd(_mm256_extractf128_ps(v.lo, 1));
    __m256d const c = _mm256_cvtps_pd(_mm256_castps256_ps128(v.hi));
    __m256d const d = _mm256_cvtps_pd(_mm256_extractf128_ps(v.hi, 1));
    acc0 = _mm256_fmadd_pd(a, a, acc0);
    acc1 = _mm256_fmadd_pd(b, b, acc1);
    acc2 = _mm256_fmadd_pd(c, c, acc2);
    acc3 = _mm256_fmadd_pd(d, d, acc3);
  }
  alignas(32) double lane[16];
  _mm256_store_pd(lane, acc0);
  _mm256_store_pd(lane + 4, acc1);
  _mm256_store_pd(lane + 8, acc2);
  _mm256_store_pd(lane + 12, acc3);
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

GRADCOMP_TARGET_AVX2 inline float block_absmax(isa_tag, float const* x, std::size_t n) noexcept {
  __m256 const absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 const big = _mm256_set1_ps(FLT_MAX);
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i < n; i += 16) {
    f32x16 const v = load16(x + i, window_valid(i, n));  // missing lanes: 0, no new maximum
    __m256 const a0 = _mm256_and_ps(v.lo, absmask);
    __m256 const a1 = _mm256_and_ps(v.hi, absmask);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a0, big, _CMP_NLE_UQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a1, big, _CMP_NLE_UQ));
    m0 = _mm256_max_ps(m0, a0);
    m1 = _mm256_max_ps(m1, a1);
  }
  if (_mm256_movemask_ps(bad) != 0) return NAN;
  __m256 m = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// Packs 16 codes of W bits (lanes 0..7 in c0, 8..15 in c1, each below 2^W) into 2W bytes.
// With `overlap`, W <= 8 uses 8-byte stores that may write up to 8 - W bytes past the window
// (only for windows whose following bytes the same thread rewrites afterwards).
template <unsigned W, bool overlap = false>
GRADCOMP_TARGET_AVX2 inline void pack16(__m256i c0, __m256i c1, std::byte* dst) noexcept {
  // 16 x u16 in order: packus interleaves the 128-bit halves, the permute restores the order.
  __m256i const h = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), _MM_SHUFFLE(3, 1, 2, 0));
  if constexpr (W <= 8) {
    __m128i const b = _mm_packus_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    std::uint64_t const p0 = _pext_u64(static_cast<std::uint64_t>(_mm_cvtsi128_si64(b)), mask);
    std::uint64_t const p1 = _pext_u64(static_cast<std::uint64_t>(_mm_extract_epi64(b, 1)), mask);
    std::memcpy(dst, &p0, overlap ? 8 : W);
    std::memcpy(dst + W, &p1, overlap ? 8 : W);
  } else {
    std::uint64_t const mask = 0x0001000100010001ull * ((1u << W) - 1u);
    alignas(32) std::uint64_t q[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), h);
    bitpack::store_runs<W>(_pext_u64(q[0], mask), _pext_u64(q[1], mask), dst);
    bitpack::store_runs<W>(_pext_u64(q[2], mask), _pext_u64(q[3], mask), dst + W);
  }
}

// Unpacks 16 codes of W bits from 2W bytes at src into c0 (lanes 0..7) and c1 (8..15). With
// `overlap`, W <= 8 uses 8-byte loads that may read up to 8 - W bytes past the window.
template <unsigned W, bool overlap = false>
GRADCOMP_TARGET_AVX2 inline void unpack16(std::byte const* src, __m256i& c0, __m256i& c1) noexcept {
  if constexpr (W <= 8) {
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, src, overlap ? 8 : W);
    std::memcpy(&b, src + W, overlap ? 8 : W);
    std::uint64_t const mask = 0x0101010101010101ull * ((1u << W) - 1u);
    c0 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(_pdep_u64(a, mask))));
    c1 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(_pdep_u64(b, mask))));
  } else {
    std::uint64_t r0, r1, r2, r3;
    bitpack::load_runs<W>(src, r0, r1);
    bitpack::load_runs<W>(src + W, r2, r3);
    std::uint64_t const mask = 0x0001000100010001ull * ((1u << W) - 1u);
    std::uint64_t const q0 = _pdep_u64(r0, mask);
    std::uint64_t const q1 = _pdep_u64(r1, mask);
    std::uint64_t const q2 = _pdep_u64(r2, mask);
    std::uint64_t const q3 = _pdep_u64(r3, mask);
    c0 = _mm256_cvtepu16_epi32(
        _mm_set_epi64x(static_cast<long long>(q1), static_cast<long long>(q0)));
    c1 = _mm256_cvtepu16_epi32(
        _mm_set_epi64x(static_cast<long long>(q3), static_cast<long long>(q2)));
  }
}

GRADCOMP_TARGET_AVX2 inline void pack16(unsigned width, __m256i c0, __m256i c1,
                                        std::byte* dst) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: pack16<W>(c0, c1, dst); return;
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return;
  }
}

GRADCOMP_TARGET_AVX2 inline void unpack16(unsigned width, std::byte const* src, __m256i& c0,
                                          __m256i& c1) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: unpack16<W>(src, c0, c1); return;
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: c0 = c1 = _mm256_setzero_si256(); return;
  }
}

// The 8 dither offsets (draw + 0.5) / 2^16 of lanes 8h..8h+7 of window k of a group (exact).
GRADCOMP_TARGET_AVX2 inline __m256 dither_offsets(philox16 const& g, unsigned k,
                                                  unsigned h) noexcept {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(philox_window(g, k, h)), _mm256_set1_ps(0x1p-16f),
                         _mm256_set1_ps(0x1p-17f));
}

// Codes of 8 elements (see the file comment for the math).
GRADCOMP_TARGET_AVX2 inline __m256i dither_codes8(__m256 xv, __m256 pre, __m256 mult, __m256 r,
                                                  dither_shape const& sh) noexcept {
  __m256 const one = _mm256_set1_ps(1.0f);
  __m256 const a =
      _mm256_mul_ps(_mm256_and_ps(xv, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))), pre);
  __m256i q;
  if (!sh.natural) {
    q = _mm256_cvttps_epi32(_mm256_fmadd_ps(a, mult, r));  // >= 0 and < 2^31: truncation = floor
  } else {
    __m256 const u = _mm256_mul_ps(a, mult);
    __m256 const small = _mm256_cmp_ps(u, one, _CMP_LT_OQ);
    __m256i const bits = _mm256_castps_si256(u);
    __m256 const m = _mm256_sub_ps(
        _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)),
                                            _mm256_set1_epi32(0x3f800000))),
        one);
    __m256 const p = _mm256_blendv_ps(m, u, small);
    __m256i const up = _mm256_castps_si256(_mm256_cmp_ps(_mm256_add_ps(p, r), one, _CMP_GE_OQ));
    __m256i const base =
        _mm256_andnot_si256(_mm256_castps_si256(small),
                            _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
    q = _mm256_sub_epi32(base, up);  // up is 0 or -1
  }
  q = _mm256_min_epu32(q, _mm256_set1_epi32(static_cast<int>(sh.s)));
  __m256i const neg = _mm256_castps_si256(_mm256_cmp_ps(xv, _mm256_setzero_ps(), _CMP_LT_OQ));
  __m256i const sign =
      _mm256_and_si256(neg, _mm256_set1_epi32(static_cast<int>(1u << (sh.width - 1))));
  return _mm256_or_si256(q,
                         _mm256_andnot_si256(_mm256_cmpeq_epi32(q, _mm256_setzero_si256()), sign));
}

// Encodes one full 128-element group lying in a single bucket, using overlapping stores.
template <unsigned W>
GRADCOMP_TARGET_AVX2 inline void dither_group_fast(float const* x, dither_bucket const& bk,
                                                   dither_shape const& sh, philox16 const& g,
                                                   std::byte* dst) noexcept {
  __m256 const pre = _mm256_set1_ps(bk.pre);
  __m256 const mult = _mm256_set1_ps(bk.mult);
  for (unsigned k = 0; k < 8; ++k) {
    __m256i const c0 =
        dither_codes8(_mm256_loadu_ps(x + 16 * k), pre, mult, dither_offsets(g, k, 0), sh);
    __m256i const c1 =
        dither_codes8(_mm256_loadu_ps(x + 16 * k + 8), pre, mult, dither_offsets(g, k, 1), sh);
    pack16<W, true>(c0, c1, dst + 2 * W * k);
  }
}

GRADCOMP_TARGET_AVX2 inline void dither_group_fast(unsigned width, float const* x,
                                                   dither_bucket const& bk, dither_shape const& sh,
                                                   philox16 const& g, std::byte* dst) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: dither_group_fast<W>(x, bk, sh, g, dst); return;
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return;
  }
}

GRADCOMP_TARGET_AVX2 inline void dither_encode(isa_tag, float const* x, std::size_t begin,
                                               std::size_t end, std::size_t bucket_len,
                                               dither_bucket const* buckets, dither_shape const& sh,
                                               random_stream const& rs, std::byte* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  philox_draws draws(rs);
  for (std::size_t g0 = begin; g0 < end; g0 += 128) {
    philox16 const g = draws.group(g0 / 128);
    // Fast path: a full group inside one bucket, not the last group of this range (its
    // overlapping stores spill into the next group, which this thread writes afterwards).
    if (g0 + 256 <= end && cur.advance(g0, 128)) {
      dither_group_fast(sh.width, x + g0, buckets[cur.index()], sh, g,
                        codes + (g0 / 16) * 2 * sh.width);
      continue;
    }
    for (unsigned k = 0; k < 8; ++k) {
      std::size_t const w0 = g0 + 16 * k;
      if (w0 >= end) break;
      std::size_t const valid = window_valid(w0, end);
      window_buckets const w = window_at(cur, bucket_len, w0, valid);
      f32x16 const pre = lanes_ps(w, [&](std::size_t b) { return buckets[b].pre; });
      f32x16 const mult = lanes_ps(w, [&](std::size_t b) { return buckets[b].mult; });
      i32x16 const live = live16(valid);
      // Dead lanes read x = 0 and are forced to code 0 (the padding bits stay clear).
      f32x16 const xv = load16(x + w0, valid);
      __m256i const c0 = _mm256_and_si256(
          live.lo, dither_codes8(xv.lo, pre.lo, mult.lo, dither_offsets(g, k, 0), sh));
      __m256i const c1 = _mm256_and_si256(
          live.hi, dither_codes8(xv.hi, pre.hi, mult.hi, dither_offsets(g, k, 1), sh));
      std::byte* dst = codes + (w0 / 16) * 2 * sh.width;
      if (valid == window_lanes) {
        pack16(sh.width, c0, c1, dst);
      } else {
        std::byte tmp[32];
        pack16(sh.width, c0, c1, tmp);
        std::memcpy(dst, tmp, packed_bytes(valid, sh.width));
      }
    }
  }
}

// Decoded values of 8 codes; accumulates non-canonical lanes into `bad`.
GRADCOMP_TARGET_AVX2 inline __m256 dither_values8(__m256i c, __m256 step, dither_shape const& sh,
                                                  __m256i& bad) noexcept {
  __m256i const sign = _mm256_set1_epi32(static_cast<int>(1u << (sh.width - 1)));
  __m256i const q = _mm256_andnot_si256(sign, c);  // c < 2^width
  __m256i const neg = _mm256_cmpeq_epi32(_mm256_and_si256(c, sign), sign);
  __m256i const zero = _mm256_cmpeq_epi32(q, _mm256_setzero_si256());
  // q < 2^15 and s < 2^15, so the signed compare is the unsigned one.
  bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(q, _mm256_set1_epi32(static_cast<int>(sh.s))));
  bad = _mm256_or_si256(bad, _mm256_and_si256(neg, zero));
  __m256 level;
  if (!sh.natural) {
    level = _mm256_cvtepi32_ps(q);  // exact, q < 2^24
  } else {
    level = _mm256_castsi256_ps(_mm256_andnot_si256(
        zero, _mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(126)), 23)));
  }
  __m256 const v = _mm256_min_ps(_mm256_mul_ps(level, step), _mm256_set1_ps(FLT_MAX));
  return _mm256_xor_ps(v, _mm256_and_ps(_mm256_castsi256_ps(neg), _mm256_set1_ps(-0.0f)));
}

template <unsigned W>
GRADCOMP_TARGET_AVX2 inline __m256i dither_decode_group_fast(std::byte const* src, float step_s,
                                                             dither_shape const& sh, float* out,
                                                             float alpha, bool add, bool stream) noexcept {
  __m256i bad = _mm256_setzero_si256();
  __m256 const step = _mm256_set1_ps(step_s);
  __m256 const a = _mm256_set1_ps(alpha);
  for (unsigned k = 0; k < 8; ++k) {
    __m256i c0, c1;
    unpack16<W, true>(src + 2 * W * k, c0, c1);
    __m256 v0 = dither_values8(c0, step, sh, bad);
    __m256 v1 = dither_values8(c1, step, sh, bad);
    if (add) {
      v0 = _mm256_fmadd_ps(a, v0, _mm256_loadu_ps(out + 16 * k));
      v1 = _mm256_fmadd_ps(a, v1, _mm256_loadu_ps(out + 16 * k + 8));
    }
    if (stream) {
      _mm256_stream_ps(out + 16 * k, v0);
      _mm256_stream_ps(out + 16 * k + 8, v1);
    } else {
      _mm256_storeu_ps(out + 16 * k, v0);
      _mm256_storeu_ps(out + 16 * k + 8, v1);
    }
  }
  return bad;
}

GRADCOMP_TARGET_AVX2 inline __m256i dither_decode_group_fast(unsigned width, std::byte const* src,
                                                             float step, dither_shape const& sh,
                                                             float* out, float alpha,
                                                             bool add, bool stream) noexcept {
  switch (width) {
#define GRADCOMP_CASE(W) \
  case W: return dither_decode_group_fast<W>(src, step, sh, out, alpha, add, stream);
    GRADCOMP_DITHER_WIDTH_CASES(GRADCOMP_CASE)
#undef GRADCOMP_CASE
    default: return _mm256_set1_epi32(-1);
  }
}

GRADCOMP_TARGET_AVX2 inline bool dither_decode(isa_tag, std::byte const* codes, std::size_t begin,
                                               std::size_t end, std::size_t bucket_len,
                                               float const* steps, dither_shape const& sh,
                                               float* out, float alpha, bool add, bool stream) noexcept {
  __m256i bad = _mm256_setzero_si256();
  __m256 const a = _mm256_set1_ps(alpha);
  bucket_cursor cur(bucket_len, begin);
  std::size_t w0 = begin;
  // The group path streams only from an aligned start (then every group is aligned).
  stream = stream && !add && bytes_to_alignment(out + begin, 32) == 0;
  while (w0 < end) {
    // Fast path: a whole 128-element group in one bucket with a full group after it (the
    // overlapping loads stay inside the code stream).
    if (w0 % 128 == 0 && w0 + 256 <= end && cur.advance(w0, 128)) {
      bad = _mm256_or_si256(bad,
                            dither_decode_group_fast(sh.width, codes + (w0 / 16) * 2 * sh.width,
                                                     steps[cur.index()], sh, out + w0, alpha, add, stream));
      w0 += 128;
      continue;
    }
    std::size_t const valid = window_valid(w0, end);
    std::byte const* src = codes + (w0 / 16) * 2 * sh.width;
    __m256i c0, c1;
    if (valid == window_lanes) {
      unpack16(sh.width, src, c0, c1);
    } else {
      std::byte tmp[32] = {};
      std::memcpy(tmp, src, packed_bytes(valid, sh.width));
      unpack16(sh.width, tmp, c0, c1);
    }
    i32x16 const live = live16(valid);
    c0 = _mm256_and_si256(c0, live.lo);
    c1 = _mm256_and_si256(c1, live.hi);
    f32x16 const step =
        lanes_ps(window_at(cur, bucket_len, w0, valid), [&](std::size_t b) { return steps[b]; });
    f32x16 const v = {dither_values8(c0, step.lo, sh, bad), dither_values8(c1, step.hi, sh, bad)};
    store_or_add16(out + w0, valid, v, a, add, stream);
    w0 += 16;
  }
  return _mm256_testz_si256(bad, bad) != 0;
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

namespace scalar {

/// The reference loop of `dither_encode`.
inline void dither_encode(isa_tag, float const* x, std::size_t begin, std::size_t end,
                          std::size_t bucket_len, dither_bucket const* buckets,
                          dither_shape const& sh, random_stream const& rs,
                          std::byte* codes) noexcept {
  std::size_t const first_byte = begin * sh.width / 8;
  std::size_t const last_byte = (end * sh.width + 7) / 8;
  std::memset(codes + first_byte, 0, last_byte - first_byte);
  philox_group g;
  for (std::size_t i = begin; i < end; ++i) {
    if (i % 128 == 0 || i == begin) philox_fill(rs, i / 128, g);
    std::uint32_t const c = quant::dither_code(x[i], buckets[i / bucket_len], sh,
                                               g.draw(static_cast<unsigned>(i % 128)));
    quant::put_code(codes, i, sh.width, c);
  }
}

/// The reference loop of `dither_decode`.
inline bool dither_decode(isa_tag, std::byte const* codes, std::size_t begin, std::size_t end,
                          std::size_t bucket_len, float const* steps, dither_shape const& sh,
                          float* out, float alpha, bool add, bool = false) noexcept {
  bool ok = true;
  for (std::size_t i = begin; i < end; ++i) {
    float const v =
        quant::dither_value(quant::get_code(codes, i, sh.width), steps[i / bucket_len], sh, ok);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
  return ok;
}

}  // namespace scalar

/// Canonical sum of squares of one norm block.
inline double block_sumsq(float const* x, std::size_t n, isa level) noexcept {
  return dispatch(level, [&](auto t) { return block_sumsq(t, x, n); });
}

/// Canonical sum of squares of x[0, n), any n, in double (core/quant/dither.hpp): the blocks of
/// `norm_block` elements from x, each by `block_sumsq`, added to 0 in block order. What the
/// L2 bucket norm sums over one bucket, the CUDA backend's `sumsq_stat` over one bucket of n,
/// and the pipeline's guard norms (`host_memory::sum_of_squares`): the same bits everywhere.
inline double canonical_sumsq(float const* x, std::size_t n, isa level) noexcept {
  double sum = 0.0;
  for (std::size_t s = 0; s < n; s += norm_block) {
    std::size_t const len = n - s < norm_block ? n - s : norm_block;
    sum += block_sumsq(x + s, len, level);
  }
  return sum;
}

/// Canonical sums of squares of four blocks of `n` elements, `stride` apart (see
/// `scalar::block_sumsq4`).
inline void block_sumsq4(float const* x, std::size_t stride, std::size_t n, double* out, isa level) noexcept {
  dispatch(level, [&](auto t) { block_sumsq4(t, x, stride, n, out); });
}

/// max |x| of one block, NaN if it holds a NaN or infinity.
inline float block_absmax(float const* x, std::size_t n, isa level) noexcept {
  return dispatch(level, [&](auto t) { return block_absmax(t, x, n); });
}

/// The scales of the buckets of [begin, end) (begin a multiple of `bucket_len`, which is at most
/// `norm_block`, so that each bucket is one canonical block): the L2 norm (`l2`) or max |x|,
/// into out[0], out[1], ...; NaN for a bucket holding a NaN or infinity, or whose L2 norm is
/// beyond the float range. One dispatch for all the buckets, instead of one per bucket.
/// `interleave`: L2 norms of four buckets at a time (`block_sumsq4`, the same sums; faster for
/// cache-resident input, slower from DRAM: `interleaved_norms_max_bytes`).
inline void bucket_scales(float const* x, std::size_t begin, std::size_t end,
                          std::size_t bucket_len, bool l2, float* out, isa level,
                          bool interleave = false) noexcept {
  dispatch(level, [&](auto t) {
    std::size_t b = begin;
    if (l2 && interleave) {
      // four whole buckets at a time (`block_sumsq4`: the same sums, more of them in flight)
      for (; b < end && end - b >= 4 * bucket_len; b += 4 * bucket_len) {
        double sum[4];
        block_sumsq4(t, x + b, bucket_len, bucket_len, sum);
        for (double const v : sum) *out++ = std::isfinite(v) ? static_cast<float>(std::sqrt(v)) : NAN;
      }
    }
    for (; b < end; b += bucket_len) {
      std::size_t const len = end - b < bucket_len ? end - b : bucket_len;
      float scale;
      if (l2) {
        double const sum = block_sumsq(t, x + b, len);
        scale = std::isfinite(sum) ? static_cast<float>(std::sqrt(sum)) : NAN;
      } else {
        scale = block_absmax(t, x + b, len);
      }
      *out++ = scale;
    }
  });
}

/// Quantizes elements [begin, end) of x (begin a multiple of 128; end a multiple of 128 or the
/// tensor end) into the code stream `codes`. `buckets[k]` holds the constants of bucket k of
/// length `bucket_len`. Code bytes of the range are overwritten (not OR-ed).
inline void dither_encode(float const* x, std::size_t begin, std::size_t end,
                          std::size_t bucket_len, dither_bucket const* buckets,
                          dither_shape const& sh, random_stream const& rs, std::byte* codes,
                          isa level) noexcept {
  dispatch(level,
           [&](auto t) { dither_encode(t, x, begin, end, bucket_len, buckets, sh, rs, codes); });
}

/// Decodes elements [begin, end) (begin a multiple of 16) into out (assign, or `out += alpha *
/// value` when `add`). Returns false if a code is not canonical; out is then unspecified.
inline bool dither_decode(std::byte const* codes, std::size_t begin, std::size_t end,
                          std::size_t bucket_len, float const* steps, dither_shape const& sh,
                          float* out, float alpha, bool add, isa level,
                          bool stream = false) noexcept {
  bool const ok = dispatch(level, [&](auto t) {
    return dither_decode(t, codes, begin, end, bucket_len, steps, sh, out, alpha, add, stream);
  });
  if (stream) stream_fence();
  return ok;
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
