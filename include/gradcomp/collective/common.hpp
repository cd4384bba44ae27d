// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// What every collective of `collective/` shares: the reduction (sum or average), the result
/// record (which algorithm ran, how many bytes this rank put on the wire), the traits that read
/// a codec's id and aggregation kind from a codec, an `any_codec` or a `compressor`, and the
/// byte-span helpers. docs/collectives.md explains the algorithms.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/convert.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How the ranks' contributions combine.
enum class reduction : std::uint8_t {
  sum = 0,      ///< every rank receives the sum of all contributions
  average = 1,  ///< the sum divided by the communicator's size (every rank, contributing or not)
};

/// Which algorithm a collective ran.
enum class collective_path : std::uint8_t {
  dense_f32 = 0,         ///< float32 all-reduce
  dense_f16 = 1,         ///< binary16 all-reduce (summed in binary16, rounded once per peer)
  dense_bf16 = 2,        ///< bfloat16 all-reduce (summed in bfloat16, rounded once per peer)
  summable = 3,          ///< compressed payloads all-reduced in the compressed domain
  shared_support = 4,    ///< the values at a support shared by all ranks all-reduced
  gather = 5,            ///< packets all-gathered, decompressed and summed
  low_rank = 6,          ///< factor all-reduces of a low-rank session
  two_way = 7,           ///< compressed shards exchanged, summed, re-compressed, gathered
  parameter_server = 8,  ///< workers push compressed shards to servers, which push back
  hierarchical = 9,      ///< reduced inside nodes, compressed between them, gathered inside nodes
};

/// Name of a collective path ("dense f32", ...).
constexpr char const* collective_path_name(collective_path p) noexcept {
  switch (p) {
    case collective_path::dense_f32: return "dense f32";
    case collective_path::dense_f16: return "dense f16";
    case collective_path::dense_bf16: return "dense bf16";
    case collective_path::summable: return "summable";
    case collective_path::shared_support: return "shared support";
    case collective_path::gather: return "gather";
    case collective_path::low_rank: return "low-rank";
    case collective_path::two_way: return "two-way";
    case collective_path::parameter_server: return "parameter server";
    case collective_path::hierarchical: return "hierarchical";
  }
  return "unknown";
}

/// Options shared by the collectives.
struct collective_options {
  /// Sum or average of the contributions.
  reduction op = reduction::sum;
  /// Integrity checks (collective/outcome.hpp): a CRC32C trailer on every packet delivered as
  /// sent, a checksum of every summed payload, and the ranks' results compared; a mismatch is a
  /// `format_error` on every rank. Off: corrupted but well-formed data are not detected. Every
  /// rank passes the same value.
  bool checksum = false;
};

/// What a collective call did on this rank.
struct collective_result {
  /// The algorithm that ran.
  collective_path path = collective_path::dense_f32;
  /// Bytes of this rank's compressed contribution (its packet, or the sum of its shard
  /// packets; 0 for a rank that contributed nothing).
  std::size_t packet_bytes = 0;
  /// Bytes this rank sends under the bandwidth-optimal algorithms of each operation (ring
  /// all-reduce 2(W-1)/W of the buffer, ring all-gather everything but the block the next rank
  /// holds, all-to-all what goes to other ranks, point-to-point what it sends), the agreement
  /// rounds included. A model of the traffic, the same for every transport.
  std::size_t wire_bytes = 0;
};

