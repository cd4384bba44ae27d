// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Batched Philox4x32-10 for the CPU kernels: the 128 16-bit draws of one 128-element group
/// (16 consecutive Philox blocks, see core/philox.hpp), as 4 words x 16 lanes. Word w of lane l
/// is word w of block (group * 16 + l). Every level returns the same numbers.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>

#include <cstdint>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// The draws of one 128-element group: `word[w][l]` is word w of block group*16 + l.
struct philox_group {
  alignas(64) std::uint32_t word[4][16];

  /// Draw of element `i` of the group (0 <= i < 128).
  [[nodiscard]] std::uint32_t draw(unsigned i) const noexcept {
    unsigned const lane = (i >> 4) & 7u;
    return (word[lane >> 1][i & 15u] >> (16u * (lane & 1u))) & 0xffffu;
  }
};

namespace scalar {

inline void philox_fill(random_stream const& rs, std::uint64_t group, philox_group& out) noexcept {
  for (unsigned l = 0; l < 16; ++l) {
    philox_block const b = rs.block(group * 16 + l);
    for (unsigned w = 0; w < 4; ++w) out.word[w][l] = b[w];
  }
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

/// Four words of 16 Philox blocks, lane l = block group*16 + l.
struct philox16 {
  __m512i w0, w1, w2, w3;
};

GRADCOMP_TARGET_AVX512 inline void mulhilo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) noexcept {
  __m512i const pe = _mm512_mul_epu32(a, m);                         // even lanes, 64-bit
  __m512i const po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // odd lanes, 64-bit
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
  lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

GRADCOMP_TARGET_AVX512 inline philox16 philox_generate(random_stream const& rs,
                                                       std::uint64_t group) noexcept {
  using namespace philox_constants;
  std::uint64_t const first = group * 16;
  __m512i const lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Blocks first..first+15 never straddle a 2^32 boundary in the low word because first is a
  // multiple of 16.
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first))), lanes);
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first >> 32)));
  __m512i c2 = _mm512_set1_epi32(static_cast<int>(rs.step));
  __m512i c3 = _mm512_set1_epi32(static_cast<int>(rs.tensor));
  philox_key k = rs.key();
  __m512i const mul0 = _mm512_set1_epi32(static_cast<int>(m0));
  __m512i const mul1 = _mm512_set1_epi32(static_cast<int>(m1));
  for (int r = 0; r < 10; ++r) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo(c0, mul0, hi0, lo0);
    mulhilo(c2, mul1, hi1, lo1);
    __m512i const k0 = _mm512_set1_epi32(static_cast<int>(k[0]));
    __m512i const k1 = _mm512_set1_epi32(static_cast<int>(k[1]));
    c0 = _mm512_ternarylogic_epi32(hi1, c1, k0, 0x96);  // hi1 ^ c1 ^ k0
    c2 = _mm512_ternarylogic_epi32(hi0, c3, k1, 0x96);  // hi0 ^ c3 ^ k1
    c1 = lo1;
    c3 = lo0;
    k[0] += w0;
    k[1] += w1;
  }
  return {c0, c1, c2, c3};
}

/// The 16 draws of window `k` (0..7) of a group, as 32-bit lanes.
GRADCOMP_TARGET_AVX512 inline __m512i philox_window(philox16 const& g, unsigned k) noexcept {
  __m512i const w = (k >> 1) == 0 ? g.w0 : (k >> 1) == 1 ? g.w1 : (k >> 1) == 2 ? g.w2 : g.w3;
  __m512i const mask = _mm512_set1_epi32(0xffff);
  return (k & 1u) ? _mm512_srli_epi32(w, 16) : _mm512_and_si512(w, mask);
}

GRADCOMP_TARGET_AVX512 inline void philox_fill(random_stream const& rs, std::uint64_t group,
                                               philox_group& out) noexcept {
  philox16 const g = philox_generate(rs, group);
  _mm512_store_si512(out.word[0], g.w0);
  _mm512_store_si512(out.word[1], g.w1);
  _mm512_store_si512(out.word[2], g.w2);
  _mm512_store_si512(out.word[3], g.w3);
}

}  // namespace avx512
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
