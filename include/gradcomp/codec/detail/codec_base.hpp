// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Shared front end of the CPU codecs: buffer checks, header writing and validation, element
/// type conversion. A codec derives from `codec_base<Self>` and supplies float kernels:
///
/// - `packet_header header_for(std::size_t n, dtype t) const` — the header it will write;
/// - `static void validate(packet_header const&)` — codec fields and payload size of a packet
///   (throws `format_error`);
/// - `void encode(float const*, std::size_t n, std::byte* payload, packet_header const&,
///   random_stream, codec_context const&) const`;
/// - `static void decode(packet_header const&, std::byte const* payload, float* out, float alpha,
///   bool add, codec_context const&)` — writes `out = x̂` or `out += alpha * x̂`.
///
/// Codecs that can work on 16-bit elements without converting them (identity, fp16, bf16)
/// also provide `encode_typed<T>` / `decode_typed<T>`, which the front end prefers.
///
/// Codecs whose packet bytes for elements [b, e) depend only on x[b, e) (given block boundaries
/// at multiples of an alignment) also provide the block interface that fuses error feedback
/// with compression (`compress_fused`, concepts/codec.hpp):
/// - `std::size_t block_align(std::size_t n) const` — block boundaries are multiples of it;
/// - `block_scratch block_begin(std::size_t n) const` — per-call working memory (a type of the
///   codec's own);
/// - `void encode_block(block_scratch&, float const* x, std::size_t n, std::size_t b,
///   std::size_t e, std::byte* payload, packet_header const&, random_stream const&, cpu::isa)
///   const` — the payload bytes of elements [b, e), exactly as `encode` writes them;
/// - `void decode_block(block_scratch&, packet_header const&, std::byte const* payload, float*
///   out, std::size_t b, std::size_t e, float alpha, cpu::isa) const` — `out[i] += alpha * x̂_i`
///   for i in [b, e), exactly as `decode` with `add` computes it.
/// `x` and `out` point at element 0 of the whole tensor. The payload is not validated: it is the
/// one just written.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <bit>
#include <cmath>
#include <numeric>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Throws `config_error` unless an output buffer of `room` bytes holds a packet of `total` bytes
/// for `n` elements of codec `id`.
inline void check_room(codec_id id, std::size_t n, std::uint64_t total, std::size_t room) {
  if (room < total) {
    throw config_error(std::string("gradcomp: ") + codec_name(id) + " packet for " + std::to_string(n) +
                       " elements needs " + std::to_string(total) + " bytes, the output buffer has " +
                       std::to_string(room));
  }
}

/// Index of the first non-finite element of `x[0, n)`, or `n`.
template <element T>
std::size_t first_nonfinite(T const* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(to_float(x[i]))) return i;
  }
  return n;
}

/// Runs `meta(k, b, e)` for every bucket k = [b, e) of length `blen` and `body(cb, ce)` over
/// chunks aligned to 128 elements and to whole buckets. Each chunk goes in blocks of whole
/// buckets of about `cpu::bucketed_pass_block` elements, each block's buckets before its body,
/// so the body reads the block again from L1 rather than from L2. Buckets too large for that
/// get all their `meta` first, sequentially, then the bodies in parallel.
template <class Meta, class Body>
void bucketed_pass(std::size_t n, std::size_t blen, codec_context const& ctx, Meta&& meta,
                   Body&& body) {
  std::size_t const align = std::lcm(blen, std::size_t{128});
  if (align <= (std::size_t{1} << 20)) {
    std::size_t const block = (cpu::bucketed_pass_block + align - 1) / align * align;
    cpu::for_each_chunk(n, align, ctx, [&](std::size_t, std::size_t cb, std::size_t ce) {
      for (std::size_t bb = cb; bb < ce; bb += block) {
        std::size_t const be = ce - bb < block ? ce : bb + block;
        for (std::size_t b = bb; b < be; b += blen) meta(b / blen, b, b + blen < be ? b + blen : be);
        body(bb, be);
      }
    });
    return;
  }
  for (std::size_t b = 0; b < n; b += blen) meta(b / blen, b, b + blen < n ? b + blen : n);
  cpu::for_each_chunk(n, 128, ctx, [&](std::size_t, std::size_t cb, std::size_t ce) { body(cb, ce); });
}

/// A codec with the block interface (see the file comment).
template <class C>
concept block_codec = requires(C const& c, typename C::block_scratch& s, float* x, std::size_t n,
                               std::byte* payload, std::byte const* cpayload, packet_header const& h,
                               random_stream const& rs, cpu::isa level) {
  { c.block_align(n) } -> std::same_as<std::size_t>;
  { c.block_begin(n) } -> std::same_as<typename C::block_scratch>;
  c.encode_block(s, x, n, n, n, payload, h, rs, level);
  c.decode_block(s, h, cpayload, x, n, n, 1.0f, level);
};

template <class Self>
class codec_base {
  static_assert(std::endian::native == std::endian::little,
                "gradcomp's CPU codecs write little-endian payloads and assume a little-endian host");

 public:
  using codec_concept = codec_tag;

