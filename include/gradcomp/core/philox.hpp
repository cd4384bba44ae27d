// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11) and the mapping from
/// (seed, step, tensor id, element index) to the 16-bit uniform draw that element uses.
///
/// Every stochastic codec takes element i's randomness from one fixed place, so a packet does
/// not depend on the thread count, the chunking, the SIMD width or the backend. Since wire
/// format 2, one 16-bit Philox draw serves `draw_share` = 4 elements, 128 apart, each shifted
/// by its own quarter of the 16-bit range:
///
///   counter = (block_lo, block_hi, step, tensor id), key = (seed_lo, seed_hi)
///   block(i)  = (i / 512) * 16 + (i % 16)          (which Philox call)
///   lane(i)   = (i / 16) % 8                        (which 16-bit half of its 128-bit output)
///   shift(i)  = ((i / 128) % 4) * 2^14              (which quarter)
///   draw(i)   = ((out[lane / 2] >> (16 * (lane % 2))) + shift(i)) mod 2^16
///
/// Each draw is uniform on [0, 2^16) (a uniform value plus a constant, mod 2^16), so every
/// element's rounding is exactly as unbiased, and has exactly the variance, it had with a draw
/// of its own; only the four elements that share a draw are coupled (stratified: their offsets
/// sit a quarter apart, so their round-ups are negatively correlated, which lowers the
/// variance of any sum over them). The proofs of QSGD, TernGrad and natural compression use
/// only per-element unbiasedness and per-element second moments, summed, so they hold as they
/// are. The point is speed: a 16-lane generator makes the draws of 512 consecutive elements
/// per 16 Philox calls, a quarter of the arithmetic of one draw per element (docs/wire-format.md,
/// "Randomness"). Format 1 drew one value per element (block(i) = (i / 128) * 16 + (i % 16),
/// no shift); its packets still decode, as decoding uses no randomness.
///
/// This layout lets a 16-wide SIMD generator produce the draws of 16 consecutive elements as one
/// vector without transposes, and a GPU thread produce the draws of one block.

#include <gradcomp/config.hpp>

#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN

/// A Philox4x32 counter or output: four 32-bit words. A plain aggregate (not `std::array`) so
/// that it is usable in device code: `philox_block{w0, w1, w2, w3}`.
struct philox_block {
  std::uint32_t w[4];
  GRADCOMP_HOST_DEVICE constexpr std::uint32_t& operator[](unsigned i) noexcept { return w[i]; }
  GRADCOMP_HOST_DEVICE constexpr std::uint32_t operator[](unsigned i) const noexcept { return w[i]; }
  friend constexpr bool operator==(philox_block const&, philox_block const&) = default;
};
/// A Philox4x32 key: two 32-bit words.
struct philox_key {
  std::uint32_t w[2];
  GRADCOMP_HOST_DEVICE constexpr std::uint32_t& operator[](unsigned i) noexcept { return w[i]; }
  GRADCOMP_HOST_DEVICE constexpr std::uint32_t operator[](unsigned i) const noexcept { return w[i]; }
  friend constexpr bool operator==(philox_key const&, philox_key const&) = default;
};

namespace philox_constants {
inline constexpr std::uint32_t m0 = 0xD2511F53u;  ///< round multiplier for word 0
inline constexpr std::uint32_t m1 = 0xCD9E8D57u;  ///< round multiplier for word 2
inline constexpr std::uint32_t w0 = 0x9E3779B9u;  ///< key schedule increment (golden ratio)
inline constexpr std::uint32_t w1 = 0xBB67AE85u;  ///< key schedule increment (sqrt(3) - 1)
}  // namespace philox_constants

/// Philox4x32 with `Rounds` rounds applied to `ctr` under `key`. `philox4x32<10>` is the
/// standard Philox4x32-10 and reproduces the Random123 known-answer vectors.
template <int Rounds = 10>
GRADCOMP_HOST_DEVICE constexpr philox_block philox4x32(philox_block ctr, philox_key key) noexcept {
  using namespace philox_constants;
  for (int r = 0; r < Rounds; ++r) {
    std::uint64_t const p0 = static_cast<std::uint64_t>(m0) * ctr[0];
    std::uint64_t const p1 = static_cast<std::uint64_t>(m1) * ctr[2];
    ctr = philox_block{static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0],
                       static_cast<std::uint32_t>(p1),
                       static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1],
                       static_cast<std::uint32_t>(p0)};
    key[0] += w0;
    key[1] += w1;
  }
  return ctr;
}

