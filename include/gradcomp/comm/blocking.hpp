// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `blocking_operations<D>`: the blocking operations of a communicator, written once from its
/// non-blocking ones (`all_reduce(...)` is `iall_reduce(...).wait()`, and so on). Every
/// communicator of the library whose transport is non-blocking (in-process, MPI,
/// `async_adaptor`, NCCL) derives from it instead of spelling the forwarders itself; a user's
/// non-blocking communicator can do the same.

#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>

#include <cstddef>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// CRTP base that gives `D` the blocking operations of `blocking_communicator`: each calls the
/// non-blocking form of `D` with the same arguments and waits for its request, so it blocks
/// until the operation completes and throws what the request's `wait()` throws.
///
/// `D` derives publicly, `class D : public blocking_operations<D>`, and provides `ibarrier()`
/// and the non-blocking operations of the `communicator` concept. An operation that `D`
/// defines itself hides the one here.
template <class D>
class blocking_operations {
 public:
  void barrier() { self().ibarrier().wait(); }
  void broadcast(std::span<std::byte> buf, int root) { self().ibroadcast(buf, root).wait(); }
  void all_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    self().iall_reduce(buf, t, op).wait();
  }
  void reduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                      reduce_op op) {
    self().ireduce_scatter(in, out, t, op).wait();
  }
  void all_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    self().iall_gather(in, out).wait();
  }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                    std::span<std::size_t const> counts) {
    self().iall_gather_v(in, out, counts).wait();
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                    std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    self().iall_to_all_v(in, send_counts, out, recv_counts).wait();
  }
  void send(std::span<std::byte const> in, int peer, int tag) {
    self().isend(in, peer, tag).wait();
  }
  void recv(std::span<std::byte> out, int peer, int tag) { self().irecv(out, peer, tag).wait(); }

 protected:
  blocking_operations() = default;
  blocking_operations(blocking_operations const&) = default;
  blocking_operations(blocking_operations&&) = default;
  blocking_operations& operator=(blocking_operations const&) = default;
  blocking_operations& operator=(blocking_operations&&) = default;
  ~blocking_operations() = default;

 private:
  D& self() noexcept { return static_cast<D&>(*this); }
};

GRADCOMP_NAMESPACE_END
