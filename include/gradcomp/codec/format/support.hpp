// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `sparse_packet_support`: the coordinates a sparse packet carries — the ascending indices of
/// a topk, approx_topk or threshold packet, or the coordinates a random_k packet selects under
/// the decoder's seed and step — whatever their values decode to (a selected value may round to
/// zero in f16). DGC's momentum masking reads it (feedback/dgc.hpp, and on the device
/// cuda/feedback.cuh). Backend-neutral: wire-format code only, no CPU kernels or thread pool.

#include <gradcomp/codec/format/randomk.hpp>
#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The support of a sparse packet: the ascending coordinates a topk, approx_topk, threshold or
/// random_k packet carries. Empty optional for any other packet (its codec sends every
/// coordinate). random_k needs the sender's seed and step in `ctx` (its check word is checked
/// against them). Malformed packets: `format_error`.
inline std::optional<std::vector<std::uint32_t>> sparse_packet_support(std::span<std::byte const> packet,
                                                                       codec_context const& ctx = {}) {
  packet_header const h = read_header(packet);
  std::vector<std::uint32_t> idx;
  if (detail::sparse::is_sparse_payload(h.codec)) {
    detail::sparse::validate(h);
    detail::sparse::read_indices(h, packet.data() + header_bytes, idx);
    return idx;
  }
  if (h.codec != codec_id::random_k) return std::nullopt;
  detail::randomk::validate(h);
  detail::randomk::check(h, detail::load_le<std::uint32_t>(packet.data() + header_bytes), ctx.seed, ctx.step);
  // The coordinates of ranks 0..k−1 of the permutation, ascending (random-k's selection S(k)).
  auto const pi = detail::randomk::permutation(h.count, random_stream{ctx.seed, ctx.step, h.param1});
  idx.resize(static_cast<std::size_t>(h.param0));
  for (std::size_t j = 0; j < idx.size(); ++j) idx[j] = pi(j);
  std::sort(idx.begin(), idx.end());
  return idx;
}

GRADCOMP_NAMESPACE_END
