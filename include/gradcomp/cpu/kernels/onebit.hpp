// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Sign-packing kernels of the onebit codec (scalar, AVX2, AVX-512), bit-identical at every
/// level. Packing: bit (i % 8) of byte (i / 8) is 1 iff x[i] < 0. Alongside, each kernel
/// returns the sum of |x| over one summation block in the canonical order of
/// `onebit_sum_order` (core/quant/onebit.hpp), so that the scale does not depend on the ISA,
/// threads or backend; `onebit_pack_signs`, for the unscaled form, returns only whether every
/// value is finite.

#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/onebit.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN

namespace cpu::kernels {

namespace scalar {

/// Packs the signs of `x[0, n)` (n <= onebit_sum_order::block, the block start a multiple of
/// 8) into `bits` and returns the block's canonical sum of |x|.
inline double onebit_pack_block(isa_tag, float const* x, std::size_t n, std::byte* bits) noexcept {
  double lane[onebit_sum_order::lanes] = {};
  for (std::size_t i = 0; i < n; i += 8) {
    unsigned byte = 0;
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) {
      float const v = x[i + j];
      byte |= static_cast<unsigned>(v < 0.0f) << j;
      lane[(i + j) % onebit_sum_order::lanes] += static_cast<double>(std::fabs(v));
    }
    bits[i / 8] = static_cast<std::byte>(byte);
  }
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

/// Packs the signs of `x[0, n)` (the start a multiple of 8) into `bits`, the bytes
/// `onebit_pack_block` writes, and returns whether every value is finite: the unscaled form,
/// which needs no sum of |x|, only the check a sum would give.
inline bool onebit_pack_signs(isa_tag, float const* x, std::size_t n, std::byte* bits) noexcept {
  bool finite = true;
  for (std::size_t i = 0; i < n; i += 8) {
    unsigned byte = 0;
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) {
      float const v = x[i + j];
      byte |= static_cast<unsigned>(v < 0.0f) << j;
      finite = finite && std::isfinite(v);
    }
    bits[i / 8] = static_cast<std::byte>(byte);
  }
  return finite;
}

/// Writes (or, if `add`, accumulates `alpha` times) ±scale for `n` elements from `bits`
/// (element 0 at bit 0 of bits[0]).
inline void onebit_unpack(isa_tag, std::byte const* bits, float scale, float* out, std::size_t n,
                          float alpha, bool add) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    bool const neg = (static_cast<unsigned>(bits[i / 8]) >> (i % 8)) & 1u;
    float const v = neg ? -scale : scale;
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
}

/// Two consecutive full blocks as two `onebit_pack_block` calls at the level of `Tag`: the
/// version of every level without a paired kernel of its own.
template <class Tag>
  requires is_isa_tag<Tag>
inline void onebit_pack_pair(Tag t, float const* x, std::byte* bits, double& s0,
                             double& s1) noexcept {
  constexpr std::size_t block = onebit_sum_order::block;
  s0 = onebit_pack_block(t, x, block, bits);
  s1 = onebit_pack_block(t, x + block, block, bits + block / 8);
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline double onebit_pack_block(isa_tag, float const* x, std::size_t n,
                                                       std::byte* bits) noexcept {
  __m512d acc_lo = _mm512_setzero_pd();
  __m512d acc_hi = _mm512_setzero_pd();
  __m512 const zero = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 const v = _mm512_loadu_ps(x + i);
    std::uint16_t const m = static_cast<std::uint16_t>(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ));
    std::memcpy(bits + i / 8, &m, 2);
    __m512 const a = _mm512_abs_ps(v);
    acc_lo = _mm512_add_pd(acc_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(a)));
    acc_hi = _mm512_add_pd(acc_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
  }
  if (i < n) {
    __mmask16 const live = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 const v = _mm512_maskz_loadu_ps(live, x + i);
    std::uint16_t const m = static_cast<std::uint16_t>(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ));
    std::size_t const nbytes = (n - i + 7) / 8;
    std::memcpy(bits + i / 8, &m, nbytes);
    __m512 const a = _mm512_abs_ps(v);
    acc_lo = _mm512_add_pd(acc_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(a)));
    acc_hi = _mm512_add_pd(acc_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
  }
  alignas(64) double lane[16];
  _mm512_store_pd(lane, acc_lo);
  _mm512_store_pd(lane + 8, acc_hi);
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

