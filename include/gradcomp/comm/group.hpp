// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Sub-communicators over any communicator, and the grouping of a communicator's ranks into
/// nodes.
///
/// `group_communicator<Parent>` runs every communicator operation among a subset of the
/// parent's ranks (its *members*, group rank i being parent rank `members[i]`). It is built on
/// the parent's point-to-point operations alone (`isend` / `irecv`), so it works over every
/// transport — in-process, MPI, NCCL, `any_communicator`, `async_adaptor`, a
/// `fault_injecting_communicator`, a user's own — and models `communicator` itself: the
/// collectives of `collective/` run on it unchanged. Several groups run at the same time, on
/// disjoint or on overlapping sets of ranks (a node's ranks, and one rank of every node).
///
/// Algorithms (g members; every message of a phase is posted at once):
/// - `all_gather`, `all_gather_v`, `all_to_all_v`: direct exchange, each rank sends its block
///   (blocks) to every other member: the bytes a ring sends, in one step instead of g - 1;
/// - `reduce_scatter`: rank b receives block b from every member and reduces the g blocks in
///   group-rank order (`reduce_into`, comm/reduce.hpp);
/// - `all_reduce`: the buffer's c elements in g shards (shard s = [c s / g, c (s + 1) / g)),
///   reduce-scattered as above, then all-gathered: 2 (g - 1) / g of the buffer per rank, as a
///   ring. Every rank gets the same bits, and they equal what the in-process communicator's
///   all-reduce gives over the same ranks (it splits and orders its sums the same way);
/// - `broadcast`: the root sends the buffer to every member; `barrier`: an empty message
///   between every pair.
///
/// Messages: the group's k-th collective uses parent tag `tag_base + k mod tag_count`
/// (`group_options`), so operations in flight at the same time never take each other's
/// messages. The group's own `send` / `recv` use the caller's tag unchanged (ranks translated);
/// a tag inside the reserved range is a `config_error`. Two groups may share the reserved range
/// when at most one rank pair is in both of them (a node group and a group of one rank per node
/// share none); groups used at the same time that share two or more ranks need ranges of their
/// own. Keep the parent's own point-to-point messages out of the range too. (NCCL ignores tags
/// and matches by issue order per peer: over it, complete each group operation before the next.)
///
/// Non-blocking operations post their messages at once and complete in `wait()` or `test()`;
/// `all_reduce` posts its second half (the all-gather) when its first half has arrived, inside
/// `wait()` / `test()`. So that no two ranks wait for each other's second halves, every member
/// must complete a group's requests in the same order (every collective of the library waits
/// in posting order). Buffers follow the concept's rules.
///
/// Failures are the parent's: a member that never takes part makes the others' receives fail
/// at the parent's timeout, a failed peer or transport error is the parent's `comm_error`, and a
/// message of an unexpected size is a `comm_error` (MPI, in-process). Argument errors one rank
/// can see are `config_error`s before anything is posted.
///
/// `node_grouping` says which node each rank lives on: `ranks_per_node` consecutive ranks, a
/// node label per rank, or a list of nodes. `layout(size)` checks it against a communicator of
/// `size` ranks (every rank in exactly one node, no empty node) and gives the node groups and
/// the *lanes* (lane j: the j-th rank of every node) that a hierarchical collective runs on
/// (collective/hierarchical.hpp).
///
/// ```cpp
/// // on every rank: the ranks of this rank's node, and the first rank of every node
/// gradcomp::node_layout const nodes = gradcomp::node_grouping::uniform(4).layout(comm.size());
/// gradcomp::group_communicator node(comm, nodes.node_ranks(nodes.node_of(comm.rank())));
/// node.all_reduce(bytes, gradcomp::comm_type::f32, gradcomp::reduce_op::sum);  // within the node
/// ```

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Where a group's collectives put their messages among the parent's tags.
struct group_options {
  /// First parent tag of the group's collective messages.
  int tag_base = 0x7000;
  /// Number of tags the group cycles through (operations in flight at once must be fewer).
  int tag_count = 1024;
};

