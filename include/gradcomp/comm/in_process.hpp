// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The in-process communicator: N ranks as threads of one process, sharing an
/// `in_process_world`. It is the embedded default for tests, examples and the demo, and the
/// reference the other adapters are checked against.
///
/// Behaviour:
/// - every operation copies what a rank contributes when the rank posts it, so buffers may be
///   reused (and all-reduce works in place) as soon as the operation completes;
/// - reductions combine contributions in rank order, so every rank gets bit-identical results;
///   all-reduce splits the reduction into one shard per rank, each computed by its own rank;
/// - collectives check that all ranks called the same operation with matching arguments; a
///   mismatch is a `comm_error` on every rank involved;
/// - a rank that waits longer than the world's timeout for its peers gets a `comm_error` naming
///   the ranks it waited for; a rank that fails (`in_process_world::fail`, or an exception in a
///   rank run by `run_in_process`) or returns while others still wait on it makes their pending
///   and later operations fail at once with a `comm_error` naming it. After any of these the
///   world is broken: every later operation fails.
///
/// Usage:
/// ```cpp
/// gradcomp::run_in_process(4, [&](gradcomp::in_process_communicator& comm) {
///   std::vector<float> g = local_gradient(comm.rank());
///   comm.all_reduce(std::as_writable_bytes(std::span(g)), gradcomp::comm_type::f32,
///                   gradcomp::reduce_op::sum);
/// });
/// ```

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail::inproc {

enum class op_kind : std::uint8_t {
  barrier,
  broadcast,
  all_reduce,
  reduce_scatter,
  all_gather,
  all_gather_v,
  all_to_all_v
};

constexpr char const* op_name(op_kind k) noexcept {
  switch (k) {
    case op_kind::barrier: return "barrier";
    case op_kind::broadcast: return "broadcast";
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::all_gather: return "all_gather";
    case op_kind::all_gather_v: return "all_gather_v";
    case op_kind::all_to_all_v: return "all_to_all_v";
  }
  return "?";
}

/// What a rank declares when it posts a collective; must agree across ranks.
struct signature {
  op_kind kind = op_kind::barrier;
  comm_type type = comm_type::u8;
  reduce_op op = reduce_op::sum;
  int root = 0;
  std::size_t bytes = 0;             ///< the size every rank must agree on (0 where none)
  std::vector<std::size_t> counts;   ///< all_gather_v: the counts every rank must agree on

  [[nodiscard]] bool matches(signature const& o) const {
    return kind == o.kind && type == o.type && op == o.op && root == o.root &&
           bytes == o.bytes && counts == o.counts;
  }

  [[nodiscard]] std::string describe() const {
    std::string s = op_name(kind);
    switch (kind) {
      case op_kind::all_reduce:
      case op_kind::reduce_scatter:
        s += std::string("(") + comm_type_name(type) + ", " + reduce_op_name(op) + ", " +
             std::to_string(bytes) + " bytes)";
        break;
      case op_kind::broadcast:
        s += "(root " + std::to_string(root) + ", " + std::to_string(bytes) + " bytes)";
        break;
      case op_kind::all_gather: s += "(" + std::to_string(bytes) + " bytes each)"; break;
      case op_kind::all_gather_v: {
        s += "(counts";
        for (std::size_t c : counts) s += " " + std::to_string(c);
        s += ")";
        break;
      }
      default: break;
    }
    return s;
  }
};

struct slot {
  signature sig;
  int defined_by = -1;
  std::vector<std::vector<std::byte>> data;          // each rank's contribution
  std::vector<std::vector<std::size_t>> send_counts;  // all_to_all_v: each rank's send counts
  std::vector<char> has_posted;
  std::vector<std::byte> result;  // all_reduce
  std::vector<char> shard_state;  // all_reduce: 0 free, 1 being reduced, 2 done
  int posted = 0;
  int reduced = 0;
  int finished = 0;
};

struct channel {
  std::uint64_t sent = 0;
  std::uint64_t claimed = 0;
  std::map<std::uint64_t, std::vector<std::byte>> messages;
};

struct world_state {
  world_state(int n, std::chrono::milliseconds t)
      : size(n), timeout(t), next_seq(static_cast<std::size_t>(n)), departed(static_cast<std::size_t>(n)) {}

  int const size;
  std::chrono::milliseconds const timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::uint64_t> next_seq;
  std::map<std::uint64_t, slot> slots;
  std::map<std::tuple<int, int, int>, channel> channels;  // (from, to, tag)
  std::vector<char> departed;
  std::string broken;  // non-empty once the world is unusable

  // Marks the world broken (first reason wins) and wakes everyone. Caller holds the lock.
  void break_world(std::string why) {
    if (broken.empty()) broken = std::move(why);
    cv.notify_all();
  }

  [[noreturn]] void fail_locked(int rank, std::string const& what) {
    break_world("rank " + std::to_string(rank) + ": " + what);
    throw comm_error("gradcomp: in-process rank " + std::to_string(rank) + ": " + what);
  }

  void check_usable(int rank) const {
    if (!broken.empty()) {
      throw comm_error("gradcomp: in-process rank " + std::to_string(rank) +
                       ": the communicator is unusable after an earlier failure (" + broken + ")");
    }
  }

  // Waits until `ready()` (caller holds `lock`). Throws comm_error on a broken world, on a
  // departed rank listed by `missing()`, or at the timeout.
  template <class Ready, class Missing>
  void wait_for(std::unique_lock<std::mutex>& lock, int rank, std::string const& what, Ready ready,
                Missing missing) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (ready()) return;
      check_usable(rank);
      std::vector<int> const m = missing();
      for (int p : m) {
        if (departed[static_cast<std::size_t>(p)] != 0) {
          fail_locked(rank, what + ": rank " + std::to_string(p) +
                                " has left the communicator without taking part");
        }
      }
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        check_usable(rank);
        std::string list;
        for (int p : missing()) list += (list.empty() ? "" : ", ") + std::to_string(p);
        fail_locked(rank, what + ": timed out after " + std::to_string(timeout.count()) +
                              " ms waiting for rank(s) " + list);
      }
    }
  }
};