// Signs only: 32 elements an iteration, their two 16-bit masks stored as one 32-bit word; a
// value is bad when it is a NaN or an infinity (fpclass 0x99: QNaN, +Inf, -Inf, SNaN).
GRADCOMP_TARGET_AVX512 inline bool onebit_pack_signs(isa_tag, float const* x, std::size_t n,
                                                     std::byte* bits) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  __m512 const zero = _mm512_setzero_ps();
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<char const*>(x + i + 16) + ahead, _MM_HINT_T0);
    __m512 const u = _mm512_loadu_ps(x + i);
    __m512 const v = _mm512_loadu_ps(x + i + 16);
    std::uint32_t const m = static_cast<std::uint32_t>(_mm512_cmp_ps_mask(u, zero, _CMP_LT_OQ)) |
                            (static_cast<std::uint32_t>(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ)) << 16);
    std::memcpy(bits + i / 8, &m, 4);
    bad = static_cast<__mmask16>(bad | _mm512_fpclass_ps_mask(u, 0x99) | _mm512_fpclass_ps_mask(v, 0x99));
  }
  return bad == 0 && scalar::onebit_pack_signs(scalar_tag{}, x + i, n - i, bits + i / 8);
}

GRADCOMP_TARGET_AVX512 inline void onebit_unpack(isa_tag, std::byte const* bits, float scale,
                                                 float* out, std::size_t n, float alpha,
                                                 bool add) noexcept {
  __m512 const pos = _mm512_set1_ps(scale);
  __m512 const neg = _mm512_set1_ps(-scale);
  __m512 const a = _mm512_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    std::uint16_t m;
    std::memcpy(&m, bits + i / 8, 2);
    __m512 const v = _mm512_mask_blend_ps(static_cast<__mmask16>(m), pos, neg);
    _mm512_storeu_ps(out + i, add ? _mm512_fmadd_ps(a, v, _mm512_loadu_ps(out + i)) : v);
  }
  scalar::onebit_unpack(scalar_tag{}, bits + i / 8, scale, out + i, n - i, alpha, add);
}

// Two consecutive full blocks at once: two independent addition chains hide the latency of the
// double adds; each block keeps its own canonical lane order.
GRADCOMP_TARGET_AVX512 inline void onebit_pack_pair(isa_tag, float const* x, std::byte* bits,
                                                    double& s0, double& s1) noexcept {
  std::size_t const ahead = machine_tuning().stats_bytes;
  constexpr std::size_t block = onebit_sum_order::block;
  __m512d a_lo = _mm512_setzero_pd(), a_hi = _mm512_setzero_pd();
  __m512d b_lo = _mm512_setzero_pd(), b_hi = _mm512_setzero_pd();
  __m512 const zero = _mm512_setzero_ps();
  float const* y = x + block;
  std::byte* ybits = bits + block / 8;
  for (std::size_t i = 0; i < block; i += 16) {
    // Two input streams at once: the hardware prefetcher alone leaves one thread short of the
    // read kernel (cpu/tuning.hpp, `prefetch_tuning::stats_bytes`).
    _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<char const*>(y + i) + ahead, _MM_HINT_T0);
    __m512 const u = _mm512_loadu_ps(x + i);
    __m512 const v = _mm512_loadu_ps(y + i);
    std::uint16_t const mu = static_cast<std::uint16_t>(_mm512_cmp_ps_mask(u, zero, _CMP_LT_OQ));
    std::uint16_t const mv = static_cast<std::uint16_t>(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ));
    std::memcpy(bits + i / 8, &mu, 2);
    std::memcpy(ybits + i / 8, &mv, 2);
    __m512 const au = _mm512_abs_ps(u);
    __m512 const av = _mm512_abs_ps(v);
    a_lo = _mm512_add_pd(a_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(au)));
    a_hi = _mm512_add_pd(a_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(au), 1))));
    b_lo = _mm512_add_pd(b_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(av)));
    b_hi = _mm512_add_pd(b_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(av), 1))));
  }
  alignas(64) double lane[32];
  _mm512_store_pd(lane, a_lo);
  _mm512_store_pd(lane + 8, a_hi);
  _mm512_store_pd(lane + 16, b_lo);
  _mm512_store_pd(lane + 24, b_hi);
  s0 = 0.0;
  s1 = 0.0;
  for (int l = 0; l < 16; ++l) s0 += lane[l];
  for (int l = 16; l < 32; ++l) s1 += lane[l];
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline double onebit_pack_block(isa_tag, float const* x, std::size_t n,
                                                     std::byte* bits) noexcept {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  __m256 const zero = _mm256_setzero_ps();
  __m256 const absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 const v0 = _mm256_loadu_ps(x + i);
    __m256 const v1 = _mm256_loadu_ps(x + i + 8);
    unsigned const m0 = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v0, zero, _CMP_LT_OQ)));
    unsigned const m1 = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v1, zero, _CMP_LT_OQ)));
    bits[i / 8] = static_cast<std::byte>(m0);
    bits[i / 8 + 1] = static_cast<std::byte>(m1);
    __m256 const a0 = _mm256_and_ps(v0, absmask);
    __m256 const a1 = _mm256_and_ps(v1, absmask);
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(a0)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(a0, 1)));
    acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(a1)));
    acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps(a1, 1)));
  }
  alignas(32) double lane[16];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lane + 4 * k, acc[k]);
  // Tail (fewer than 16 elements): continue the same lanes in scalar code.
  if (i < n) {
    for (std::size_t b = i; b < n; b += 8) {
      unsigned byte = 0;
      for (std::size_t j = 0; j < 8 && b + j < n; ++j) {
        float const v = x[b + j];
        byte |= static_cast<unsigned>(v < 0.0f) << j;
        lane[(b + j) % 16] += static_cast<double>(std::fabs(v));
      }
      bits[b / 8] = static_cast<std::byte>(byte);
    }
  }
  double s = 0.0;
  for (double l : lane) s += l;
  return s;
}