  /// Compresses `in` into `out` (at least `max_compressed_bytes(in.size())` bytes, or the
  /// exact packet size) and returns the packet size.
  template <element T>
  std::size_t compress(tensor_view<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    Self const& self = static_cast<Self const&>(*this);
    packet_header const h = self.header_for(in.size(), dtype_of<T>);
    std::uint64_t const total = h.packet_bytes();
    check_room(Self::id, in.size(), total, out.size());
    write_header(out, h);
    std::byte* payload = out.data() + header_bytes;
    random_stream const rs{ctx.seed, ctx.step, static_cast<std::uint32_t>(in.id())};
    if constexpr (requires { self.template encode_typed<T>(in.data(), in.size(), payload, h, ctx); }) {
      self.template encode_typed<T>(in.data(), in.size(), payload, h, ctx);
    } else if constexpr (std::same_as<T, float>) {
      self.encode(in.data(), in.size(), payload, h, rs, ctx);
    } else {
      std::vector<float> tmp(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) tmp[i] = to_float(in[i]);
      self.encode(tmp.data(), tmp.size(), payload, h, rs, ctx);
    }
    return static_cast<std::size_t>(total);
  }

  /// Convenience overload for a span (tensor id 0).
  template <element T>
  std::size_t compress(std::span<T const> in, std::span<std::byte> out,
                       codec_context const& ctx = {}) const {
    return compress(tensor_view<T const>(in), out, ctx);
  }

  /// Decodes `packet` into `out`, which must have the packet's element count.
  template <element T>
  void decompress(std::span<std::byte const> packet, std::span<T> out,
                  codec_context const& ctx = {}) const {
    decode_into<false>(packet, out, 1.0f, ctx);
  }

  /// Adds `alpha` times the decoded `packet` to `out`.
  template <element T>
  void decompress_add(std::span<std::byte const> packet, std::span<T> out, float alpha = 1.0f,
                      codec_context const& ctx = {}) const {
    decode_into<true>(packet, out, alpha, ctx);
  }

  /// Whether this codec fuses error feedback with compression (it has the block interface).
  /// A template, like `compress_fused`, so that the check waits for the call, when `Self` is
  /// complete: Clang 14 otherwise checks it while the base is instantiated and keeps the
  /// answer "no".
  template <class S = Self>
  [[nodiscard]] static constexpr bool fusable() noexcept {
    return block_codec<S>;
  }

  /// Error feedback fused with compression (the contract is `fused_feedback_codec`'s, in
  /// concepts/codec.hpp): blocks of `fused_feedback_block` elements, each filled, encoded and
  /// decoded into `x` while in cache, spread over the context's threads. The packet is the one
  /// `compress` writes, for any thread count and ISA level.
  template <class S = Self>
    requires block_codec<S>
  std::size_t compress_fused(float* x, std::size_t n, tensor_id id, std::span<std::byte> out,
                             block_fill const& fill, block_fill const& refill, float alpha,
                             codec_context const& ctx) const {
    Self const& self = static_cast<Self const&>(*this);
    packet_header const h = self.header_for(n, dtype::f32);
    std::uint64_t const total = h.packet_bytes();
    check_room(Self::id, n, total, out.size());
    write_header(out, h);
    std::byte* payload = out.data() + header_bytes;
    random_stream const rs{ctx.seed, ctx.step, static_cast<std::uint32_t>(id)};
    auto scratch = self.block_begin(n);
    std::size_t const align = self.block_align(n);
    std::size_t const block = align >= cpu::fused_feedback_block ? align : cpu::fused_feedback_block / align * align;
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    cpu::for_each_chunk(n, block, ctx, [&](std::size_t, std::size_t cb, std::size_t ce) {
      for (std::size_t b = cb; b < ce; b += block) {
        std::size_t const e = b + block < ce ? b + block : ce;
        if (!fill(b, e)) continue;
        self.encode_block(scratch, x, n, b, e, payload, h, rs, level);
        refill(b, e);
        self.decode_block(scratch, h, payload, x, b, e, alpha, level);
      }
    });
    return static_cast<std::size_t>(total);
  }

  /// Header of `packet` after full validation as a packet of this codec.
  static packet_header inspect(std::span<std::byte const> packet) {
    packet_header const h = read_header(packet);
    expect_codec(h, Self::id);
    Self::validate(h);
    return h;
  }

 private:
  template <bool Add, element T>
  void decode_into(std::span<std::byte const> packet, std::span<T> out, float alpha,
                   codec_context const& ctx) const {
    packet_header const h = inspect(packet);
    expect_count(h, Self::id, out.size());
    std::byte const* payload = packet.data() + header_bytes;
    if constexpr (requires { Self::template decode_typed<T>(h, payload, out.data(), alpha, Add, ctx); }) {
      Self::template decode_typed<T>(h, payload, out.data(), alpha, Add, ctx);
    } else if constexpr (std::same_as<T, float>) {
      Self::decode(h, payload, out.data(), alpha, Add, ctx);
    } else {
      std::vector<float> tmp(out.size());
      Self::decode(h, payload, tmp.data(), 1.0f, false, ctx);
      for (std::size_t i = 0; i < out.size(); ++i) {
        out[i] = Add ? from_float<T>(std::fma(alpha, tmp[i], to_float(out[i])))
                     : from_float<T>(tmp[i]);
      }
    }
  }
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