// One posted collective of one rank; completes in `advance`.
class collective_op final : public request::state {
 public:
  collective_op(std::shared_ptr<world_state> w, int rank, std::uint64_t seq, std::span<std::byte> out,
                std::vector<std::size_t> recv_counts)
      : w_(std::move(w)), rank_(rank), seq_(seq), out_(out), recv_counts_(std::move(recv_counts)) {}

  bool test() override { return advance(false); }
  void wait() override { advance(true); }

 private:
  bool advance(bool block) {
    if (done_) return true;
    world_state& w = *w_;
    std::unique_lock lock(w.mutex);
    slot& s = w.slots.at(seq_);
    std::string const what = "collective #" + std::to_string(seq_) + " " + s.sig.describe();
    auto all_posted = [&] { return s.posted == w.size; };
    auto not_posted = [&] {
      std::vector<int> m;
      for (int p = 0; p < w.size; ++p) {
        if (s.has_posted[static_cast<std::size_t>(p)] == 0) m.push_back(p);
      }
      return m;
    };
    if (!block) {
      w.check_usable(rank_);
      if (!all_posted()) return false;
    }
    w.wait_for(lock, rank_, what, all_posted, not_posted);
    if (s.sig.kind == op_kind::all_reduce) {
      // Shard r is normally reduced by rank r, but any rank that gets here takes whatever
      // shard is still free, so the operation completes even while a peer is busy elsewhere.
      auto const n = static_cast<std::size_t>(w.size);
      for (std::size_t k = 0; k < n; ++k) {
        std::size_t const shard = (static_cast<std::size_t>(rank_) + k) % n;
        if (s.shard_state[shard] != 0) continue;
        s.shard_state[shard] = 1;
        lock.unlock();
        reduce_shard(s, shard, n);
        lock.lock();
        s.shard_state[shard] = 2;
        ++s.reduced;
        w.cv.notify_all();
      }
      auto all_reduced = [&] { return s.reduced == w.size; };
      if (!block) {
        w.check_usable(rank_);
        if (!all_reduced()) return false;
      }
      w.wait_for(lock, rank_, what, all_reduced, [] { return std::vector<int>{}; });
    }
    // Every contribution is in place and immutable now; copy this rank's result out.
    lock.unlock();
    deliver(s, w.size);
    lock.lock();
    done_ = true;
    if (++s.finished == w.size) w.slots.erase(seq_);
    return true;
  }

