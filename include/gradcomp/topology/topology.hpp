// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Gossip topologies for decentralized training: deterministic, time-varying mixing schedules.
///
/// A topology says, for step t and rank i, whose parameters rank i averages with and with what
/// weights: row i of the mixing matrix W^(t). Every matrix is symmetric and doubly stochastic.
/// The schedule is periodic (step t uses phase t mod period) and has no randomness, so every
/// rank computes the same schedule without talking to anyone.
///
/// All topologies except `static_ring` are *group based*: each phase partitions the ranks into
/// groups, every rank in exactly one group, and a group averages uniformly (keep weight
/// 1/|G|), which a transport implements as one all-reduce over the group.
///
/// | kind | phases | groups per phase |
/// |---|---|---|
/// | complete | 1 | all n ranks |
/// | ring (alternating pairs, n even) | 2 | (2k, 2k+1); then (2k+1, 2k+2 mod n) |
/// | static_ring | 1 | not group based: self, left, right, 1/3 each |
/// | one_peer_exponential (n = 2^d) | d | pairs (j, j xor 2^r) in phase r |
/// | alternating_exp_ring (N = n/p = 2^e >= 2) | 2e | a node's p ranks, or a node pair's 2p |
///
/// Ranks are laid out node by node: rank r lives on node r / ranks_per_node. A topology has at
/// most `topology::max_ranks` (2^24) ranks: its index arithmetic (n + rank, the mixing rows)
/// then stays far inside `int`, and a larger count is a `config_error`. See
/// docs/decentralized.md for the choices and their sources.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The topologies gradcomp schedules.
enum class topology_kind : std::uint8_t {
  complete,              ///< exact average over all ranks every step
  ring,                  ///< one peer per step, alternating between the two ring matchings
  static_ring,           ///< fixed ring, weights 1/3 for self, left and right
  one_peer_exponential,  ///< hypercube pairs, exact average after log2(n) steps
  alternating_exp_ring,  ///< intra-node and inter-node phases over a hypercube of nodes
};

/// The spec name of a kind ("complete", "ring", "static-ring", "exp", "aer").
constexpr char const* topology_name(topology_kind k) noexcept {
  switch (k) {
    case topology_kind::complete: return "complete";
    case topology_kind::ring: return "ring";
    case topology_kind::static_ring: return "static-ring";
    case topology_kind::one_peer_exponential: return "exp";
    case topology_kind::alternating_exp_ring: return "aer";
  }
  return "unknown";
}

/// A group of ranks that average together in one phase. Member i's new value is
/// `keep * x_i + (1 - keep) / (size - 1) * sum of the other members' x_j`.
struct mixing_group {
  std::vector<int> ranks;  ///< members in ascending order
  double keep = 1.0;       ///< weight of a member's own value (1/size: uniform average)

  /// Weight member `self` gives to member `other` (both must be members).
  [[nodiscard]] double weight(int self, int other) const noexcept {
    if (self == other) return keep;
    return (1.0 - keep) / static_cast<double>(ranks.size() - 1);
  }
  [[nodiscard]] bool contains(int r) const noexcept {
    return std::binary_search(ranks.begin(), ranks.end(), r);
  }
};

/// One term of a mixing row: rank `rank` contributes `weight` times its parameters.
struct mixing_entry {
  int rank = 0;
  double weight = 0.0;
};

/// Row `rank` of a mixing matrix: the new value of `rank` is the sum over `entries` of
/// weight * x_rank. Entries are in ascending rank order, `rank` itself included, weights sum to 1.
struct mixing_row {
  int rank = 0;
  std::vector<mixing_entry> entries;

  /// The weight of the rank's own value.
  [[nodiscard]] double self_weight() const noexcept {
    for (auto const& e : entries) {
      if (e.rank == rank) return e.weight;
    }
    return 0.0;
  }
  /// Number of peers (entries other than the rank itself).
  [[nodiscard]] std::size_t degree() const noexcept {
    return entries.size() - (contains(rank) ? 1 : 0);
  }
  [[nodiscard]] bool contains(int r) const noexcept {
    return std::any_of(entries.begin(), entries.end(),
                       [r](mixing_entry const& e) { return e.rank == r; });
  }
  /// The peers (every entry but the rank itself), ascending.
  [[nodiscard]] std::vector<int> peers() const {
    std::vector<int> p;
    for (auto const& e : entries) {
      if (e.rank != rank) p.push_back(e.rank);
    }
    return p;
  }
};

