// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The keyed Feistel permutation of random-k (docs/wire-format.md, "random_k"), for every
/// backend: `GRADCOMP_HOST_DEVICE` code that the CPU's batch kernels (cpu/kernels/feistel.hpp,
/// whose SIMD bodies give the same numbers) and the CUDA codec (cuda/randomk.cuh) evaluate.

#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN

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
  GRADCOMP_HOST_DEVICE static constexpr std::uint32_t mix(std::uint32_t x) noexcept {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
  }

  GRADCOMP_HOST_DEVICE feistel_permutation(std::uint64_t n, random_stream const& rs,
                                           std::uint32_t domain) noexcept
      : n_(n) {
    unsigned w = 0;
    for (std::uint64_t v = n <= 1 ? 0 : n - 1; v != 0; v >>= 1) ++w;  // bit_width(n - 1)
    if (n > 1 && w < min_width) w = min_width;
    a_ = w / 2;
    b_ = w - a_;
    for (unsigned blk = 0; blk < rounds / 4; ++blk) {
      philox_block const o = rs.block((std::uint64_t{domain} << 32) | blk);
      for (unsigned j = 0; j < 4; ++j) key_[4 * blk + j] = o[j];
    }
  }

  [[nodiscard]] GRADCOMP_HOST_DEVICE std::uint64_t size() const noexcept { return n_; }
  [[nodiscard]] GRADCOMP_HOST_DEVICE unsigned high_bits() const noexcept { return a_; }
  [[nodiscard]] GRADCOMP_HOST_DEVICE unsigned low_bits() const noexcept { return b_; }
  [[nodiscard]] GRADCOMP_HOST_DEVICE std::uint32_t key(int r) const noexcept { return key_[r]; }

  /// One pass of the network over [0, 2^w).
  [[nodiscard]] GRADCOMP_HOST_DEVICE std::uint32_t step(std::uint32_t x) const noexcept {
    unsigned wl = a_, wr = b_;
    std::uint32_t l = static_cast<std::uint32_t>(std::uint64_t{x} >> wr);
    std::uint32_t r = x & low_mask(wr);
    for (int k = 0; k < rounds; ++k) {
      std::uint32_t const f = mix(r ^ key_[k]) & low_mask(wl);
      std::uint32_t const nl = r;
      r = l ^ f;
      l = nl;
      unsigned const t = wl;
      wl = wr;
      wr = t;
    }
    return static_cast<std::uint32_t>((std::uint64_t{l} << wr) | r);
  }

  /// π(i) for i < n.
  [[nodiscard]] GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::uint64_t i) const noexcept {
    if (n_ <= 1) return 0;
    auto x = static_cast<std::uint32_t>(i);
    do {
      x = step(x);
    } while (x >= n_);
    return x;
  }

  GRADCOMP_HOST_DEVICE static constexpr std::uint32_t low_mask(unsigned bits) noexcept {
    return static_cast<std::uint32_t>((std::uint64_t{1} << bits) - 1);
  }

 private:
  std::uint64_t n_;
  unsigned a_ = 0, b_ = 0;
  std::uint32_t key_[rounds] = {};
};

GRADCOMP_NAMESPACE_END