namespace detail::group {

// One posted group operation: the parent requests of its current phase, and the local work
// (`then`) that runs once they have completed, which may post a further phase.
class pending final : public request::state {
 public:
  std::vector<request> reqs;
  std::function<void(pending&)> then;
  std::vector<std::byte> scratch;

  bool test() override {
    if (done_) return true;
    try {
      while (true) {
        for (request& r : reqs) {
          if (!r.test()) return false;
        }
        if (!advance()) break;
      }
    } catch (...) {
      error_ = std::current_exception();
    }
    done_ = true;
    return true;
  }

  void wait() override {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (done_) return;
    while (advance()) {
    }
    done_ = true;
  }

 private:
  // Completes the phase's requests (rethrowing the first failure) and runs the local work;
  // false when nothing is left.
  bool advance() {
    wait_all(reqs);
    reqs.clear();
    if (!then) return false;
    auto f = std::move(then);
    then = nullptr;
    f(*this);
    return true;
  }

  bool done_ = false;
  std::exception_ptr error_;
};

inline bool overlaps(std::span<std::byte const> a, std::span<std::byte const> b) noexcept {
  if (a.empty() || b.empty()) return false;
  std::less<std::byte const*> const lt;
  return lt(a.data(), b.data() + b.size()) && lt(b.data(), a.data() + a.size());
}

inline void copy_bytes(std::byte* to, std::byte const* from, std::size_t n) noexcept {
  if (n != 0 && to != from) std::memmove(to, from, n);
}

}  // namespace detail::group

/// A communicator over a subset of a parent communicator's ranks (see the file comment).
/// Copies share the group's state (its operation counter); the parent must outlive them.
///
/// @tparam Parent the parent's type (a `communicator`; not a reference).
template <communicator Parent>
class group_communicator : public blocking_operations<group_communicator<Parent>> {
 public:
  using communicator_concept = communicator_tag;

