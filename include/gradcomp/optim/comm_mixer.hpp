// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `comm_mixer`: gossip of a flat parameter span over any `communicator` (in-process, MPI,
/// `any_communicator`, a user's own), modelling `parameter_mixer` for the decentralized
/// optimizers (DAdam, AccumAdam, D-PSGD in `optim/decentralized.hpp`).
///
/// `start_mixing(x, t)` posts a non-blocking receive from, and a non-blocking send of x to, every
/// peer of this rank's row of W^(t) (`topology::row`); `wait_mixing(x)` completes them and writes
/// sum_j w_ij x_j with `mix_row` (ascending rank order in double, one rounding), so the result is
/// bit-identical to the in-process `gossip_board` and the two members of a pair agree. The
/// caller leaves x untouched in between (the concept's rule), so the sends go straight from it;
/// computation between the two calls overlaps the exchange.
///
/// A peer that fails or disappears surfaces as the communicator's `comm_error` from
/// `wait_mixing`; a topology whose size differs from the communicator's, or a span whose
/// length differs from a peer's, is a `config_error` / `comm_error` rather than a wrong mix.
/// A failed `wait_mixing` leaves `x` as it was.
///
/// Gossip has no global synchronisation, so by default a failure reaches the rank's neighbours
/// at once and the other ranks only at their next exchange (in-process: at once, the world is
/// broken): some ranks may complete a mixing a failed peer never completes. Two options of
/// `comm_mixer_options` close that (docs/reliability.md, "Faults"): `agree_outcome` ends every
/// mixing with the step-outcome round of collective/outcome.hpp (one all-reduce of 12 bytes
/// over the whole communicator, a global synchronisation point), so every rank fails the same
/// mixing; `checksum` appends to every message the CRC32C of its parameters seeded with the
/// schedule step, checked before mixing, so a corrupted, stale or repeated message is a
/// `format_error` instead of a wrong mix.
///
/// Element types: the mixed parameters are float32 (the master copy; the mix is exact up to one
/// rounding, which 16-bit storage would spoil). 16-bit gradients are taken by the local
/// optimizer of `decentralized_optimizer` (optim/decentralized.hpp).

#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/mixer.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/optim/mixing.hpp>
#include <gradcomp/topology/topology.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of a `comm_mixer` (see the file comment).
struct comm_mixer_options {
  /// Message tag of the point-to-point traffic (>= 0).
  int tag = 0x4d58;
  /// End every mixing with the step-outcome round: every rank fails the same mixing.
  bool agree_outcome = false;
  /// A CRC32C trailer (seeded with the schedule step) on every message, checked before mixing.
  bool checksum = false;
};

/// Gossip over a communicator (see file comment). Holds a reference to the communicator, which
/// must outlive it; one mixer per rank.
template <communicator Comm>
class comm_mixer {
 public:
  using mixer_concept = mixer_tag;

  /// Mixes over `comm` with the schedule of `topo` (whose size must be `comm.size()`), using
  /// message tag `tag` (>= 0) for its point-to-point traffic.
  comm_mixer(Comm& comm, topology topo, int tag = 0x4d58)
      : comm_mixer(comm, std::move(topo), comm_mixer_options{.tag = tag}) {}

  /// Mixes over `comm` with the schedule of `topo` and the failure handling of `opt` (every rank
  /// passes the same options).
  comm_mixer(Comm& comm, topology topo, comm_mixer_options opt)
      : comm_(&comm), topo_(std::move(topo)), tag_(opt.tag), opt_(opt) {
    int const tag = opt.tag;
    if (topo_.size() != comm.size()) {
      throw config_error("gradcomp: comm_mixer topology has " + std::to_string(topo_.size()) +
                         " ranks, the communicator " + std::to_string(comm.size()));
    }
    if (tag < 0) throw config_error("gradcomp: comm_mixer tag must be >= 0, got " + std::to_string(tag));
  }

  comm_mixer(comm_mixer&&) noexcept = default;
  /// Completes what this mixer still has in flight (a failed `start_mixing` may leave
  /// receives posted into its buffers), then takes `other`'s place.
  comm_mixer& operator=(comm_mixer&& other) noexcept {
    if (this == &other) return *this;
    requests_.clear();
    comm_ = other.comm_;
    topo_ = std::move(other.topo_);
    tag_ = other.tag_;
    opt_ = other.opt_;
    framed_ = std::move(other.framed_);
    row_ = std::move(other.row_);
    peers_ = std::move(other.peers_);
    received_ = std::move(other.received_);
    requests_ = std::move(other.requests_);
    step_ = other.step_;
    bytes_sent_ = other.bytes_sent_;
    wait_s_ = other.wait_s_;
    pending_ = other.pending_;
    return *this;
  }
  comm_mixer(comm_mixer const&) = delete;
  comm_mixer& operator=(comm_mixer const&) = delete;
  ~comm_mixer() = default;

