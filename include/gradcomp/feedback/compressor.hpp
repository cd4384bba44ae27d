// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `compressor<Codec, Feedback>`: a codec composed with an error-feedback policy, holding one
/// feedback state per tensor id. The codec may be replaced between steps (a controller changing
/// the compression factor); the residual carries over, so no gradient mass is lost.
///
/// Saved state format (little-endian): "GCEF", u8 version 1, u8 feedback_id, u16 0,
/// u32 tensor count, u32 0, then per tensor (ascending id): u32 id, u64 n, n x f32, where the n
/// floats are the policy state's `values()` (the residual, n = the tensor's elements; for
/// `dgc_feedback` momentum and accumulation, n = twice the elements).

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// A codec with error feedback and per-tensor state (see file comment).
template <codec_operations Codec, class Feedback = residual_feedback>
  requires feedback_policy<Feedback, Codec>
class compressor {
 public:
  using codec_type = Codec;
  using feedback_type = Feedback;
  using state_type = typename Feedback::state;

  explicit compressor(Codec c = Codec{}, Feedback f = Feedback{})
      : codec_(std::move(c)), feedback_(std::move(f)) {}

  /// The codec; assign a new one to change parameters between steps.
  [[nodiscard]] Codec& codec() noexcept { return codec_; }
  [[nodiscard]] Codec const& codec() const noexcept { return codec_; }
  [[nodiscard]] Feedback const& feedback() const noexcept { return feedback_; }

  /// Upper bound of a packet for `n` elements.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return codec_.max_compressed_bytes(n);
  }

  /// Compresses gradient `g` with error feedback into `out`; returns the packet size. State is
  /// keyed by `g.id()`; on an exception it is left unchanged.
  template <element T>
  std::size_t compress(tensor_view<T const> g, std::span<std::byte> out, codec_context const& ctx = {}) {
    if (auto it = states_.find(g.id()); it != states_.end()) {
      return feedback_.compress(codec_, it->second, g, out, ctx);
    }
    state_type fresh;  // enters the map only once a step has succeeded
    std::size_t const bytes = feedback_.compress(codec_, fresh, g, out, ctx);
    states_.emplace(g.id(), std::move(fresh));
    return bytes;
  }

  /// Decodes a packet (any sender) into `out`.
  template <element T>
  void decompress(std::span<std::byte const> packet, std::span<T> out, codec_context const& ctx = {}) const {
    codec_.decompress(packet, out, ctx);
  }

  /// Adds `alpha` times a decoded packet to `out`.
  template <element T>
  void decompress_add(std::span<std::byte const> packet, std::span<T> out, float alpha = 1.0f,
                      codec_context const& ctx = {}) const {
    codec_.decompress_add(packet, out, alpha, ctx);
  }

  /// Feedback state of tensor `id` (created empty if absent).
  [[nodiscard]] state_type& state(tensor_id id) { return states_[id]; }
  /// Forgets all state (e.g. after the model was re-initialised).
  void reset() { states_.clear(); }

  /// Serializes every tensor's state.
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> out(16);
    std::memcpy(out.data(), "GCEF", 4);
    out[4] = std::byte{1};
    out[5] = static_cast<std::byte>(Feedback::id);
    detail::store_le<std::uint16_t>(out.data() + 6, 0);
    detail::store_le<std::uint32_t>(out.data() + 8, static_cast<std::uint32_t>(states_.size()));
    detail::store_le<std::uint32_t>(out.data() + 12, 0);
    for (auto const& [id, s] : states_) {
      std::span<float const> v = s.values();
      std::size_t const at = out.size();
      out.resize(at + 12 + 4 * v.size());
      detail::store_le<std::uint32_t>(out.data() + at, static_cast<std::uint32_t>(id));
      detail::store_le<std::uint64_t>(out.data() + at + 4, v.size());
      for (std::size_t i = 0; i < v.size(); ++i) detail::store_f32(out.data() + at + 12 + 4 * i, v[i]);
    }
    return out;
  }

  /// Restores state written by `save` (replacing all current state). Throws `format_error` on a
  /// malformed buffer or a different feedback policy; the current state is kept then.
  void load(std::span<std::byte const> in) {
    auto fail = [](std::string const& what) -> void {
      throw format_error("gradcomp: error-feedback state: " + what);
    };
    if (in.size() < 16 || std::memcmp(in.data(), "GCEF", 4) != 0) fail("missing \"GCEF\" magic");
    if (static_cast<unsigned>(in[4]) != 1) fail("unsupported version " + std::to_string(static_cast<unsigned>(in[4])));
    if (static_cast<feedback_id>(in[5]) != Feedback::id) {
      fail("saved by feedback policy " + std::to_string(static_cast<unsigned>(in[5])) + ", this is " +
           std::to_string(static_cast<unsigned>(Feedback::id)));
    }
    std::uint32_t const count = detail::load_le<std::uint32_t>(in.data() + 8);
    std::map<tensor_id, state_type> restored;
    std::size_t at = 16;
    for (std::uint32_t t = 0; t < count; ++t) {
      if (in.size() - at < 12) fail("truncated tensor record " + std::to_string(t));
      auto const id = static_cast<tensor_id>(detail::load_le<std::uint32_t>(in.data() + at));
      std::uint64_t const n = detail::load_le<std::uint64_t>(in.data() + at + 4);
      if (n > (in.size() - at - 12) / 4) fail("tensor record " + std::to_string(t) + " claims " + std::to_string(n) + " values beyond the buffer");
      if (restored.count(id) != 0) fail("tensor id " + std::to_string(static_cast<unsigned>(id)) + " appears twice");
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = detail::load_f32(in.data() + at + 12 + 4 * i);
      restored[id].assign(v);
      at += 12 + 4 * n;
    }
    if (at != in.size()) fail(std::to_string(in.size() - at) + " trailing bytes");
    states_ = std::move(restored);
  }

 private:
  Codec codec_;
  Feedback feedback_;
  std::map<tensor_id, state_type> states_;
};

GRADCOMP_NAMESPACE_END