/// Elements that share one Philox draw (wire format 2; see the file comment): 128 consecutive
/// elements take the 128 draws of 16 Philox calls, and `draw_share` such groups in a row take
/// the same 16 calls, each group shifted by its own fraction of the 16-bit range.
inline constexpr unsigned draw_share = 4;

/// Where an element's randomness comes from: the seed shared by all ranks, the training step
/// and the tensor. Together with the element index this fixes the draw.
struct random_stream {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor = 0;

  /// The Philox key of this stream.
  GRADCOMP_HOST_DEVICE constexpr philox_key key() const noexcept {
    return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  }
  /// The Philox counter of block `b`.
  GRADCOMP_HOST_DEVICE constexpr philox_block counter(std::uint64_t b) const noexcept {
    return {static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), step, tensor};
  }
  /// The 128 random bits of block `b`.
  GRADCOMP_HOST_DEVICE constexpr philox_block block(std::uint64_t b) const noexcept {
    return philox4x32<10>(counter(b), key());
  }
  /// Block holding element `i`'s draw.
  GRADCOMP_HOST_DEVICE static constexpr std::uint64_t block_of(std::uint64_t i) noexcept {
    return ((i / (128u * draw_share)) << 4) | (i & 15u);
  }
  /// Which of the eight 16-bit lanes of its block element `i` uses.
  GRADCOMP_HOST_DEVICE static constexpr unsigned lane_of(std::uint64_t i) noexcept {
    return static_cast<unsigned>((i >> 4) & 7u);
  }
  /// The quarter (0..3) by which element `i`'s draw is shifted: (i / 128) % draw_share.
  GRADCOMP_HOST_DEVICE static constexpr unsigned quarter_of(std::uint64_t i) noexcept {
    return static_cast<unsigned>((i / 128u) % draw_share);
  }
  /// Extracts 16-bit lane `lane` of a block output.
  GRADCOMP_HOST_DEVICE static constexpr std::uint32_t lane16(philox_block const& out,
                                                             unsigned lane) noexcept {
    return (out[lane >> 1] >> (16u * (lane & 1u))) & 0xffffu;
  }
  /// A raw 16-bit lane shifted by quarter `q` of the 16-bit range.
  GRADCOMP_HOST_DEVICE static constexpr std::uint32_t shifted(std::uint32_t raw16,
                                                              unsigned q) noexcept {
    return (raw16 + q * (0x10000u / draw_share)) & 0xffffu;
  }
  /// Element `i`'s draw taken from `out`, the output of its block (`block(block_of(i))`): the
  /// one place that says which bits of a block, shifted how, element i uses. Generators that
  /// compute a block once for the several elements it serves (the CUDA codecs' draw cache)
  /// call this, so they follow any change of the mapping.
  GRADCOMP_HOST_DEVICE static constexpr std::uint32_t draw_from(philox_block const& out,
                                                                std::uint64_t i) noexcept {
    return shifted(lane16(out, lane_of(i)), quarter_of(i));
  }
  /// Element `i`'s uniform 16-bit draw (one Philox call; use the block form in loops).
  GRADCOMP_HOST_DEVICE constexpr std::uint32_t draw16(std::uint64_t i) const noexcept {
    return draw_from(block(block_of(i)), i);
  }
};

/// Bernoulli decision of stochastic rounding: true with probability `frac` (in [0, 1]) up to
/// the resolution of the 16-bit draw. The draw is centred, `(d + 0.5) / 65536`, so the error of
/// the probability is at most 2^-17.
GRADCOMP_HOST_DEVICE constexpr bool round_up(std::uint32_t draw16, float frac) noexcept {
  return (static_cast<float>(draw16) + 0.5f) * (1.0f / 65536.0f) < frac;
}

GRADCOMP_NAMESPACE_END
