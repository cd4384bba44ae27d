// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Element-wise float32 <-> binary16 / bfloat16 conversion kernels (scalar, AVX2, AVX-512).
/// All levels give bit-identical results: round to nearest even, NaN quieted with its payload
/// truncated, overflow to infinity (see core/dtype.hpp), or, with `Saturate` (the codecs'
/// encoders), a finite value beyond the format's range to its largest finite value
/// (core/quant/half.hpp). With `stream` set, the SIMD levels
/// write their output with streaming stores (cpu/kernels/stream.hpp); the bytes are the same.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// Which 16-bit format a conversion targets.
enum class half_format { f16, bf16 };

namespace scalar {

template <half_format F, bool Saturate = false>
inline std::uint16_t narrow(float f) noexcept {
  if constexpr (F == half_format::f16) {
    return Saturate ? quant::half_bits_saturated(f) : float_to_half_bits(f);
  } else {
    return Saturate ? quant::bfloat16_bits_saturated(f) : float_to_bfloat16_bits(f);
  }
}

/// The largest finite value of format `F` (what `Saturate` clamps to).
template <half_format F>
inline constexpr float saturation_bound =
    F == half_format::f16 ? quant::half_max : quant::bfloat16_max;

template <half_format F>
inline float widen(std::uint16_t b) noexcept {
  if constexpr (F == half_format::f16) {
    return half_bits_to_float(b);
  } else {
    return bfloat16_bits_to_float(b);
  }
}

inline std::uint16_t load_u16(std::byte const* p) noexcept {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline void store_u16(std::byte* p, std::uint16_t v) noexcept { std::memcpy(p, &v, 2); }

template <half_format F, bool Saturate = false>
inline void narrow(isa_tag, float const* x, std::byte* y, std::size_t n, bool = false) noexcept {
  for (std::size_t i = 0; i < n; ++i) store_u16(y + 2 * i, narrow<F, Saturate>(x[i]));
}

template <half_format F>
inline void widen(isa_tag, std::byte const* x, float* y, std::size_t n, float alpha,
                  bool add, bool = false) noexcept {
  if (add) {
    for (std::size_t i = 0; i < n; ++i) y[i] = std::fma(alpha, widen<F>(load_u16(x + 2 * i)), y[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) y[i] = widen<F>(load_u16(x + 2 * i));
  }
}

/// y = fma(alpha, x, y) for n little-endian floats at x (any alignment).
inline void axpy_f32(isa_tag, std::byte const* x, float* y, std::size_t n, float alpha) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, x + 4 * i, 4);
    y[i] = std::fma(alpha, v, y[i]);
  }
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline __m256i bf16_round(__m512 v) noexcept {
  __m512i const x = _mm512_castps_si512(v);
  __m512i const lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i const rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __m512i const quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  __mmask16 const nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

/// With `Saturate`: a finite v beyond ±saturation_bound<F> clamped to it (infinities and NaN
/// kept), which the rounding below then maps to the largest finite value.
template <half_format F, bool Saturate>
GRADCOMP_TARGET_AVX512 inline __m512 clamp(__m512 v) noexcept {
  if constexpr (!Saturate) {
    return v;
  } else {
    __m512 const m = _mm512_set1_ps(scalar::saturation_bound<F>);
    __m512 const c =
        _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-scalar::saturation_bound<F>)), m);
    __m512 const a = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
    __mmask16 const keep = _mm512_cmp_ps_mask(a, _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    return _mm512_mask_mov_ps(c, keep, v);
  }
}

template <half_format F>
GRADCOMP_TARGET_AVX512 inline __m256i narrow16(__m512 v) noexcept {
  if constexpr (F == half_format::f16) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    return bf16_round(v);
  }
}

/// `bf16_round` with the result in the high half of each 32-bit lane (the low half is junk).
GRADCOMP_TARGET_AVX512 inline __m512i bf16_round_hi(__m512 v) noexcept {
  __m512i const x = _mm512_castps_si512(v);
  __m512i const lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i const r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
  __m512i const quiet = _mm512_or_si512(x, _mm512_set1_epi32(0x400000));
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
}

