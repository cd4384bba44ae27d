// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The scan of exact top-k's one-pass selection (scalar, AVX2, AVX-512): collect, in index
/// order, the index and value of every element whose magnitude key `bits(x) & 0x7fffffff` is at
/// least a bound (so that neither the selection among them nor the packet writer has to look at
/// the data again), and flag non-finite values among them. Every level writes the same entries.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// What `collect_at_least` wrote.
struct collect_counts {
  std::size_t count = 0;   ///< entries written
  bool nonfinite = false;  ///< one of them is infinite or NaN (key >= 0x7f800000)
};

/// Spare room `collect_at_least` needs at the end of each output: it may write (garbage) up to
/// this many entries past the last one it reports.
inline constexpr std::size_t collect_slack = 16;

namespace scalar {

/// See the dispatching `collect_at_least`.
inline collect_counts collect_at_least(isa_tag, float const* x, std::size_t len, std::uint32_t base,
                                       std::uint32_t lo, std::uint32_t* at, float* values,
                                       bool /*many*/ = false) noexcept {
  std::size_t c = 0;
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < len; ++i) {
    std::uint32_t k;
    std::memcpy(&k, x + i, 4);
    k &= 0x7fffffffu;
    if (k < lo) continue;
    top = k > top ? k : top;
    at[c] = static_cast<std::uint32_t>(base + i);
    values[c++] = x[i];
  }
  return {c, top >= 0x7f800000u};
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

// Writes index and value of the lanes `in`: a register compress and a full store each (not a
// compressing store, which is slow on some cores). Tracks the largest key in `top`.
GRADCOMP_TARGET_AVX512 inline void collect_emit(__m512i raw, __m512i k, __mmask16 in, __m512i pos,
                                                std::uint32_t*& a, float*& v,
                                                __m512i& top) noexcept {
  top = _mm512_mask_max_epu32(top, in, top, k);
  _mm512_storeu_si512(a, _mm512_maskz_compress_epi32(in, pos));
  _mm512_storeu_si512(v, _mm512_maskz_compress_epi32(in, raw));
  int const m = std::popcount(static_cast<unsigned>(in));
  a += m;
  v += m;
}

GRADCOMP_TARGET_AVX512 inline collect_counts collect_at_least(isa_tag, float const* x,
                                                              std::size_t len, std::uint32_t base,
                                                              std::uint32_t lo, std::uint32_t* at,
                                                              float* values,
                                                              bool branch_free) noexcept {
  __m512i const absmask = _mm512_set1_epi32(0x7fffffff);
  __m512i const vlo = _mm512_set1_epi32(static_cast<int>(lo));
  __m512i const sixteen = _mm512_set1_epi32(16);
  __m512i pos =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i top = _mm512_setzero_si512();
  std::uint32_t* a = at;
  float* v = values;
  std::size_t i = 0;
  if (branch_free) {  // many hits: a mispredicted branch costs more than an empty emit
    for (; i + 16 <= len; i += 16) {
      __m512i const raw = _mm512_loadu_si512(x + i);
      __m512i const k = _mm512_and_si512(raw, absmask);
      collect_emit(raw, k, _mm512_cmpge_epu32_mask(k, vlo), pos, a, v, top);
      pos = _mm512_add_epi32(pos, sixteen);
    }
  }
  for (; i + 16 <= len; i += 16) {
    __m512i const raw = _mm512_loadu_si512(x + i);
    __m512i const k = _mm512_and_si512(raw, absmask);
    __mmask16 const in = _mm512_cmpge_epu32_mask(k, vlo);
    if (in != 0) collect_emit(raw, k, in, pos, a, v, top);  // usually skipped
    pos = _mm512_add_epi32(pos, sixteen);
  }
  if (i < len) {
    auto const live = static_cast<__mmask16>((1u << (len - i)) - 1u);
    __m512i const raw = _mm512_maskz_loadu_epi32(live, x + i);
    __m512i const k = _mm512_and_si512(raw, absmask);
    __mmask16 const in = _mm512_mask_cmpge_epu32_mask(live, k, vlo);
    if (in != 0) collect_emit(raw, k, in, pos, a, v, top);
  }
  return {static_cast<std::size_t>(a - at), _mm512_reduce_max_epu32(top) >= 0x7f800000u};
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline collect_counts collect_at_least(isa_tag, float const* x,
                                                            std::size_t len, std::uint32_t base,
                                                            std::uint32_t lo, std::uint32_t* at,
                                                            float* values,
                                                            bool /*many*/ = false) noexcept {
  // Keys are below 2^31, so a signed compare works: key >= lo is key > lo - 1 (lo = 0 gives
  // -1; the caller guarantees lo < 2^31). The rare groups with a hit are visited bit by bit.
  __m256i const absmask = _mm256_set1_epi32(0x7fffffff);
  __m256i const vlo = _mm256_set1_epi32(static_cast<int>(lo) - 1);
  std::size_t c = 0;
  std::uint32_t top = 0;
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m256i const k =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + i)), absmask);
    auto in =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, vlo))));
    while (in != 0) {
      auto const j = static_cast<unsigned>(std::countr_zero(in));
      in &= in - 1;
      float const f = x[i + j];
      std::uint32_t kk;
      std::memcpy(&kk, &f, 4);
      kk &= 0x7fffffffu;
      top = kk > top ? kk : top;
      at[c] = static_cast<std::uint32_t>(base + i + j);
      values[c++] = f;
    }
  }
  collect_counts const t = scalar::collect_at_least(
      scalar_tag{}, x + i, len - i, static_cast<std::uint32_t>(base + i), lo, at + c, values + c);
  return {c + t.count, t.nonfinite || top >= 0x7f800000u};
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif

/// Writes to `at` the indices base + i, and to `values` the values, of the elements of
/// x[0, len) whose key is at least `lo`, in ascending order; returns how many and whether one
/// of them is non-finite. Each output needs room for the entries plus `collect_slack`.
/// base + len must fit in 32 bits. `many` says that more than about 1% of the elements are
/// expected to qualify (a hint for the AVX-512 loop, which then stores every group instead of
/// branching around the empty ones; the result is the same).
inline collect_counts collect_at_least(float const* x, std::size_t len, std::uint32_t base,
                                       std::uint32_t lo, std::uint32_t* at, float* values,
                                       isa level, bool many = false) noexcept {
  if (lo > 0x7fffffffu) return {};  // no key reaches it
  return dispatch(level,
                  [&](auto t) { return collect_at_least(t, x, len, base, lo, at, values, many); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
