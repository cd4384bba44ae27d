// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Kernels of `int4_codec`: symmetric 4-bit codes with one multiplier per bucket, two codes a
/// byte (element 2i in the low nibble, 2i + 1 in the high one). Scalar is the reference; AVX2
/// and AVX-512 give identical bytes and identical decoded floats. The element math (what one
/// element's nibble is and what a nibble decodes to) lives in core/quant/int4.hpp.
///
/// The SIMD levels work on the 16-lane windows of cpu/kernels/window.hpp: a window's 16 codes
/// are one 8-byte group, so every range starts at an even element and no byte is shared by
/// two threads. The nibble of an element past the tensor's end (n odd) is written as 0.
///
/// A bucket's largest magnitude (`int4_absmax_bits`) is the largest of the elements' bits with
/// the sign cleared, compared as unsigned integers: for finite floats that order is the order
/// of the magnitudes, so the result is max |x| (+0 for a bucket of zeros of either sign), and a
/// NaN or infinity shows as bits >= 0x7f800000. `int4_encode_buckets` is the encoder of the
/// usual bucket lengths (multiples of 16): per bucket, its maximum, its scale and its codes in
/// one visit, so each element is read from memory once (the second read hits L1).

#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/int4.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/bucket.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/kernels/window.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// No bad bucket (`int4_encode_buckets`).
inline constexpr std::size_t int4_no_bad_bucket = ~std::size_t{0};

/// Stores the scale of a bucket whose largest magnitude has the bits `top` (finite) at `at`
/// and returns its encoding multiplier.
inline float int4_store_scale(std::uint32_t top, std::byte* at) noexcept {
  float m;
  std::memcpy(&m, &top, sizeof m);
  float const s = quant::int4_scale(m);
  std::memcpy(at, &s, sizeof s);
  return quant::int4_inverse(m);
}

