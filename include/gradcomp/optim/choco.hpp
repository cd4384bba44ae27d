// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Compressed gossip with any gradcomp codec: CHOCO-SGD (Koloskova, Stich, Jaggi 2019) and
/// DeepSqueeze (Tang et al. 2019). Both act on the parameters after the local optimizer step
/// (x = x^(t+1/2)) over a fixed mixing row (a static topology: complete or static-ring), and
/// both split a round into `prepare` (compress; returns the packet to send to every peer) and
/// `finish` (apply the peers' packets), so any transport can carry the packets; `step` does both
/// with an exchange callable.
///
/// CHOCO, rank i, with public copies x^_j (zero at the start), consensus step size gamma:
/// ```
///   q_i = Q(x_i - x^_i)                   prepare
///   x^_j += D(q_j) for j in N(i) and i    finish (kept as s_i = sum_j w_ij x^_j)
///   x_i += gamma * (s_i - x^_i)
/// ```
/// DeepSqueeze, rank i, with error delta_i (zero at the start):
/// ```
///   v = x_i + delta_i;  c_i = C(v);  delta_i = v - D(c_i)                prepare
///   x_i += gamma * (sum_j w_ij D(c_j) - D(c_i))                           finish
/// ```
/// Every rank keeps two vectors besides x. Stochastic codecs draw with the context's seed and a
/// step counter that advances by one per round.
///
/// Element types: CHOCO and DeepSqueeze gossip parameters, not gradients, so x, the public copies
/// and the error are float32 (the master copy; 16-bit parameters would lose the small consensus
/// corrections gamma * (s - x^) to rounding). 16-bit gradients enter through the local step
/// before `prepare` (`sgd` and `adam` accept them, optim/sgd.hpp), and the packets may still be
/// 16-bit (fp16/bf16 codecs, 16-bit top-k values).

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/topology/topology.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

inline void check_gossip_setup(mixing_row const& row, double gamma, char const* who) {
  if (!(gamma > 0.0 && gamma <= 1.0)) {
    throw config_error(std::string("gradcomp: ") + who +
                       " consensus step size gamma must be in (0, 1], got " +
                       std::to_string(gamma));
  }
  double sum = 0.0;
  bool self = false;
  for (auto const& e : row.entries) {
    if (!(e.weight >= 0.0))
      throw config_error(std::string("gradcomp: ") + who + " mixing weights must be >= 0");
    sum += e.weight;
    self = self || e.rank == row.rank;
  }
  if (!self || std::abs(sum - 1.0) > 1e-9) {
    throw config_error(std::string("gradcomp: ") + who +
                       " needs a mixing row that names the rank itself and sums to 1; got sum " +
                       std::to_string(sum));
  }
}

// Base of the two gossip rules: codec, row, packet buffer, counters.
template <class Codec>
class gossip_common {
 public:
  gossip_common(Codec codec, mixing_row row, double gamma, codec_context ctx, tensor_id id,
                char const* who)
      : codec_(std::move(codec)),
        row_(std::move(row)),
        gamma_(gamma),
        ctx_(ctx),
        id_(id),
        who_(who) {
    check_gossip_setup(row_, gamma_, who);
    self_weight_ = row_.self_weight();
    for (auto const& e : row_.entries) {
      if (e.rank != row_.rank) peer_weights_.push_back(e.weight);
    }
  }

  [[nodiscard]] mixing_row const& row() const noexcept { return row_; }
  [[nodiscard]] std::vector<int> peers() const { return row_.peers(); }
  [[nodiscard]] double gamma() const noexcept { return gamma_; }
  [[nodiscard]] Codec const& codec() const noexcept { return codec_; }
  /// Rounds done so far.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }
  /// Packet bytes sent so far (each packet counted once per peer).
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return sent_; }

 protected:
  void check_size(std::size_t n) const {
    if (n_ != 0 && n != n_) {
      throw config_error(std::string("gradcomp: ") + who_ + " holds state for " +
                         std::to_string(n_) + " parameters but got " + std::to_string(n));
    }
  }
  void check_peer_packets(std::size_t got) const {
    if (got != peer_weights_.size()) {
      throw config_error(std::string("gradcomp: ") + who_ + " expected " +
                         std::to_string(peer_weights_.size()) +
                         " peer packets (one per peer of the mixing row, ascending rank) but got " +
                         std::to_string(got));
    }
    if (!prepared_)
      throw config_error(std::string("gradcomp: ") + who_ + "::finish called without prepare");
  }
  codec_context round_context() const {
    codec_context c = ctx_;
    c.step = static_cast<std::uint32_t>(ctx_.step + rounds_);
    return c;
  }
  std::span<std::byte const> compress(std::span<float const> v) {
    packet_.resize(codec_.max_compressed_bytes(v.size()));
    std::size_t const bytes = codec_.compress(tensor_view<float const>(v, id_),
                                              std::span<std::byte>(packet_), round_context());
    packet_size_ = bytes;
    return std::span<std::byte const>(packet_.data(), bytes);
  }
  std::span<std::byte const> own_packet() const { return {packet_.data(), packet_size_}; }

  Codec codec_;
  mixing_row row_;
  double gamma_;
  codec_context ctx_;
  tensor_id id_;
  char const* who_;
  double self_weight_ = 0.0;
  std::vector<double> peer_weights_;
  std::vector<std::byte> packet_;
  std::size_t packet_size_ = 0;
  std::size_t n_ = 0;
  std::uint64_t rounds_ = 0;
  std::uint64_t sent_ = 0;
  bool prepared_ = false;
};

}  // namespace detail

