// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The keyed Feistel permutation of random-k (docs/wire-format.md, "random_k") and its batch
/// evaluation: `feistel_fill` writes π(first), ..., π(first + count − 1). Scalar, AVX2 (8 lanes)
/// and AVX-512 (16 lanes) bodies give the same numbers; lanes that land outside [0, n) keep
/// walking while the others hold their value.

#include <gradcomp/config.hpp>
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

/// A keyed pseudo-random permutation π of [0, n), n ≤ 2^32 − 1: an 8-round unbalanced Feistel
/// network on w = max(8, bit_width(n − 1)) bits, applied repeatedly until the value is < n
/// (cycle-walking). x = L · 2^b + R with a = ⌊w/2⌋ bits of L and b = w − a of R; round r maps
/// (L, R) to (R, L xor (mix(R xor key_r) mod 2^|L|)), the widths swapping each round; the eight
/// round keys are the words of Philox4x32-10 blocks (domain << 32 | 0) and (domain << 32 | 1)
/// of the stream.
class feistel_permutation {
 public:
  static constexpr int rounds = 8;
  static constexpr unsigned min_width = 8;

  /// The 32-bit avalanche mixer of the round function.
  GRADCOMP_FORCEINLINE static constexpr std::uint32_t mix(std::uint32_t x) noexcept {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
  }

  feistel_permutation(std::uint64_t n, random_stream const& rs, std::uint32_t domain) noexcept
      : n_(n) {
    unsigned const w =
        n <= 1 ? 0u : std::max(min_width, static_cast<unsigned>(std::bit_width(n - 1)));
    a_ = w / 2;
    b_ = w - a_;
    for (unsigned blk = 0; blk < rounds / 4; ++blk) {
      philox_block const o = rs.block((std::uint64_t{domain} << 32) | blk);
      for (unsigned j = 0; j < 4; ++j) key_[4 * blk + j] = o[j];
    }
  }

  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }
  [[nodiscard]] unsigned high_bits() const noexcept { return a_; }
  [[nodiscard]] unsigned low_bits() const noexcept { return b_; }
  [[nodiscard]] std::uint32_t key(int r) const noexcept { return key_[r]; }

  /// One pass of the network over [0, 2^w).
  [[nodiscard]] std::uint32_t step(std::uint32_t x) const noexcept {
    unsigned wl = a_, wr = b_;
    std::uint32_t l = static_cast<std::uint32_t>(std::uint64_t{x} >> wr);
    std::uint32_t r = x & low_mask(wr);
    for (int k = 0; k < rounds; ++k) {
      std::uint32_t const f = mix(r ^ key_[k]) & low_mask(wl);
      std::uint32_t const nl = r;
      r = l ^ f;
      l = nl;
      std::swap(wl, wr);
    }
    return static_cast<std::uint32_t>((std::uint64_t{l} << wr) | r);
  }

  /// π(i) for i < n.
  [[nodiscard]] std::uint32_t operator()(std::uint64_t i) const noexcept {
    if (n_ <= 1) return 0;
    auto x = static_cast<std::uint32_t>(i);
    do {
      x = step(x);
    } while (x >= n_);
    return x;
  }

  static constexpr std::uint32_t low_mask(unsigned bits) noexcept {
    return static_cast<std::uint32_t>((std::uint64_t{1} << bits) - 1);
  }

 private:
  std::uint64_t n_;
  unsigned a_ = 0, b_ = 0;
  std::uint32_t key_[rounds] = {};
};

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
