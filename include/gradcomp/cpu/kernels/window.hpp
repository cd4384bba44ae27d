// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The 16-lane window shared by the bucketed byte kernels (int8, natural, dither): a window is
/// the elements [w0, w0 + valid) with valid = 16 except at the end of a range. Primitives, one
/// set per ISA level:
///
/// - the buckets under a window (`window_at`) and the per-lane bucket constants
///   (`lanes_ps`, `lanes_epi32`): one broadcast when a single bucket holds the window, else a
///   lane-by-lane gather, where dead lanes repeat the window's first bucket;
/// - the masked 16-lane load of a tail (`load16`, `load16_bits`, `load_bytes16`): dead lanes
///   read as zero and no byte past the range is touched;
/// - the masked store of a tail (`store_bytes16`) and store-or-add of decoded floats
///   (`store_or_add16`: out = v, or out = fma(alpha, v, out)); dead lanes are never written.
///   With `stream`, a full window stored to an aligned address uses a streaming store
///   (cpu/kernels/stream.hpp; the caller fences once at the end).
///
/// AVX-512 holds a window in one register with a `__mmask16`; AVX2 in two 8-lane halves
/// (`f32x16`, `i32x16`). The primitives change no result: they are the loops the kernels
/// had copied, written once.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/bucket.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// Lanes of a window.
inline constexpr std::size_t window_lanes = 16;

/// Live lanes of the window at `w0` in a range ending at `end` (w0 < end).
constexpr std::size_t window_valid(std::size_t w0, std::size_t end) noexcept {
  return end - w0 < window_lanes ? end - w0 : window_lanes;
}

/// The buckets under one window.
struct window_buckets {
  std::size_t w0 = 0;          ///< first element of the window
  std::size_t valid = 0;       ///< live lanes
  std::size_t bucket_len = 1;  ///< elements per bucket
  std::size_t first = 0;       ///< bucket of lane 0
  bool single = false;         ///< whether bucket `first` holds every live lane

  /// Bucket of lane `l`; a dead lane reports the first bucket (its constants are harmless).
  [[nodiscard]] std::size_t operator[](unsigned l) const noexcept {
    return l < valid ? (w0 + l) / bucket_len : first;
  }
};

/// Moves `cur` (windows in ascending order) to the window [w0, w0 + valid) and returns its
/// buckets.
inline window_buckets window_at(bucket_cursor& cur, std::size_t bucket_len, std::size_t w0,
                                std::size_t valid) noexcept {
  bool const single = cur.advance(w0, valid);
  return {w0, valid, bucket_len, cur.index(), single};
}

/// out[l] = field(bucket of lane l) for the 16 lanes.
template <class T, class Field>
inline void lane_values(window_buckets const& w, T* out, Field const& field) noexcept {
  for (unsigned l = 0; l < window_lanes; ++l) out[l] = static_cast<T>(field(w[l]));
}

/// Bytes of a window's packed codes of `width` bits each.
constexpr std::size_t packed_bytes(std::size_t valid, unsigned width) noexcept {
  return (valid * width + 7) / 8;
}

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx2 {
GRADCOMP_TARGET_AVX2 inline void store_codes16(std::uint8_t* p, __m128i c, bool stream) noexcept;
}  // namespace avx2