  /// The group of parent ranks `members` (group rank i is parent rank `members[i]`), seen from
  /// the calling rank, which must be one of them. Local: no message is exchanged; every member
  /// must build the group with the same members, in the same order, and the same options.
  /// `config_error` for an empty list, a rank outside the parent, a repeated rank, a caller
  /// outside the group, or a tag range that is empty or negative.
  group_communicator(Parent& parent, std::vector<int> members, group_options opt = {})
      : s_(std::make_shared<state>()) {
    if (members.empty())
      throw config_error("gradcomp: a group_communicator needs at least one member");
    if (opt.tag_base < 0 || opt.tag_count < 1 || opt.tag_base > INT_MAX - opt.tag_count) {
      throw config_error(
          "gradcomp: group_options needs tag_base >= 0, tag_count >= 1 and tag_base + tag_count <= "
          "INT_MAX; got " +
          std::to_string(opt.tag_base) + " and " + std::to_string(opt.tag_count));
    }
    std::vector<char> seen(static_cast<std::size_t>(parent.size()), 0);
    s_->rank = -1;
    for (std::size_t i = 0; i < members.size(); ++i) {
      int const r = members[i];
      if (r < 0 || r >= parent.size()) {
        throw config_error("gradcomp: group member " + std::to_string(r) +
                           " is not a rank of the parent (size " + std::to_string(parent.size()) +
                           ")");
      }
      if (seen[static_cast<std::size_t>(r)] != 0) {
        throw config_error("gradcomp: rank " + std::to_string(r) +
                           " appears twice in a group's members");
      }
      seen[static_cast<std::size_t>(r)] = 1;
      if (r == parent.rank()) s_->rank = static_cast<int>(i);
    }
    if (s_->rank < 0) {
      throw config_error("gradcomp: parent rank " + std::to_string(parent.rank()) +
                         " builds a group_communicator it is not a member of");
    }
    s_->parent = &parent;
    s_->members = std::move(members);
    s_->opt = opt;
  }

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(s_->members.size()); }
  /// The parent rank of group rank `r`.
  [[nodiscard]] int parent_rank(int r) const {
    detail::comm_checks::peer(r, size(), "group rank");
    return s_->members[static_cast<std::size_t>(r)];
  }
  /// The members: parent ranks in group-rank order.
  [[nodiscard]] std::span<int const> members() const noexcept { return s_->members; }
  [[nodiscard]] Parent& parent() const noexcept { return *s_->parent; }
  [[nodiscard]] group_options const& options() const noexcept { return s_->opt; }

  request ibarrier() {
    auto op = start();
    int const tag = next_tag();
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      post_recv(*op, std::span<std::byte>{}, p, tag);
      post_send(*op, std::span<std::byte const>{}, p, tag);
    }
    return request(std::move(op));
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    detail::comm_checks::peer(root, size(), "broadcast root");
    auto op = start();
    int const tag = next_tag();
    if (rank() == root) {
      for (int p = 0; p < size(); ++p) {
        if (p != root) post_send(*op, buf, p, tag);
      }
    } else {
      post_recv(*op, buf, root, tag);
    }
    return request(std::move(op));
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    detail::comm_checks::all_gather(in.size(), out.size(), size());
    std::vector<std::size_t> const counts(static_cast<std::size_t>(size()), in.size());
    return gather(in, out, counts);
  }

  /// `counts` is copied: it need not outlive the call.
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), size());
    return gather(in, out, counts);
  }

  /// The counts are copied: they need not outlive the call.
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts, size());
    auto const me = static_cast<std::size_t>(rank());
    if (send_counts[me] != recv_counts[me]) {
      throw config_error("gradcomp: all_to_all_v sends " + std::to_string(send_counts[me]) +
                         " bytes to its own rank but expects " + std::to_string(recv_counts[me]));
    }
    auto op = start();
    int const tag = next_tag();
    std::size_t sat = 0, rat = 0, own_in = 0, own_out = 0;
    for (std::size_t p = 0; p < send_counts.size(); ++p) {
      if (p == me) {
        own_in = sat;
        own_out = rat;
      } else {
        post_recv(*op, out.subspan(rat, recv_counts[p]), static_cast<int>(p), tag);
        post_send(*op, in.subspan(sat, send_counts[p]), static_cast<int>(p), tag);
      }
      sat += send_counts[p];
      rat += recv_counts[p];
    }
    detail::group::copy_bytes(out.data() + own_out, in.data() + own_in, send_counts[me]);
    return request(std::move(op));
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size());
    auto p = start();
    int const tag = next_tag();
    std::size_t const block = out.size();
    auto const g = static_cast<std::size_t>(size());
    auto const me = static_cast<std::size_t>(rank());
    // Slot q of the scratch holds member q's block of ours (our own copied, so that `out` may
    // overlap `in`).
    p->scratch.resize(block * g);
    for (std::size_t q = 0; q < g; ++q) {
      if (q == me) continue;
      post_recv(*p, std::span<std::byte>(p->scratch).subspan(q * block, block), static_cast<int>(q),
                tag);
      post_send(*p, in.subspan(q * block, block), static_cast<int>(q), tag);
    }
    detail::group::copy_bytes(p->scratch.data() + me * block, in.data() + me * block, block);
    p->then = [out, t, op, g, block](detail::group::pending& self) {
      reduce_slots(self.scratch.data(), g, block, out.data(), t, op);
    };
    return request(std::move(p));
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    auto p = start();
    int const tag = next_tag();
    auto const g = static_cast<std::size_t>(size());
    auto const me = static_cast<std::size_t>(rank());
    std::size_t const es = comm_type_size(t);
    std::size_t const count = buf.size() / es;
    auto shard = [count, g, es](std::size_t s) {
      return std::pair<std::size_t, std::size_t>{count * s / g * es, count * (s + 1) / g * es};
    };
    std::size_t const mb = shard(me).first;  // (Clang 14 cannot capture structured bindings)
    std::size_t const mine = shard(me).second - mb;
    // First half: member q's part of our shard goes to scratch slot q (ours copied there too).
    p->scratch.resize(mine * g);
    for (std::size_t q = 0; q < g; ++q) {
      if (q == me) continue;
      auto const [b, e] = shard(q);
      post_recv(*p, std::span<std::byte>(p->scratch).subspan(q * mine, mine), static_cast<int>(q),
                tag);
      post_send(*p, std::span<std::byte const>(buf).subspan(b, e - b), static_cast<int>(q), tag);
    }
    detail::group::copy_bytes(p->scratch.data() + me * mine, buf.data() + mb, mine);
    // Second half: our reduced shard to every member, theirs into the buffer.
    p->then = [s = s_, buf, t, op, g, me, mb, mine, tag, shard](detail::group::pending& self) {
      reduce_slots(self.scratch.data(), g, mine, buf.data() + mb, t, op);
      for (std::size_t q = 0; q < g; ++q) {
        if (q == me) continue;
        auto const [b, e] = shard(q);
        post_recv(*s, self, buf.subspan(b, e - b), static_cast<int>(q), tag);
        post_send(*s, self, std::span<std::byte const>(buf).subspan(mb, mine), static_cast<int>(q),
                  tag);
      }
    };
    return request(std::move(p));
  }

  request isend(std::span<std::byte const> in, int peer, int tag) {
    check_p2p(peer, tag, "send peer");
    return s_->parent->isend(in, parent_rank(peer), tag);
  }

  request irecv(std::span<std::byte> out, int peer, int tag) {
    check_p2p(peer, tag, "recv peer");
    return s_->parent->irecv(out, parent_rank(peer), tag);
  }

 private:
  struct state {
    Parent* parent = nullptr;
    std::vector<int> members;
    int rank = 0;
    group_options opt;
    std::uint64_t ops = 0;
  };

  static std::unique_ptr<detail::group::pending> start() {
    return std::make_unique<detail::group::pending>();
  }

  int next_tag() {
    auto const k = static_cast<int>(s_->ops++ % static_cast<std::uint64_t>(s_->opt.tag_count));
    return s_->opt.tag_base + k;
  }

  // Posts a message of `op` to / from group rank `peer`.
  static void post_send(state& s, detail::group::pending& op, std::span<std::byte const> in,
                        int peer, int tag) {
    op.reqs.push_back(s.parent->isend(in, s.members[static_cast<std::size_t>(peer)], tag));
  }
  static void post_recv(state& s, detail::group::pending& op, std::span<std::byte> out, int peer,
                        int tag) {
    op.reqs.push_back(s.parent->irecv(out, s.members[static_cast<std::size_t>(peer)], tag));
  }
  void post_send(detail::group::pending& op, std::span<std::byte const> in, int peer, int tag) {
    post_send(*s_, op, in, peer, tag);
  }
  void post_recv(detail::group::pending& op, std::span<std::byte> out, int peer, int tag) {
    post_recv(*s_, op, out, peer, tag);
  }

  // Direct all-gather(-v): our block to every member, theirs into place.
  request gather(std::span<std::byte const> in, std::span<std::byte> out,
                 std::span<std::size_t const> counts) {
    auto op = start();
    int const tag = next_tag();
    std::size_t at = 0, own = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (static_cast<int>(q) == rank()) {
        own = at;
      } else {
        post_recv(*op, out.subspan(at, counts[q]), static_cast<int>(q), tag);
        post_send(*op, in, static_cast<int>(q), tag);
      }
      at += counts[q];
    }
    detail::group::copy_bytes(out.data() + own, in.data(), in.size());
    return request(std::move(op));
  }

  // acc = slot 0 op slot 1 op ... op slot g-1, in that order (slots of `bytes` each).
  static void reduce_slots(std::byte const* slots, std::size_t g, std::size_t bytes, std::byte* acc,
                           comm_type t, reduce_op op) {
    detail::group::copy_bytes(acc, slots, bytes);
    for (std::size_t q = 1; q < g; ++q) reduce_into(t, op, acc, slots + q * bytes, bytes);
  }

  void check_p2p(int peer, int tag, char const* what) const {
    detail::comm_checks::peer(peer, size(), what);
    detail::comm_checks::tag(tag);
    if (tag >= s_->opt.tag_base && tag - s_->opt.tag_base < s_->opt.tag_count) {
      throw config_error(
          "gradcomp: tag " + std::to_string(tag) + " is reserved for the group's collectives ([" +
          std::to_string(s_->opt.tag_base) + ", " +
          std::to_string(s_->opt.tag_base + s_->opt.tag_count) + "), group_options)");
    }
  }

  std::shared_ptr<state> s_;
};