namespace scalar {

/// The reference loop of `int4_encode`: nibbles of elements [begin, end) (begin even) with
/// bucket multipliers `inv`.
inline void int4_encode(isa_tag, float const* x, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* inv, std::uint8_t* codes) noexcept {
  for (std::size_t i = begin; i < end; i += 2) {
    unsigned const lo = quant::int4_nibble(x[i], inv[i / bucket_len]);
    unsigned const hi = i + 1 < end ? quant::int4_nibble(x[i + 1], inv[(i + 1) / bucket_len]) : 0u;
    codes[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

/// The reference loop of `int4_decode`: out[i] = (nibble - 8) * scale of its bucket, or
/// out[i] = fma(alpha, that, out[i]) when `add`.
inline void int4_decode(isa_tag, std::uint8_t const* codes, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* scales, float* out, float alpha,
                        bool add, bool = false) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    auto const c = static_cast<std::uint8_t>((codes[i / 2] >> (4 * (i & 1))) & 0xf);
    float const v = quant::int4_value(c, scales[i / bucket_len]);
    out[i] = add ? std::fma(alpha, v, out[i]) : v;
  }
}

/// The reference loop of `int4_absmax_bits`.
inline std::uint32_t int4_absmax_bits(isa_tag, float const* x, std::size_t n) noexcept {
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffffu;
    top = b > top ? b : top;
  }
  return top;
}

/// The codes of one bucket [b, e) (b even) with multiplier `inv`.
inline void int4_encode_bucket(isa_tag, float const* x, std::size_t b, std::size_t e, float inv,
                               std::uint8_t* codes) noexcept {
  for (std::size_t i = b; i < e; i += 2) {
    unsigned const lo = quant::int4_nibble(x[i], inv);
    unsigned const hi = i + 1 < e ? quant::int4_nibble(x[i + 1], inv) : 0u;
    codes[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

/// The reference loop of `int4_encode_buckets`.
inline std::size_t int4_encode_buckets(isa_tag t, float const* x, std::size_t begin,
                                       std::size_t end, std::size_t bucket_len, std::byte* scales,
                                       std::uint8_t* codes) noexcept {
  for (std::size_t b = begin, k = begin / bucket_len; b < end; b += bucket_len, ++k) {
    std::size_t const e = end - b < bucket_len ? end : b + bucket_len;
    std::uint32_t const top = int4_absmax_bits(t, x + b, e - b);
    if (top >= 0x7f800000u) return k;
    int4_encode_bucket(t, x, b, e, int4_store_scale(top, scales + 4 * k), codes);
  }
  return int4_no_bad_bucket;
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH

/// How far ahead (bytes) `int4_encode_buckets` prefetches its input. Speed only.
inline constexpr std::size_t int4_prefetch_bytes = 2048;

namespace avx2 {

// 16 nibbles (one per byte of `c`, in element order) as 8 bytes, element 2i low.
GRADCOMP_TARGET_AVX2 inline __m128i pack_nibbles16(__m128i c) noexcept {
  // c[2i] * 1 + c[2i + 1] * 16 as 16-bit lanes (at most 255), then narrowed to bytes.
  __m128i const pairs = _mm_maddubs_epi16(c, _mm_set1_epi16(0x1001));
  return _mm_packus_epi16(pairs, pairs);
}

// The 16 nibbles of 8 bytes, one per byte in element order.
GRADCOMP_TARGET_AVX2 inline __m128i unpack_nibbles16(__m128i b) noexcept {
  __m128i const m = _mm_set1_epi8(0x0f);
  return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

// Rounded, clamped codes + 8 of one half window (rounding explicit, never the MXCSR mode).
GRADCOMP_TARGET_AVX2 inline __m256i int4_codes8(__m256 x, __m256 inv) noexcept {
  __m256 v = _mm256_mul_ps(x, inv);
  // Clamping before rounding equals clamping after: the bounds are integers.
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-7.0f)), _mm256_set1_ps(7.0f));
  v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_add_epi32(_mm256_cvttps_epi32(v), _mm256_set1_epi32(8));
}

GRADCOMP_TARGET_AVX2 inline std::uint32_t int4_absmax_bits(isa_tag, float const* x,
                                                           std::size_t n) noexcept {
  __m256i const abs = _mm256_set1_epi32(0x7fffffff);
  __m256i t0 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
  for (std::size_t w0 = 0; w0 < n; w0 += window_lanes) {
    i32x16 const b = load16_bits(x + w0, window_valid(w0, n));
    t0 = _mm256_max_epu32(t0, _mm256_and_si256(b.lo, abs));
    t1 = _mm256_max_epu32(t1, _mm256_and_si256(b.hi, abs));
  }
  __m256i t = _mm256_max_epu32(t0, t1);
  __m128i u = _mm_max_epu32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_max_epu32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 3, 2)));
  u = _mm_max_epu32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(u));
}

// The codes of the window [w0, w0 + valid) with multiplier `inv` (every lane's), at p.
GRADCOMP_TARGET_AVX2 inline void int4_window(float const* x, std::size_t valid, f32x16 const& m,
                                             std::uint8_t* p) noexcept {
  f32x16 const v = load16(x, valid);
  __m256i c0 = int4_codes8(v.lo, m.lo);
  __m256i c1 = int4_codes8(v.hi, m.hi);
  if (valid != window_lanes) {  // dead lanes: nibble 0
    i32x16 const live = live16(valid);
    c0 = _mm256_and_si256(c0, live.lo);
    c1 = _mm256_and_si256(c1, live.hi);
  }
  __m256i const h = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), _MM_SHUFFLE(3, 1, 2, 0));
  __m128i const bytes = _mm_packus_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  __m128i const packed = pack_nibbles16(bytes);
  if (valid == window_lanes) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), packed);
  } else {
    alignas(16) std::uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), packed);
    std::memcpy(p, tmp, (valid + 1) / 2);
  }
}

GRADCOMP_TARGET_AVX2 inline void int4_encode_bucket(isa_tag, float const* x, std::size_t b,
                                                    std::size_t e, float inv,
                                                    std::uint8_t* codes) noexcept {
  __m256 const v = _mm256_set1_ps(inv);
  f32x16 const m{v, v};
  for (std::size_t w0 = b; w0 < e; w0 += window_lanes) {
    int4_window(x + w0, window_valid(w0, e), m, codes + w0 / 2);
  }
}

