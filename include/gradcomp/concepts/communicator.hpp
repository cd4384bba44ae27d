// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The communicator concepts: what a transport must provide for gradcomp's collectives.
///
/// Everything is expressed over byte spans; reductions also name the element type
/// (`comm_type`) and the operation (`reduce_op`), and the element count is the span's size
/// divided by the element size. Two levels:
///
/// - `blocking_communicator`: rank, size and the blocking operations. This is all a user must
///   write to bring a transport of their own (see examples/ for one over Gloo);
///   `async_adaptor` (comm/async_adaptor.hpp) turns it into a full `communicator`.
/// - `communicator`: the blocking operations plus non-blocking forms (`iall_reduce`, ...) that
///   return a `request` (concepts/request.hpp), so communication overlaps compression and
///   computation.
///
/// Semantics shared by every adapter (docs/collectives.md):
/// - collectives are called by every rank of the communicator, in the same order, with
///   matching arguments (same type, operation, byte count, root); an adapter that can detect a
///   mismatch throws `comm_error` rather than corrupt data;
/// - a buffer handed to a non-blocking operation must stay valid, and a send buffer unchanged,
///   until its request completes;
/// - failures (a peer that disappeared, a timeout, a transport error) are `comm_error`;
///   argument errors (sizes that do not divide, a bad rank) are `config_error`.

#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the communicator concepts.
struct communicator_tag {};

/// Element-wise reduction of a collective.
enum class reduce_op : std::uint8_t {
  sum = 0,  ///< element-wise sum (16-bit floats are summed in float32 and rounded once per peer)
  max = 1,  ///< element-wise maximum
  min = 2,  ///< element-wise minimum
};

/// Element type of a reduction.
enum class comm_type : std::uint8_t {
  u8 = 0,
  i32 = 1,
  u32 = 2,
  i64 = 3,
  u64 = 4,
  f32 = 5,
  f64 = 6,
  f16 = 7,   ///< IEEE binary16 (`gradcomp::half`)
  bf16 = 8,  ///< bfloat16 (`gradcomp::bfloat16`)
};

/// Size in bytes of one element of `t` (0 for a value that is not a `comm_type`).
constexpr std::size_t comm_type_size(comm_type t) noexcept {
  switch (t) {
    case comm_type::u8: return 1;
    case comm_type::f16:
    case comm_type::bf16: return 2;
    case comm_type::i32:
    case comm_type::u32:
    case comm_type::f32: return 4;
    case comm_type::i64:
    case comm_type::u64:
    case comm_type::f64: return 8;
  }
  return 0;
}

/// Name of a `comm_type` ("f32", ...), or "unknown".
constexpr char const* comm_type_name(comm_type t) noexcept {
  switch (t) {
    case comm_type::u8: return "u8";
    case comm_type::i32: return "i32";
    case comm_type::u32: return "u32";
    case comm_type::i64: return "i64";
    case comm_type::u64: return "u64";
    case comm_type::f32: return "f32";
    case comm_type::f64: return "f64";
    case comm_type::f16: return "f16";
    case comm_type::bf16: return "bf16";
  }
  return "unknown";
}

/// Name of a `reduce_op` ("sum", "max", "min"), or "unknown".
constexpr char const* reduce_op_name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "unknown";
}

namespace detail {
template <class T>
inline constexpr bool has_comm_type = false;
template <> inline constexpr bool has_comm_type<std::uint8_t> = true;
template <> inline constexpr bool has_comm_type<std::int32_t> = true;
template <> inline constexpr bool has_comm_type<std::uint32_t> = true;
template <> inline constexpr bool has_comm_type<std::int64_t> = true;
template <> inline constexpr bool has_comm_type<std::uint64_t> = true;
template <> inline constexpr bool has_comm_type<float> = true;
template <> inline constexpr bool has_comm_type<double> = true;
template <> inline constexpr bool has_comm_type<half> = true;
template <> inline constexpr bool has_comm_type<bfloat16> = true;
}  // namespace detail

/// A C++ type with a `comm_type`.
template <class T>
concept comm_element = detail::has_comm_type<std::remove_const_t<T>>;