/// The nodes of a communicator, checked against its size (`node_grouping::layout`): node k's
/// ranks in ascending order, nodes ordered by their lowest rank.
class node_layout {
 public:
  node_layout() = default;
  /// From the node label of every rank (labels already checked).
  explicit node_layout(std::vector<int> const& labels) {
    std::map<int, int> index_of_label;
    node_of_.resize(labels.size());
    local_.resize(labels.size());
    for (std::size_t r = 0; r < labels.size(); ++r) {
      auto const [it, fresh] =
          index_of_label.try_emplace(labels[r], static_cast<int>(nodes_.size()));
      if (fresh) nodes_.emplace_back();
      auto& node = nodes_[static_cast<std::size_t>(it->second)];
      node_of_[r] = it->second;
      local_[r] = static_cast<int>(node.size());
      node.push_back(static_cast<int>(r));
    }
  }

  /// Ranks of the communicator.
  [[nodiscard]] int ranks() const noexcept { return static_cast<int>(node_of_.size()); }
  /// Number of nodes.
  [[nodiscard]] int nodes() const noexcept { return static_cast<int>(nodes_.size()); }
  /// The node of rank `r`.
  [[nodiscard]] int node_of(int r) const { return node_of_.at(static_cast<std::size_t>(r)); }
  /// The position of rank `r` among its node's ranks (0: the node's lowest rank).
  [[nodiscard]] int local_rank(int r) const { return local_.at(static_cast<std::size_t>(r)); }
  /// The ranks of node `k`, ascending.
  [[nodiscard]] std::vector<int> const& node_ranks(int k) const {
    return nodes_.at(static_cast<std::size_t>(k));
  }
  /// The size of the smallest node: the number of lanes.
  [[nodiscard]] int min_node_size() const noexcept {
    std::size_t m = nodes_.empty() ? 0 : nodes_.front().size();
    for (auto const& n : nodes_) m = std::min(m, n.size());
    return static_cast<int>(m);
  }
  /// Lane `j` (< `min_node_size()`): the j-th rank of every node, in node order.
  [[nodiscard]] std::vector<int> lane(int j) const {
    if (j < 0 || j >= min_node_size()) {
      throw config_error("gradcomp: lane " + std::to_string(j) +
                         " does not exist: the smallest node has " +
                         std::to_string(min_node_size()) + " ranks");
    }
    std::vector<int> out;
    out.reserve(nodes_.size());
    for (auto const& n : nodes_) out.push_back(n[static_cast<std::size_t>(j)]);
    return out;
  }
  /// The node index of every rank (what identifies the layout).
  [[nodiscard]] std::span<int const> node_indices() const noexcept { return node_of_; }

