// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Whole-model (global) top-k: exact (`topk_codec`) or approximate (`approx_topk_codec`)
/// selection over a list of tensors treated as one concatenated vector, k = `k_for(N)` with
/// N the total element count.
///
/// The result is **one packet per tensor**, each an ordinary top-k (or approx_topk) packet of
/// that tensor with its own element count m_i (possibly 0 or all of it); the union of their
/// supports is the global selection (ties toward the lower position in the concatenation,
/// i.e. the earlier tensor first). Per-tensor packets are what the collective layer wants:
/// each tensor keeps its own id, dtype, error-feedback state and decoder, tensors can be
/// bucketed or sent as soon as they are ready, and no index exceeds 32 bits. Each per-tensor
/// packet is itself the exact top-m_i of its tensor.
///
/// When to use which: **layer-wise** selection (the codec on each tensor) keeps the same
/// fraction of every layer, which protects layers with small gradients (biases, norms,
/// late layers) from being starved, and lets each tensor be compressed as soon as its gradient
/// is ready (overlap with back-propagation). **Whole-model** selection keeps the k largest
/// entries of the whole gradient, which minimises the dropped energy ‖x − x̂‖² for a given
/// budget (the best choice with error feedback, where starved layers catch up through the
/// residual), but needs every gradient before it can start and lets a few layers take most
/// of the budget.

#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/detail/select.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/tensor.hpp>

#include <concepts>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Codecs that whole-model selection supports.
template <class C>
concept whole_model_codec = std::same_as<C, topk_codec> || std::same_as<C, approx_topk_codec>;

/// A whole-model selection: ascending indices per tensor.
struct whole_model_selection {
  std::vector<std::vector<std::uint32_t>> indices;  ///< per tensor, in the order given
  std::uint64_t k = 0;                              ///< the target count over all tensors
  std::uint64_t selected = 0;                       ///< elements selected over all tensors
};

namespace detail {

template <element T>
std::vector<select::segment> whole_model_segments(std::span<tensor_view<T const> const> tensors,
                                                  std::vector<std::vector<float>>& tmp) {
  std::vector<select::segment> segs(tensors.size());
  if constexpr (!std::same_as<T, float>) tmp.resize(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::size_t const n = tensors[t].size();
    if (n > UINT32_MAX) {
      throw config_error("gradcomp: whole-model top-k handles at most " +
                         std::to_string(UINT32_MAX) + " elements per tensor, tensor " +
                         std::to_string(t) + " has " + std::to_string(n));
    }
    if constexpr (std::same_as<T, float>) {
      segs[t] = {tensors[t].data(), n};
    } else {
      tmp[t].resize(n);
      for (std::size_t i = 0; i < n; ++i) tmp[t][i] = to_float(tensors[t][i]);
      segs[t] = {tmp[t].data(), n};
    }
  }
  return segs;
}

template <whole_model_codec C>
select::request whole_model_request(C const& c, std::uint64_t k) {
  if constexpr (std::same_as<C, topk_codec>) {
    return {k, k, k, 0.001, 4096};
  } else {
    return c.request_for(k);
  }
}

}  // namespace detail

/// Selects the top `c.k_for(N)` elements (exactly, or within the tolerance of an
/// `approx_topk_codec`) of `tensors` treated as one vector of N elements.
template <whole_model_codec C, element T>
whole_model_selection select_whole_model(C const& c, std::span<tensor_view<T const> const> tensors,
                                         codec_context const& ctx = {}) {
  std::vector<std::vector<float>> tmp;
  auto const segs = detail::whole_model_segments(tensors, tmp);
  std::uint64_t total = 0;
  for (auto const& s : segs) total += s.n;
  std::uint64_t const k = c.k_for(static_cast<std::size_t>(total));
  whole_model_selection out;
  out.k = k;
  out.indices = detail::select::top(segs, detail::whole_model_request(c, k), C::id, ctx);
  for (auto const& v : out.indices) out.selected += v.size();
  return out;
}

/// Bytes enough for the whole-model packet of a tensor of `n` elements when the tensors hold
/// `total` elements in all: header + min(n, most selected over all) × (4 + value bytes).
template <whole_model_codec C>
std::size_t whole_model_max_bytes(C const& c, std::size_t n, std::size_t total) {
  std::uint64_t most = c.k_for(total);
  if constexpr (std::same_as<C, approx_topk_codec>) most = c.window(most).second;
  std::size_t const m = std::min<std::size_t>(n, static_cast<std::size_t>(most));
  return header_bytes +
         m * static_cast<std::size_t>(4 + detail::sparse::value_bytes(c.value_type()));
}

/// Compresses `tensors` with whole-model selection into one packet per tensor: `out[t]`
/// receives tensor t's packet (codec id of `C`, the sparse payload, its own m_t) and must hold
/// `whole_model_max_bytes(c, tensors[t].size(), N)` bytes or the exact packet. Returns the
/// packet sizes. Decode each packet with `C` (or `decompress_any`) like any other.
template <whole_model_codec C, element T>
std::vector<std::size_t> compress_whole_model(C const& c,
                                              std::span<tensor_view<T const> const> tensors,
                                              std::span<std::span<std::byte> const> out,
                                              codec_context const& ctx = {}) {
  if (out.size() != tensors.size()) {
    throw config_error("gradcomp: compress_whole_model got " + std::to_string(tensors.size()) +
                       " tensors but " + std::to_string(out.size()) +
                       " output buffers (one per tensor expected)");
  }
  std::vector<std::vector<float>> tmp;
  auto const segs = detail::whole_model_segments(tensors, tmp);
  std::uint64_t total = 0;
  for (auto const& s : segs) total += s.n;
  auto const sel = detail::select::top(
      segs, detail::whole_model_request(c, c.k_for(static_cast<std::size_t>(total))), C::id, ctx);
  std::vector<packet_header> heads(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    heads[t] = detail::sparse::plan(C::id, dtype_of<T>, segs[t].n, sel[t], c.value_type());
    if (out[t].size() < heads[t].packet_bytes()) {
      throw config_error(std::string("gradcomp: ") + codec_name(C::id) +
                         " whole-model packet of tensor " + std::to_string(t) + " needs " +
                         std::to_string(heads[t].packet_bytes()) +
                         " bytes, its output buffer has " + std::to_string(out[t].size()));
    }
  }
  std::vector<std::size_t> sizes(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    write_header(out[t], heads[t]);
    detail::sparse::write(out[t].data() + header_bytes, heads[t], sel[t], segs[t].x);
    sizes[t] = static_cast<std::size_t>(heads[t].packet_bytes());
  }
  return sizes;
}

GRADCOMP_NAMESPACE_END
