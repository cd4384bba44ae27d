// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Batched Philox4x32-10 for the CPU kernels: the 128 16-bit draws of one 128-element group, as
/// 4 words x 16 lanes (core/philox.hpp). Group g takes the 16 Philox blocks 16 s .. 16 s + 15 of
/// super-group s = g / draw_share, each 16-bit half shifted by (g % draw_share) · 2^16 /
/// draw_share; word w of lane l holds the draws of elements 128 g + 16 (2 w) + l (low half) and
/// 128 g + 16 (2 w + 1) + l (high half). `philox_draws` generates each super-group once for the
/// draw_share groups that use it. Every level returns the same numbers.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>

#include <cstddef>
#include <cstdint>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// The draws of one 128-element group: `word[w][l]` is word w of block (group / draw_share) * 16
/// + l, both halves shifted by the group's quarter.
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
  unsigned const q = static_cast<unsigned>(group % draw_share);
  for (unsigned l = 0; l < 16; ++l) {
    philox_block const b = rs.block((group / draw_share) * 16 + l);
    for (unsigned w = 0; w < 4; ++w) {
      out.word[w][l] = random_stream::shifted(b[w] & 0xffffu, q) |
                       (random_stream::shifted(b[w] >> 16, q) << 16);
    }
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

/// Broadcast Philox round keys of one stream (computed once per kernel call).
struct philox_schedule {
  __m512i k0[10];
  __m512i k1[10];
  std::uint64_t counter_hi_step_tensor[3];
};

GRADCOMP_TARGET_AVX512 inline philox_schedule philox_prepare(random_stream const& rs) noexcept {
  philox_schedule s;
  philox_key k = rs.key();
  for (int r = 0; r < 10; ++r) {
    s.k0[r] = _mm512_set1_epi64(k[0]);
    s.k1[r] = _mm512_set1_epi64(k[1]);
    k[0] += philox_constants::w0;
    k[1] += philox_constants::w1;
  }
  s.counter_hi_step_tensor[0] = 0;
  s.counter_hi_step_tensor[1] = rs.step;
  s.counter_hi_step_tensor[2] = rs.tensor;
  return s;
}

// Philox4x32-10 on 16 blocks held as two chains of 8, each block word in the low half of a
// 64-bit lane. High halves hold garbage that never reaches a result (_mm512_mul_epu32 reads
// only the low 32 bits; the outputs keep only the low halves).
GRADCOMP_TARGET_AVX512 inline philox16 philox_generate(philox_schedule const& ks,
                                                       std::uint64_t group) noexcept {
  std::uint64_t const first = group * 16;  // a multiple of 16: first + l never carries
  __m512i const lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  __m512i const lo = _mm512_set1_epi64(static_cast<std::uint32_t>(first));
  __m512i a0 = _mm512_add_epi64(lo, lanes);
  __m512i b0 = _mm512_add_epi64(a0, _mm512_set1_epi64(8));
  __m512i a1 = _mm512_set1_epi64(static_cast<std::uint32_t>(first >> 32));
  __m512i b1 = a1;
  __m512i a2 = _mm512_set1_epi64(static_cast<long long>(ks.counter_hi_step_tensor[1]));
  __m512i b2 = a2;
  __m512i a3 = _mm512_set1_epi64(static_cast<long long>(ks.counter_hi_step_tensor[2]));
  __m512i b3 = a3;
  __m512i const mul0 = _mm512_set1_epi64(philox_constants::m0);
  __m512i const mul1 = _mm512_set1_epi64(philox_constants::m1);
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    __m512i const pa0 = _mm512_mul_epu32(a0, mul0);
    __m512i const pb0 = _mm512_mul_epu32(b0, mul0);
    __m512i const pa1 = _mm512_mul_epu32(a2, mul1);
    __m512i const pb1 = _mm512_mul_epu32(b2, mul1);
    // High product words to the low halves with a shuffle (another port than the multiply).
    a0 = _mm512_ternarylogic_epi64(_mm512_shuffle_epi32(pa1, _MM_PERM_DDBB), a1, ks.k0[r], 0x96);
    b0 = _mm512_ternarylogic_epi64(_mm512_shuffle_epi32(pb1, _MM_PERM_DDBB), b1, ks.k0[r], 0x96);
    a2 = _mm512_ternarylogic_epi64(_mm512_shuffle_epi32(pa0, _MM_PERM_DDBB), a3, ks.k1[r], 0x96);
    b2 = _mm512_ternarylogic_epi64(_mm512_shuffle_epi32(pb0, _MM_PERM_DDBB), b3, ks.k1[r], 0x96);
    a1 = pa1;
    b1 = pb1;
    a3 = pa0;
    b3 = pb0;
  }
  __m512i const even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return {_mm512_permutex2var_epi32(a0, even, b0), _mm512_permutex2var_epi32(a1, even, b1),
          _mm512_permutex2var_epi32(a2, even, b2), _mm512_permutex2var_epi32(a3, even, b3)};
}

