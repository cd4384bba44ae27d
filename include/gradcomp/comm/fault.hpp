// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `fault_injecting_communicator<C>`: wraps any communicator (in-process, MPI,
/// `any_communicator`, a user's own) and misbehaves on purpose at chosen operations of chosen
/// ranks, so that a training integration can be tested against a peer that dies, hangs or sends
/// bad bytes. It models `communicator` itself: hand it to the collectives, the pipeline or a
/// `comm_mixer` in place of the communicator it wraps.
///
/// A `fault_plan` lists `fault`s; every rank may be given the same plan, and each wrapper acts
/// only on the faults of its own rank. A fault names its rank, the operation (the `index`-th
/// operation this rank posts, counting every operation, or only operations of kind `of`; 0
/// first; blocking and non-blocking forms count alike) and what happens there:
///
/// | kind        | what the rank does at that operation                                      |
/// |-------------|---------------------------------------------------------------------------|
/// | `drop`      | exits: `fault_plan::on_drop` runs (in-process: `in_process_world::leave`; under
/// MPI, e.g. `std::raise(SIGKILL)`), then this and every later operation throws `rank_dropped` | |
/// `stall`     | sleeps `duration` (longer than the peers' timeout), then posts the operation | |
/// `truncate`  | the message it sends loses its second half (whole elements; a one-element message
/// becomes empty) | | `corrupt`   | `flips` bits are flipped in the bytes it sends
/// (`fault_side::send`, every receiver sees them) or in the bytes it received
/// (`fault_side::receive`, only this rank sees them) | | `duplicate` | the message is sent twice: a
/// send is repeated, a collective is posted a second time with the same contribution (the copy's
/// request is kept by the wrapper and completes, or fails, on its own; it is waited for when the
/// wrapper is destroyed) | | `delay`     | sleeps `duration` (shorter than the timeout), then posts
/// the operation: the step must succeed with the same result |
///
/// Where a fault has nothing to act on (a receive has no bytes to send, a root receives nothing
/// in its own broadcast, a barrier carries no bytes) it is *not effective*; `events()` records
/// every fault that was reached and whether it took effect.
///
/// Corruption flips one bit per flip, at a byte drawn from `seed` (or starting at `byte`, then
/// the next bytes) among the bytes of the message that travel between ranks (for gathers and
/// all-to-all, not this rank's own block).
///
/// Truncation and duplication model transport bugs. The in-process communicator checks sizes
/// and signatures and turns them into `comm_error`; under MPI a truncated or repeated
/// collective is an erroneous MPI program, so use those two with in-process ranks (or a
/// transport that checks lengths). Drop, stall, delay and corruption work with every transport.
///
/// Usage (in-process; every rank gets the same plan, rank 1 stalls at its third operation):
/// ```cpp
/// gradcomp::in_process_world world(4, std::chrono::milliseconds(300));
/// gradcomp::fault_plan plan{{{.kind = gradcomp::fault_kind::stall, .rank = 1, .index = 2,
///                             .duration = std::chrono::milliseconds(600)}}};
/// plan.on_drop = [&](int r) { world.leave(r); };
/// // on the thread of rank r:
/// gradcomp::fault_injecting_communicator comm(world.communicator(r), plan);
/// gradcomp::all_reduce_compressed(comm, codec, grad, out);  // comm_error on every rank
/// ```

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// What an injected fault does (see the file comment).
enum class fault_kind : std::uint8_t {
  drop = 0,       ///< the rank exits
  stall = 1,      ///< the rank sleeps past the timeout before posting the operation
  truncate = 2,   ///< the message sent loses its second half
  corrupt = 3,    ///< bits flipped in the message
  duplicate = 4,  ///< the message is sent twice
  delay = 5,      ///< the rank sleeps within the timeout before posting the operation
};

/// Name of a fault kind ("drop", ...).
constexpr char const* fault_kind_name(fault_kind k) noexcept {
  switch (k) {
    case fault_kind::drop: return "drop";
    case fault_kind::stall: return "stall";
    case fault_kind::truncate: return "truncate";
    case fault_kind::corrupt: return "corrupt";
    case fault_kind::duplicate: return "duplicate";
    case fault_kind::delay: return "delay";
  }
  return "unknown";
}