 private:
  std::vector<std::vector<int>> nodes_;
  std::vector<int> node_of_, local_;
};

/// Which node each rank of a communicator lives on (see the file comment). Default: none (a
/// collective that needs one says so).
class node_grouping {
 public:
  node_grouping() = default;

  /// `ranks_per_node` consecutive ranks per node: rank r lives on node r / ranks_per_node
  /// (`ranks_per_node` >= 1, dividing the communicator's size).
  [[nodiscard]] static node_grouping uniform(int ranks_per_node) {
    node_grouping g;
    g.kind_ = kind::uniform;
    g.per_node_ = ranks_per_node;
    return g;
  }
  /// Rank r lives on the node labelled `labels[r]` (any non-negative integers; one per rank).
  [[nodiscard]] static node_grouping labelled(std::vector<int> labels) {
    node_grouping g;
    g.kind_ = kind::labelled;
    g.labels_ = std::move(labels);
    return g;
  }
  /// Node k holds the ranks `nodes[k]`; every rank of the communicator in exactly one node.
  [[nodiscard]] static node_grouping explicit_nodes(std::vector<std::vector<int>> nodes) {
    node_grouping g;
    g.kind_ = kind::nodes;
    g.nodes_ = std::move(nodes);
    return g;
  }

  /// True for the default (no grouping given).
  [[nodiscard]] bool empty() const noexcept { return kind_ == kind::none; }

