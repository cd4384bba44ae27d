// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `natural_codec`: natural compression (Horváth et al. 2019) — each element is rounded
/// stochastically to one of the two powers of two around it, so E[x̂] = x and the relative
/// variance is at most 1/8. One byte per element: the sign and the exponent counted down from
/// the bucket's largest exponent, which costs one byte per bucket.
///
/// Payload: nb bytes E (largest biased float32 exponent of the bucket, at most 253), then n
/// bytes c = k | sign << 7 where k = 0 means zero and k in 1..min(E+1, 127) means magnitude
/// 2^(E + 2 - k - 127). Elements below 2^(max(1, E-125) - 127) round stochastically to 0 or that
/// power. Inputs with |x| >= 2^127 (could round to infinity) or non-finite raise
/// `numeric_error`. Header: param0 = bucket (0 = whole tensor).

#include <gradcomp/codec/detail/codec_base.hpp>
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
    if (n > UINT64_MAX / 4) return 0;
    std::uint64_t const nb = detail::bucket_count(bucket, n);
    return nb + n;
  }
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    return header_bytes + static_cast<std::size_t>(payload_bytes(bucket_, n));
  }
  [[nodiscard]] double bits_per_element() const noexcept {
    return 8.0 + (bucket_ != 0 ? 8.0 / bucket_ : 0.0);
  }

  packet_header header_for(std::size_t n, dtype t) const {
    std::uint64_t const bytes = payload_bytes(bucket_, n);
    if (n != 0 && bytes == 0) throw config_error("gradcomp: tensor too large for a natural packet");
    return {id, t, 0, n, bytes, bucket_, 0};
  }

  static void validate(packet_header const& h) {
    if (h.variant != 0 || h.param1 != 0) {
      throw format_error("gradcomp: natural packet has non-zero variant or param1");
    }
    std::uint64_t const bytes = payload_bytes(h.param0, h.count);
    if (h.count != 0 && bytes == 0) throw format_error("gradcomp: natural packet count is impossible");
    detail::expect_payload(h, bytes);
  }

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
    for (std::size_t k = 0; k < nb; ++k) {
      if (emax[k] > 253) {
        throw format_error("gradcomp: natural packet has bucket exponent " + std::to_string(emax[k]) +
                           " at bucket " + std::to_string(k) + " (expected at most 253)");
      }
    }
    auto const* codes = reinterpret_cast<std::uint8_t const*>(payload + nb);
    std::atomic<bool> ok{true};
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    bool const stream = !add && cpu::stream_output(4 * n);
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      if (!cpu::kernels::natural_decode(codes, b, e, blen, emax, out, alpha, add, level, stream)) {
        ok.store(false, std::memory_order_relaxed);
      }
    });
    if (!ok.load()) {
      throw format_error("gradcomp: natural packet holds a code its bucket exponent cannot produce");
    }
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
    if (m >= 254) {
      std::size_t const bad = b + detail::first_nonfinite(x + b, e - b);
      if (bad < e) detail::throw_nonfinite(id, bad, x[bad]);
      throw numeric_error("gradcomp: natural compression cannot encode |x| >= 2^127 (bucket at element " +
                          std::to_string(b) + "): rounding up would overflow float32");
    }
    return static_cast<std::uint8_t>(m);
  }

  std::uint32_t bucket_;
};

GRADCOMP_NAMESPACE_END
