// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Wire format of random-k (`random_k_codec`, `scaled_random_k_codec`), for every backend:
/// the Philox domains of its permutation and check word, packet validation and the check
/// word's error message. docs/wire-format.md, "random_k", is the specification:
///
/// - header param0 = k, param1 = tensor id; variant bits 0-1 = value type (`sparse_values`),
///   bit 2 = scaled (values multiplied by n/k), bits 3-7 zero;
/// - payload: the check word (u32 of Philox block `check_domain << 32` of the stream), then
///   the k values at the coordinates π(0), ..., π(k − 1) in ascending coordinate order.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/feistel.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::randomk {

/// Philox block-counter high words (counter word 1) reserved for random-k; the per-element
/// draws of the stochastic codecs never reach them.
inline constexpr std::uint32_t permutation_domain = 0x524b5031u;  // "RKP1"
inline constexpr std::uint32_t check_domain = 0x524b4331u;        // "RKC1"

/// The permutation π of random-k for a stream.
GRADCOMP_HOST_DEVICE inline feistel_permutation permutation(std::uint64_t n,
                                                            random_stream const& rs) noexcept {
  return feistel_permutation(n, rs, permutation_domain);
}

/// The check word of packets of (seed, step, tensor id).
GRADCOMP_HOST_DEVICE inline std::uint32_t check_word(random_stream const& rs) noexcept {
  return rs.block(std::uint64_t{check_domain} << 32)[0];
}

/// The factor values are multiplied by before sending: n/k rounded to float (1 unscaled).
inline float scale(bool scaled, std::uint64_t n, std::uint64_t k) noexcept {
  return scaled && k > 0 ? static_cast<float>(static_cast<double>(n) / static_cast<double>(k)) : 1.0f;
}

/// Checks the fields and payload size of a random_k packet; throws `format_error`.
inline void validate(packet_header const& h) {
  std::string const who = "gradcomp: random_k packet ";
  if ((h.variant & 3u) > 2 || (h.variant >> 3) != 0) {
    throw format_error(who + "has variant " + std::to_string(h.variant) +
                       " (value type must be 0..2, bit 2 = scaled, bits 3-7 zero)");
  }
  if (h.count > UINT32_MAX) {
    throw format_error(who + "declares " + std::to_string(h.count) + " elements (at most " +
                       std::to_string(UINT32_MAX) + ")");
  }
  if (h.param0 > h.count) {
    throw format_error(who + "selects " + std::to_string(h.param0) + " of " +
                       std::to_string(h.count) + " elements");
  }
  expect_payload(h, 4 + std::uint64_t{h.param0} *
                            sparse::value_bytes(static_cast<sparse_values>(h.variant & 3u)));
}

/// Where a validated packet's values are: after the 4-byte check word, in the value type of
/// the header's variant (f32, f16, bf16). Ranks sharing the seed and step write identical
/// headers and check words, so collectives all-reduce only this section.
[[nodiscard]] inline value_section values_of(packet_header const& h) noexcept {
  auto const v = static_cast<sparse_values>(h.variant & 3u);
  dtype const t = v == sparse_values::f16 ? dtype::f16 : v == sparse_values::bf16 ? dtype::bf16 : dtype::f32;
  return {header_bytes + 4, static_cast<std::size_t>(h.payload_bytes) - 4, t};
}

/// Throws `format_error` unless check word `got` of a packet is the one of the decoder's seed
/// and step (and the packet's tensor id).
inline void check(packet_header const& h, std::uint32_t got, std::uint64_t seed, std::uint32_t step) {
  std::uint32_t const want = check_word(random_stream{seed, step, h.param1});
  if (got != want) {
    throw format_error("gradcomp: random_k packet of tensor " + std::to_string(h.param1) +
                       " has check word " + std::to_string(got) + ", the decoder's seed " +
                       std::to_string(seed) + " and step " + std::to_string(step) +
                       " give " + std::to_string(want) +
                       " (decode with the sender's codec_context seed and step; or the packet "
                       "is corrupt)");
  }
}

/// Throws `config_error` unless a tensor of n elements fits random-k's u32 coordinates.
inline void check_size(std::uint64_t n) {
  if (n > UINT32_MAX) {
    throw config_error("gradcomp: random_k handles at most " + std::to_string(UINT32_MAX) +
                       " elements per tensor, got " + std::to_string(n));
  }
}

}  // namespace detail::randomk
GRADCOMP_NAMESPACE_END