/// CHOCO-SGD gossip state of one rank (file comment).
template <codec_operations Codec>
class choco_gossip : public detail::gossip_common<Codec> {
  using base = detail::gossip_common<Codec>;

 public:
  /// `row`: this rank's fixed mixing row; `gamma`: consensus step size in (0, 1]; `ctx`: seed
  /// and first step of the codec's random stream; `id`: tensor id given to the codec.
  choco_gossip(Codec codec, mixing_row row, double gamma, codec_context ctx = {},
               tensor_id id = tensor_id{0})
      : base(std::move(codec), std::move(row), gamma, ctx, id, "choco_gossip") {}

  /// Compresses x - x^_i; returns the packet for every peer (valid until the next call).
  std::span<std::byte const> prepare(std::span<float const> x) {
    this->check_size(x.size());
    if (this->n_ == 0) {
      this->n_ = x.size();
      xhat_.assign(x.size(), 0.0f);
      s_.assign(x.size(), 0.0f);
    }
    diff_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) diff_[i] = x[i] - xhat_[i];
    auto const p = this->compress(diff_);
    this->prepared_ = true;
    return p;
  }

  /// Applies the peers' packets (ascending peer rank, as in `peers()`) and the consensus step.
  void finish(std::span<float> x, std::span<std::span<std::byte const> const> peer_packets) {
    this->check_size(x.size());
    this->check_peer_packets(peer_packets.size());
    codec_context const c = this->round_context();
    auto const own = this->own_packet();
    this->codec_.decompress_add(own, std::span<float>(xhat_), 1.0f, c);
    this->codec_.decompress_add(own, std::span<float>(s_), static_cast<float>(this->self_weight_),
                                c);
    for (std::size_t j = 0; j < peer_packets.size(); ++j) {
      this->codec_.decompress_add(peer_packets[j], std::span<float>(s_),
                                  static_cast<float>(this->peer_weights_[j]), c);
    }
    float const g = static_cast<float>(this->gamma_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = x[i] + g * (s_[i] - xhat_[i]);
    this->sent_ += own.size() * this->peer_weights_.size();
    ++this->rounds_;
    this->prepared_ = false;
  }

  /// One round: `exchange(packet)` sends this rank's packet to its peers and returns theirs as
  /// a `std::vector<std::span<std::byte const>>` in ascending peer rank.
  template <class Exchange>
  void step(std::span<float> x, Exchange&& exchange) {
    auto const mine = prepare(x);
    auto const theirs = exchange(mine);
    finish(x, std::span<std::span<std::byte const> const>(theirs));
  }

  /// This rank's public copy x^_i.
  [[nodiscard]] std::span<float const> public_copy() const noexcept { return xhat_; }

 private:
  std::vector<float> xhat_, s_, diff_;
};

/// DeepSqueeze gossip state of one rank (file comment).
template <codec_operations Codec>
class deepsqueeze_gossip : public detail::gossip_common<Codec> {
  using base = detail::gossip_common<Codec>;

 public:
  deepsqueeze_gossip(Codec codec, mixing_row row, double gamma, codec_context ctx = {},
                     tensor_id id = tensor_id{0})
      : base(std::move(codec), std::move(row), gamma, ctx, id, "deepsqueeze_gossip") {}

  /// Compresses x + delta and keeps the new error; returns the packet for every peer.
  std::span<std::byte const> prepare(std::span<float const> x) {
    this->check_size(x.size());
    if (this->n_ == 0) {
      this->n_ = x.size();
      delta_.assign(x.size(), 0.0f);
    }
    v_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) v_[i] = x[i] + delta_[i];
    auto const p = this->compress(v_);
    // delta = v - D(c)
    delta_.assign(v_.begin(), v_.end());
    this->codec_.decompress_add(p, std::span<float>(delta_), -1.0f, this->round_context());
    this->prepared_ = true;
    return p;
  }

  /// Applies the peers' packets (ascending peer rank) and the consensus step.
  void finish(std::span<float> x, std::span<std::span<std::byte const> const> peer_packets) {
    this->check_size(x.size());
    this->check_peer_packets(peer_packets.size());
    codec_context const c = this->round_context();
    auto const own = this->own_packet();
    acc_.assign(x.size(), 0.0f);
    this->codec_.decompress_add(own, std::span<float>(acc_),
                                static_cast<float>(this->self_weight_ - 1.0), c);
    for (std::size_t j = 0; j < peer_packets.size(); ++j) {
      this->codec_.decompress_add(peer_packets[j], std::span<float>(acc_),
                                  static_cast<float>(this->peer_weights_[j]), c);
    }
    float const g = static_cast<float>(this->gamma_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = x[i] + g * acc_[i];
    this->sent_ += own.size() * this->peer_weights_.size();
    ++this->rounds_;
    this->prepared_ = false;
  }

  template <class Exchange>
  void step(std::span<float> x, Exchange&& exchange) {
    auto const mine = prepare(x);
    auto const theirs = exchange(mine);
    finish(x, std::span<std::span<std::byte const> const>(theirs));
  }

  /// The compression error carried to the next round.
  [[nodiscard]] std::span<float const> error() const noexcept { return delta_; }

 private:
  std::vector<float> delta_, v_, acc_;
};

GRADCOMP_NAMESPACE_END