/// A deterministic periodic gossip schedule over `size()` ranks (see file comment). Value type.
class topology {
 public:
  /// The largest number of ranks a topology accepts (2^24).
  static constexpr int max_ranks = 1 << 24;

  /// Exact average over all n >= 1 ranks every step.
  static topology complete(int n) {
    check_size(n, "complete");
    return topology(topology_kind::complete, n, n);
  }

  /// Alternating pairs on a ring of even n >= 2: phase 0 pairs (2k, 2k+1), phase 1 pairs
  /// (2k+1, 2k+2 mod n); weight 1/2 each.
  static topology ring(int n) {
    check_size(n, "ring");
    if (n % 2 != 0) {
      throw config_error(
          "gradcomp: topology ring pairs ranks, so it needs an even number of "
          "ranks; got " +
          std::to_string(n) + " (use static-ring for odd n)");
    }
    return topology(topology_kind::ring, n, n);
  }

  /// Fixed ring: self, left and right neighbour with weight 1/3 each (n = 2: 1/3 self, 2/3 the
  /// other rank; n = 1: the rank alone).
  static topology static_ring(int n) {
    check_size(n, "static-ring");
    return topology(topology_kind::static_ring, n, n);
  }

  /// One-peer exponential graph (hypercube): in phase r = t mod log2(n), rank j averages with
  /// j xor 2^r. n must be a power of two. The product of log2(n) consecutive phases starting at
  /// phase 0 is exactly J/n.
  static topology one_peer_exponential(int n) {
    check_size(n, "exp");
    if (!std::has_single_bit(static_cast<unsigned>(n))) {
      throw config_error(
          "gradcomp: topology exp (one-peer exponential) needs a power-of-two "
          "number of ranks; got " +
          std::to_string(n));
    }
    return topology(topology_kind::one_peer_exponential, n, n);
  }

  /// Alternating exp-ring over N = n / ranks_per_node nodes (N a power of two, N >= 2). Round
  /// r = 0..log2(N)-1 pairs node a with a xor 2^r and has two phases: in one, each node
  /// averages its own ranks (keep 1/p); in the other, the two nodes' 2p ranks average together
  /// (keep 1/(2p)). Even-numbered node pairs of a round go intra-node first, odd-numbered ones
  /// inter-node first, so each phase sends about half the node pairs over the network.
  static topology alternating_exp_ring(int n, int ranks_per_node) {
    check_size(n, "aer");
    if (ranks_per_node < 1 || n % ranks_per_node != 0) {
      throw config_error(
          "gradcomp: topology aer needs ranks_per_node >= 1 dividing the number of "
          "ranks; got " +
          std::to_string(ranks_per_node) + " for " + std::to_string(n) + " ranks");
    }
    int const nodes = n / ranks_per_node;
    if (nodes < 2 || !std::has_single_bit(static_cast<unsigned>(nodes))) {
      throw config_error("gradcomp: topology aer needs a power-of-two number of nodes >= 2; got " +
                         std::to_string(nodes) + " (" + std::to_string(n) + " ranks, " +
                         std::to_string(ranks_per_node) + " per node)");
    }
    return topology(topology_kind::alternating_exp_ring, n, ranks_per_node);
  }

  /// Builds a topology from its spec name ("complete", "ring", "static-ring", "exp", "aer").
  static topology from_name(std::string_view name, int n, int ranks_per_node = 0) {
    if (name == "complete") return complete(n);
    if (name == "ring") return ring(n);
    if (name == "static-ring") return static_ring(n);
    if (name == "exp") return one_peer_exponential(n);
    if (name == "aer") return alternating_exp_ring(n, ranks_per_node);
    throw config_error("gradcomp: unknown topology \"" + std::string(name) +
                       "\"; expected complete, ring, static-ring, exp or aer");
  }

