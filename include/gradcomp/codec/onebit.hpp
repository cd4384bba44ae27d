// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `onebit_codec`: the sign of every element plus one scale (BytePS "onebit").
///
/// - scaled (variant 0): x̂_i = ±mean|x| — the L1-optimal scale for sign compression;
/// - unscaled (variant 1): x̂_i = ±1 — signSGD; summing decoded packets and taking the sign
///   again is majority vote.
///
/// The wire format is `onebit_format` (codec/format/onebit.hpp). Biased; aggregation kind
/// gather. The scale is computed in the canonical order of `onebit_sum_order`
/// (core/quant/onebit.hpp), so packets are identical on every ISA, thread count and backend.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/onebit.hpp>
#include <gradcomp/core/quant/onebit.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/onebit.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <atomic>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Scaled-sign / majority-vote codec (see file comment).
class onebit_codec : public detail::codec_base<onebit_codec> {
 public:
  static constexpr codec_id id = codec_id::onebit;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Scale choice of the decoded signs (`mean_abs`: ±mean|x|; `none`: ±1, signSGD).
  using scaling = onebit_format::scaling;

  /// A onebit codec with the given scaling (default: mean |x|).
  constexpr explicit onebit_codec(scaling s = scaling::mean_abs) noexcept : scaling_(s) {}

  [[nodiscard]] constexpr scaling scale_mode() const noexcept { return scaling_; }

  /// Payload bytes for `n` elements.
  static constexpr std::uint64_t payload_bytes(std::uint64_t n) noexcept {
    return onebit_format::payload_bytes(n);
  }

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return onebit_format::max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept { return 1.0; }

  packet_header header_for(std::size_t n, dtype t) const noexcept {
    return wire_format().header_for(n, t);
  }
  static void validate(packet_header const& h) { onebit_format::validate(h); }
  /// The wire format of this codec's packets.
  [[nodiscard]] constexpr onebit_format wire_format() const noexcept { return {scaling_}; }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const& h,
              random_stream, codec_context const& ctx) const {
    constexpr std::size_t block = onebit_sum_order::block;
    std::byte* bits = payload + 8;
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    if (h.variant != static_cast<std::uint8_t>(scaling::mean_abs)) {
      // Unscaled: the signs and a finiteness check, no sum of |x| (the scale is 1).
      std::atomic<bool> finite{true};
      cpu::for_each_chunk(n, block, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
        if (!cpu::kernels::onebit_pack_signs(x + b, e - b, bits + b / 8, level)) {
          finite.store(false, std::memory_order_relaxed);
        }
      });
      if (!finite.load()) {
        std::size_t const bad = detail::first_nonfinite(x, n);
        detail::throw_nonfinite(id, bad, bad < n ? x[bad] : 0.0f);
      }
      detail::store_f32(payload, quant::onebit_scale(0.0, n, false));
      detail::store_le<std::uint32_t>(payload + 4, 0);
      return;
    }
    std::size_t const blocks = (n + block - 1) / block;
    std::vector<double> sums(blocks);
    cpu::for_each_chunk(n, block, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      std::size_t s = b;
      for (; s + 2 * block <= e; s += 2 * block) {
        cpu::kernels::onebit_pack_pair(x + s, bits + s / 8, sums[s / block], sums[s / block + 1], level);
      }
      for (; s < e; s += block) {
        std::size_t const len = e - s < block ? e - s : block;
        sums[s / block] = cpu::kernels::onebit_pack_block(x + s, len, bits + s / 8, level);
      }
    });
    double total = 0.0;
    for (double s : sums) total += s;
    if (!std::isfinite(total)) {
      std::size_t const bad = detail::first_nonfinite(x, n);
      detail::throw_nonfinite(id, bad, bad < n ? x[bad] : 0.0f);
    }
    float const scale =
        quant::onebit_scale(total, n, h.variant == static_cast<std::uint8_t>(scaling::mean_abs));
    detail::store_f32(payload, scale);
    detail::store_le<std::uint32_t>(payload + 4, 0);
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    float const scale = onebit_format::checked_scale(h, payload);
    std::byte const* bits = payload + 8;
    std::size_t const n = h.count;
    if (n % 8 != 0) onebit_format::check_padding(n, bits[n / 8]);
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    cpu::for_each_chunk(n, 8, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      cpu::kernels::onebit_unpack(bits + b / 8, scale, out + b, e - b, alpha, add, level);
    });
  }

 private:
  scaling scaling_;
};

GRADCOMP_NAMESPACE_END
