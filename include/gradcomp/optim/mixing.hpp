// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Mixing arithmetic and an in-process gossip board.
///
/// `mix_row` computes one rank's sum_j w_ij x_j. It adds the terms in ascending rank order in
/// double and rounds once to float, so the two members of a pair compute bit-identical
/// results, and a pair average is the correctly rounded mean.
///
/// `gossip_board` simulates the gossip of n ranks in one thread (tests, simulations, the
/// in-process demo): each rank's `endpoint` models `parameter_mixer`. A rank's
/// `start_mixing(x, t)` posts a copy of x for step t; `wait_mixing(x)` reads the posts of its
/// row of W^(t). Posts are double-buffered by step parity, so a plain loop over ranks that
/// calls wait-update-start on each rank in turn is correct; the board throws `config_error`
/// when a rank waits for a post that was not made or would overwrite one still unread.

#include <gradcomp/concepts/mixer.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/topology/topology.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Writes sum over `row.entries` of weight * x_of(rank) into `out` (which may alias the rank's
/// own input). `x_of(r)` returns a `std::span<float const>` of out.size() elements.
template <class Lookup>
void mix_row(mixing_row const& row, Lookup&& x_of, std::span<float> out) {
  std::vector<std::span<float const>> in;
  std::vector<double> w;
  in.reserve(row.entries.size());
  for (auto const& e : row.entries) {
    std::span<float const> s = x_of(e.rank);
    if (s.size() != out.size()) {
      throw config_error("gradcomp: mixing got " + std::to_string(s.size()) + " values from rank " +
                         std::to_string(e.rank) + " but " + std::to_string(out.size()) +
                         " locally (every rank must mix spans of the same length)");
    }
    in.push_back(s);
    w.push_back(e.weight);
  }
  std::size_t const k = in.size();
  for (std::size_t i = 0; i < out.size(); ++i) {
    double acc = 0.0;
    for (std::size_t j = 0; j < k; ++j) acc += w[j] * static_cast<double>(in[j][i]);
    out[i] = static_cast<float>(acc);
  }
}

/// How a transport mixes a group with one all-reduce (Decent-DP's arithmetic): every member
/// sends `send_scale * x` into an all-reduce-sum over the group, then sets
/// x <- self_scale * x + sum, which gives keep * x_i + (1 - keep)/(|G| - 1) * sum of the others.
/// For uniform groups self_scale is 0 and the result is the sum itself.
struct group_mixing_coefficients {
  double send_scale = 1.0;  ///< (1 - keep) / (|G| - 1); 1 for a group of one
  double self_scale = 0.0;  ///< keep - send_scale
};

/// The all-reduce coefficients of a group (see `group_mixing_coefficients`).
[[nodiscard]] inline group_mixing_coefficients group_mixing(mixing_group const& g) {
  if (g.ranks.empty()) throw config_error("gradcomp: a mixing group is empty");
  group_mixing_coefficients c;
  if (g.ranks.size() == 1) {
    c.send_scale = 1.0;
    c.self_scale = g.keep - 1.0;
    return c;
  }
  c.send_scale = (1.0 - g.keep) / static_cast<double>(g.ranks.size() - 1);
  c.self_scale = g.keep - c.send_scale;
  return c;
}

/// Single-threaded in-process gossip over a topology (file comment).
class gossip_board {
 public:
  explicit gossip_board(topology t) : topo_(std::move(t)) {
    for (auto& s : slots_) s.resize(static_cast<std::size_t>(topo_.size()));
    sent_.assign(static_cast<std::size_t>(topo_.size()), 0);
  }

  /// One rank's mixer.
  class endpoint {
   public:
    using mixer_concept = mixer_tag;

    void start_mixing(std::span<float const> x, std::uint64_t step) {
      if (pending_) {
        throw config_error("gradcomp: rank " + std::to_string(rank_) +
                           " started a mixing while step " + std::to_string(step_) +
                           " is still outstanding");
      }
      board_->post(rank_, x, step);
      pending_ = true;
      step_ = step;
    }