/// 32 floats as 32 16-bit values in one register (a line of output). bf16 rounds in the 32-bit
/// lanes and keeps the high halves with one two-source word shuffle, instead of narrowing each
/// half with `vpmovdw` and joining them.
template <half_format F, bool Saturate = false>
GRADCOMP_TARGET_AVX512 inline __m512i narrow32(float const* x) noexcept {
  if constexpr (F == half_format::f16) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(narrow16<F>(clamp<F, Saturate>(_mm512_loadu_ps(x)))),
        narrow16<F>(clamp<F, Saturate>(_mm512_loadu_ps(x + 16))), 1);
  } else {
    __m512i const odd_words = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(bf16_round_hi(clamp<F, Saturate>(_mm512_loadu_ps(x))),
                                     odd_words,
                                     bf16_round_hi(clamp<F, Saturate>(_mm512_loadu_ps(x + 16))));
  }
}

template <half_format F, bool Saturate = false>
GRADCOMP_TARGET_AVX512 inline void narrow(isa_tag, float const* x, std::byte* y, std::size_t n,
                                          bool stream = false) noexcept {
  std::size_t const ahead = machine_tuning().stream_bytes;
  std::size_t i = 0;
  // Streaming: whole 64-byte lines of output (32 elements) once y + 2i is line-aligned; an odd
  // y never is, and is written with ordinary stores.
  std::size_t const head = bytes_to_alignment(y, 64);
  if (stream && head % 2 == 0 && head / 2 + 32 <= n) {
    scalar::narrow<F, Saturate>(scalar_tag{}, x, y, head / 2);
    for (i = head / 2; i + 32 <= n; i += 32) {
      _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(y + 2 * i), narrow32<F, Saturate>(x + i));
    }
    stream_fence();
  }
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_si512(reinterpret_cast<void*>(y + 2 * i), narrow32<F, Saturate>(x + i));
  }
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 2 * i),
                        narrow16<F>(clamp<F, Saturate>(_mm512_loadu_ps(x + i))));
  }
  scalar::narrow<F, Saturate>(scalar_tag{}, x + i, y + 2 * i, n - i);
}

template <half_format F>
GRADCOMP_TARGET_AVX512 inline __m512 widen16(__m256i h) noexcept {
  if constexpr (F == half_format::f16) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <half_format F>
GRADCOMP_TARGET_AVX512 inline void widen(isa_tag, std::byte const* x, float* y, std::size_t n,
                                         float alpha, bool add, bool stream = false) noexcept {
  std::size_t i = 0;
  std::size_t const head = bytes_to_alignment(y, 64) / 4;
  if (!add && stream && head + 16 <= n) {
    scalar::widen<F>(scalar_tag{}, x, y, head, alpha, false);
    for (i = head; i + 16 <= n; i += 16) {
      _mm512_stream_ps(y + i, widen16<F>(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + 2 * i))));
    }
    stream_fence();
  } else if (add) {
    __m512 const a = _mm512_set1_ps(alpha);
    for (; i + 16 <= n; i += 16) {
      __m512 const v = widen16<F>(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + 2 * i)));
      _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, v, _mm512_loadu_ps(y + i)));
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(y + i,
                       widen16<F>(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + 2 * i))));
    }
  }
  scalar::widen<F>(scalar_tag{}, x + 2 * i, y + i, n - i, alpha, add);
}

GRADCOMP_TARGET_AVX512 inline void axpy_f32(isa_tag, std::byte const* x, float* y, std::size_t n,
                                            float alpha) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + 4 * i), _mm512_loadu_ps(y + i)));
  }
  scalar::axpy_f32(scalar_tag{}, x + 4 * i, y + i, n - i, alpha);
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline __m128i bf16_round(__m256 v) noexcept {
  __m256i const x = _mm256_castps_si256(v);
  __m256i const lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i const rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256i const quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  __m256i const nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m256i const r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Pack 8 x u32 (values < 2^16) into 8 x u16.
  __m128i const lo = _mm256_castsi256_si128(r);
  __m128i const hi = _mm256_extracti128_si256(r, 1);
  return _mm_packus_epi32(lo, hi);
}

/// As avx512::clamp.
template <half_format F, bool Saturate>
GRADCOMP_TARGET_AVX2 inline __m256 clamp(__m256 v) noexcept {
  if constexpr (!Saturate) {
    return v;
  } else {
    __m256 const m = _mm256_set1_ps(scalar::saturation_bound<F>);
    __m256 const c =
        _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-scalar::saturation_bound<F>)), m);
    __m256 const a = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
    __m256 const keep = _mm256_cmp_ps(a, _mm256_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    return _mm256_blendv_ps(c, v, keep);
  }
}

template <half_format F>
GRADCOMP_TARGET_AVX2 inline __m128i narrow8(__m256 v) noexcept {
  if constexpr (F == half_format::f16) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    return bf16_round(v);
  }
}