  /// Launches the exchange of `x` for schedule step `step`.
  void start_mixing(std::span<float const> x, std::uint64_t step) {
    if (pending_) {
      throw config_error("gradcomp: comm_mixer on rank " + std::to_string(comm_->rank()) +
                         " started step " + std::to_string(step) + " while step " +
                         std::to_string(step_) + " is still outstanding");
    }
    requests_.clear();  // what a failed start left in flight completes before its buffers change
    row_ = topo_.row(step, comm_->rank());
    peers_ = row_.peers();
    received_.resize(peers_.size());
    requests_.reserve(2 * peers_.size());
    std::size_t const words = x.size() + (opt_.checksum ? 1 : 0);  // the trailer takes one float's bytes
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      received_[i].resize(words);
      requests_.push_back(comm_->irecv(std::as_writable_bytes(std::span<float>(received_[i])), peers_[i], tag_));
    }
    std::span<std::byte const> message = std::as_bytes(x);
    if (opt_.checksum) {
      framed_.assign(x.begin(), x.end());
      framed_.push_back(0.0f);
      std::uint32_t const crc = message_crc(x, step);
      std::memcpy(&framed_.back(), &crc, 4);
      message = std::as_bytes(std::span<float const>(framed_));
    }
    for (int p : peers_) requests_.push_back(comm_->isend(message, p, tag_));
    bytes_sent_ += peers_.size() * message.size();
    pending_ = true;
    step_ = step;
  }

  /// Completes the exchange and writes sum_j w_ij x_j into `x` (the span given to
  /// `start_mixing`).
  void wait_mixing(std::span<float> x) {
    if (!pending_) {
      throw config_error("gradcomp: comm_mixer on rank " + std::to_string(comm_->rank()) +
                         " waits for a mixing it never started");
    }
    pending_ = false;
    auto const t0 = std::chrono::steady_clock::now();
    wait_all(requests_);  // a transport failure: the peers fail on the transport
    requests_.clear();
    if (opt_.checksum || opt_.agree_outcome) {
      detail::step_check check;
      if (opt_.checksum) {
        check.guard([&] {
          for (std::size_t i = 0; i < peers_.size(); ++i) {
            std::uint32_t got = 0;
            std::memcpy(&got, &received_[i].back(), 4);
            if (got != message_crc(std::span<float const>(received_[i]).first(x.size()), step_)) {
              throw format_error("gradcomp: comm_mixer on rank " + std::to_string(comm_->rank()) +
                                 ": the parameters from rank " + std::to_string(peers_[i]) + " for step " +
                                 std::to_string(step_) +
                                 " fail their checksum (corrupted, or a message of another step)");
            }
          }
        });
      }
      if (opt_.agree_outcome) {
        detail::agree_outcome(*comm_, check, "comm_mixer", step_);
      } else if (check.failed()) {
        std::rethrow_exception(check.failure());
      }
    }
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int const self = comm_->rank();
    mix_row(
        row_,
        [&](int j) -> std::span<float const> {
          if (j == self) return x;
          for (std::size_t i = 0; i < peers_.size(); ++i) {
            if (peers_[i] == j) return std::span<float const>(received_[i]).first(x.size());
          }
          throw config_error("gradcomp: comm_mixer row names rank " + std::to_string(j) +
                             ", which is not a peer");
        },
        x);
  }

  /// Moves the outstanding exchange forward without blocking and returns true once all of it
  /// has completed. Some transports move
  /// large messages only inside their own calls (Open MPI over TCP without a progress thread
  /// sends a long message in pieces, each one driven by an MPI call), so a caller that wants
  /// the exchange to overlap a long computation calls this now and then during it; transports
  /// with asynchronous progress (in-process, NCCL) do not need it. Returns false when no
  /// mixing is outstanding. `wait_mixing` must still be called to mix.
  bool test_mixing() {
    if (!pending_) return false;
    bool done = true;
    for (auto& r : requests_) done = r.test() && done;
    return done;
  }

  /// True between `start_mixing` and `wait_mixing`.
  [[nodiscard]] bool pending() const noexcept { return pending_; }
  /// Seconds this rank has spent blocked in `wait_mixing` completing the exchange (the
  /// communication the overlap did not hide; the mixing arithmetic is not included).
  [[nodiscard]] double wait_seconds() const noexcept { return wait_s_; }
  /// Parameter bytes this rank has sent so far.
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return bytes_sent_; }
  [[nodiscard]] topology const& topo() const noexcept { return topo_; }

 private:
  static std::uint32_t message_crc(std::span<float const> x, std::uint64_t step) {
    std::byte seed[8];
    detail::store_le<std::uint64_t>(seed, step);
    return cpu::kernels::crc32c(std::as_bytes(x), cpu::kernels::crc32c(std::span<std::byte const>(seed, 8)));
  }

  Comm* comm_;
  topology topo_;
  int tag_;
  comm_mixer_options opt_;
  std::vector<float> framed_;  // x and its trailer (checksum option)
  mixing_row row_;
  std::vector<int> peers_;
  std::vector<std::vector<float>> received_;
  std::vector<request> requests_;
  std::uint64_t step_ = 0;
  std::uint64_t bytes_sent_ = 0;
  double wait_s_ = 0.0;
  bool pending_ = false;
};

GRADCOMP_NAMESPACE_END
