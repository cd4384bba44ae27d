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
/// Payload: f32 scale, u32 reserved (0), then ceil(n/8) bytes of sign bits (bit i%8 of byte
/// i/8 is 1 iff x_i < 0; -0 and +0 are positive; unused high bits of the last byte are 0).
/// Biased; aggregation kind gather. The scale is computed in the canonical order of
/// `onebit_sum_order`, so packets are identical on every ISA, thread count and backend.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/onebit.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Scaled-sign / majority-vote codec (see file comment).
class onebit_codec : public detail::codec_base<onebit_codec> {
 public:
  static constexpr codec_id id = codec_id::onebit;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Scale choice of the decoded signs.
  enum class scaling : std::uint8_t {
    mean_abs = 0,  ///< ±mean|x| (BytePS "scaling on")
    none = 1,      ///< ±1 (signSGD, majority vote when summed and re-signed)
  };

  /// A onebit codec with the given scaling (default: mean |x|).
  constexpr explicit onebit_codec(scaling s = scaling::mean_abs) noexcept : scaling_(s) {}

  [[nodiscard]] constexpr scaling scale_mode() const noexcept { return scaling_; }

  /// Payload bytes for `n` elements.
  static constexpr std::uint64_t payload_bytes(std::uint64_t n) noexcept { return 8 + (n + 7) / 8; }

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    return header_bytes + static_cast<std::size_t>(payload_bytes(n));
  }
  [[nodiscard]] double bits_per_element() const noexcept { return 1.0; }

  packet_header header_for(std::size_t n, dtype t) const noexcept {
    return {id, t, static_cast<std::uint8_t>(scaling_), n, payload_bytes(n), 0, 0};
  }

  static void validate(packet_header const& h) {
    if (h.variant > 1 || h.param0 != 0 || h.param1 != 0) {
      throw format_error("gradcomp: onebit packet has variant " + std::to_string(h.variant) +
                         " (expected 0 or 1) or non-zero parameters");
    }
    if (h.count > UINT64_MAX - 64) throw format_error("gradcomp: onebit count is impossible");
    detail::expect_payload(h, payload_bytes(h.count));
  }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const& h,
              random_stream, codec_context const& ctx) const {
    constexpr std::size_t block = onebit_sum_order::block;
    std::size_t const blocks = (n + block - 1) / block;
    std::vector<double> sums(blocks);
    std::byte* bits = payload + 8;
    cpu::isa const level = cpu::effective_isa(ctx.isa);
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
    float scale = 1.0f;
    if (h.variant == static_cast<std::uint8_t>(scaling::mean_abs)) {
      scale = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
    }
    detail::store_f32(payload, scale);
    detail::store_le<std::uint32_t>(payload + 4, 0);
  }

  /// Checks the first 8 payload bytes (scale and reserved word) of a packet with header `h`
  /// and returns the scale; throws `format_error`. Shared with the CUDA decoder.
  static float checked_scale(packet_header const& h, std::byte const* payload) {
    float const scale = detail::load_f32(payload);
    if (!std::isfinite(scale) || std::signbit(scale)) {
      throw format_error("gradcomp: onebit packet has scale " + std::to_string(scale) +
                         " (expected a finite value >= +0)");
    }
    if (h.variant == static_cast<std::uint8_t>(scaling::none) && scale != 1.0f) {
      throw format_error("gradcomp: unscaled onebit packet has scale " + std::to_string(scale) +
                         " (expected 1)");
    }
    if (detail::load_le<std::uint32_t>(payload + 4) != 0) {
      throw format_error("gradcomp: onebit packet has a non-zero reserved word");
    }
    return scale;
  }

  /// Checks that the unused high bits of the last sign byte `last` of an n-element packet are 0.
  static void check_padding(std::uint64_t n, std::byte last) {
    if (n % 8 != 0 && (static_cast<unsigned>(last) >> (n % 8)) != 0) {
      throw format_error("gradcomp: onebit packet has set padding bits after element " +
                         std::to_string(n));
    }
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    float const scale = checked_scale(h, payload);
    std::byte const* bits = payload + 8;
    std::size_t const n = h.count;
    if (n % 8 != 0) check_padding(n, bits[n / 8]);
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    cpu::for_each_chunk(n, 8, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      cpu::kernels::onebit_unpack(bits + b / 8, scale, out + b, e - b, alpha, add, level);
    });
  }

 private:
  scaling scaling_;
};

GRADCOMP_NAMESPACE_END