/// The operations of a communicator, as the wrapper counts them.
enum class comm_operation : std::uint8_t {
  barrier = 0,
  broadcast = 1,
  all_reduce = 2,
  reduce_scatter = 3,
  all_gather = 4,
  all_gather_v = 5,
  all_to_all_v = 6,
  send = 7,
  recv = 8,
  any = 9,  ///< every operation (a fault's `of`: count them all)
};

/// Name of a communicator operation ("all_reduce", ...).
constexpr char const* comm_operation_name(comm_operation o) noexcept {
  switch (o) {
    case comm_operation::barrier: return "barrier";
    case comm_operation::broadcast: return "broadcast";
    case comm_operation::all_reduce: return "all_reduce";
    case comm_operation::reduce_scatter: return "reduce_scatter";
    case comm_operation::all_gather: return "all_gather";
    case comm_operation::all_gather_v: return "all_gather_v";
    case comm_operation::all_to_all_v: return "all_to_all_v";
    case comm_operation::send: return "send";
    case comm_operation::recv: return "recv";
    case comm_operation::any: return "any";
  }
  return "unknown";
}

/// Which bytes a corruption hits.
enum class fault_side : std::uint8_t {
  send = 0,     ///< the bytes this rank sends (every receiver sees the same corruption)
  receive = 1,  ///< the bytes this rank received (only this rank sees it)
};

/// One fault of a `fault_plan`.
struct fault {
  fault_kind kind = fault_kind::drop;
  /// The rank that misbehaves.
  int rank = 0;
  /// Which of that rank's operations (0: the first), counting operations of kind `of`.
  std::uint64_t index = 0;
  /// The kind of operation counted (`any`: every operation).
  comm_operation of = comm_operation::any;
  /// `stall`, `delay`: how long the rank sleeps before posting (must be > 0).
  std::chrono::milliseconds duration{0};
  /// `corrupt`: the bytes sent or the bytes received.
  fault_side side = fault_side::send;
  /// `corrupt`: bits to flip (one per byte, consecutive bytes when `byte` is given).
  std::size_t flips = 1;
  /// `corrupt`: the first byte to hit, counted over the bytes that travel (wraps around);
  /// empty: bytes drawn from `seed`.
  std::optional<std::size_t> byte{};
  /// `corrupt`: the bits to flip in each byte hit; 0: one bit drawn from `seed`.
  std::uint8_t mask = 0;
  /// `corrupt`: seed of the drawn bytes and bits.
  std::uint64_t seed = 0;
};

/// The faults to inject and what a dropped rank does.
struct fault_plan {
  /// The faults (each acts on its own rank only; at most one fault acts per operation, the
  /// first listed).
  std::vector<fault> faults;
  /// Called with the rank when it drops, before `rank_dropped` is thrown: make the peers see
  /// the exit (in-process: `world.leave(rank)`; MPI: kill the process). Empty: nothing.
  std::function<void(int)> on_drop;
};

/// Thrown by every operation of a rank that a `drop` fault made exit.
class rank_dropped : public comm_error {
 public:
  using comm_error::comm_error;
};

/// A fault that was reached (see `fault_injecting_communicator::events`).
struct fault_event {
  std::size_t fault = 0;                    ///< index into `fault_plan::faults`
  comm_operation op = comm_operation::any;  ///< the operation it hit
  std::uint64_t index = 0;                  ///< that operation's index among all of this rank's
  bool effective = false;                   ///< whether it changed anything
};

namespace detail::faults {

inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Bytes a truncated message of `n` bytes keeps: half its elements of `es` bytes (rounded down).
constexpr std::size_t kept(std::size_t n, std::size_t es) noexcept { return n / es / 2 * es; }

using bytes = std::vector<std::byte>;
using counts = std::vector<std::size_t>;

/// A request that owns what its operation reads until it completes (copies of the bytes sent,
/// counts) and runs `after` once it has completed successfully (receive-side corruption).
class held_request final : public request::state {
 public:
  held_request(request inner, std::vector<bytes> b, std::vector<counts> c,
               std::function<void()> after)
      : bufs_(std::move(b)),
        counts_(std::move(c)),
        after_(std::move(after)),
        inner_(std::move(inner)) {}
  bool test() override { return inner_.test(); }
  void wait() override {
    inner_.wait();
    if (after_) {
      auto a = std::move(after_);
      after_ = nullptr;
      a();
    }
  }