/// The draws of 128-element groups in any order, each super-group's 16 Philox calls made once
/// while its groups come in a row.
class philox_draws {
 public:
  GRADCOMP_TARGET_AVX512 explicit philox_draws(random_stream const& rs) noexcept
      : ks_(philox_prepare(rs)) {}

  /// The draws of group `g` (elements 128 g .. 128 g + 127).
  GRADCOMP_TARGET_AVX512 philox16 group(std::uint64_t g) noexcept {
    std::uint64_t const s = g / draw_share;
    if (!valid_ || s != super_) {
      raw_ = philox_generate(ks_, s);
      super_ = s;
      valid_ = true;
    }
    unsigned const q = static_cast<unsigned>(g % draw_share);
    if (q == 0) return raw_;
    __m512i const d = _mm512_set1_epi16(static_cast<short>(q * (0x10000u / draw_share)));
    return {_mm512_add_epi16(raw_.w0, d), _mm512_add_epi16(raw_.w1, d),
            _mm512_add_epi16(raw_.w2, d), _mm512_add_epi16(raw_.w3, d)};
  }

 private:
  philox_schedule ks_;
  philox16 raw_{};
  std::uint64_t super_ = 0;
  bool valid_ = false;
};

/// The 16 draws of window `k` (0..7) of a group, as 32-bit lanes.
GRADCOMP_TARGET_AVX512 inline __m512i philox_window(philox16 const& g, unsigned k) noexcept {
  __m512i const w = (k >> 1) == 0 ? g.w0 : (k >> 1) == 1 ? g.w1 : (k >> 1) == 2 ? g.w2 : g.w3;
  __m512i const mask = _mm512_set1_epi32(0xffff);
  return (k & 1u) ? _mm512_srli_epi32(w, 16) : _mm512_and_si512(w, mask);
}

GRADCOMP_TARGET_AVX512 inline void philox_fill(random_stream const& rs, std::uint64_t group,
                                               philox_group& out) noexcept {
  philox16 const g = philox_draws(rs).group(group);
  _mm512_store_si512(out.word[0], g.w0);
  _mm512_store_si512(out.word[1], g.w1);
  _mm512_store_si512(out.word[2], g.w2);
  _mm512_store_si512(out.word[3], g.w3);
}

}  // namespace avx512

namespace avx2 {

/// Four words of 16 Philox blocks: `w[w][h]` lane j is word w of block group*16 + 8h + j.
struct philox16 {
  __m256i w[4][2];
};

/// Broadcast Philox round keys of one stream (computed once per kernel call).
struct philox_schedule {
  __m256i k0[10];
  __m256i k1[10];
  std::uint32_t step;
  std::uint32_t tensor;
};

GRADCOMP_TARGET_AVX2 inline philox_schedule philox_prepare(random_stream const& rs) noexcept {
  philox_schedule s;
  philox_key k = rs.key();
  for (int r = 0; r < 10; ++r) {
    s.k0[r] = _mm256_set1_epi64x(k[0]);
    s.k1[r] = _mm256_set1_epi64x(k[1]);
    k[0] += philox_constants::w0;
    k[1] += philox_constants::w1;
  }
  s.step = rs.step;
  s.tensor = rs.tensor;
  return s;
}

// The low halves of the 64-bit lanes of a and b: a0 a1 b0 b1 | a2 a3 b2 b3.
GRADCOMP_TARGET_AVX2 inline __m256i philox_low_words(__m256i a, __m256i b) noexcept {
  return _mm256_castps_si256(
      _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), _MM_SHUFFLE(2, 0, 2, 0)));
}

