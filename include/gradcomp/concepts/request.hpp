// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `request`: the handle of a non-blocking communication operation. Every communicator returns
/// this one type, so collectives and the type-erased `any_communicator` need no per-transport
/// handle types. An adapter implements `request::state` for its transport.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <exception>
#include <memory>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN

/// Handle of a non-blocking operation. Move-only. A default-constructed request is already
/// complete.
///
/// `wait()` blocks until the operation has completed, and throws `comm_error` (or the
/// transport's error) if it failed; after that the request is complete and a second `wait()`
/// returns at once. Destroying a request that was never waited for waits for it first (and
/// discards its error: call `wait()` to see errors), so buffers are never released while a
/// transport may still use them.
class request {
 public:
  /// What a transport implements for one pending operation.
  class state {
   public:
    virtual ~state() = default;
    /// True when the operation has completed (successfully or not); never blocks. May make
    /// progress. A failure is reported by the following `wait()`.
    virtual bool test() = 0;
    /// Blocks until the operation completes; throws on failure.
    virtual void wait() = 0;
  };

  request() noexcept = default;
  /// Takes ownership of a pending operation.
  explicit request(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}

  request(request&& other) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  request(request const&) = delete;
  request& operator=(request const&) = delete;
  ~request() { finish_quietly(); }

  /// Completes the operation; rethrows its failure.
  void wait() {
    if (!state_) return;
    std::unique_ptr<state> s = std::move(state_);
    s->wait();
  }

  /// True when the operation has completed (a following `wait()` does not block).
  [[nodiscard]] bool test() {
    return !state_ || state_->test();
  }

  /// True until `wait()` has been called on a pending operation.
  [[nodiscard]] bool pending() const noexcept { return static_cast<bool>(state_); }

 private:
  void finish_quietly() noexcept {
    if (!state_) return;
    try {
      state_->wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): documented; wait() reports errors
    }
    state_.reset();
  }

  std::unique_ptr<state> state_;
};

/// Waits for every request of `rs` (even after one failed) and rethrows the first failure.
template <class Range>
void wait_all(Range& rs) {
  std::exception_ptr first;
  for (request& r : rs) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

GRADCOMP_NAMESPACE_END