namespace detail {

template <class T>
std::span<std::byte> writable_bytes(std::vector<T>& v) noexcept {
  return std::as_writable_bytes(std::span<T>(v));
}
template <class T>
std::span<std::byte const> const_bytes(std::vector<T> const& v) noexcept {
  return std::as_bytes(std::span<T const>(v));
}

/// A byte buffer that is not zero-filled when it grows (packets are written before they are
/// read, and a fill would cost a pass over memory per call).
class raw_buffer {
 public:
  raw_buffer() = default;
  explicit raw_buffer(std::size_t n) { resize(n); }
  /// Sets the size to `n`; keeps the contents only when `n` fits the capacity.
  void resize(std::size_t n) {
    if (n > cap_) {
      data_ = std::make_unique_for_overwrite<std::byte[]>(n);
      cap_ = n;
    }
    size_ = n;
  }
  [[nodiscard]] std::byte* data() noexcept { return data_.get(); }
  [[nodiscard]] std::byte const* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::span<std::byte> span() noexcept { return {data_.get(), size_}; }
  [[nodiscard]] std::span<std::byte const> span() const noexcept { return {data_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0, cap_ = 0;
};

/// The codec of `x`: `x` itself, or `x.codec()` for a `compressor`.
template <class X>
auto const& codec_of(X const& x) noexcept {
  if constexpr (requires { x.codec(); }) {
    return x.codec();
  } else {
    return x;
  }
}

/// Aggregation kind of a codec (static `C::aggregation` or `any_codec::aggregation()`).
template <class C>
aggregation_kind aggregation_of_codec(C const& c) noexcept {
  if constexpr (requires { { C::aggregation } -> std::convertible_to<aggregation_kind>; }) {
    return C::aggregation;
  } else {
    return c.aggregation();
  }
}

/// Codec id of a codec (static `C::id` or `any_codec::id()`).
template <class C>
codec_id id_of_codec(C const& c) noexcept {
  if constexpr (requires { { C::id } -> std::convertible_to<codec_id>; }) {
    return C::id;
  } else {
    return c.id();
  }
}

/// Aggregation kind of a codec or compressor.
template <class X>
aggregation_kind aggregation_of(X const& x) noexcept {
  return aggregation_of_codec(codec_of(x));
}

/// Codec id of a codec or compressor.
template <class X>
codec_id codec_id_of(X const& x) noexcept {
  return id_of_codec(codec_of(x));
}

/// Something `all_reduce_compressed` can compress with: a codec, an `any_codec` or a
/// `compressor` (error feedback), compressing gradients of element type `T` (float by default).
template <class X, class T = float>
concept packet_source =
    element<T> &&
    requires(X& x, tensor_view<T const> g, std::span<std::byte> out, codec_context const& ctx,
             std::size_t n) {
      { x.compress(g, out, ctx) } -> std::same_as<std::size_t>;
      { codec_of(x).max_compressed_bytes(n) } -> std::same_as<std::size_t>;
      { codec_of(x).bits_per_element() } -> std::convertible_to<double>;
      { aggregation_of(x) } -> std::same_as<aggregation_kind>;
      { codec_id_of(x) } -> std::same_as<codec_id>;
    };

/// Hands a collective's output for tensor `id` to the receiver side of `src`'s error feedback
/// (EF21's estimate; see `compressor::receive`); nothing for other sources.
template <class X>
void receive_output(X& src, tensor_id id, std::span<float> out) {
  if constexpr (requires { src.receive(id, out); }) src.receive(id, out);
}

/// Ring all-reduce traffic of a `bytes` buffer on `w` ranks.
constexpr std::size_t ring_all_reduce_bytes(std::size_t bytes, int w) noexcept {
  if (w <= 1) return 0;
  auto const ww = static_cast<std::size_t>(w);
  return 2 * (bytes / ww) * (ww - 1) + 2 * (bytes % ww) * (ww - 1) / ww;
}

/// Ring all-gather(-v) traffic of rank `r`: every block except the one of rank r+1 (the block
/// it receives last and need not forward).
inline std::size_t ring_all_gather_bytes(std::span<std::size_t const> sizes, int r) noexcept {
  if (sizes.size() <= 1) return 0;
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  return total - sizes[(static_cast<std::size_t>(r) + 1) % sizes.size()];
}

/// Throws `config_error` unless `grad` is empty (no contribution) or as long as `out`.
inline void check_contribution(std::size_t grad, std::size_t out, char const* who) {
  if (grad != 0 && grad != out) {
    throw config_error(std::string("gradcomp: ") + who + " got a gradient of " + std::to_string(grad) +
                       " elements for an output of " + std::to_string(out) +
                       " (expected equal sizes, or an empty gradient for a rank that contributes "
                       "nothing)");
  }
}

/// The 16-bit format of the conversion kernels for element type `T` (not float).
template <element T>
inline constexpr cpu::kernels::half_format half_format_of =
    std::same_as<T, half> ? cpu::kernels::half_format::f16 : cpu::kernels::half_format::bf16;

/// dst = src widened to float32 (exact); `dst.size() == src.size()`.
template <element T>
void widen_to_f32(std::span<T const> src, std::span<float> dst, codec_context const& ctx) {
  if (src.empty()) return;
  if constexpr (std::same_as<T, float>) {
    if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.size_bytes());
  } else {
    cpu::kernels::widen<half_format_of<T>>(reinterpret_cast<std::byte const*>(src.data()), dst.data(),
                                           src.size(), 1.0f, false, cpu::effective_isa(ctx.isa));
  }
}

/// dst = src rounded once to `T` (nearest even; a copy for float); `dst.size() == src.size()`.
template <element T>
void round_from_f32(std::span<float const> src, std::span<T> dst, codec_context const& ctx) {
  if (src.empty()) return;
  if constexpr (std::same_as<T, float>) {
    if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.size_bytes());
  } else {
    cpu::kernels::narrow<half_format_of<T>>(src.data(), reinterpret_cast<std::byte*>(dst.data()), src.size(),
                                            cpu::effective_isa(ctx.isa));
  }
}

/// The 16-bit edge of a collective: widens `grad` (exact) into a float32 buffer, runs
/// `body(tensor_view<float const> g, std::span<float> o)` — the float32 collective, in place on
/// that buffer (`g` empty when `grad` is: no contribution) — and rounds its result once into
/// `out`. Sums and decoding thus accumulate in float32 whatever the element type; `out` is
/// written only when `body` returns. `grad` may alias `out`.
template <element T, class Body>
auto through_f32(tensor_view<T const> grad, std::span<T> out, codec_context const& ctx, char const* who,
                 Body&& body) {
  check_contribution(grad.size(), out.size(), who);
  std::size_t const n = out.size();
  auto const buf = std::make_unique_for_overwrite<float[]>(n);
  std::span<float> const f(buf.get(), n);
  widen_to_f32(grad.span(), f.first(grad.size()), ctx);
  auto result = body(tensor_view<float const>(std::span<float const>(f.first(grad.size())), grad.id()), f);
  round_from_f32(std::span<float const>(f), out, ctx);
  return result;
}

/// The factor applied to the sum for `op` on `w` ranks.
constexpr float reduction_scale(reduction op, int w) noexcept {
  return op == reduction::average ? 1.0f / static_cast<float>(w) : 1.0f;
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