template <half_format F, bool Saturate = false>
GRADCOMP_TARGET_AVX2 inline void narrow(isa_tag, float const* x, std::byte* y, std::size_t n,
                                        bool stream = false) noexcept {
  std::size_t const ahead = machine_tuning().stream_bytes;
  std::size_t i = 0;
  std::size_t const head = bytes_to_alignment(y, 32);
  if (stream && head % 2 == 0 && head / 2 + 16 <= n) {
    scalar::narrow<F, Saturate>(scalar_tag{}, x, y, head / 2);
    for (i = head / 2; i + 16 <= n; i += 16) {
      _mm_prefetch(reinterpret_cast<char const*>(x + i) + ahead, _MM_HINT_T0);
      __m128i const a = narrow8<F>(clamp<F, Saturate>(_mm256_loadu_ps(x + i)));
      __m128i const b = narrow8<F>(clamp<F, Saturate>(_mm256_loadu_ps(x + i + 8)));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(y + 2 * i), _mm256_set_m128i(b, a));
    }
    stream_fence();
  }
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i),
                     narrow8<F>(clamp<F, Saturate>(_mm256_loadu_ps(x + i))));
  }
  scalar::narrow<F, Saturate>(scalar_tag{}, x + i, y + 2 * i, n - i);
}

template <half_format F>
GRADCOMP_TARGET_AVX2 inline __m256 widen8(__m128i h) noexcept {
  if constexpr (F == half_format::f16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <half_format F>
GRADCOMP_TARGET_AVX2 inline void widen(isa_tag, std::byte const* x, float* y, std::size_t n,
                                       float alpha, bool add, bool stream = false) noexcept {
  std::size_t i = 0;
  std::size_t const head = bytes_to_alignment(y, 32) / 4;
  if (!add && stream && head + 8 <= n) {
    scalar::widen<F>(scalar_tag{}, x, y, head, alpha, false);
    for (i = head; i + 8 <= n; i += 8) {
      _mm256_stream_ps(y + i, widen8<F>(_mm_loadu_si128(reinterpret_cast<__m128i const*>(x + 2 * i))));
    }
    stream_fence();
  } else if (add) {
    __m256 const a = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8) {
      __m256 const v = widen8<F>(_mm_loadu_si128(reinterpret_cast<__m128i const*>(x + 2 * i)));
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, v, _mm256_loadu_ps(y + i)));
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(y + i, widen8<F>(_mm_loadu_si128(reinterpret_cast<__m128i const*>(x + 2 * i))));
    }
  }
  scalar::widen<F>(scalar_tag{}, x + 2 * i, y + i, n - i, alpha, add);
}

GRADCOMP_TARGET_AVX2 inline void axpy_f32(isa_tag, std::byte const* x, float* y, std::size_t n,
                                          float alpha) noexcept {
  __m256 const a = _mm256_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(reinterpret_cast<float const*>(x + 4 * i)),
                                            _mm256_loadu_ps(y + i)));
  }
  scalar::axpy_f32(scalar_tag{}, x + 4 * i, y + i, n - i, alpha);
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// y = fma(alpha, x, y) for n floats stored little-endian at x.
inline void axpy_f32(std::byte const* x, float* y, std::size_t n, float alpha, isa level) noexcept {
  dispatch(level, [&](auto t) { axpy_f32(t, x, y, n, alpha); });
}

/// Converts `n` floats to 16-bit format `F` at SIMD level `level`; `stream`: with streaming
/// stores (for an output larger than the caches, `cpu::stream_output`).
template <half_format F>
inline void narrow(float const* x, std::byte* y, std::size_t n, isa level,
                   bool stream = false) noexcept {
  dispatch(level, [&](auto t) { narrow<F>(t, x, y, n, stream); });
}

/// `narrow`, saturating: a finite value beyond the format's range becomes its largest finite
/// value with the sign (core/quant/half.hpp). What the codecs' encoders use.
template <half_format F>
inline void narrow_saturated(float const* x, std::byte* y, std::size_t n, isa level,
                             bool stream = false) noexcept {
  dispatch(level, [&](auto t) { narrow<F, true>(t, x, y, n, stream); });
}

/// Widens `n` 16-bit values to float: `y = x` or, if `add`, `y = fma(alpha, x, y)`; `stream`:
/// `y = x` with streaming stores (ignored when `add`).
template <half_format F>
inline void widen(std::byte const* x, float* y, std::size_t n, float alpha, bool add,
                  isa level, bool stream = false) noexcept {
  dispatch(level, [&](auto t) { widen<F>(t, x, y, n, alpha, add, stream); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