// Philox4x32-10 on 16 blocks as four independent chains of 4, each block word in the low half
// of a 64-bit lane (_mm256_mul_epu32 reads only the low halves; the garbage the high halves
// collect never reaches a result). Chain c holds blocks {0,1,4,5} + 8 * (c / 2) + 2 * (c % 2),
// so that one _mm256_shuffle_ps of chains 2j and 2j + 1 yields blocks 8j..8j+7 in order.
GRADCOMP_TARGET_AVX2 inline philox16 philox_generate(philox_schedule const& ks,
                                                     std::uint64_t group) noexcept {
  constexpr int chains = 4;
  std::uint64_t const first = group * 16;  // a multiple of 16: first + l never carries
  __m256i const lo = _mm256_set1_epi64x(static_cast<std::uint32_t>(first));
  __m256i const hi = _mm256_set1_epi64x(static_cast<std::uint32_t>(first >> 32));
  __m256i const st = _mm256_set1_epi64x(ks.step);
  __m256i const tn = _mm256_set1_epi64x(ks.tensor);
  __m256i const mul0 = _mm256_set1_epi64x(philox_constants::m0);
  __m256i const mul1 = _mm256_set1_epi64x(philox_constants::m1);
  __m256i x0[chains], x1[chains], x2[chains], x3[chains];
#pragma GCC unroll 4
  for (int c = 0; c < chains; ++c) {
    long long const b = 8 * (c / 2) + 2 * (c % 2);
    x0[c] = _mm256_add_epi64(lo, _mm256_setr_epi64x(b, b + 1, b + 4, b + 5));
    x1[c] = hi;
    x2[c] = st;
    x3[c] = tn;
  }
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < chains; ++c) {
      __m256i const p0 = _mm256_mul_epu32(x0[c], mul0);
      __m256i const p1 = _mm256_mul_epu32(x2[c], mul1);
      x0[c] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(x1[c], ks.k0[r]));
      x2[c] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(x3[c], ks.k1[r]));
      x1[c] = p1;
      x3[c] = p0;
    }
  }
  philox16 g;
  g.w[0][0] = philox_low_words(x0[0], x0[1]);
  g.w[0][1] = philox_low_words(x0[2], x0[3]);
  g.w[1][0] = philox_low_words(x1[0], x1[1]);
  g.w[1][1] = philox_low_words(x1[2], x1[3]);
  g.w[2][0] = philox_low_words(x2[0], x2[1]);
  g.w[2][1] = philox_low_words(x2[2], x2[3]);
  g.w[3][0] = philox_low_words(x3[0], x3[1]);
  g.w[3][1] = philox_low_words(x3[2], x3[3]);
  return g;
}

/// The draws of 128-element groups in any order, each super-group's 16 Philox calls made once
/// while its groups come in a row.
class philox_draws {
 public:
  GRADCOMP_TARGET_AVX2 explicit philox_draws(random_stream const& rs) noexcept
      : ks_(philox_prepare(rs)) {}

  /// The draws of group `g` (elements 128 g .. 128 g + 127).
  GRADCOMP_TARGET_AVX2 philox16 group(std::uint64_t g) noexcept {
    std::uint64_t const s = g / draw_share;
    if (!valid_ || s != super_) {
      raw_ = philox_generate(ks_, s);
      super_ = s;
      valid_ = true;
    }
    unsigned const q = static_cast<unsigned>(g % draw_share);
    if (q == 0) return raw_;
    __m256i const d = _mm256_set1_epi16(static_cast<short>(q * (0x10000u / draw_share)));
    philox16 out;
    for (unsigned w = 0; w < 4; ++w) {
      out.w[w][0] = _mm256_add_epi16(raw_.w[w][0], d);
      out.w[w][1] = _mm256_add_epi16(raw_.w[w][1], d);
    }
    return out;
  }

 private:
  philox_schedule ks_;
  philox16 raw_{};
  std::uint64_t super_ = 0;
  bool valid_ = false;
};

/// The draws of window `k` (0..7) of a group, lanes 8h..8h+7, as 32-bit lanes.
GRADCOMP_TARGET_AVX2 inline __m256i philox_window(philox16 const& g, unsigned k,
                                                  unsigned h) noexcept {
  __m256i const w = g.w[k >> 1][h];
  return (k & 1u) ? _mm256_srli_epi32(w, 16) : _mm256_and_si256(w, _mm256_set1_epi32(0xffff));
}

GRADCOMP_TARGET_AVX2 inline void philox_fill(random_stream const& rs, std::uint64_t group,
                                             philox_group& out) noexcept {
  philox16 const g = philox_draws(rs).group(group);
  for (unsigned w = 0; w < 4; ++w) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.word[w]), g.w[w][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.word[w] + 8), g.w[w][1]);
  }
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
