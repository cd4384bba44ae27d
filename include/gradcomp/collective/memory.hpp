// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Where a collective keeps its payload buffers: the memory space of the collectives.
///
/// A collective of `collective/` moves two kinds of bytes. *Control messages* (the agreement
/// reports, packet sizes, the step-outcome round) are small, built and read by the host, and
/// always live in host memory. *Payloads* (packets, their values, gathered packets, decoded
/// sums) live where the codec reads and writes them: host memory for the CPU codecs, device
/// memory for a CUDA codec (cuda/collective.cuh). The memory space says which, and gives the
/// collective the things it does to a payload besides handing it to the codec and the
/// communicator: own a buffer of it, zero it, copy it (into and out of a fused bucket), scale
/// its floats (an average of dense values), and read a few of its bytes on the host (the frame
/// around summable values, which the agreement round fingerprints).
///
/// A memory space `M` provides:
/// - `M::buffer`: an owning byte buffer with `resize(n)` (contents kept only when `n` fits
///   the capacity), `data()`, `size()`, `empty()` and `span()` (const and not);
/// - `M::on_host` (`bool`): whether the host may read and write its bytes directly;
/// - `m.make_buffer()`: an empty `M::buffer` of this space (a device space binds its stream);
/// - `m.zero(std::span<std::byte>)`: sets the bytes to zero;
/// - `m.copy(std::span<std::byte> dst, std::span<std::byte const> src)`: copies `src` (as
///   many bytes as `dst` holds, no overlap) within the space, ordered after the writes to
///   `src` the caller issued;
/// - `m.scale(std::span<float> x, float alpha)`: `x[i] = x[i] * alpha` (one rounded float32
///   product, the same bits in every space);
/// - `m.read(std::span<std::byte const> bytes, f)`: calls `f` with a host span holding the same
///   bytes (the span itself on the host; a host copy, made when every write to `bytes` the
///   caller issued has finished, elsewhere) and returns what `f` returns;
/// - `m.write(std::span<std::byte> dst, std::span<std::byte const> host)`: copies host bytes
///   into `dst` (as many bytes as `dst` holds); the host span may be reused once it returns
///   (a checkpoint's state going back into the space);
/// - `m.sum_of_squares(std::span<float const> x)`: Σ x², in double, in the canonical order of
///   core/quant/dither.hpp (the same bits in every space; the training pipeline's guard norms),
///   returned to the host.
///
/// A space that is not `on_host` also gives what the 16-bit paths and the hierarchical
/// all-reduce's node sums use in place of the host kernels: `m.widen(std::span<T const>,
/// std::span<float>)`, `m.narrow(std::span<float const>, std::span<T>)` (T `half` or `bfloat16`)
/// and `m.add(std::span<T const> x, std::span<float> acc)` (`acc += x` widened, T also `float`),
/// each with the host kernels' bits (cuda/memory.cuh).
///
/// `host_memory` is the default. A source (codec, `any_codec`, compressor) opts into another
/// space by a member `memory()` on its codec, which returns the space object; `memory_of`
/// reads it. The communicator sees both kinds of buffers: an adapter for device memory tells
/// them apart by their pointers (comm/nccl.cuh).

#include <gradcomp/collective/common.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/dither.hpp>

#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// The memory space of host payloads: `raw_buffer`s, `memset`, no copies to read.
struct host_memory {
  /// Owning payload buffer.
  using buffer = detail::raw_buffer;
  /// The host reads and writes payloads directly.
  static constexpr bool on_host = true;

  /// An empty buffer.
  [[nodiscard]] buffer make_buffer() const noexcept { return {}; }
  /// Sets `bytes` to zero.
  void zero(std::span<std::byte> bytes) const noexcept {
    if (!bytes.empty()) std::memset(bytes.data(), 0, bytes.size());
  }
  /// Copies `src` into `dst` (the same size; no overlap).
  void copy(std::span<std::byte> dst, std::span<std::byte const> src) const noexcept {
    if (!dst.empty()) std::memcpy(dst.data(), src.data(), dst.size());
  }
  /// `x[i] *= alpha`.
  void scale(std::span<float> x, float alpha) const noexcept {
    for (float& v : x) v *= alpha;
  }
  /// `f(bytes)`: host bytes need no copy.
  template <class F>
  decltype(auto) read(std::span<std::byte const> bytes, F&& f) const {
    return std::forward<F>(f)(bytes);
  }
  /// Copies host bytes into `dst` (the same size; no overlap).
  void write(std::span<std::byte> dst, std::span<std::byte const> host) const noexcept {
    if (!dst.empty()) std::memcpy(dst.data(), host.data(), dst.size());
  }
  /// Σ x² in the canonical order (`cpu::kernels::canonical_sumsq`, at the machine's level).
  [[nodiscard]] double sum_of_squares(std::span<float const> x) const noexcept {
    return cpu::kernels::canonical_sumsq(x.data(), x.size(), cpu::isa::best);
  }
};

/// A memory space (see the file comment).
template <class M>
concept memory_space = requires(M const& m, typename M::buffer& b, typename M::buffer const& cb,
                                std::span<std::byte> s, std::span<std::byte const> cs,
                                std::span<float> f, std::size_t n) {
  b.resize(n);
  { b.data() } -> std::same_as<std::byte*>;
  { cb.size() } -> std::same_as<std::size_t>;
  { b.span() } -> std::same_as<std::span<std::byte>>;
  { cb.span() } -> std::same_as<std::span<std::byte const>>;
  { M::on_host } -> std::convertible_to<bool>;
  { m.make_buffer() } -> std::same_as<typename M::buffer>;
  m.zero(s);
  m.copy(s, cs);
  m.scale(f, 1.0f);
  m.write(s, cs);
  { m.sum_of_squares(std::span<float const>(f)) } -> std::same_as<double>;
};

static_assert(memory_space<host_memory>);

namespace detail {

/// The memory space of a source's payloads: its codec's `memory()`, else `host_memory`.
template <class X>
auto memory_of(X const& x) {
  if constexpr (requires {
                  { codec_of(x).memory() } -> memory_space;
                }) {
    return codec_of(x).memory();
  } else {
    return host_memory{};
  }
}

/// The memory space type of a source.
template <class X>
using memory_of_t = decltype(memory_of(std::declval<X const&>()));

/// The float32 elements of a payload buffer of any space (its first `n`).
template <class Buffer>
std::span<float> float_span(Buffer& b, std::size_t n) noexcept {
  return {reinterpret_cast<float*>(b.data()), n};
}

/// Whether a source's payloads live in host memory.
template <class X>
inline constexpr bool host_payloads = memory_of_t<X>::on_host;

}  // namespace detail

GRADCOMP_NAMESPACE_END
