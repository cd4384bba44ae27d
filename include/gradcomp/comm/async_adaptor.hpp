// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `async_adaptor<C>`: turns a `blocking_communicator` into a full `communicator`. A user who
/// brings a transport of their own writes only the blocking operations; the adaptor adds the
/// non-blocking forms.
///
/// How it works: the adaptor owns one worker thread and a FIFO queue. Every operation, the
/// blocking ones too, is queued and run by that thread on the wrapped communicator in the order
/// it was issued, so every rank presents its collectives to the transport in program order (the
/// order all ranks agree on). A non-blocking call returns at once with a `request`; a blocking
/// call queues the same work and waits for it. An exception thrown by the wrapped communicator
/// is stored and rethrown by the request's `wait()` (for a blocking call, by the call itself);
/// the queue carries on with the next operation, so whether a transport is usable after a
/// failure is the wrapped communicator's decision. Argument errors that one rank can see (sizes
/// that do not divide, a bad rank or tag) are thrown as `config_error` by the call itself,
/// before anything is queued.
///
/// What it does not do:
/// - It adds no timeout. Operations run to completion on the worker thread, because a request
///   that gave up while the transport still writes into its buffer would hand the caller a
///   buffer that changes under it. Detecting a dead peer is the wrapped communicator's job.
/// - It runs one operation at a time. Two non-blocking operations overlap with the caller's
///   computation, not with each other. In particular, if the wrapped `send` blocks until the
///   peer receives (a rendezvous transport), two ranks that both queue a send to each other
///   before their receives deadlock, exactly as they would calling the blocking operations in
///   that order; order exchanges (the lower rank sends first) or use an eager transport.
/// - `rank()` and `size()` are read from the wrapped communicator once, at construction.
///
/// Copies of an adaptor share the worker and the wrapped communicator. The worker stops, after
/// finishing everything queued, when the last copy is destroyed; requests outlive it safely.
///
/// ```cpp
/// my_transport t = ...;                          // models blocking_communicator
/// gradcomp::async_adaptor comm(std::move(t));    // models communicator
/// gradcomp::request r = comm.iall_reduce(bytes, gradcomp::comm_type::f32,
/// gradcomp::reduce_op::sum); compress_next_bucket();                        // overlaps the
/// all-reduce r.wait();
/// ```

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail::async {

// Completion of one queued operation, shared by the queue entry and the request.
struct completion {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
};

class queued_request final : public request::state {
 public:
  explicit queued_request(std::shared_ptr<completion> c) : c_(std::move(c)) {}

  bool test() override {
    std::lock_guard lock(c_->mutex);
    return c_->done;
  }

  // `request` calls this once. The error is moved out under the lock, so the exception object
  // is owned by the waiting thread alone from here on: the worker never releases the last
  // reference to an exception the caller is still handling (libstdc++ counts references to
  // exceptions in code ThreadSanitizer does not see, which it reported as a race).
  void wait() override {
    std::exception_ptr e;
    {
      std::unique_lock lock(c_->mutex);
      c_->cv.wait(lock, [&] { return c_->done; });
      e = std::move(c_->error);
      c_->error = nullptr;
    }
    if (e) std::rethrow_exception(e);
  }

 private:
  std::shared_ptr<completion> c_;
};

// The worker thread, its queue and the wrapped communicator.
template <class C>
class worker {
 public:
  explicit worker(C c) : comm_(std::move(c)), thread_([this] { run(); }) {}

  worker(worker const&) = delete;
  worker& operator=(worker const&) = delete;

  // Finishes everything queued, then stops.
  ~worker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  [[nodiscard]] C const& comm() const noexcept { return comm_; }

  // Queues `fn(comm)` and returns the request that completes when it has run.
  template <class Fn>
  request submit(Fn fn) {
    auto done = std::make_shared<completion>();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(task{std::function<void(C&)>(std::move(fn)), done});
    }
    cv_.notify_one();
    return request(std::make_unique<queued_request>(std::move(done)));
  }

 private:
  struct task {
    std::function<void(C&)> fn;
    std::shared_ptr<completion> done;
  };

  void run() {
    while (true) {
      task t;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to do
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr e;
      try {
        t.fn(comm_);
      } catch (...) {
        e = std::current_exception();
      }
      t.done->finish(std::move(e));
    }
  }

  C comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace detail::async

/// A `communicator` made of a `blocking_communicator` and one FIFO worker thread (see the file
/// comment for the semantics and the limits).
///
/// @tparam C the wrapped communicator; it is used from the worker thread only (except for
///   `rank()` and `size()`), so it need not be thread-safe.
template <blocking_communicator C>
class async_adaptor : public blocking_operations<async_adaptor<C>> {
 public:
  using communicator_concept = communicator_tag;
  using wrapped_type = C;

  /// Wraps `c` (moved in) and starts the worker thread.
  explicit async_adaptor(C c)
      : w_(std::make_shared<detail::async::worker<C>>(std::move(c))),
        rank_(w_->comm().rank()),
        size_(w_->comm().size()) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

  request ibarrier() {
    return w_->submit([](C& c) { c.barrier(); });
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    detail::comm_checks::peer(root, size_, "broadcast root");
    return w_->submit([=](C& c) { c.broadcast(buf, root); });
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    return w_->submit([=](C& c) { c.all_reduce(buf, t, op); });
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size_);
    return w_->submit([=](C& c) { c.reduce_scatter(in, out, t, op); });
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    detail::comm_checks::all_gather(in.size(), out.size(), size_);
    return w_->submit([=](C& c) { c.all_gather(in, out); });
  }

  /// `counts` is copied: it need not outlive the call.
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank_, size_);
    return w_->submit([in, out, n = std::vector<std::size_t>(counts.begin(), counts.end())](C& c) {
      c.all_gather_v(in, out, std::span<std::size_t const>(n));
    });
  }

  /// The counts are copied: they need not outlive the call.
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts, size_);
    return w_->submit(
        [in, out, sc = std::vector<std::size_t>(send_counts.begin(), send_counts.end()),
         rc = std::vector<std::size_t>(recv_counts.begin(), recv_counts.end())](C& c) {
          c.all_to_all_v(in, std::span<std::size_t const>(sc), out,
                         std::span<std::size_t const>(rc));
        });
  }

  request isend(std::span<std::byte const> in, int peer, int tag) {
    detail::comm_checks::peer(peer, size_, "send peer");
    detail::comm_checks::tag(tag);
    return w_->submit([=](C& c) { c.send(in, peer, tag); });
  }

  request irecv(std::span<std::byte> out, int peer, int tag) {
    detail::comm_checks::peer(peer, size_, "recv peer");
    detail::comm_checks::tag(tag);
    return w_->submit([=](C& c) { c.recv(out, peer, tag); });
  }

 private:
  std::shared_ptr<detail::async::worker<C>> w_;
  int rank_;
  int size_;
};

GRADCOMP_NAMESPACE_END
