// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Multi-level compression: `recompress_sparse` turns a sparse packet into one with fewer
/// elements, working on the packet alone (cost O(m) in its element count m, never O(n)).
/// GraVAC-style adaptive compression uses it to try higher compression factors without
/// re-reading the gradient.
///
/// - **topk, approx_topk, threshold** (the sparse payload): keeps the k largest |value| of
///   the packet, ties toward the lower index, and writes a packet of the same codec id. A
///   top-m set contains the top-k set for every k ≤ m under the same order, so for f32 values
///   the result is **exactly the packet that compressing the dense tensor to k gives**
///   (`topk_codec::count(k)`, byte for byte; the same holds for an approx_topk or threshold
///   packet, whose support is also a top-m set). With f16 / bf16 values the ranking uses the
///   rounded values, so ties created by rounding go to the lower index: the result is the
///   top-k of the *decoded* packet.
/// - **random_k**: keeps the coordinates of ranks < k of the packet's permutation, i.e.
///   exactly the support of a direct random-k compression to k under the same seed, step and
///   tensor id; every rank sharing the seed keeps the same subset. Unscaled packets come out
///   byte-identical to the direct compression; scaled ones are re-scaled by k_old / k (to
///   float rounding of the direct packet's n/k scale). Needs the sender's seed and step in
///   `ctx`, as decoding does.
///
/// `sparse_packet_support` (codec/format/support.hpp, included) reads the coordinates such a
/// packet carries (DGC's momentum masking).
///
/// A request for k ≥ m returns a copy of the packet, once it is checked like any other. Other
/// codecs are a `config_error`; malformed packets a `format_error`.

#include <gradcomp/codec/detail/select.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/codec/format/support.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/wire.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// Header of a packet `recompress_sparse` accepts, fully validated.
inline packet_header recompress_header(std::span<std::byte const> packet) {
  packet_header const h = read_header(packet);
  if (sparse::is_sparse_payload(h.codec)) {
    sparse::validate(h);
  } else if (h.codec == codec_id::random_k) {
    randomk::validate(h);
  } else {
    throw config_error(
        std::string("gradcomp: recompress_sparse takes topk, approx_topk, threshold or "
                    "random_k packets, got a '") +
        codec_name(h.codec) + "' packet");
  }
  return h;
}

inline std::size_t copy_packet(std::span<std::byte const> packet, std::span<std::byte> out) {
  if (out.size() < packet.size()) {
    throw config_error("gradcomp: recompress_sparse output buffer of " +
                       std::to_string(out.size()) + " bytes cannot hold the " +
                       std::to_string(packet.size()) + "-byte packet");
  }
  std::memcpy(out.data(), packet.data(), packet.size());
  return packet.size();
}

}  // namespace detail

/// Bytes enough for `recompress_sparse(packet, k, ...)`: the header plus min(k, m) elements
/// at their largest encoding (absolute indices for sparse payloads; values only for
/// random_k), or the packet's own size when k ≥ m.
inline std::size_t max_recompressed_bytes(std::span<std::byte const> packet, std::uint64_t k) {
  packet_header const h = detail::recompress_header(packet);
  std::uint64_t const m = h.param0;
  if (k >= m) return packet.size();
  auto const vb = detail::sparse::value_bytes(static_cast<sparse_values>(h.variant & 3u));
  if (h.codec == codec_id::random_k) return static_cast<std::size_t>(header_bytes + 4 + k * vb);
  return static_cast<std::size_t>(header_bytes + k * (4 + vb));
}