  /// The layout over a communicator of `size` ranks; `config_error` saying what is wrong when
  /// the grouping does not describe exactly those ranks.
  [[nodiscard]] node_layout layout(int size) const {
    auto fail = [](std::string const& why) {
      throw config_error("gradcomp: node grouping: " + why);
    };
    if (size < 1) fail("the communicator has " + std::to_string(size) + " ranks");
    std::vector<int> labels(static_cast<std::size_t>(size), -1);
    switch (kind_) {
      case kind::none:
        fail("none given (node_grouping::uniform, labelled or explicit_nodes)");
        break;
      case kind::uniform:
        if (per_node_ < 1 || size % per_node_ != 0) {
          fail(std::to_string(per_node_) + " ranks per node does not divide " +
               std::to_string(size) +
               " ranks (use labelled or explicit_nodes for nodes of different sizes)");
        }
        for (int r = 0; r < size; ++r) labels[static_cast<std::size_t>(r)] = r / per_node_;
        break;
      case kind::labelled:
        if (labels_.size() != static_cast<std::size_t>(size)) {
          fail(std::to_string(labels_.size()) + " node labels for " + std::to_string(size) +
               " ranks (one per rank)");
        }
        for (std::size_t r = 0; r < labels_.size(); ++r) {
          if (labels_[r] < 0) {
            fail("rank " + std::to_string(r) + " has node label " + std::to_string(labels_[r]) +
                 " (expected a label >= 0)");
          }
        }
        labels = labels_;
        break;
      case kind::nodes:
        for (std::size_t k = 0; k < nodes_.size(); ++k) {
          if (nodes_[k].empty()) fail("node " + std::to_string(k) + " has no ranks");
          for (int r : nodes_[k]) {
            if (r < 0 || r >= size) {
              fail("node " + std::to_string(k) + " lists rank " + std::to_string(r) +
                   ", not a rank of a communicator of " + std::to_string(size));
            }
            int& l = labels[static_cast<std::size_t>(r)];
            if (l >= 0)
              fail("rank " + std::to_string(r) + " is in node " + std::to_string(l) +
                   " and in node " + std::to_string(k));
            l = static_cast<int>(k);
          }
        }
        for (int r = 0; r < size; ++r) {
          if (labels[static_cast<std::size_t>(r)] < 0)
            fail("rank " + std::to_string(r) + " is in no node");
        }
        break;
    }
    return node_layout(labels);
  }

 private:
  enum class kind : std::uint8_t { none, uniform, labelled, nodes };
  kind kind_ = kind::none;
  int per_node_ = 0;
  std::vector<int> labels_;
  std::vector<std::vector<int>> nodes_;
};

GRADCOMP_NAMESPACE_END
