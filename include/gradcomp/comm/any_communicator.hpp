// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `any_communicator`: a communicator chosen at run time (in-process, MPI, NCCL, a user's own),
/// behind one type. It models `communicator` itself, so everything written against the
/// concept also takes it. The wrapped communicator is shared by copies of the wrapper, or, made
/// by `borrow`, referred to (a layer that keeps code behind a virtual interface, such as the
/// pipeline's device source, runs its collectives on the caller's communicator that way).

#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// Type-erased `communicator` (see file comment).
class any_communicator {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps `c` (moved in; copies of this wrapper share it).
  template <communicator C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_communicator>)
  any_communicator(C c)  // NOLINT(google-explicit-constructor): a value-semantic wrapper
      : impl_(std::make_shared<model<C>>(std::move(c))) {}

  /// A wrapper that refers to `c` instead of owning it: `c` must outlive the wrapper and its
  /// copies. Costs one allocation; every operation forwards to `c`.
  template <communicator C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_communicator>)
  [[nodiscard]] static any_communicator borrow(C& c) {
    return any_communicator(std::make_shared<model<C&>>(c));
  }

  [[nodiscard]] int rank() const { return impl_->rank(); }
  [[nodiscard]] int size() const { return impl_->size(); }

  void barrier() { impl_->barrier(); }
  void broadcast(std::span<std::byte> buf, int root) { impl_->broadcast(buf, root); }
  void all_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) { impl_->all_reduce(buf, t, op); }
  void reduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t, reduce_op op) {
    impl_->reduce_scatter(in, out, t, op);
  }
  void all_gather(std::span<std::byte const> in, std::span<std::byte> out) { impl_->all_gather(in, out); }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    impl_->all_gather_v(in, out, counts);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc, std::span<std::byte> out,
                    std::span<std::size_t const> rc) {
    impl_->all_to_all_v(in, sc, out, rc);
  }
  void send(std::span<std::byte const> in, int peer, int tag) { impl_->send(in, peer, tag); }
  void recv(std::span<std::byte> out, int peer, int tag) { impl_->recv(out, peer, tag); }

  request ibroadcast(std::span<std::byte> buf, int root) { return impl_->ibroadcast(buf, root); }
  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) { return impl_->iall_reduce(buf, t, op); }
  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t, reduce_op op) {
    return impl_->ireduce_scatter(in, out, t, op);
  }
  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) { return impl_->iall_gather(in, out); }
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    return impl_->iall_gather_v(in, out, counts);
  }
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc, std::span<std::byte> out,
                        std::span<std::size_t const> rc) {
    return impl_->iall_to_all_v(in, sc, out, rc);
  }
  request isend(std::span<std::byte const> in, int peer, int tag) { return impl_->isend(in, peer, tag); }
  request irecv(std::span<std::byte> out, int peer, int tag) { return impl_->irecv(out, peer, tag); }

  /// The wrapped communicator if it is a `C`, else null.
  template <class C>
  [[nodiscard]] C* target() noexcept {
    if (auto* m = dynamic_cast<model<C>*>(impl_.get())) return &m->c;
    auto* b = dynamic_cast<model<C&>*>(impl_.get());  // made by `borrow`
    return b != nullptr ? &b->c : nullptr;
  }

 private:
  struct interface;
  explicit any_communicator(std::shared_ptr<interface> impl) noexcept : impl_(std::move(impl)) {}

  struct interface {
    virtual ~interface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void barrier() = 0;
    virtual void broadcast(std::span<std::byte>, int) = 0;
    virtual void all_reduce(std::span<std::byte>, comm_type, reduce_op) = 0;
    virtual void reduce_scatter(std::span<std::byte const>, std::span<std::byte>, comm_type, reduce_op) = 0;
    virtual void all_gather(std::span<std::byte const>, std::span<std::byte>) = 0;
    virtual void all_gather_v(std::span<std::byte const>, std::span<std::byte>, std::span<std::size_t const>) = 0;
    virtual void all_to_all_v(std::span<std::byte const>, std::span<std::size_t const>, std::span<std::byte>,
                              std::span<std::size_t const>) = 0;
    virtual void send(std::span<std::byte const>, int, int) = 0;
    virtual void recv(std::span<std::byte>, int, int) = 0;
    virtual request ibroadcast(std::span<std::byte>, int) = 0;
    virtual request iall_reduce(std::span<std::byte>, comm_type, reduce_op) = 0;
    virtual request ireduce_scatter(std::span<std::byte const>, std::span<std::byte>, comm_type, reduce_op) = 0;
    virtual request iall_gather(std::span<std::byte const>, std::span<std::byte>) = 0;
    virtual request iall_gather_v(std::span<std::byte const>, std::span<std::byte>, std::span<std::size_t const>) = 0;
    virtual request iall_to_all_v(std::span<std::byte const>, std::span<std::size_t const>, std::span<std::byte>,
                                  std::span<std::size_t const>) = 0;
    virtual request isend(std::span<std::byte const>, int, int) = 0;
    virtual request irecv(std::span<std::byte>, int, int) = 0;
  };

  template <class C>
  struct model final : interface {
    explicit model(C x) : c(std::forward<C>(x)) {}  // C = X&: a borrowed communicator
    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    void barrier() override { c.barrier(); }
    void broadcast(std::span<std::byte> b, int r) override { c.broadcast(b, r); }
    void all_reduce(std::span<std::byte> b, comm_type t, reduce_op o) override { c.all_reduce(b, t, o); }
    void reduce_scatter(std::span<std::byte const> i, std::span<std::byte> b, comm_type t, reduce_op o) override {
      c.reduce_scatter(i, b, t, o);
    }
    void all_gather(std::span<std::byte const> i, std::span<std::byte> b) override { c.all_gather(i, b); }
    void all_gather_v(std::span<std::byte const> i, std::span<std::byte> b, std::span<std::size_t const> n) override {
      c.all_gather_v(i, b, n);
    }
    void all_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> b,
                      std::span<std::size_t const> rc) override {
      c.all_to_all_v(i, sc, b, rc);
    }
    void send(std::span<std::byte const> i, int p, int t) override { c.send(i, p, t); }
    void recv(std::span<std::byte> b, int p, int t) override { c.recv(b, p, t); }
    request ibroadcast(std::span<std::byte> b, int r) override { return c.ibroadcast(b, r); }
    request iall_reduce(std::span<std::byte> b, comm_type t, reduce_op o) override { return c.iall_reduce(b, t, o); }
    request ireduce_scatter(std::span<std::byte const> i, std::span<std::byte> b, comm_type t, reduce_op o) override {
      return c.ireduce_scatter(i, b, t, o);
    }
    request iall_gather(std::span<std::byte const> i, std::span<std::byte> b) override { return c.iall_gather(i, b); }
    request iall_gather_v(std::span<std::byte const> i, std::span<std::byte> b, std::span<std::size_t const> n) override {
      return c.iall_gather_v(i, b, n);
    }
    request iall_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> b,
                          std::span<std::size_t const> rc) override {
      return c.iall_to_all_v(i, sc, b, rc);
    }
    request isend(std::span<std::byte const> i, int p, int t) override { return c.isend(i, p, t); }
    request irecv(std::span<std::byte> b, int p, int t) override { return c.irecv(b, p, t); }
    C c;
  };

  std::shared_ptr<interface> impl_;
};

static_assert(communicator<any_communicator>);

GRADCOMP_NAMESPACE_END