  [[nodiscard]] topology_kind kind() const noexcept { return kind_; }
  [[nodiscard]] char const* name() const noexcept { return topology_name(kind_); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return n_; }
  /// Ranks per node (the whole world for the node-oblivious kinds).
  [[nodiscard]] int ranks_per_node() const noexcept { return p_; }
  /// Number of nodes (1 for the node-oblivious kinds).
  [[nodiscard]] int nodes() const noexcept { return n_ / p_; }
  /// Whether every phase is a partition into uniformly averaging groups.
  [[nodiscard]] bool group_based() const noexcept { return kind_ != topology_kind::static_ring; }

  /// Number of distinct phases; step t uses phase t mod period().
  [[nodiscard]] std::uint64_t period() const noexcept {
    switch (kind_) {
      case topology_kind::complete:
      case topology_kind::static_ring: return 1;
      case topology_kind::ring: return n_ > 2 ? 2 : 1;
      case topology_kind::one_peer_exponential:
        return n_ > 1 ? static_cast<std::uint64_t>(std::countr_zero(static_cast<unsigned>(n_))) : 1;
      case topology_kind::alternating_exp_ring:
        return 2 * static_cast<std::uint64_t>(std::countr_zero(static_cast<unsigned>(n_ / p_)));
    }
    return 1;
  }

  /// The groups of step `step`: a partition of the ranks, each group ascending, groups ordered
  /// by their smallest rank. Throws `config_error` for a topology that is not group based.
  [[nodiscard]] std::vector<mixing_group> groups(std::uint64_t step) const {
    if (!group_based()) {
      throw config_error(std::string("gradcomp: topology ") + name() +
                         " is not group based; use row() or mixing_matrix()");
    }
    std::vector<mixing_group> out;
    for (int r = 0; r < n_; ++r) {
      mixing_group g = group_of(step, r);
      if (g.ranks.front() == r) out.push_back(std::move(g));
    }
    return out;
  }

  /// The group rank `rank` belongs to at step `step` (group-based topologies only).
  [[nodiscard]] mixing_group group_of(std::uint64_t step, int rank) const {
    check_rank(rank);
    if (!group_based()) {
      throw config_error(std::string("gradcomp: topology ") + name() + " is not group based");
    }
    std::uint64_t const phase = step % period();
    mixing_group g;
    switch (kind_) {
      case topology_kind::complete:
        for (int r = 0; r < n_; ++r) g.ranks.push_back(r);
        break;
      case topology_kind::ring: {
        int peer;
        if (phase == 0) {
          peer = rank ^ 1;
        } else {
          peer = (rank % 2 == 1) ? (rank + 1) % n_ : (rank == 0 ? n_ - 1 : rank - 1);
        }
        g.ranks = {std::min(rank, peer), std::max(rank, peer)};
        break;
      }
      case topology_kind::one_peer_exponential: {
        if (n_ == 1) {
          g.ranks = {0};
          break;
        }
        int const peer = rank ^ (1 << phase);
        g.ranks = {std::min(rank, peer), std::max(rank, peer)};
        break;
      }
      case topology_kind::alternating_exp_ring: {
        int const node = rank / p_;
        auto const round = static_cast<int>(phase / 2);
        int const other = node ^ (1 << round);
        int const low = std::min(node, other);
        // Ordinal of the pair {low, low + 2^round} among the round's pairs, ascending by `low`.
        int const pair_index = ((low >> (round + 1)) << round) | (low & ((1 << round) - 1));
        bool const intra_first = pair_index % 2 == 0;
        bool const intra = (phase % 2 == 0) == intra_first;
        if (intra) {
          for (int r = 0; r < p_; ++r) g.ranks.push_back(node * p_ + r);
        } else {
          int const high = std::max(node, other);
          for (int r = 0; r < p_; ++r) g.ranks.push_back(low * p_ + r);
          for (int r = 0; r < p_; ++r) g.ranks.push_back(high * p_ + r);
        }
        break;
      }
      case topology_kind::static_ring: break;
    }
    g.keep = 1.0 / static_cast<double>(g.ranks.size());
    return g;
  }

