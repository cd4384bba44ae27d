// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `natural_codec`: natural compression (Horváth et al. 2019) — each element is rounded
/// stochastically to one of the two powers of two around it, so E[x̂] = x and the relative
/// variance is at most 1/8. One byte per element: the sign and the exponent counted down from
/// the bucket's largest exponent, which costs one byte per bucket.
///
/// The wire format is `natural_format` (codec/format/natural.hpp), the element math
/// core/quant/natural.hpp. Elements below 2^(max(1, E-125) - 127) round stochastically to 0 or
/// that power. Inputs with |x| >= 2^127 (could round to infinity) or non-finite raise
/// `numeric_error`.

#include <gradcomp/codec/detail/codec_base.hpp>
#include <gradcomp/codec/format/natural.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/kernels/bytecode.hpp>
#include <gradcomp/cpu/kernels/stream.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <atomic>
#include <numeric>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Natural compression codec (see file comment).
class natural_codec : public detail::codec_base<natural_codec> {
 public:
  static constexpr codec_id id = codec_id::natural;
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = true;

  /// `bucket` elements per exponent byte (0 = whole tensor).
  explicit natural_codec(std::uint32_t bucket = 512) noexcept : bucket_(bucket) {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return bucket_; }

  static std::uint64_t payload_bytes(std::uint32_t bucket, std::uint64_t n) noexcept {
    return natural_format::payload_bytes(bucket, n);
  }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return wire_format().max_compressed_bytes(n);
  }
  [[nodiscard]] double bits_per_element() const noexcept {
    return wire_format().bits_per_element();
  }

  packet_header header_for(std::size_t n, dtype t) const { return wire_format().header_for(n, t); }
  static void validate(packet_header const& h) { natural_format::validate(h); }
  /// The wire format of this codec's packets.
  [[nodiscard]] natural_format wire_format() const noexcept { return {bucket_}; }

  void encode(float const* x, std::size_t n, std::byte* payload, packet_header const&,
              random_stream const& rs, codec_context const& ctx) const {
    std::size_t const blen = detail::bucket_length(bucket_, n);
    std::size_t const nb = detail::bucket_count(bucket_, n);
    auto* emax = reinterpret_cast<std::uint8_t*>(payload);
    auto* codes = reinterpret_cast<std::uint8_t*>(payload + nb);
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    detail::bucketed_pass(
        n, blen, ctx,
        [&](std::size_t k, std::size_t b, std::size_t e) { emax[k] = bucket_exponent(x, b, e, level); },
        [&](std::size_t cb, std::size_t ce) {
          cpu::kernels::natural_encode(x, cb, ce, blen, emax, rs, codes, level);
        });
  }

  static void decode(packet_header const& h, std::byte const* payload, float* out, float alpha,
                     bool add, codec_context const& ctx) {
    std::size_t const n = h.count;
    std::size_t const blen = detail::bucket_length(h.param0, n);
    std::size_t const nb = detail::bucket_count(h.param0, n);
    auto const* emax = reinterpret_cast<std::uint8_t const*>(payload);
    for (std::size_t k = 0; k < nb; ++k) natural_format::check_exponent(k, emax[k]);
    auto const* codes = reinterpret_cast<std::uint8_t const*>(payload + nb);
    std::atomic<bool> ok{true};
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = !add && cpu::stream_output(4 * n);
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      if (!cpu::kernels::natural_decode(codes, b, e, blen, emax, out, alpha, add, level, stream)) {
        ok.store(false, std::memory_order_relaxed);
      }
    });
    if (!ok.load()) natural_format::throw_bad_code();
  }

  // Block interface (codec/detail/codec_base.hpp): blocks of whole buckets and whole
  // 128-element random groups, so each block's bytes are those `encode` writes.
  struct block_scratch {};
  [[nodiscard]] std::size_t block_align(std::size_t n) const noexcept {
    return std::lcm(detail::bucket_length(bucket_, n), std::size_t{128});
  }
  [[nodiscard]] block_scratch block_begin(std::size_t) const noexcept { return {}; }
  void encode_block(block_scratch&, float const* x, std::size_t n, std::size_t b, std::size_t e,
                    std::byte* payload, packet_header const&, random_stream const& rs,
                    cpu::isa level) const {
    std::size_t const blen = detail::bucket_length(bucket_, n);
    auto* emax = reinterpret_cast<std::uint8_t*>(payload);
    for (std::size_t k0 = b; k0 < e; k0 += blen) {
      emax[k0 / blen] = bucket_exponent(x, k0, k0 + blen < n ? k0 + blen : n, level);
    }
    cpu::kernels::natural_encode(x, b, e, blen, emax, rs,
                                 reinterpret_cast<std::uint8_t*>(payload + detail::bucket_count(bucket_, n)), level);
  }
  void decode_block(block_scratch&, packet_header const& h, std::byte const* payload, float* out,
                    std::size_t b, std::size_t e, float alpha, cpu::isa level) const {
    std::size_t const blen = detail::bucket_length(h.param0, h.count);
    auto const* emax = reinterpret_cast<std::uint8_t const*>(payload);
    // the packet is the one just written: every code is one its bucket can produce
    (void)cpu::kernels::natural_decode(
        reinterpret_cast<std::uint8_t const*>(payload + detail::bucket_count(h.param0, h.count)), b, e, blen, emax,
        out, alpha, true, level);
  }

 private:
  // The largest exponent of bucket [b, e): `numeric_error` for a non-finite value or one that
  // rounding up would overflow.
  static std::uint8_t bucket_exponent(float const* x, std::size_t b, std::size_t e, cpu::isa level) {
    unsigned const m = cpu::kernels::block_max_exponent(x + b, e - b, level);
    if (m > natural_format::max_exponent) {
      std::size_t const bad = b + detail::first_nonfinite(x + b, e - b);
      if (bad < e) detail::throw_nonfinite(id, bad, x[bad]);
      natural_format::throw_too_large(b);
    }
    return static_cast<std::uint8_t>(m);
  }

  std::uint32_t bucket_;
};

GRADCOMP_NAMESPACE_END