  static void reduce_shard(slot& s, std::size_t shard, std::size_t n) {
    std::size_t const es = comm_type_size(s.sig.type);
    std::size_t const count = s.sig.bytes / es;
    std::size_t const b = count * shard / n * es;
    std::size_t const e = count * (shard + 1) / n * es;
    if (e == b) return;
    std::memcpy(s.result.data() + b, s.data[0].data() + b, e - b);
    for (std::size_t p = 1; p < s.data.size(); ++p) {
      reduce_into(s.sig.type, s.sig.op, s.result.data() + b, s.data[p].data() + b, e - b);
    }
  }

  void deliver(slot const& s, int n) {
    auto copy = [](std::byte* to, std::byte const* from, std::size_t bytes) {
      if (bytes != 0) std::memcpy(to, from, bytes);
    };
    auto const r = static_cast<std::size_t>(rank_);
    switch (s.sig.kind) {
      case op_kind::barrier: break;
      case op_kind::broadcast:
        copy(out_.data(), s.data[static_cast<std::size_t>(s.sig.root)].data(), out_.size());
        break;
      case op_kind::all_reduce: copy(out_.data(), s.result.data(), out_.size()); break;
      case op_kind::reduce_scatter: {
        std::size_t const block = out_.size();
        copy(out_.data(), s.data[0].data() + r * block, block);
        for (std::size_t p = 1; p < s.data.size(); ++p) {
          reduce_into(s.sig.type, s.sig.op, out_.data(), s.data[p].data() + r * block, block);
        }
        break;
      }
      case op_kind::all_gather:
      case op_kind::all_gather_v: {
        std::size_t at = 0;
        for (int p = 0; p < n; ++p) {
          auto const& d = s.data[static_cast<std::size_t>(p)];
          copy(out_.data() + at, d.data(), d.size());
          at += d.size();
        }
        break;
      }
      case op_kind::all_to_all_v: {
        std::size_t at = 0;
        for (std::size_t p = 0; p < static_cast<std::size_t>(n); ++p) {
          auto const& sc = s.send_counts[p];
          std::size_t const off = std::accumulate(sc.begin(), sc.begin() + static_cast<std::ptrdiff_t>(r), std::size_t{0});
          copy(out_.data() + at, s.data[p].data() + off, recv_counts_[p]);
          at += recv_counts_[p];
        }
        break;
      }
    }
  }

  std::shared_ptr<world_state> w_;
  int rank_;
  std::uint64_t seq_;
  std::span<std::byte> out_;
  std::vector<std::size_t> recv_counts_;
  bool done_ = false;
};

// A posted receive; completes when the message with its ticket has arrived.
class recv_op final : public request::state {
 public:
  recv_op(std::shared_ptr<world_state> w, int rank, int peer, int tag, std::uint64_t ticket,
          std::span<std::byte> out)
      : w_(std::move(w)), rank_(rank), peer_(peer), tag_(tag), ticket_(ticket), out_(out) {}

  bool test() override { return advance(false); }
  void wait() override { advance(true); }

 private:
  bool advance(bool block) {
    if (done_) return true;
    world_state& w = *w_;
    std::unique_lock lock(w.mutex);
    channel& ch = w.channels[{peer_, rank_, tag_}];
    auto arrived = [&] { return ch.messages.count(ticket_) != 0; };
    std::string const what = "recv of " + std::to_string(out_.size()) + " bytes from rank " +
                             std::to_string(peer_) + " (tag " + std::to_string(tag_) + ")";
    if (!block) {
      if (!arrived()) {
        w.check_usable(rank_);
        return false;
      }
    }
    w.wait_for(lock, rank_, what, arrived, [&] { return std::vector<int>{peer_}; });
    auto node = ch.messages.extract(ticket_);
    lock.unlock();
    done_ = true;
    std::vector<std::byte> const& m = node.mapped();
    if (m.size() != out_.size()) {
      std::lock_guard relock(w.mutex);
      w.fail_locked(rank_, what + ": the message holds " + std::to_string(m.size()) + " bytes");
    }
    if (!m.empty()) std::memcpy(out_.data(), m.data(), m.size());
    return true;
  }

  std::shared_ptr<world_state> w_;
  int rank_, peer_, tag_;
  std::uint64_t ticket_;
  std::span<std::byte> out_;
  bool done_ = false;
};

}  // namespace detail::inproc

class in_process_world;

