// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `codec` concept: what a compressor must declare and provide. A type opts in with
/// `using codec_concept = gradcomp::codec_tag;` and must then provide the operations below;
/// the concept checks both, so a type that merely looks like a codec is not taken for one.

#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `codec` concept.
struct codec_tag {};

/// How packets of a codec combine across ranks; the collective layer picks its algorithm
/// from this (docs/algorithms.md).
enum class aggregation_kind {
  summable,        ///< packets add in the compressed domain (all-reduce the payload)
  shared_support,  ///< ranks sharing a seed select the same support; all-reduce the values
  gather,          ///< packets must be gathered, decompressed and summed
  low_rank,        ///< low-rank factors are all-reduced
};

/// Name of an aggregation kind ("summable", "shared support", "gather", "low-rank").
constexpr char const* aggregation_name(aggregation_kind k) noexcept {
  switch (k) {
    case aggregation_kind::summable: return "summable";
    case aggregation_kind::shared_support: return "shared support";
    case aggregation_kind::gather: return "gather";
    case aggregation_kind::low_rank: return "low-rank";
  }
  return "unknown";
}

/// The operations of a codec without its static traits: what a run-time codec
/// (`any_codec`) also provides, and all that error feedback needs.
template <class C>
concept codec_operations =
    requires(C const& c, std::size_t n, tensor_view<float const> f32, tensor_view<half const> f16,
             tensor_view<bfloat16 const> b16, std::span<std::byte> out,
             std::span<std::byte const> packet, std::span<float> of32, std::span<half> of16,
             std::span<bfloat16> ob16, codec_context const& ctx) {
      { c.max_compressed_bytes(n) } -> std::same_as<std::size_t>;
      { c.bits_per_element() } -> std::convertible_to<double>;
      { c.compress(f32, out, ctx) } -> std::same_as<std::size_t>;
      { c.compress(f16, out, ctx) } -> std::same_as<std::size_t>;
      { c.compress(b16, out, ctx) } -> std::same_as<std::size_t>;
      c.decompress(packet, of32, ctx);
      c.decompress(packet, of16, ctx);
      c.decompress(packet, ob16, ctx);
      c.decompress_add(packet, of32, 1.0f, ctx);
      c.decompress_add(packet, of16, 1.0f, ctx);
      c.decompress_add(packet, ob16, 1.0f, ctx);
    };

/// A non-owning reference to a callable `bool(std::size_t b, std::size_t e)` (the callable must
/// outlive it): how error feedback hands a codec the code that fills a block of its input.
class block_fill {
 public:
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, block_fill>)
  block_fill(F const& f) noexcept  // NOLINT(google-explicit-constructor)
      : obj_(&f), call_([](void const* o, std::size_t b, std::size_t e) { return (*static_cast<F const*>(o))(b, e); }) {}
  bool operator()(std::size_t b, std::size_t e) const { return call_(obj_, b, e); }

 private:
  void const* obj_;
  bool (*call_)(void const*, std::size_t, std::size_t);
};

/// A codec that can run error feedback fused with its compression, block by block in cache
/// (feedback/policies.hpp). `c.fusable()` says whether this codec (or, for `any_codec`, the codec
/// held) can; then `c.compress_fused(x, n, id, out, fill, refill, alpha, ctx)` writes into `out`
/// the same packet `c.compress` would write for `x[0, n)` as tensor `id`, and leaves in `x` what
/// `decompress_add(packet, x, alpha)` would after `refill`, processing the tensor in blocks
/// [b, e): `fill(b, e)` writes `x[b, e)` (false: a non-finite value; the block is skipped and the
/// caller throws), the block is encoded, `refill(b, e)` may rewrite `x[b, e)`, and the block's
/// decoded values times `alpha` are added to it. Returns the packet size.
template <class C>
concept fused_feedback_codec =
    requires(C const& c, float* x, std::size_t n, tensor_id id, std::span<std::byte> out,
             block_fill const& fill, codec_context const& ctx) {
      { c.fusable() } -> std::convertible_to<bool>;
      { c.compress_fused(x, n, id, out, fill, fill, 1.0f, ctx) } -> std::same_as<std::size_t>;
    };

/// A gradient compressor.
///
/// Required of `C` (with `c` a `C const&`, `n` a `std::size_t`, `T` each `element` type):
/// - `C::codec_concept` derived from `codec_tag`;
/// - `C::id` (`codec_id`), `C::aggregation` (`aggregation_kind`), `C::unbiased` (`bool`:
///   E[decompress(compress(x))] = x for every x);
/// - `c.max_compressed_bytes(n)`: an upper bound of the packet size for `n` elements of any
///   dtype (the header included);
/// - `c.bits_per_element()`: nominal wire bits per element for float32 input, per-bucket
///   metadata included, header excluded;
/// - `c.compress(tensor_view<T const>, std::span<std::byte>, codec_context const&)`: writes a
///   packet into the buffer and returns its exact size;
/// - `c.decompress(std::span<std::byte const>, std::span<T>, codec_context const&)`: writes the
///   decoded tensor;
/// - `c.decompress_add(std::span<std::byte const>, std::span<T>, float alpha,
///   codec_context const&)`: adds `alpha` times the decoded tensor.
template <class C>
concept codec = std::derived_from<typename C::codec_concept, codec_tag> && codec_operations<C> &&
                requires {
                  { C::id } -> std::convertible_to<codec_id>;
                  { C::aggregation } -> std::convertible_to<aggregation_kind>;
                  { C::unbiased } -> std::convertible_to<bool>;
                };

GRADCOMP_NAMESPACE_END
