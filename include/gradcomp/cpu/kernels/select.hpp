// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Stream compaction for magnitude selection: `compact_above` writes the index and key
/// (`bits(x) & 0x7fffffff`) of every element of a block whose key is at least a bound, in
/// index order, without branches on the data. Scalar, AVX2 (8 lanes, permutation table) and
/// AVX-512 (16 lanes, compress-store) bodies give the same output.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// Extra output slots `compact_above` may write (garbage) past its returned count.
inline constexpr std::size_t compact_slack = 16;

namespace scalar {
/// Indices (from `first`) and keys of x[0, len) with key >= bound; returns their number.
inline std::size_t compact_above(isa_tag, float const* x, std::size_t len, std::uint32_t first,
                                 std::uint32_t bound, std::uint32_t* idx,
                                 std::uint32_t* key) noexcept {
  std::size_t m = 0;
  for (std::size_t i = 0; i < len; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, 4);
    u &= 0x7fffffffu;
    idx[m] = first + static_cast<std::uint32_t>(i);
    key[m] = u;
    m += u >= bound ? 1u : 0u;
  }
  return m;
}
}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {
GRADCOMP_TARGET_AVX512 inline std::size_t compact_above(isa_tag, float const* x, std::size_t len,
                                                        std::uint32_t first, std::uint32_t bound,
                                                        std::uint32_t* idx,
                                                        std::uint32_t* key) noexcept {
  __m512i const abs = _mm512_set1_epi32(0x7fffffff);
  __m512i const b = _mm512_set1_epi32(static_cast<int>(bound));
  __m512i at =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i const sixteen = _mm512_set1_epi32(16);
  std::size_t m = 0, i = 0;
  for (; i + 16 <= len; i += 16) {
    __m512i const k = _mm512_and_si512(_mm512_loadu_si512(x + i), abs);
    __mmask16 const sel = _mm512_cmpge_epu32_mask(k, b);
    // Compress in registers, then store all 16 lanes: the memory form of vpcompressd is
    // microcoded and slow on some cores (AMD Zen 4).
    _mm512_storeu_si512(idx + m, _mm512_maskz_compress_epi32(sel, at));
    _mm512_storeu_si512(key + m, _mm512_maskz_compress_epi32(sel, k));
    m += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(sel)));
    at = _mm512_add_epi32(at, sixteen);
  }
  return m + scalar::compact_above(scalar_tag{}, x + i, len - i,
                                   first + static_cast<std::uint32_t>(i), bound, idx + m, key + m);
}
}  // namespace avx512

namespace avx2 {
/// Lane permutations that move the selected lanes of an 8-bit mask to the front.
inline constexpr std::array<std::uint64_t, 256> compact_table = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned mask = 0; mask < 256; ++mask) {
    std::uint64_t v = 0;
    unsigned o = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      if ((mask >> lane) & 1u) v |= static_cast<std::uint64_t>(lane) << (8 * o++);
    }
    t[mask] = v;
  }
  return t;
}();

GRADCOMP_TARGET_AVX2 inline std::size_t compact_above(isa_tag, float const* x, std::size_t len,
                                                      std::uint32_t first, std::uint32_t bound,
                                                      std::uint32_t* idx,
                                                      std::uint32_t* key) noexcept {
  __m256i const abs = _mm256_set1_epi32(0x7fffffff);
  // k >= bound  <=>  k > bound - 1 (signed compare is fine: keys and bound are below 2^31).
  __m256i const b1 = _mm256_set1_epi32(static_cast<int>(bound) - 1);
  __m256i at = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i const eight = _mm256_set1_epi32(8);
  std::size_t m = 0, i = 0;
  if (bound == 0) return scalar::compact_above(scalar_tag{}, x, len, first, bound, idx, key);
  for (; i + 8 <= len; i += 8) {
    __m256i const k =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + i)), abs);
    auto const sel =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, b1))));
    __m256i const perm =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(compact_table[sel])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + m), _mm256_permutevar8x32_epi32(at, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(key + m), _mm256_permutevar8x32_epi32(k, perm));
    m += static_cast<std::size_t>(std::popcount(sel));
    at = _mm256_add_epi32(at, eight);
  }
  return m + scalar::compact_above(scalar_tag{}, x + i, len - i,
                                   first + static_cast<std::uint32_t>(i), bound, idx + m, key + m);
}
}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// `compact_above` at SIMD level `level`. `idx` and `key` need room for len + `compact_slack`
/// entries.
inline std::size_t compact_above(float const* x, std::size_t len, std::uint32_t first,
                                 std::uint32_t bound, std::uint32_t* idx, std::uint32_t* key,
                                 isa level) noexcept {
  return dispatch(level, [&](auto t) { return compact_above(t, x, len, first, bound, idx, key); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