/// One rank's handle on an `in_process_world`. Cheap to copy; copies are the same rank. A rank
/// issues its operations from one thread at a time.
class in_process_communicator : public blocking_operations<in_process_communicator> {
 public:
  using communicator_concept = communicator_tag;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return w_->size; }

  /// Non-blocking barrier.
  request ibarrier() {
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::barrier;
    return post(std::move(sig), {}, {}, {}, {});
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    check_peer(root, "broadcast root");
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::broadcast;
    sig.root = root;
    sig.bytes = buf.size();
    std::span<std::byte const> contribution = rank_ == root ? std::span<std::byte const>(buf) : std::span<std::byte const>{};
    return post(std::move(sig), contribution, buf, {}, {});
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    check_reduction(buf.size(), t, op, "all_reduce");
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::all_reduce;
    sig.type = t;
    sig.op = op;
    sig.bytes = buf.size();
    return post(std::move(sig), buf, buf, {}, {});
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t, reduce_op op) {
    check_reduction(out.size(), t, op, "reduce_scatter");
    if (in.size() != out.size() * static_cast<std::size_t>(size())) {
      throw config_error("gradcomp: reduce_scatter needs an input of size() * output bytes (" +
                         std::to_string(size()) + " * " + std::to_string(out.size()) + "), got " +
                         std::to_string(in.size()));
    }
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::reduce_scatter;
    sig.type = t;
    sig.op = op;
    sig.bytes = out.size();
    return post(std::move(sig), in, out, {}, {});
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    if (out.size() != in.size() * static_cast<std::size_t>(size())) {
      throw config_error("gradcomp: all_gather needs an output of size() * input bytes (" +
                         std::to_string(size()) + " * " + std::to_string(in.size()) + "), got " +
                         std::to_string(out.size()));
    }
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::all_gather;
    sig.bytes = in.size();
    return post(std::move(sig), in, out, {}, {});
  }

  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    check_counts(counts, "all_gather_v counts");
    if (counts[static_cast<std::size_t>(rank_)] != in.size()) {
      throw config_error("gradcomp: all_gather_v counts[" + std::to_string(rank_) + "] is " +
                         std::to_string(counts[static_cast<std::size_t>(rank_)]) +
                         " but this rank contributes " + std::to_string(in.size()) + " bytes");
    }
    std::size_t const total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    if (total != out.size()) {
      throw config_error("gradcomp: all_gather_v counts add up to " + std::to_string(total) +
                         " bytes, the output has " + std::to_string(out.size()));
    }
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::all_gather_v;
    sig.counts.assign(counts.begin(), counts.end());
    return post(std::move(sig), in, out, {}, {});
  }

  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    check_counts(send_counts, "all_to_all_v send counts");
    check_counts(recv_counts, "all_to_all_v receive counts");
    std::size_t const st = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
    std::size_t const rt = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    if (st != in.size() || rt != out.size()) {
      throw config_error("gradcomp: all_to_all_v counts add up to " + std::to_string(st) + " sent / " +
                         std::to_string(rt) + " received bytes, the buffers have " +
                         std::to_string(in.size()) + " / " + std::to_string(out.size()));
    }
    detail::inproc::signature sig;
    sig.kind = detail::inproc::op_kind::all_to_all_v;
    return post(std::move(sig), in, out, send_counts, recv_counts);
  }

  /// Eager: the message is copied and the returned request is already complete.
  request isend(std::span<std::byte const> in, int peer, int tag) {
    check_peer(peer, "send peer");
    check_tag(tag);
    std::lock_guard lock(w_->mutex);
    w_->check_usable(rank_);
    auto& ch = w_->channels[{rank_, peer, tag}];
    ch.messages.emplace(ch.sent++, std::vector<std::byte>(in.begin(), in.end()));
    w_->cv.notify_all();
    return request{};
  }

  /// Receives exactly `out.size()` bytes; a message of another size is a `comm_error`.
  request irecv(std::span<std::byte> out, int peer, int tag) {
    check_peer(peer, "recv peer");
    check_tag(tag);
    std::lock_guard lock(w_->mutex);
    w_->check_usable(rank_);
    std::uint64_t const ticket = w_->channels[{peer, rank_, tag}].claimed++;
    return request(std::make_unique<detail::inproc::recv_op>(w_, rank_, peer, tag, ticket, out));
  }

 private:
  friend class in_process_world;
  in_process_communicator(std::shared_ptr<detail::inproc::world_state> w, int rank)
      : w_(std::move(w)), rank_(rank) {}

  void check_peer(int p, char const* what) const {
    if (p < 0 || p >= size()) {
      throw config_error(std::string("gradcomp: ") + what + " " + std::to_string(p) +
                         " is not a rank of this communicator (size " + std::to_string(size()) + ")");
    }
  }
  static void check_tag(int tag) {
    if (tag < 0) throw config_error("gradcomp: message tags must be >= 0, got " + std::to_string(tag));
  }
  void check_counts(std::span<std::size_t const> counts, char const* what) const {
    if (counts.size() != static_cast<std::size_t>(size())) {
      throw config_error(std::string("gradcomp: ") + what + " has " + std::to_string(counts.size()) +
                         " entries, the communicator has " + std::to_string(size()) + " ranks");
    }
  }
  static void check_reduction(std::size_t bytes, comm_type t, reduce_op op, char const* what) {
    std::size_t const es = comm_type_size(t);
    if (es == 0) throw config_error(std::string("gradcomp: ") + what + " with an unknown comm_type");
    if (op != reduce_op::sum && op != reduce_op::max && op != reduce_op::min) {
      throw config_error(std::string("gradcomp: ") + what + " with an unknown reduce_op");
    }
    if (bytes % es != 0) {
      throw config_error(std::string("gradcomp: ") + what + " of " + std::to_string(bytes) +
                         " bytes is not a whole number of " + comm_type_name(t) + " elements");
    }
  }

  request post(detail::inproc::signature sig, std::span<std::byte const> contribution,
               std::span<std::byte> out, std::span<std::size_t const> send_counts,
               std::span<std::size_t const> recv_counts) {
    using namespace detail::inproc;
    auto& w = *w_;
    std::vector<std::byte> copy(contribution.begin(), contribution.end());
    std::unique_lock lock(w.mutex);
    w.check_usable(rank_);
    std::uint64_t const seq = w.next_seq[static_cast<std::size_t>(rank_)]++;
    auto [it, fresh] = w.slots.try_emplace(seq);
    slot& s = it->second;
    if (fresh) {
      s.sig = sig;
      s.defined_by = rank_;
      s.data.resize(static_cast<std::size_t>(w.size));
      s.has_posted.assign(static_cast<std::size_t>(w.size), 0);
      if (sig.kind == op_kind::all_to_all_v) s.send_counts.resize(static_cast<std::size_t>(w.size));
      if (sig.kind == op_kind::all_reduce) {
        s.result.resize(sig.bytes);
        s.shard_state.assign(static_cast<std::size_t>(w.size), 0);
      }
    } else if (!s.sig.matches(sig)) {
      w.fail_locked(rank_, "collective #" + std::to_string(seq) + ": this rank called " +
                               sig.describe() + " but rank " + std::to_string(s.defined_by) +
                               " called " + s.sig.describe());
    }
    auto const r = static_cast<std::size_t>(rank_);
    if (sig.kind == op_kind::all_to_all_v) s.send_counts[r].assign(send_counts.begin(), send_counts.end());
    s.data[r] = std::move(copy);
    s.has_posted[r] = 1;
    ++s.posted;
    w.cv.notify_all();
    lock.unlock();
    std::vector<std::size_t> rc(recv_counts.begin(), recv_counts.end());
    if (sig.kind == op_kind::all_to_all_v) {
      // Peers that post later are checked against our receive counts at completion.
      return request(std::make_unique<checked_all_to_all>(w_, rank_, seq, out, std::move(rc)));
    }
    return request(std::make_unique<collective_op>(w_, rank_, seq, out, std::move(rc)));
  }

  // all_to_all_v: checks, once all have posted, that every peer sends what this rank expects.
  class checked_all_to_all final : public request::state {
   public:
    checked_all_to_all(std::shared_ptr<detail::inproc::world_state> w, int rank, std::uint64_t seq,
                       std::span<std::byte> out, std::vector<std::size_t> rc)
        : w_(w), rank_(rank), seq_(seq), expected_(rc), inner_(std::move(w), rank, seq, out, std::move(rc)) {}
    bool test() override {
      if (!checked_) {
        std::unique_lock lock(w_->mutex);
        auto& s = w_->slots.at(seq_);
        if (s.posted != w_->size) {
          w_->check_usable(rank_);
          return false;
        }
        check(s);
      }
      return inner_.test();
    }
    void wait() override {
      if (!checked_) {
        std::unique_lock lock(w_->mutex);
        auto& s = w_->slots.at(seq_);
        w_->wait_for(lock, rank_, "all_to_all_v #" + std::to_string(seq_),
                     [&] { return s.posted == w_->size; },
                     [&] {
                       std::vector<int> m;
                       for (int p = 0; p < w_->size; ++p) {
                         if (s.has_posted[static_cast<std::size_t>(p)] == 0) m.push_back(p);
                       }
                       return m;
                     });
        check(s);
      }
      inner_.wait();
    }

   private:
    void check(detail::inproc::slot const& s) {
      auto const r = static_cast<std::size_t>(rank_);
      for (std::size_t p = 0; p < expected_.size(); ++p) {
        if (s.send_counts[p][r] != expected_[p]) {
          w_->fail_locked(rank_, "all_to_all_v #" + std::to_string(seq_) + ": expects " +
                                     std::to_string(expected_[p]) + " bytes from rank " +
                                     std::to_string(p) + ", which sends " + std::to_string(s.send_counts[p][r]));
        }
      }
      checked_ = true;
    }
    std::shared_ptr<detail::inproc::world_state> w_;
    int rank_;
    std::uint64_t seq_;
    std::vector<std::size_t> expected_;
    detail::inproc::collective_op inner_;
    bool checked_ = false;
  };

  std::shared_ptr<detail::inproc::world_state> w_;
  int rank_;
};