/// The AVX2 loop of `int4_encode_buckets`.
GRADCOMP_TARGET_AVX2 inline std::size_t int4_encode_buckets(isa_tag t, float const* x,
                                                            std::size_t begin, std::size_t end,
                                                            std::size_t bucket_len,
                                                            std::byte* scales,
                                                            std::uint8_t* codes) noexcept {
  for (std::size_t b = begin, k = begin / bucket_len; b < end; b += bucket_len, ++k) {
    std::size_t const e = end - b < bucket_len ? end : b + bucket_len;
    // The hardware prefetcher alone leaves this loop well short of the read kernel.
    for (std::size_t l = 0; l < e - b; l += 16) {
      _mm_prefetch(reinterpret_cast<char const*>(x + b + l) + int4_prefetch_bytes, _MM_HINT_T0);
    }
    std::uint32_t const top = int4_absmax_bits(t, x + b, e - b);
    if (top >= 0x7f800000u) return k;
    int4_encode_bucket(t, x, b, e, int4_store_scale(top, scales + 4 * k), codes);
  }
  return int4_no_bad_bucket;
}

GRADCOMP_TARGET_AVX2 inline void int4_encode(isa_tag, float const* x, std::size_t begin,
                                             std::size_t end, std::size_t bucket_len,
                                             float const* inv, std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += window_lanes) {
    std::size_t const valid = window_valid(w0, end);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    int4_window(x + w0, valid, lanes_ps(w, [&](std::size_t b) { return inv[b]; }), codes + w0 / 2);
  }
}

GRADCOMP_TARGET_AVX2 inline void int4_decode(isa_tag, std::uint8_t const* codes, std::size_t begin,
                                             std::size_t end, std::size_t bucket_len,
                                             float const* scales, float* out, float alpha, bool add,
                                             bool stream = false) noexcept {
  __m256 const a = _mm256_set1_ps(alpha);
  __m256i const eight = _mm256_set1_epi32(8);
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += window_lanes) {
    std::size_t const valid = window_valid(w0, end);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    std::uint8_t const* const p = codes + w0 / 2;
    __m128i b;
    if (valid == window_lanes) {
      b = _mm_loadl_epi64(reinterpret_cast<__m128i const*>(p));
    } else {
      alignas(16) std::uint8_t tmp[16] = {};
      std::memcpy(tmp, p, (valid + 1) / 2);
      b = _mm_load_si128(reinterpret_cast<__m128i const*>(tmp));
    }
    __m128i const nib = unpack_nibbles16(b);
    __m256i const q0 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nib), eight);
    __m256i const q1 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8)), eight);
    f32x16 const s = lanes_ps(w, [&](std::size_t k) { return scales[k]; });
    f32x16 const v{_mm256_mul_ps(_mm256_cvtepi32_ps(q0), s.lo),
                   _mm256_mul_ps(_mm256_cvtepi32_ps(q1), s.hi)};
    store_or_add16(out + w0, valid, v, a, add, stream);
  }
}

}  // namespace avx2

namespace avx512 {

GRADCOMP_TARGET_AVX512 inline std::uint32_t int4_absmax_bits(isa_tag, float const* x,
                                                             std::size_t n) noexcept {
  __m512i const abs = _mm512_set1_epi32(0x7fffffff);
  __m512i t = _mm512_setzero_si512();
  std::size_t w0 = 0;
  for (; w0 + window_lanes <= n; w0 += window_lanes) {
    t = _mm512_max_epu32(t, _mm512_and_si512(_mm512_loadu_si512(x + w0), abs));
  }
  if (w0 < n) t = _mm512_max_epu32(t, _mm512_and_si512(load16_bits(x + w0, live16(n - w0)), abs));
  return _mm512_reduce_max_epu32(t);
}

// The 8 code bytes (low half) of 16 values `x` with multipliers `m`; lanes off `live` give 0.
GRADCOMP_TARGET_AVX512 inline __m128i int4_pack16(__m512 x, __m512 m,
                                                  __mmask16 live = full_window16) noexcept {
  __m512 v = _mm512_mul_ps(x, m);
  // Clamping before rounding equals clamping after: the bounds are integers.
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-7.0f)), _mm512_set1_ps(7.0f));
  __m512i const q = _mm512_maskz_add_epi32(
      live, _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
      _mm512_set1_epi32(8));
  // Lane 2i + 1 (bits 32..35 of a 64-bit lane) moves to bits 4..7 beside lane 2i.
  return _mm512_cvtepi64_epi8(_mm512_or_si512(q, _mm512_srli_epi64(q, 28)));
}