 private:
  // Declared first, destroyed last: the inner request (which waits) goes before its buffers.
  std::vector<bytes> bufs_;
  std::vector<counts> counts_;
  std::function<void()> after_;
  request inner_;
};

/// Flips bits of `f` in the bytes of `regions` (taken as one sequence). False if empty.
inline bool flip(gradcomp::fault const& f, std::vector<std::span<std::byte>> const& regions) {
  std::size_t total = 0;
  for (auto const& r : regions) total += r.size();
  if (total == 0 || f.flips == 0) return false;
  for (std::size_t i = 0; i < f.flips; ++i) {
    std::uint64_t const r = mix(f.seed * 0x100000001B3ull + i);
    std::size_t at = f.byte ? (*f.byte + i) % total : static_cast<std::size_t>(r % total);
    std::uint8_t const m = f.mask != 0 ? f.mask : static_cast<std::uint8_t>(1u << ((r >> 40) % 8));
    for (auto const& reg : regions) {
      if (at < reg.size()) {
        reg[at] ^= std::byte{m};
        break;
      }
      at -= reg.size();
    }
  }
  return true;
}

/// `all` without the block [skip, skip + n).
inline std::vector<std::span<std::byte>> without(std::span<std::byte> all, std::size_t skip,
                                                 std::size_t n) {
  std::vector<std::span<std::byte>> r;
  if (skip > all.size()) skip = all.size();
  n = std::min(n, all.size() - skip);
  if (skip > 0) r.push_back(all.first(skip));
  if (skip + n < all.size()) r.push_back(all.subspan(skip + n));
  return r;
}

/// Moves its arguments into a vector (never through an initializer list, which would copy the
/// buffers whose addresses were already handed to the transport).
template <class T, class... More>
std::vector<T> own(T&& first, More&&... more) {
  std::vector<T> v;
  v.reserve(1 + sizeof...(More));
  v.push_back(std::move(first));
  (v.push_back(std::move(more)), ...);
  return v;
}

inline std::span<std::byte> span_of(bytes& b) noexcept { return {b.data(), b.size()}; }
inline std::span<std::size_t const> span_of(counts const& c) noexcept {
  return {c.data(), c.size()};
}

}  // namespace detail::faults

/// A communicator that injects the faults of a `fault_plan` (see the file comment). `C` is the
/// communicator type, or a reference to one (`fault_injecting_communicator<mpi_communicator&>`
/// wraps without copying). One wrapper per rank; not copyable (it counts operations and keeps
/// the requests of duplicated messages).
template <class C>
  requires communicator<std::remove_cvref_t<C>>
class fault_injecting_communicator : public blocking_operations<fault_injecting_communicator<C>> {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps `comm` with `plan`. `config_error` for a stall or delay without a positive duration
  /// or a fault of a negative rank.
  explicit fault_injecting_communicator(C comm, fault_plan plan = {})
      : comm_(std::forward<C>(comm)), plan_(std::move(plan)) {
    for (auto const& f : plan_.faults) {
      if (f.rank < 0) throw config_error("gradcomp: a fault names rank " + std::to_string(f.rank));
      if ((f.kind == fault_kind::stall || f.kind == fault_kind::delay) && f.duration.count() <= 0) {
        throw config_error(std::string("gradcomp: a ") + fault_kind_name(f.kind) +
                           " fault needs a positive duration");
      }
    }
  }
  fault_injecting_communicator(fault_injecting_communicator const&) = delete;
  fault_injecting_communicator& operator=(fault_injecting_communicator const&) = delete;
  fault_injecting_communicator(fault_injecting_communicator&&) = default;
  fault_injecting_communicator& operator=(fault_injecting_communicator&&) = delete;
  /// Waits for the requests of duplicated messages (a copy nobody matches waits until the
  /// transport gives up on it; its error is discarded).
  ~fault_injecting_communicator() = default;

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  /// The wrapped communicator.
  [[nodiscard]] std::remove_cvref_t<C>& inner() noexcept { return comm_; }