static_assert(communicator<in_process_communicator>);

/// N ranks in one process. Create one world, hand `communicator(r)` to the thread of rank r.
class in_process_world {
 public:
  /// A world of `size` ranks (>= 1) whose waits give up after `timeout`.
  explicit in_process_world(int size, std::chrono::milliseconds timeout = std::chrono::minutes(2))
      : w_(make_state(size, timeout)) {}

  [[nodiscard]] int size() const noexcept { return w_->size; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return w_->timeout; }

  /// The handle of rank `rank`.
  [[nodiscard]] in_process_communicator communicator(int rank) const {
    if (rank < 0 || rank >= w_->size) {
      throw config_error("gradcomp: rank " + std::to_string(rank) + " is not in an in-process world of " +
                         std::to_string(w_->size));
    }
    return in_process_communicator(w_, rank);
  }

  /// Declares that `rank` failed: every pending and later operation of every rank fails with a
  /// `comm_error` that names it and `why`.
  void fail(int rank, std::string const& why) {
    std::lock_guard lock(w_->mutex);
    w_->break_world("rank " + std::to_string(rank) + " failed: " + why);
  }

  /// Declares that `rank` will post no more operations (its thread returned). Peers waiting for
  /// it in an operation it never joined fail at once instead of at the timeout.
  void leave(int rank) {
    std::lock_guard lock(w_->mutex);
    w_->departed.at(static_cast<std::size_t>(rank)) = 1;
    w_->cv.notify_all();
  }

