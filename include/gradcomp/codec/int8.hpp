// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `int8_codec`: 8-bit min-max quantization per bucket. Each bucket [lo, hi] is split into 255
/// equal steps; elements round to the nearest step (deterministic, error <= step/2) or
/// stochastically (`int8_rounding::stochastic`, unbiased up to float rounding of the step).
///
/// The wire format is `int8_format` (codec/format/int8.hpp), the element math
/// core/quant/int8.hpp. Per-rank ranges differ, so packets are gathered (aggregation kind
/// gather).

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/int8.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/bytecode.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <numeric>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// 8-bit min-max codec (see file comment).
class int8_codec : public detail::codec_base<int8_codec> {
 public:
  static constexpr codec_id id = codec_id::int8;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  /// The nearest-rounding default is biased; `int8_rounding::stochastic` is unbiased.
  static constexpr bool unbiased = false;

  /// `bucket` elements per [lo, hi] range (0 = the whole tensor).
  explicit int8_codec(std::uint32_t bucket = 512, int8_rounding rounding = int8_rounding::nearest)
      : bucket_(bucket), rounding_(int8_format::checked_rounding(rounding)) {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return bucket_; }
  [[nodiscard]] int8_rounding rounding() const noexcept { return rounding_; }

  static std::uint64_t payload_bytes(std::uint32_t bucket, std::uint64_t n) noexcept {
    return int8_format::payload_bytes(bucket, n);
  }

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return wire_format().max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept {
    return wire_format().bits_per_element();
  }

  packet_header header_for(std::size_t n, dtype t) const { return wire_format().header_for(n, t); }
  static void validate(packet_header const& h) { int8_format::validate(h); }
  /// The wire format of this codec's packets.
  [[nodiscard]] int8_format wire_format() const noexcept { return {bucket_, rounding_}; }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const& h,
              random_stream const& rs, codec_context const& ctx) const {
    std::size_t const blen = detail::bucket_length(bucket_, n);
    std::size_t const nb = detail::bucket_count(bucket_, n);
    std::vector<cpu::kernels::int8_bucket> kb(nb);
    auto* codes = reinterpret_cast<std::uint8_t*>(payload + 8 * nb);
    bool const stochastic = h.variant == 1;
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = cpu::stream_output(n);
    detail::bucketed_pass(
        n, blen, ctx,
        [&](std::size_t k, std::size_t b, std::size_t e) {
          float lo = x[b], hi = x[b];
          if (!cpu::kernels::block_minmax(x + b, e - b, lo, hi, level)) {
            std::size_t const bad = b + detail::first_nonfinite(x + b, e - b);
            detail::throw_nonfinite(id, bad, x[bad]);
          }
          detail::store_f32(payload + 8 * k, lo);
          detail::store_f32(payload + 8 * k + 4, hi);
          kb[k] = cpu::kernels::make_int8_bucket(lo, hi);
        },
        [&](std::size_t cb, std::size_t ce) {
          cpu::kernels::int8_encode(x, cb, ce, blen, kb.data(), stochastic, rs, codes, level,
                                    stream);
        });
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    std::size_t const n = h.count;
    std::size_t const blen = detail::bucket_length(h.param0, n);
    std::size_t const nb = detail::bucket_count(h.param0, n);
    std::vector<float> los(nb), steps(nb);
    for (std::size_t k = 0; k < nb; ++k) {
      float const lo = detail::load_f32(payload + 8 * k);
      float const hi = detail::load_f32(payload + 8 * k + 4);
      int8_format::check_range(k, lo, hi);
      los[k] = lo;
      steps[k] = cpu::kernels::int8_step(lo, hi);
    }
    auto const* codes = reinterpret_cast<std::uint8_t const*>(payload + 8 * nb);
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = !add && cpu::stream_output(4 * n);
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      cpu::kernels::int8_decode(codes, b, e, blen, los.data(), steps.data(), out, alpha, add, level,
                                stream);
    });
  }

  // Block interface (codec/detail/codec_base.hpp): blocks of whole buckets and whole
  // 128-element random groups, so each block's bytes are those `encode` writes.
  struct block_scratch {
    std::vector<cpu::kernels::int8_bucket> kb;  // encode's bucket constants, by bucket
    std::vector<float> los, steps;              // decode's, by bucket
  };
  [[nodiscard]] std::size_t block_align(std::size_t n) const noexcept {
    return std::lcm(detail::bucket_length(bucket_, n), std::size_t{128});
  }
  [[nodiscard]] block_scratch block_begin(std::size_t n) const {
    std::size_t const nb = detail::bucket_count(bucket_, n);
    return {std::vector<cpu::kernels::int8_bucket>(nb), std::vector<float>(nb), std::vector<float>(nb)};
  }
  void encode_block(block_scratch& s, float const* x, std::size_t n, std::size_t b, std::size_t e,
                    std::byte* payload, packet_header const& h, random_stream const& rs,
                    cpu::isa level) const {
    std::size_t const blen = detail::bucket_length(bucket_, n);
    std::size_t const nb = detail::bucket_count(bucket_, n);
    for (std::size_t k0 = b; k0 < e; k0 += blen) {
      std::size_t const k1 = k0 + blen < n ? k0 + blen : n;
      float lo = x[k0], hi = x[k0];
      if (!cpu::kernels::block_minmax(x + k0, k1 - k0, lo, hi, level)) {
        std::size_t const bad = k0 + detail::first_nonfinite(x + k0, k1 - k0);
        detail::throw_nonfinite(id, bad, x[bad]);
      }
      detail::store_f32(payload + 8 * (k0 / blen), lo);
      detail::store_f32(payload + 8 * (k0 / blen) + 4, hi);
      s.kb[k0 / blen] = cpu::kernels::make_int8_bucket(lo, hi);
    }
    cpu::kernels::int8_encode(x, b, e, blen, s.kb.data(), h.variant == 1, rs,
                              reinterpret_cast<std::uint8_t*>(payload + 8 * nb), level);
  }
  void decode_block(block_scratch& s, packet_header const& h, std::byte const* payload, float* out,
                    std::size_t b, std::size_t e, float alpha, cpu::isa level) const {
    std::size_t const blen = detail::bucket_length(h.param0, h.count);
    std::size_t const nb = detail::bucket_count(h.param0, h.count);
    for (std::size_t k0 = b; k0 < e; k0 += blen) {
      std::size_t const k = k0 / blen;
      s.los[k] = detail::load_f32(payload + 8 * k);
      s.steps[k] = cpu::kernels::int8_step(s.los[k], detail::load_f32(payload + 8 * k + 4));
    }
    cpu::kernels::int8_decode(reinterpret_cast<std::uint8_t const*>(payload + 8 * nb), b, e, blen, s.los.data(),
                              s.steps.data(), out, alpha, true, level);
  }

 private:
  std::uint32_t bucket_;
  int8_rounding rounding_;
};

GRADCOMP_NAMESPACE_END