// Signs only, 16 elements an iteration; x - x is 0 exactly when x is finite.
GRADCOMP_TARGET_AVX2 inline bool onebit_pack_signs(isa_tag, float const* x, std::size_t n,
                                                   std::byte* bits) noexcept {
  __m256 const zero = _mm256_setzero_ps();
  __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 const v0 = _mm256_loadu_ps(x + i);
    __m256 const v1 = _mm256_loadu_ps(x + i + 8);
    bits[i / 8] = static_cast<std::byte>(_mm256_movemask_ps(_mm256_cmp_ps(v0, zero, _CMP_LT_OQ)));
    bits[i / 8 + 1] = static_cast<std::byte>(_mm256_movemask_ps(_mm256_cmp_ps(v1, zero, _CMP_LT_OQ)));
    finite = _mm256_and_ps(finite, _mm256_cmp_ps(_mm256_sub_ps(v0, v0), zero, _CMP_EQ_OQ));
    finite = _mm256_and_ps(finite, _mm256_cmp_ps(_mm256_sub_ps(v1, v1), zero, _CMP_EQ_OQ));
  }
  bool const body = _mm256_movemask_ps(finite) == 0xff;
  return scalar::onebit_pack_signs(scalar_tag{}, x + i, n - i, bits + i / 8) && body;
}

GRADCOMP_TARGET_AVX2 inline void onebit_unpack(isa_tag, std::byte const* bits, float scale,
                                               float* out, std::size_t n, float alpha,
                                               bool add) noexcept {
  __m256 const pos = _mm256_set1_ps(scale);
  __m256 const neg = _mm256_set1_ps(-scale);
  __m256 const a = _mm256_set1_ps(alpha);
  __m256i const sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i const b = _mm256_set1_epi32(static_cast<int>(bits[i / 8]));
    __m256 const m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, sel), sel));
    __m256 const v = _mm256_blendv_ps(pos, neg, m);
    _mm256_storeu_ps(out + i, add ? _mm256_fmadd_ps(a, v, _mm256_loadu_ps(out + i)) : v);
  }
  scalar::onebit_unpack(scalar_tag{}, bits + i / 8, scale, out + i, n - i, alpha, add);
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// Packs signs of one summation block and returns its canonical |x| sum.
inline double onebit_pack_block(float const* x, std::size_t n, std::byte* bits, isa level) noexcept {
  return dispatch(level, [&](auto t) { return onebit_pack_block(t, x, n, bits); });
}

/// Packs two consecutive full summation blocks starting at x (2 * block elements) and returns
/// their canonical sums, exactly as two `onebit_pack_block` calls would.
inline void onebit_pack_pair(float const* x, std::byte* bits, double& s0, double& s1, isa level) noexcept {
  dispatch(level, [&](auto t) { onebit_pack_pair(t, x, bits, s0, s1); });
}

/// Packs the signs of `x[0, n)` (see `scalar::onebit_pack_signs`); false if any is not finite.
inline bool onebit_pack_signs(float const* x, std::size_t n, std::byte* bits, isa level) noexcept {
  return dispatch(level, [&](auto t) { return onebit_pack_signs(t, x, n, bits); });
}

/// Expands sign bits into ±scale (see `scalar::onebit_unpack`).
inline void onebit_unpack(std::byte const* bits, float scale, float* out, std::size_t n,
                          float alpha, bool add, isa level) noexcept {
  dispatch(level, [&](auto t) { onebit_unpack(t, bits, scale, out, n, alpha, add); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