/// Re-compresses the sparse `packet` to k elements into `out` (see the file comment);
/// returns the new packet's size. `out` must hold `max_recompressed_bytes(packet, k)` bytes or
/// the exact size. `ctx` supplies the seed and step of random_k packets (ignored otherwise).
inline std::size_t recompress_sparse(std::span<std::byte const> packet, std::uint64_t k,
                                     std::span<std::byte> out, codec_context const& ctx = {}) {
  packet_header const h = detail::recompress_header(packet);
  std::byte const* payload = packet.data() + header_bytes;
  std::uint64_t const m = h.param0;
  auto const v = static_cast<sparse_values>(h.variant & 3u);
  auto const vb = static_cast<std::size_t>(detail::sparse::value_bytes(v));
  if (h.codec == codec_id::random_k) {
    detail::randomk::check(h, payload, ctx);
    if (k >= m) return detail::copy_packet(packet, out);
    random_stream const rs{ctx.seed, ctx.step, h.param1};
    auto const ranked = detail::randomk::ranked_indices(h.count, m, rs, ctx);
    std::size_t const total = header_bytes + 4 + static_cast<std::size_t>(k) * vb;
    if (out.size() < total) {
      throw config_error("gradcomp: recompressed random_k packet needs " + std::to_string(total) +
                         " bytes, the output buffer has " + std::to_string(out.size()));
    }
    packet_header nh = h;
    nh.param0 = static_cast<std::uint32_t>(k);
    nh.payload_bytes = 4 + k * vb;
    write_header(out, nh);
    std::memcpy(out.data() + header_bytes, payload, 4);  // the check word
    bool const scaled = (h.variant & 4u) != 0;
    float const rescale =
        scaled ? static_cast<float>(static_cast<double>(m) / static_cast<double>(k)) : 1.0f;
    std::byte const* vals = payload + 4;
    std::byte* nv = out.data() + header_bytes + 4;
    std::size_t j = 0;
    for (std::size_t p = 0; p < ranked.size(); ++p) {
      if ((ranked[p] & 0xffffffffu) >= k) continue;
      float const f = detail::sparse::value_at(v, vals, p);
      detail::sparse::store_value(v, nv, j++, scaled ? quant::scale_saturated(f, rescale) : f);
    }
    return total;
  }
  // The indices are checked before the copy too: a malformed packet is a format_error
  // whatever k is, never passed on as a valid one.
  std::vector<std::uint32_t> idx;
  detail::sparse::read_indices(h, payload, idx);
  if (k >= m) return detail::copy_packet(packet, out);
  bool const delta = (h.variant >> 2) == 1;
  std::byte const* vals = payload + (delta ? detail::sparse::delta_bytes(m, h.param1) : 4 * m);
  std::vector<float> val(static_cast<std::size_t>(m));
  std::vector<std::uint32_t> keys(val.size());
  for (std::size_t j = 0; j < val.size(); ++j) {
    val[j] = detail::sparse::value_at(v, vals, j);
    keys[j] = detail::select::key(val[j]);
  }
  detail::select::cut const c = detail::select::find_cut(keys, k, k, k);
  std::vector<std::uint32_t> nidx;
  std::vector<float> nval;
  nidx.reserve(static_cast<std::size_t>(k));
  nval.reserve(static_cast<std::size_t>(k));
  std::uint64_t eq = c.eq;
  for (std::size_t j = 0; j < val.size(); ++j) {
    if (keys[j] > c.t || (keys[j] == c.t && eq > 0)) {
      if (keys[j] == c.t) --eq;
      nidx.push_back(idx[j]);
      nval.push_back(val[j]);
    }
  }
  packet_header const nh = detail::sparse::plan(h.codec, h.type, h.count, nidx, v);
  if (out.size() < nh.packet_bytes()) {
    throw config_error("gradcomp: recompressed " + std::string(codec_name(h.codec)) +
                       " packet needs " + std::to_string(nh.packet_bytes()) +
                       " bytes, the output buffer has " + std::to_string(out.size()));
  }
  write_header(out, nh);
  std::byte* np = out.data() + header_bytes;
  std::size_t const ib = detail::sparse::write_indices(np, nh, nidx);
  for (std::size_t j = 0; j < nval.size(); ++j) detail::sparse::store_value(v, np + ib, j, nval[j]);
  (void)vb;
  return static_cast<std::size_t>(nh.packet_bytes());
}

GRADCOMP_NAMESPACE_END