namespace avx512 {

using avx2::store_codes16;

/// Mask of the live lanes.
/// The mask of a full window. The AVX-512 primitives below test for it and use plain loads and
/// stores: on AMD Zen 5 a masked load or store costs several times a plain one even with every
/// lane live (int8 decoding ran at 0.47 of the write kernel with masked byte loads, see
/// docs/performance.md).
inline constexpr __mmask16 full_window16 = 0xffff;

GRADCOMP_TARGET_AVX512 inline __mmask16 live16(std::size_t valid) noexcept {
  return valid >= window_lanes ? __mmask16(0xffff) : __mmask16((1u << valid) - 1u);
}

/// Per-lane float constants `field(bucket)`.
template <class Field>
GRADCOMP_TARGET_AVX512 inline __m512 lanes_ps(window_buckets const& w,
                                              Field const& field) noexcept {
  if (w.single) return _mm512_set1_ps(field(w.first));
  alignas(64) float v[window_lanes];
  lane_values(w, v, field);
  return _mm512_load_ps(v);
}

/// Per-lane 32-bit integer constants `field(bucket)`.
template <class Field>
GRADCOMP_TARGET_AVX512 inline __m512i lanes_epi32(window_buckets const& w,
                                                  Field const& field) noexcept {
  if (w.single) return _mm512_set1_epi32(static_cast<std::int32_t>(field(w.first)));
  alignas(64) std::int32_t v[window_lanes];
  lane_values(w, v, field);
  return _mm512_load_si512(v);
}

/// 16 floats, dead lanes 0.
GRADCOMP_TARGET_AVX512 inline __m512 load16(float const* p, __mmask16 live) noexcept {
  if (live == full_window16) return _mm512_loadu_ps(p);
  return _mm512_maskz_loadu_ps(live, p);
}

/// The bits of 16 floats, dead lanes 0.
GRADCOMP_TARGET_AVX512 inline __m512i load16_bits(float const* p, __mmask16 live) noexcept {
  if (live == full_window16) return _mm512_loadu_si512(p);
  return _mm512_maskz_loadu_epi32(live, p);
}

/// 16 bytes, dead lanes 0.
GRADCOMP_TARGET_AVX512 inline __m128i load_bytes16(std::uint8_t const* p, __mmask16 live) noexcept {
  if (live == full_window16) return _mm_loadu_si128(reinterpret_cast<__m128i const*>(p));
  return _mm_maskz_loadu_epi8(live, p);
}

/// Stores the live bytes of `c`.
GRADCOMP_TARGET_AVX512 inline void store_bytes16(std::uint8_t* p, __mmask16 live,
                                                 __m128i c) noexcept {
  if (live == full_window16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), c);
    return;
  }
  _mm_mask_storeu_epi8(p, live, c);
}

/// out = v, or out = fma(alpha, v, out) when `add`, on the live lanes; `stream` (ignored when
/// `add`): a full window at a 64-byte aligned `out` is written with a streaming store.
GRADCOMP_TARGET_AVX512 inline void store_or_add16(float* out, __mmask16 live, __m512 v,
                                                  __m512 alpha, bool add,
                                                  bool stream = false) noexcept {
  if (live == full_window16) {
    if (add) {
      _mm512_storeu_ps(out, _mm512_fmadd_ps(alpha, v, _mm512_loadu_ps(out)));
    } else if (stream && bytes_to_alignment(out, 64) == 0) {
      _mm512_stream_ps(out, v);
    } else {
      _mm512_storeu_ps(out, v);
    }
    return;
  }
  if (add) v = _mm512_fmadd_ps(alpha, v, _mm512_maskz_loadu_ps(live, out));
  _mm512_mask_storeu_ps(out, live, v);
}

}  // namespace avx512