  /// True once a failure, a timeout or a mismatch has made the world unusable.
  [[nodiscard]] bool broken() const {
    std::lock_guard lock(w_->mutex);
    return !w_->broken.empty();
  }

 private:
  static std::shared_ptr<detail::inproc::world_state> make_state(int size, std::chrono::milliseconds timeout) {
    if (size < 1) throw config_error("gradcomp: an in-process world needs at least one rank, got " + std::to_string(size));
    if (timeout.count() <= 0) throw config_error("gradcomp: the in-process timeout must be positive");
    return std::make_shared<detail::inproc::world_state>(size, timeout);
  }

  std::shared_ptr<detail::inproc::world_state> w_;
};

/// Runs `fn(in_process_communicator&)` on `size` threads, one per rank, and joins them. If
/// ranks throw, the world is failed (so no rank hangs on a dead peer) and the exception of the
/// rank that failed first is rethrown; the `comm_error`s that its failure caused in other
/// ranks are not.
template <class Fn>
void run_in_process(int size, Fn&& fn, std::chrono::milliseconds timeout = std::chrono::minutes(2)) {
  in_process_world world(size, timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::mutex first_mutex;
  int first = -1;
  auto body = [&](int r) {
    try {
      in_process_communicator comm = world.communicator(r);
      fn(comm);
      world.leave(r);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      {
        std::lock_guard lock(first_mutex);
        if (first < 0) first = r;
      }
      world.fail(r, "it threw an exception");
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 1; r < size; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  if (first >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
}

GRADCOMP_NAMESPACE_END