  /// Operations this rank has posted through the wrapper (of kind `k`; `any`: all).
  [[nodiscard]] std::uint64_t operations(comm_operation k = comm_operation::any) const noexcept {
    return count_[static_cast<std::size_t>(k)];
  }
  /// The faults reached so far, in order.
  [[nodiscard]] std::span<fault_event const> events() const noexcept { return events_; }
  /// Whether a fault took effect.
  [[nodiscard]] bool faulted() const noexcept {
    for (auto const& e : events_) {
      if (e.effective) return true;
    }
    return false;
  }
  /// Whether a `drop` fault made this rank exit.
  [[nodiscard]] bool dropped() const noexcept { return dropped_; }

  request ibarrier() {
    gradcomp::fault const* f = enter(comm_operation::barrier);
    if (f != nullptr && f->kind == fault_kind::duplicate) {
      request first = barrier_once();
      effective();
      strays_.push_back(barrier_once());
      return first;
    }
    return barrier_once();
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    gradcomp::fault const* f = enter(comm_operation::broadcast);
    if (f == nullptr) return comm_.ibroadcast(buf, root);
    bool const sender = rank() == root;
    switch (f->kind) {
      case fault_kind::truncate:
        if (buf.empty()) break;
        effective();
        return comm_.ibroadcast(buf.first(detail::faults::kept(buf.size(), 1)), root);
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          if (!sender) break;
          detail::faults::bytes copy(buf.begin(), buf.end());
          if (!flip(*f, {detail::faults::span_of(copy)})) break;
          request r = comm_.ibroadcast(detail::faults::span_of(copy), root);
          return held(std::move(r), detail::faults::own(std::move(copy)));
        }
        if (sender || buf.empty()) break;
        return flip_after(comm_.ibroadcast(buf, root), *f, {buf});
      case fault_kind::duplicate: {
        request first = comm_.ibroadcast(buf, root);
        detail::faults::bytes copy(buf.begin(), buf.end());
        request second = comm_.ibroadcast(detail::faults::span_of(copy), root);
        stray(std::move(second), detail::faults::own(std::move(copy)));
        return first;
      }
      default: break;
    }
    return comm_.ibroadcast(buf, root);
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    gradcomp::fault const* f = enter(comm_operation::all_reduce);
    if (f == nullptr) return comm_.iall_reduce(buf, t, op);
    std::size_t const es = std::max<std::size_t>(comm_type_size(t), 1);
    switch (f->kind) {
      case fault_kind::truncate:
        if (buf.size() < es) break;
        effective();
        return comm_.iall_reduce(buf.first(detail::faults::kept(buf.size(), es)), t, op);
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          // In place: the contribution is overwritten by the result anyway.
          if (!flip(*f, {buf})) break;
          return comm_.iall_reduce(buf, t, op);
        }
        if (buf.empty()) break;
        return flip_after(comm_.iall_reduce(buf, t, op), *f, {buf});
      case fault_kind::duplicate: {
        detail::faults::bytes copy(buf.begin(), buf.end());
        request first = comm_.iall_reduce(buf, t, op);
        request second = comm_.iall_reduce(detail::faults::span_of(copy), t, op);
        stray(std::move(second), detail::faults::own(std::move(copy)));
        return first;
      }
      default: break;
    }
    return comm_.iall_reduce(buf, t, op);
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    gradcomp::fault const* f = enter(comm_operation::reduce_scatter);
    if (f == nullptr) return comm_.ireduce_scatter(in, out, t, op);
    std::size_t const es = std::max<std::size_t>(comm_type_size(t), 1);
    auto const w = static_cast<std::size_t>(size());
    switch (f->kind) {
      case fault_kind::truncate: {
        if (out.size() < es) break;
        std::size_t const keep = detail::faults::kept(out.size(), es);
        effective();
        return comm_.ireduce_scatter(in.first(std::min(in.size(), keep * w)), out.first(keep), t,
                                     op);
      }
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          detail::faults::bytes copy(in.begin(), in.end());
          if (!flip(*f, {detail::faults::span_of(copy)})) break;
          request r = comm_.ireduce_scatter(detail::faults::span_of(copy), out, t, op);
          return held(std::move(r), detail::faults::own(std::move(copy)));
        }
        if (out.empty()) break;
        return flip_after(comm_.ireduce_scatter(in, out, t, op), *f, {out});
      case fault_kind::duplicate: {
        detail::faults::bytes copy(in.begin(), in.end()), scratch(out.size());
        request first = comm_.ireduce_scatter(in, out, t, op);
        request second = comm_.ireduce_scatter(detail::faults::span_of(copy),
                                               detail::faults::span_of(scratch), t, op);
        stray(std::move(second), detail::faults::own(std::move(copy), std::move(scratch)));
        return first;
      }
      default: break;
    }
    return comm_.ireduce_scatter(in, out, t, op);
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    gradcomp::fault const* f = enter(comm_operation::all_gather);
    if (f == nullptr) return comm_.iall_gather(in, out);
    auto const w = static_cast<std::size_t>(size());
    auto const me = static_cast<std::size_t>(rank());
    switch (f->kind) {
      case fault_kind::truncate: {
        if (in.empty()) break;
        std::size_t const keep = detail::faults::kept(in.size(), 1);
        effective();
        return comm_.iall_gather(in.first(keep), out.first(keep * w));
      }
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          detail::faults::bytes copy(in.begin(), in.end());
          if (!flip(*f, {detail::faults::span_of(copy)})) break;
          request r = comm_.iall_gather(detail::faults::span_of(copy), out);
          return held(std::move(r), detail::faults::own(std::move(copy)));
        }
        return flip_after(comm_.iall_gather(in, out), *f,
                          detail::faults::without(out, me * in.size(), in.size()));
      case fault_kind::duplicate: {
        detail::faults::bytes copy(in.begin(), in.end()), scratch(out.size());
        request first = comm_.iall_gather(in, out);
        request second =
            comm_.iall_gather(detail::faults::span_of(copy), detail::faults::span_of(scratch));
        stray(std::move(second), detail::faults::own(std::move(copy), std::move(scratch)));
        return first;
      }
      default: break;
    }
    return comm_.iall_gather(in, out);
  }

  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    gradcomp::fault const* f = enter(comm_operation::all_gather_v);
    if (f == nullptr) return comm_.iall_gather_v(in, out, counts);
    auto const me = static_cast<std::size_t>(rank());
    switch (f->kind) {
      case fault_kind::truncate: {
        if (in.empty() || me >= counts.size()) break;
        std::size_t const keep = detail::faults::kept(in.size(), 1);
        detail::faults::counts c(counts.begin(), counts.end());
        c[me] = keep;
        effective();
        request r = comm_.iall_gather_v(in.first(keep), out.first(out.size() - (in.size() - keep)),
                                        detail::faults::span_of(c));
        return held(std::move(r), {}, detail::faults::own(std::move(c)));
      }
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          detail::faults::bytes copy(in.begin(), in.end());
          if (!flip(*f, {detail::faults::span_of(copy)})) break;
          request r = comm_.iall_gather_v(detail::faults::span_of(copy), out, counts);
          return held(std::move(r), detail::faults::own(std::move(copy)));
        } else {
          std::size_t const before = std::accumulate(
              counts.begin(),
              counts.begin() + static_cast<std::ptrdiff_t>(std::min(me, counts.size())),
              std::size_t{0});
          return flip_after(comm_.iall_gather_v(in, out, counts), *f,
                            detail::faults::without(out, before, in.size()));
        }
      case fault_kind::duplicate: {
        detail::faults::bytes copy(in.begin(), in.end()), scratch(out.size());
        detail::faults::counts c(counts.begin(), counts.end());
        request first = comm_.iall_gather_v(in, out, counts);
        request second =
            comm_.iall_gather_v(detail::faults::span_of(copy), detail::faults::span_of(scratch),
                                detail::faults::span_of(c));
        stray(std::move(second), detail::faults::own(std::move(copy), std::move(scratch)),
              detail::faults::own(std::move(c)));
        return first;
      }
      default: break;
    }
    return comm_.iall_gather_v(in, out, counts);
  }

  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    gradcomp::fault const* f = enter(comm_operation::all_to_all_v);
    if (f == nullptr) return comm_.iall_to_all_v(in, send_counts, out, recv_counts);
    auto const me = static_cast<std::size_t>(rank());
    auto offset = [](std::span<std::size_t const> c, std::size_t p) {
      return std::accumulate(c.begin(),
                             c.begin() + static_cast<std::ptrdiff_t>(std::min(p, c.size())),
                             std::size_t{0});
    };
    switch (f->kind) {
      case fault_kind::truncate: {
        // Cut the block for the first peer that gets one (this rank's own block if none does).
        std::size_t victim = send_counts.size();
        for (std::size_t p = 0; p < send_counts.size() && victim == send_counts.size(); ++p) {
          if (p != me && send_counts[p] > 0) victim = p;
        }
        if (victim == send_counts.size() && me < send_counts.size() && send_counts[me] > 0)
          victim = me;
        if (victim == send_counts.size()) break;
        detail::faults::counts c(send_counts.begin(), send_counts.end());
        c[victim] = detail::faults::kept(c[victim], 1);
        std::size_t const at = offset(send_counts, victim);
        detail::faults::bytes copy;
        copy.reserve(in.size());
        copy.insert(copy.end(), in.begin(),
                    in.begin() + static_cast<std::ptrdiff_t>(at + c[victim]));
        copy.insert(copy.end(), in.begin() + static_cast<std::ptrdiff_t>(at + send_counts[victim]),
                    in.end());
        effective();
        request r = comm_.iall_to_all_v(detail::faults::span_of(copy), detail::faults::span_of(c),
                                        out, recv_counts);
        return held(std::move(r), detail::faults::own(std::move(copy)),
                    detail::faults::own(std::move(c)));
      }
      case fault_kind::corrupt:
        if (f->side == fault_side::send) {
          detail::faults::bytes copy(in.begin(), in.end());
          std::size_t const own = me < send_counts.size() ? send_counts[me] : 0;
          if (!flip(*f, detail::faults::without(detail::faults::span_of(copy),
                                                offset(send_counts, me), own)))
            break;
          request r =
              comm_.iall_to_all_v(detail::faults::span_of(copy), send_counts, out, recv_counts);
          return held(std::move(r), detail::faults::own(std::move(copy)));
        } else {
          std::size_t const own = me < recv_counts.size() ? recv_counts[me] : 0;
          return flip_after(comm_.iall_to_all_v(in, send_counts, out, recv_counts), *f,
                            detail::faults::without(out, offset(recv_counts, me), own));
        }
      case fault_kind::duplicate: {
        detail::faults::bytes copy(in.begin(), in.end()), scratch(out.size());
        detail::faults::counts sc(send_counts.begin(), send_counts.end()),
            rc(recv_counts.begin(), recv_counts.end());
        request first = comm_.iall_to_all_v(in, send_counts, out, recv_counts);
        request second =
            comm_.iall_to_all_v(detail::faults::span_of(copy), detail::faults::span_of(sc),
                                detail::faults::span_of(scratch), detail::faults::span_of(rc));
        stray(std::move(second), detail::faults::own(std::move(copy), std::move(scratch)),
              detail::faults::own(std::move(sc), std::move(rc)));
        return first;
      }
      default: break;
    }
    return comm_.iall_to_all_v(in, send_counts, out, recv_counts);
  }

  request isend(std::span<std::byte const> in, int peer, int tag) {
    gradcomp::fault const* f = enter(comm_operation::send);
    if (f == nullptr) return comm_.isend(in, peer, tag);
    switch (f->kind) {
      case fault_kind::truncate:
        if (in.empty()) break;
        effective();
        return comm_.isend(in.first(detail::faults::kept(in.size(), 1)), peer, tag);
      case fault_kind::corrupt: {
        if (f->side != fault_side::send) break;
        detail::faults::bytes copy(in.begin(), in.end());
        if (!flip(*f, {detail::faults::span_of(copy)})) break;
        request r = comm_.isend(detail::faults::span_of(copy), peer, tag);
        return held(std::move(r), detail::faults::own(std::move(copy)));
      }
      case fault_kind::duplicate: {
        detail::faults::bytes copy(in.begin(), in.end());
        request first = comm_.isend(in, peer, tag);
        request second = comm_.isend(detail::faults::span_of(copy), peer, tag);
        stray(std::move(second), detail::faults::own(std::move(copy)));
        return first;
      }
      default: break;
    }
    return comm_.isend(in, peer, tag);
  }

  request irecv(std::span<std::byte> out, int peer, int tag) {
    gradcomp::fault const* f = enter(comm_operation::recv);
    if (f == nullptr) return comm_.irecv(out, peer, tag);
    switch (f->kind) {
      case fault_kind::truncate:
        if (out.empty()) break;
        effective();
        return comm_.irecv(out.first(detail::faults::kept(out.size(), 1)), peer, tag);
      case fault_kind::corrupt:
        if (f->side != fault_side::receive || out.empty()) break;
        return flip_after(comm_.irecv(out, peer, tag), *f, {out});
      default: break;
    }
    return comm_.irecv(out, peer, tag);
  }

 private:
  // Counts the operation, and applies drop, stall and delay at once; returns the byte fault
  // (truncate, corrupt, duplicate) to apply to it, if any.
  gradcomp::fault const* enter(comm_operation op) {
    if (dropped_) {
      throw rank_dropped("gradcomp: rank " + std::to_string(rank()) +
                         " was dropped by an injected fault");
    }
    std::uint64_t const all = count_[static_cast<std::size_t>(comm_operation::any)]++;
    std::uint64_t const mine = count_[static_cast<std::size_t>(op)]++;
    for (std::size_t i = 0; i < plan_.faults.size(); ++i) {
      gradcomp::fault const& f = plan_.faults[i];
      if (f.rank != rank()) continue;
      if (f.of == comm_operation::any ? f.index != all : (f.of != op || f.index != mine)) continue;
      events_.push_back({i, op, all, false});
      switch (f.kind) {
        case fault_kind::drop:
          events_.back().effective = true;
          dropped_ = true;
          if (plan_.on_drop) plan_.on_drop(rank());
          throw rank_dropped("gradcomp: rank " + std::to_string(rank()) +
                             " dropped by an injected fault at its " + comm_operation_name(op) +
                             " (operation " + std::to_string(all) + ")");
        case fault_kind::stall:
        case fault_kind::delay:
          events_.back().effective = true;
          std::this_thread::sleep_for(f.duration);
          return nullptr;
        case fault_kind::duplicate:
          if (op != comm_operation::recv) events_.back().effective = true;
          return &f;
        default: return &f;
      }
    }
    return nullptr;
  }

  void effective() noexcept { events_.back().effective = true; }

  bool flip(gradcomp::fault const& f, std::vector<std::span<std::byte>> const& regions) {
    if (!detail::faults::flip(f, regions)) return false;
    effective();
    return true;
  }

  request barrier_once() {
    if constexpr (requires(std::remove_cvref_t<C> & c) {
                    { c.ibarrier() } -> std::same_as<request>;
                  }) {
      return comm_.ibarrier();
    } else {
      comm_.barrier();
      return request{};
    }
  }

  static request held(request r, std::vector<detail::faults::bytes> b,
                      std::vector<detail::faults::counts> c = {}) {
    return request(std::make_unique<detail::faults::held_request>(std::move(r), std::move(b),
                                                                  std::move(c), nullptr));
  }

  // Receive-side corruption: the regions are flipped once the operation has completed.
  request flip_after(request r, gradcomp::fault const& f,
                     std::vector<std::span<std::byte>> regions) {
    std::size_t total = 0;
    for (auto const& s : regions) total += s.size();
    if (total == 0) return r;
    effective();
    gradcomp::fault const copy = f;
    return request(std::make_unique<detail::faults::held_request>(
        std::move(r), std::vector<detail::faults::bytes>{}, std::vector<detail::faults::counts>{},
        [copy, regions = std::move(regions)] { detail::faults::flip(copy, regions); }));
  }

  void stray(request r, std::vector<detail::faults::bytes> b,
             std::vector<detail::faults::counts> c = {}) {
    strays_.push_back(held(std::move(r), std::move(b), std::move(c)));
  }

  C comm_;
  fault_plan plan_;
  std::array<std::uint64_t, 10> count_{};
  std::vector<fault_event> events_;
  bool dropped_ = false;
  std::vector<request> strays_;  // the copies of duplicated messages
};

template <class C>
fault_injecting_communicator(C, fault_plan) -> fault_injecting_communicator<C>;

GRADCOMP_NAMESPACE_END