/// The `comm_type` of `T`.
template <comm_element T>
inline constexpr comm_type comm_type_of = [] {
  using U = std::remove_const_t<T>;
  if constexpr (std::same_as<U, std::uint8_t>) return comm_type::u8;
  else if constexpr (std::same_as<U, std::int32_t>) return comm_type::i32;
  else if constexpr (std::same_as<U, std::uint32_t>) return comm_type::u32;
  else if constexpr (std::same_as<U, std::int64_t>) return comm_type::i64;
  else if constexpr (std::same_as<U, std::uint64_t>) return comm_type::u64;
  else if constexpr (std::same_as<U, float>) return comm_type::f32;
  else if constexpr (std::same_as<U, double>) return comm_type::f64;
  else if constexpr (std::same_as<U, half>) return comm_type::f16;
  else return comm_type::bf16;
}();

/// The blocking operations of a communicator.
///
/// Required of `C` (with `c` a `C&`, `buf` a `std::span<std::byte>`, `in` a
/// `std::span<std::byte const>`, `counts` a `std::span<std::size_t const>`):
/// - `C::communicator_concept` derived from `communicator_tag`;
/// - `c.rank()`, `c.size()` (`int`, 0 <= rank < size);
/// - `c.barrier()`;
/// - `c.broadcast(buf, root)`: `buf` of `root` is copied into every rank's `buf`;
/// - `c.all_reduce(buf, type, op)`: in place, element-wise over all ranks;
/// - `c.reduce_scatter(in, buf, type, op)`: `in` holds `size()` blocks of `buf.size()` bytes;
///   rank r receives the reduction of every rank's block r;
/// - `c.all_gather(in, buf)`: `buf` (`size() * in.size()` bytes) receives every rank's `in`
///   in rank order;
/// - `c.all_gather_v(in, buf, counts)`: like `all_gather` with `counts[r]` bytes from rank r
///   (`counts` identical on all ranks, `counts[rank()] == in.size()`, `buf.size()` the sum; a
///   rank may contribute nothing);
/// - `c.all_to_all_v(in, send_counts, buf, recv_counts)`: rank r sends the `send_counts[p]`
///   bytes of its `in` block p (blocks consecutive, in peer order) to peer p, and receives
///   `recv_counts[p]` bytes from each peer p into consecutive blocks of `buf`;
/// - `c.send(in, peer, tag)`, `c.recv(buf, peer, tag)`: point to point, matched in order per
///   (sender, receiver, tag); the receiver names the exact byte count.
template <class C>
concept blocking_communicator =
    std::derived_from<typename C::communicator_concept, communicator_tag> &&
    requires(C& c, C const& cc, std::span<std::byte> buf, std::span<std::byte const> in,
             std::span<std::size_t const> counts, comm_type t, reduce_op op, int peer, int tag) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      c.barrier();
      c.broadcast(buf, peer);
      c.all_reduce(buf, t, op);
      c.reduce_scatter(in, buf, t, op);
      c.all_gather(in, buf);
      c.all_gather_v(in, buf, counts);
      c.all_to_all_v(in, counts, buf, counts);
      c.send(in, peer, tag);
      c.recv(buf, peer, tag);
    };

/// A full communicator: the blocking operations plus their non-blocking forms, each returning
/// a `request` whose `wait()` completes it (and throws `comm_error` on failure):
/// `ibroadcast`, `iall_reduce`, `ireduce_scatter`, `iall_gather`, `iall_gather_v`,
/// `iall_to_all_v`, `isend`, `irecv`, with the arguments of the blocking form. For `_v`
/// operations the `counts` spans must stay valid until the request completes.
template <class C>
concept communicator =
    blocking_communicator<C> &&
    requires(C& c, std::span<std::byte> buf, std::span<std::byte const> in,
             std::span<std::size_t const> counts, comm_type t, reduce_op op, int peer, int tag) {
      { c.ibroadcast(buf, peer) } -> std::same_as<request>;
      { c.iall_reduce(buf, t, op) } -> std::same_as<request>;
      { c.ireduce_scatter(in, buf, t, op) } -> std::same_as<request>;
      { c.iall_gather(in, buf) } -> std::same_as<request>;
      { c.iall_gather_v(in, buf, counts) } -> std::same_as<request>;
      { c.iall_to_all_v(in, counts, buf, counts) } -> std::same_as<request>;
      { c.isend(in, peer, tag) } -> std::same_as<request>;
      { c.irecv(buf, peer, tag) } -> std::same_as<request>;
    };

GRADCOMP_NAMESPACE_END