  /// Row `rank` of W^(step).
  [[nodiscard]] mixing_row row(std::uint64_t step, int rank) const {
    check_rank(rank);
    mixing_row out;
    out.rank = rank;
    if (group_based()) {
      mixing_group const g = group_of(step, rank);
      for (int r : g.ranks) out.entries.push_back({r, g.weight(rank, r)});
      return out;
    }
    // static ring
    if (n_ == 1) {
      out.entries = {{0, 1.0}};
    } else if (n_ == 2) {
      out.entries = {{0, rank == 0 ? 1.0 / 3.0 : 2.0 / 3.0},
                     {1, rank == 1 ? 1.0 / 3.0 : 2.0 / 3.0}};
    } else {
      int const left = rank == 0 ? n_ - 1 : rank - 1;
      int const right = (rank + 1) % n_;
      std::vector<int> members = {left, rank, right};
      std::sort(members.begin(), members.end());
      for (int r : members) out.entries.push_back({r, 1.0 / 3.0});
    }
    return out;
  }

  /// Number of peers of `rank` at step `step`.
  [[nodiscard]] std::size_t degree(std::uint64_t step, int rank) const {
    return row(step, rank).degree();
  }

  /// Largest number of peers of any rank in any phase.
  [[nodiscard]] std::size_t max_degree() const {
    std::size_t d = 0;
    for (std::uint64_t t = 0; t < period(); ++t) {
      for (int r = 0; r < n_; ++r) d = std::max(d, degree(t, r));
    }
    return d;
  }

 private:
  topology(topology_kind k, int n, int p) noexcept : kind_(k), n_(n), p_(p) {}

  static void check_size(int n, char const* what) {
    if (n < 1 || n > max_ranks) {
      throw config_error(std::string("gradcomp: topology ") + what +
                         " needs 1 to 2^24 ranks; got " + std::to_string(n));
    }
  }
  void check_rank(int rank) const {
    if (rank < 0 || rank >= n_) {
      throw config_error("gradcomp: rank " + std::to_string(rank) + " is outside the topology's " +
                         std::to_string(n_) + " ranks");
    }
  }

  topology_kind kind_;
  int n_;
  int p_;
};

/// The n x n mixing matrix W^(step), row-major (element (i, j) at i * n + j).
[[nodiscard]] inline std::vector<double> mixing_matrix(topology const& t, std::uint64_t step) {
  auto const n = static_cast<std::size_t>(t.size());
  std::vector<double> w(n * n, 0.0);
  for (int i = 0; i < t.size(); ++i) {
    for (auto const& e : t.row(step, i).entries) {
      w[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(e.rank)] += e.weight;
    }
  }
  return w;
}

/// Checks that `groups` partitions ranks 0..n-1 (every rank in exactly one group, members
/// ascending, keep weights in (0, 1]); throws `config_error` naming the first violation. For
/// user-supplied schedules and the transport layer.
inline void check_partition(std::vector<mixing_group> const& groups, int n) {
  std::vector<int> seen(static_cast<std::size_t>(n < 0 ? 0 : n), 0);
  for (auto const& g : groups) {
    if (g.ranks.empty()) throw config_error("gradcomp: a mixing group is empty");
    if (!(g.keep > 0.0 && g.keep <= 1.0) || (g.ranks.size() == 1 && g.keep != 1.0)) {
      throw config_error("gradcomp: mixing group keep weight " + std::to_string(g.keep) +
                         " is outside (0, 1] (a single rank must keep 1)");
    }
    if (!std::is_sorted(g.ranks.begin(), g.ranks.end())) {
      throw config_error("gradcomp: mixing group members must be in ascending order");
    }
    for (int r : g.ranks) {
      if (r < 0 || r >= n) {
        throw config_error("gradcomp: mixing group names rank " + std::to_string(r) +
                           " outside 0.." + std::to_string(n - 1));
      }
      if (++seen[static_cast<std::size_t>(r)] > 1) {
        throw config_error("gradcomp: rank " + std::to_string(r) +
                           " appears in more than one mixing group of a phase");
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (seen[static_cast<std::size_t>(r)] == 0) {
      throw config_error("gradcomp: rank " + std::to_string(r) + " is in no mixing group");
    }
  }
}

GRADCOMP_NAMESPACE_END
