// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `int4_codec`: dense 4-bit quantization, symmetric, with one f32 absmax scale per bucket of
/// 64 elements (4.5 bits per element). Each element rounds to the nearest of the 15 levels
/// -7 s .. 7 s, s = max|x| / 7 over its bucket, so |x - x̂| <= s / 2 (plus float rounding).
/// A bucket of zeros (of either sign) has the scale +0.
///
/// Why this format (Streaming DiLoCo sends its pseudo-gradients in 4 bits):
/// - symmetric, absmax: pseudo-gradients are centred on zero; zero and the sign survive
///   exactly, the bucket's largest magnitude decodes exactly, and a bucket needs one number
///   (min-max would need two for one extra level);
/// - 15 levels, not 16: the 16th code would make the grid lopsided (-8 s .. 7 s);
/// - an f32 scale, not f16: a bucket's scale covers every finite float without overflow or
///   flush to zero, at 0.5 bit per element with buckets of 64 (the block size of common
///   4-bit weight formats);
/// - nearest rounding, not stochastic: half the worst-case error, and deterministic; the codec
///   is meant to run under error feedback (the residual keeps what rounding drops), which is
///   what removes the bias. A stochastic variant would take the header's `variant` 1, reserved.
/// - not the E3M0 float (sign and 3 exponent bits) of the Streaming DiLoCo paper: its grid is
///   logarithmic, so an element near a bucket's maximum errs by up to a third of its value; the
///   uniform grid bounds the error of every element by the same s / 2.
///
/// The wire format is `int4_format` (codec/format/int4.hpp), the element math
/// core/quant/int4.hpp, the kernels cpu/kernels/int4.hpp (byte-identical at every ISA level).
/// Per-rank scales differ, so packets are gathered (aggregation kind gather).

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/int4.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/bytecode.hpp>
#include <gradcomp/cpu/kernels/int4.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Symmetric 4-bit codec with a per-bucket absmax scale (see file comment).
class int4_codec : public detail::codec_base<int4_codec> {
 public:
  static constexpr codec_id id = codec_id::int4;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  /// Nearest rounding is biased (use it under error feedback).
  static constexpr bool unbiased = false;

  /// `bucket` elements per scale (0 = the whole tensor).
  explicit int4_codec(std::uint32_t bucket = 64) : bucket_(bucket) {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return bucket_; }

  static std::uint64_t payload_bytes(std::uint32_t bucket, std::uint64_t n) noexcept {
    return int4_format::payload_bytes(bucket, n);
  }

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return wire_format().max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept {
    return wire_format().bits_per_element();
  }

  packet_header header_for(std::size_t n, dtype t) const { return wire_format().header_for(n, t); }
  static void validate(packet_header const& h) { int4_format::validate(h); }
  /// The wire format of this codec's packets.
  [[nodiscard]] int4_format wire_format() const noexcept { return {bucket_}; }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const&,
              random_stream const&, codec_context const& ctx) const {
    std::size_t const blen = detail::bucket_length(bucket_, n);
    auto* codes = reinterpret_cast<std::uint8_t*>(payload + int4_format::codes_offset(bucket_, n));
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    auto nonfinite = [&](std::size_t b) {
      std::size_t const bad = b + detail::first_nonfinite(x + b, std::min(n, b + blen) - b);
      detail::throw_nonfinite(id, bad, x[bad]);
    };
    if (blen % 16 == 0 && blen <= fused_bucket_limit) {
      // One visit per bucket: its maximum, scale and codes (the second read hits L1).
      cpu::for_each_chunk(n, std::lcm(blen, std::size_t{128}), ctx,
                          [&](std::size_t, std::size_t cb, std::size_t ce) {
                            std::size_t const bad = cpu::kernels::int4_encode_buckets(
                                x, cb, ce, blen, payload, codes, level);
                            if (bad != cpu::kernels::int4_no_bad_bucket) nonfinite(bad * blen);
                          });
      return;
    }
    std::vector<float> inv(detail::bucket_count(bucket_, n));
    detail::bucketed_pass(
        n, blen, ctx,
        [&](std::size_t k, std::size_t b, std::size_t e) {
          std::uint32_t const top = cpu::kernels::int4_absmax_bits(x + b, e - b, level);
          if (top >= 0x7f800000u) nonfinite(b);
          float const m = std::bit_cast<float>(top);
          detail::store_f32(payload + 4 * k, quant::int4_scale(m));
          inv[k] = quant::int4_inverse(m);
        },
        [&](std::size_t cb, std::size_t ce) {
          cpu::kernels::int4_encode(x, cb, ce, blen, inv.data(), codes, level);
        });
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    std::size_t const n = h.count;
    std::size_t const blen = detail::bucket_length(h.param0, n);
    std::size_t const nb = detail::bucket_count(h.param0, n);
    std::vector<float> scales(nb);
    for (std::size_t k = 0; k < nb; ++k) {
      scales[k] = detail::load_f32(payload + 4 * k);
      int4_format::check_scale(k, scales[k]);
    }
    auto const* codes =
        reinterpret_cast<std::uint8_t const*>(payload + int4_format::codes_offset(h.param0, n));
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = !add && cpu::stream_output(4 * n);
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      cpu::kernels::int4_decode(codes, b, e, blen, scales.data(), out, alpha, add, level, stream);
    });
  }

 private:
  // The longest bucket encoded in one visit (its floats stay in L1/L2 between the two reads).
  static constexpr std::size_t fused_bucket_limit = 16384;

  std::uint32_t bucket_;
};

GRADCOMP_NAMESPACE_END
