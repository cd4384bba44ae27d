// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Batch evaluation of the keyed Feistel permutation of random-k (core/feistel.hpp,
/// docs/wire-format.md, "random_k"): `feistel_fill` writes π(first), ..., π(first + count − 1).
/// Scalar, AVX2 (8 lanes) and AVX-512 (16 lanes) bodies give the same numbers; lanes that land
/// outside [0, n) keep walking while the others hold their value.

#include <gradcomp/config.hpp>
#include <gradcomp/core/feistel.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// The permutation (core/feistel.hpp, shared with the CUDA backend).
using gradcomp::feistel_permutation;

namespace scalar {
inline void feistel_fill(isa_tag, feistel_permutation const& p, std::uint64_t first,
                         std::size_t count, std::uint32_t* out) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = p(first + i);
}
}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {
GRADCOMP_TARGET_AVX512 inline __m512i feistel_mix(__m512i x) noexcept {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

GRADCOMP_TARGET_AVX512 inline void feistel_fill(isa_tag, feistel_permutation const& p,
                                                std::uint64_t first, std::size_t count,
                                                std::uint32_t* out) noexcept {
  if (p.size() <= 1) return scalar::feistel_fill(scalar_tag{}, p, first, count, out);
  unsigned const a = p.high_bits(), b = p.low_bits();
  __m512i const ma = _mm512_set1_epi32(static_cast<int>(feistel_permutation::low_mask(a)));
  __m512i const mb = _mm512_set1_epi32(static_cast<int>(feistel_permutation::low_mask(b)));
  __m512i key[feistel_permutation::rounds];
  for (int r = 0; r < feistel_permutation::rounds; ++r)
    key[r] = _mm512_set1_epi32(static_cast<int>(p.key(r)));
  __m512i const n = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(p.size())));
  __m128i const sb = _mm_cvtsi32_si128(static_cast<int>(b));
  __m512i const lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512i x = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first + i)), lanes);
    __mmask16 todo = 0xffff;
    while (todo != 0) {
      __m512i l = _mm512_srl_epi32(x, sb);
      __m512i r = _mm512_and_si512(x, mb);
#  pragma GCC unroll 8
      for (int k = 0; k < feistel_permutation::rounds; k += 2) {
        __m512i const f0 = _mm512_and_si512(feistel_mix(_mm512_xor_si512(r, key[k])), ma);
        l = _mm512_xor_si512(l, f0);  // (L, R) -> (R, L ^ f): keep the names, swap roles
        __m512i const f1 = _mm512_and_si512(feistel_mix(_mm512_xor_si512(l, key[k + 1])), mb);
        r = _mm512_xor_si512(r, f1);
      }
      __m512i const y = _mm512_or_si512(_mm512_sll_epi32(l, sb), r);
      x = _mm512_mask_mov_epi32(x, todo, y);
      todo = _mm512_mask_cmpge_epu32_mask(todo, x, n);
    }
    _mm512_storeu_si512(out + i, x);
  }
  scalar::feistel_fill(scalar_tag{}, p, first + i, count - i, out + i);
}
}  // namespace avx512

namespace avx2 {
GRADCOMP_TARGET_AVX2 inline __m256i feistel_mix(__m256i x) noexcept {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

GRADCOMP_TARGET_AVX2 inline void feistel_fill(isa_tag, feistel_permutation const& p,
                                              std::uint64_t first, std::size_t count,
                                              std::uint32_t* out) noexcept {
  if (p.size() <= 1) return scalar::feistel_fill(scalar_tag{}, p, first, count, out);
  unsigned const a = p.high_bits(), b = p.low_bits();
  __m256i const ma = _mm256_set1_epi32(static_cast<int>(feistel_permutation::low_mask(a)));
  __m256i const mb = _mm256_set1_epi32(static_cast<int>(feistel_permutation::low_mask(b)));
  __m256i key[feistel_permutation::rounds];
  for (int r = 0; r < feistel_permutation::rounds; ++r)
    key[r] = _mm256_set1_epi32(static_cast<int>(p.key(r)));
  __m256i const bias = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  __m256i const nb = _mm256_xor_si256(
      _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(p.size()))), bias);
  __m128i const sb = _mm_cvtsi32_si128(static_cast<int>(b));
  __m256i const lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first + i)), lanes);
    __m256i todo = _mm256_set1_epi32(-1);
    while (!_mm256_testz_si256(todo, todo)) {
      __m256i l = _mm256_srl_epi32(x, sb);
      __m256i r = _mm256_and_si256(x, mb);
#  pragma GCC unroll 8
      for (int k = 0; k < feistel_permutation::rounds; k += 2) {
        l = _mm256_xor_si256(l, _mm256_and_si256(feistel_mix(_mm256_xor_si256(r, key[k])), ma));
        r = _mm256_xor_si256(r, _mm256_and_si256(feistel_mix(_mm256_xor_si256(l, key[k + 1])), mb));
      }
      __m256i const y = _mm256_or_si256(_mm256_sll_epi32(l, sb), r);
      x = _mm256_blendv_epi8(x, y, todo);
      // x >= n (unsigned) <=> !(n > x), via the sign-bias trick.
      __m256i const lt = _mm256_cmpgt_epi32(nb, _mm256_xor_si256(x, bias));
      todo = _mm256_andnot_si256(lt, todo);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), x);
  }
  scalar::feistel_fill(scalar_tag{}, p, first + i, count - i, out + i);
}
}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// π(first + j) into out[j] for j < count, at SIMD level `level` (the same numbers at every
/// level).
inline void feistel_fill(feistel_permutation const& p, std::uint64_t first, std::size_t count,
                         std::uint32_t* out, isa level) noexcept {
  dispatch(level, [&](auto t) { feistel_fill(t, p, first, count, out); });
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