// The codes of the window [w0, w0 + valid) (`live` its lanes) with multipliers `m`, at p.
GRADCOMP_TARGET_AVX512 inline void int4_window(float const* x, std::size_t valid, __mmask16 live,
                                               __m512 m, std::uint8_t* p) noexcept {
  __m128i const packed = int4_pack16(load16(x, live), m, live);
  if (live == full_window16) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), packed);
  } else {
    _mm_mask_storeu_epi8(p, live16((valid + 1) / 2), packed);
  }
}

GRADCOMP_TARGET_AVX512 inline void int4_encode_bucket(isa_tag, float const* x, std::size_t b,
                                                      std::size_t e, float inv,
                                                      std::uint8_t* codes) noexcept {
  __m512 const m = _mm512_set1_ps(inv);
  for (std::size_t w0 = b; w0 < e; w0 += window_lanes) {
    std::size_t const valid = window_valid(w0, e);
    int4_window(x + w0, valid, live16(valid), m, codes + w0 / 2);
  }
}

/// The AVX-512 loop of `int4_encode_buckets`.
GRADCOMP_TARGET_AVX512 inline std::size_t int4_encode_buckets(isa_tag t, float const* x,
                                                              std::size_t begin, std::size_t end,
                                                              std::size_t bucket_len,
                                                              std::byte* scales,
                                                              std::uint8_t* codes) noexcept {
  std::size_t b = begin, k = begin / bucket_len;
  if (bucket_len == 64) {  // the default bucket: held in four registers between the passes
    __m512i const abs = _mm512_set1_epi32(0x7fffffff);
    for (; end - b >= 64; b += 64, ++k) {
      for (std::size_t l = 0; l < 64; l += 16) {
        _mm_prefetch(reinterpret_cast<char const*>(x + b + l) + int4_prefetch_bytes, _MM_HINT_T0);
      }
      __m512 v[4];
      __m512i top = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm512_loadu_ps(x + b + 16 * j);
        top = _mm512_max_epu32(top, _mm512_and_si512(_mm512_castps_si512(v[j]), abs));
      }
      std::uint32_t const m = _mm512_reduce_max_epu32(top);
      if (m >= 0x7f800000u) return k;
      __m512 const inv = _mm512_set1_ps(int4_store_scale(m, scales + 4 * k));
      for (int j = 0; j < 4; ++j) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + b / 2 + 8 * j), int4_pack16(v[j], inv));
      }
    }
  }
  for (; b < end; b += bucket_len, ++k) {
    std::size_t const e = end - b < bucket_len ? end : b + bucket_len;
    // The hardware prefetcher alone leaves this loop well short of the read kernel.
    for (std::size_t l = 0; l < e - b; l += 16) {
      _mm_prefetch(reinterpret_cast<char const*>(x + b + l) + int4_prefetch_bytes, _MM_HINT_T0);
    }
    std::uint32_t const top = int4_absmax_bits(t, x + b, e - b);
    if (top >= 0x7f800000u) return k;
    int4_encode_bucket(t, x, b, e, int4_store_scale(top, scales + 4 * k), codes);
  }
  return int4_no_bad_bucket;
}