namespace avx2 {

/// 16 float lanes as two halves.
struct f32x16 {
  __m256 lo, hi;
};
/// 16 32-bit integer lanes as two halves.
struct i32x16 {
  __m256i lo, hi;
};

/// Which of the 8 lanes 8h..8h+7 (`first` = 8h) of a window lie below `valid`, as 32-bit lane
/// masks (for the masked loads and stores of a window's tail).
GRADCOMP_TARGET_AVX2 inline __m256i live_mask8(std::size_t valid, unsigned first) noexcept {
  long long const left = static_cast<long long>(valid) - first;
  int const n = left < 0 ? 0 : (left > 8 ? 8 : static_cast<int>(left));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Masks of the live lanes.
GRADCOMP_TARGET_AVX2 inline i32x16 live16(std::size_t valid) noexcept {
  return {live_mask8(valid, 0), live_mask8(valid, 8)};
}

/// Per-lane float constants `field(bucket)`.
template <class Field>
GRADCOMP_TARGET_AVX2 inline f32x16 lanes_ps(window_buckets const& w, Field const& field) noexcept {
  if (w.single) {
    __m256 const v = _mm256_set1_ps(field(w.first));
    return {v, v};
  }
  alignas(32) float v[window_lanes];
  lane_values(w, v, field);
  return {_mm256_load_ps(v), _mm256_load_ps(v + 8)};
}

/// Per-lane 32-bit integer constants `field(bucket)`.
template <class Field>
GRADCOMP_TARGET_AVX2 inline i32x16 lanes_epi32(window_buckets const& w,
                                               Field const& field) noexcept {
  if (w.single) {
    __m256i const v = _mm256_set1_epi32(static_cast<std::int32_t>(field(w.first)));
    return {v, v};
  }
  alignas(32) std::int32_t v[window_lanes];
  lane_values(w, v, field);
  return {_mm256_load_si256(reinterpret_cast<__m256i const*>(v)),
          _mm256_load_si256(reinterpret_cast<__m256i const*>(v + 8))};
}

/// 16 floats, dead lanes 0.
GRADCOMP_TARGET_AVX2 inline f32x16 load16(float const* p, std::size_t valid) noexcept {
  if (valid == window_lanes) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  return {_mm256_maskload_ps(p, live_mask8(valid, 0)),
          _mm256_maskload_ps(p + 8, live_mask8(valid, 8))};
}

/// The bits of 16 floats, dead lanes 0.
GRADCOMP_TARGET_AVX2 inline i32x16 load16_bits(float const* p, std::size_t valid) noexcept {
  f32x16 const v = load16(p, valid);
  return {_mm256_castps_si256(v.lo), _mm256_castps_si256(v.hi)};
}

/// 16 bytes, dead lanes 0.
GRADCOMP_TARGET_AVX2 inline __m128i load_bytes16(std::uint8_t const* p,
                                                 std::size_t valid) noexcept {
  if (valid == window_lanes) return _mm_loadu_si128(reinterpret_cast<__m128i const*>(p));
  alignas(16) std::uint8_t tmp[window_lanes] = {};
  std::memcpy(tmp, p, valid);
  return _mm_load_si128(reinterpret_cast<__m128i const*>(tmp));
}

/// Stores 16 code bytes at `p`; `stream`: with a streaming store (`p` 16-byte aligned).
GRADCOMP_TARGET_AVX2 inline void store_codes16(std::uint8_t* p, __m128i c, bool stream) noexcept {
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), c);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), c);
  }
}

/// Stores the live bytes of `c`.
GRADCOMP_TARGET_AVX2 inline void store_bytes16(std::uint8_t* p, std::size_t valid,
                                               __m128i c) noexcept {
  if (valid == window_lanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), c);
    return;
  }
  alignas(16) std::uint8_t tmp[window_lanes];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), c);
  std::memcpy(p, tmp, valid);
}

/// out = v, or out = fma(alpha, v, out) when `add`, on the live lanes; `stream` (ignored when
/// `add`): a full window at a 32-byte aligned `out` is written with streaming stores.
GRADCOMP_TARGET_AVX2 inline void store_or_add16(float* out, std::size_t valid, f32x16 v,
                                                __m256 alpha, bool add,
                                                bool stream = false) noexcept {
  if (valid == window_lanes) {
    if (!add && stream && bytes_to_alignment(out, 32) == 0) {
      _mm256_stream_ps(out, v.lo);
      _mm256_stream_ps(out + 8, v.hi);
      return;
    }
    if (add) {
      v.lo = _mm256_fmadd_ps(alpha, v.lo, _mm256_loadu_ps(out));
      v.hi = _mm256_fmadd_ps(alpha, v.hi, _mm256_loadu_ps(out + 8));
    }
    _mm256_storeu_ps(out, v.lo);
    _mm256_storeu_ps(out + 8, v.hi);
    return;
  }
  __m256i const live0 = live_mask8(valid, 0);
  __m256i const live1 = live_mask8(valid, 8);
  if (add) {
    v.lo = _mm256_fmadd_ps(alpha, v.lo, _mm256_maskload_ps(out, live0));
    v.hi = _mm256_fmadd_ps(alpha, v.hi, _mm256_maskload_ps(out + 8, live1));
  }
  _mm256_maskstore_ps(out, live0, v.lo);
  _mm256_maskstore_ps(out + 8, live1, v.hi);
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