    void wait_mixing(std::span<float> x) {
      if (!pending_) {
        throw config_error("gradcomp: rank " + std::to_string(rank_) +
                           " waits for a mixing it never started");
      }
      board_->collect(rank_, step_, x);
      pending_ = false;
    }

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] bool pending() const noexcept { return pending_; }

   private:
    friend class gossip_board;
    endpoint(gossip_board* b, int r) noexcept : board_(b), rank_(r) {}
    gossip_board* board_;
    int rank_;
    bool pending_ = false;
    std::uint64_t step_ = 0;
  };

  /// The mixer of rank `rank`; it refers to this board, which must outlive it.
  [[nodiscard]] endpoint mixer(int rank) {
    if (rank < 0 || rank >= topo_.size()) {
      throw config_error("gradcomp: gossip_board has no rank " + std::to_string(rank));
    }
    return endpoint(this, rank);
  }

  [[nodiscard]] topology const& topo() const noexcept { return topo_; }
  /// Parameter bytes rank `rank` has sent so far (its posts times the peers that read them).
  [[nodiscard]] std::uint64_t bytes_sent(int rank) const {
    return sent_.at(static_cast<std::size_t>(rank));
  }

 private:
  struct slot {
    std::vector<float> x;
    std::uint64_t step = 0;
    bool posted = false;
    int unread = 0;  // peers (self included) that still have to read this post
  };

  void post(int rank, std::span<float const> x, std::uint64_t step) {
    slot& s = slots_[step % 2][static_cast<std::size_t>(rank)];
    if (s.posted && s.unread > 0) {
      throw config_error("gradcomp: rank " + std::to_string(rank) + " posts step " +
                         std::to_string(step) + " while its post of step " +
                         std::to_string(s.step) + " is still unread by " +
                         std::to_string(s.unread) + " rank(s)");
    }
    s.x.assign(x.begin(), x.end());
    s.step = step;
    s.posted = true;
    // Readers of rank's post: every rank whose row of W^(step) names it (W is symmetric).
    mixing_row const r = topo_.row(step, rank);
    s.unread = static_cast<int>(r.entries.size());
    sent_[static_cast<std::size_t>(rank)] += r.degree() * x.size() * sizeof(float);
  }

  void collect(int rank, std::uint64_t step, std::span<float> x) {
    auto& bank = slots_[step % 2];
    mixing_row const r = topo_.row(step, rank);
    for (auto const& e : r.entries) {
      slot const& s = bank[static_cast<std::size_t>(e.rank)];
      if (!s.posted || s.step != step) {
        throw config_error("gradcomp: rank " + std::to_string(rank) + " waits for step " +
                           std::to_string(step) + " but rank " + std::to_string(e.rank) +
                           " has not started that mixing (in one thread, every rank must start a "
                           "step before any rank waits for it)");
      }
    }
    mix_row(
        r, [&](int j) { return std::span<float const>(bank[static_cast<std::size_t>(j)].x); }, x);
    for (auto const& e : r.entries) --bank[static_cast<std::size_t>(e.rank)].unread;
  }

  topology topo_;
  std::vector<slot> slots_[2];
  std::vector<std::uint64_t> sent_;
};

/// Replaces `x` by the mean over all ranks: `sum(x)` must sum the span in place over the
/// `world` ranks (an all-reduce), after which x is divided by `world`.
template <class AllReduceSum>
void average_parameters(std::span<float> x, int world, AllReduceSum&& sum) {
  if (world < 1) {
    throw config_error("gradcomp: averaging needs a world of at least one rank; got " +
                       std::to_string(world));
  }
  sum(x);
  float const n = static_cast<float>(world);
  for (float& v : x) v = v / n;
}

GRADCOMP_NAMESPACE_END