GRADCOMP_TARGET_AVX512 inline void int4_encode(isa_tag, float const* x, std::size_t begin,
                                               std::size_t end, std::size_t bucket_len,
                                               float const* inv, std::uint8_t* codes) noexcept {
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += window_lanes) {
    std::size_t const valid = window_valid(w0, end);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    int4_window(x + w0, valid, live16(valid), lanes_ps(w, [&](std::size_t b) { return inv[b]; }),
                codes + w0 / 2);
  }
}

GRADCOMP_TARGET_AVX512 inline void int4_decode(isa_tag, std::uint8_t const* codes,
                                               std::size_t begin, std::size_t end,
                                               std::size_t bucket_len, float const* scales,
                                               float* out, float alpha, bool add,
                                               bool stream = false) noexcept {
  __m512 const a = _mm512_set1_ps(alpha);
  __m512i const eight = _mm512_set1_epi32(8);
  bucket_cursor cur(bucket_len, begin);
  for (std::size_t w0 = begin; w0 < end; w0 += window_lanes) {
    std::size_t const valid = window_valid(w0, end);
    __mmask16 const live = live16(valid);
    window_buckets const w = window_at(cur, bucket_len, w0, valid);
    std::uint8_t const* const p = codes + w0 / 2;
    __m128i const b = live == full_window16 ? _mm_loadl_epi64(reinterpret_cast<__m128i const*>(p))
                                            : _mm_maskz_loadu_epi8(live16((valid + 1) / 2), p);
    __m512i const q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(avx2::unpack_nibbles16(b)), eight);
    __m512 const v =
        _mm512_mul_ps(_mm512_cvtepi32_ps(q), lanes_ps(w, [&](std::size_t k) { return scales[k]; }));
    store_or_add16(out + w0, live, v, a, add, stream);
  }
}

}  // namespace avx512

GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// max |x| over x[0, n) as the bits of a non-negative float (see the file comment): below
/// 0x7f800000 when every element is finite.
inline std::uint32_t int4_absmax_bits(float const* x, std::size_t n, isa level) noexcept {
  return dispatch(level, [&](auto t) { return int4_absmax_bits(t, x, n); });
}

/// The encoder of buckets of a length that is a multiple of 16: for each bucket of [begin,
/// end) (begin a bucket start; the last bucket may end early), its scale
/// `quant::int4_scale(max |x|)` into the 4 bytes at `scales + 4 k` (k its index, little-endian)
/// and its codes into `codes`, reading the bucket from memory once. Stops at the first bucket
/// holding a NaN or an infinity and returns its index (its scale and codes unwritten), else
/// `int4_no_bad_bucket`. Byte-identical to `int4_absmax_bits` + `int4_encode` at every level.
inline std::size_t int4_encode_buckets(float const* x, std::size_t begin, std::size_t end,
                                       std::size_t bucket_len, std::byte* scales,
                                       std::uint8_t* codes, isa level) noexcept {
  return dispatch(level, [&](auto t) {
    return int4_encode_buckets(t, x, begin, end, bucket_len, scales, codes);
  });
}

/// int4 nibbles of elements [begin, end) (begin a multiple of 16) into `codes` (byte i / 2 of
/// element i), with per-bucket multipliers `inv` (`quant::int4_inverse`).
inline void int4_encode(float const* x, std::size_t begin, std::size_t end, std::size_t bucket_len,
                        float const* inv, std::uint8_t* codes, isa level) noexcept {
  dispatch(level, [&](auto t) { int4_encode(t, x, begin, end, bucket_len, inv, codes); });
}

/// Decodes int4 nibbles [begin, end) (begin a multiple of 16) with per-bucket scales; `add`:
/// out = fma(alpha, x̂, out). `stream`: streaming stores for an overwriting decode.
inline void int4_decode(std::uint8_t const* codes, std::size_t begin, std::size_t end,
                        std::size_t bucket_len, float const* scales, float* out, float alpha,
                        bool add, isa level, bool stream = false) noexcept {
  dispatch(level, [&](auto t) {
    int4_decode(t, codes, begin, end, bucket_len, scales, out, alpha, add, stream);
  });
  if (stream) stream_fence();
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
