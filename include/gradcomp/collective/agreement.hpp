// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Agreement: every decision that changes the shape of a message (codec, its parameters, the
/// tensor size, a factor, a dense fallback) is checked to be the same on all ranks before data
/// moves, so ranks never diverge or deadlock.
///
/// The protocol (docs/collectives.md, "Agreement"): before the payload of a collective, each
/// rank contributes a fixed-size `rank_report` to one all-gather: a `fingerprint` of its
/// configuration, its status (did its local step, e.g. compression, succeed?), and the sizes
/// the payload operation needs. Every rank then sees the same reports and takes the same
/// decision: if a rank failed, every rank throws (the failed one its own exception, the others
/// `comm_error`); if fingerprints differ, every rank throws `config_error` naming the first
/// rank that differs from rank 0. Nobody proceeds to a payload operation whose shape might not
/// match. The same round carries the packet sizes that an all-gather-v needs, so a gather
/// collective pays no extra latency for it.
///
/// For values chosen at run time (a controller's compression factor), `agree_on_value`
/// broadcasts rank 0's choice, so all ranks use the same one.

#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Incremental 64-bit fingerprint of configuration fields (FNV-1a over their little-endian
/// bytes). Equal inputs give equal fingerprints on every platform.
class fingerprint {
 public:
  /// Adds an integer (as 8 little-endian bytes).
  fingerprint& add(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  /// Adds a double by its bit pattern.
  fingerprint& add_double(double v) noexcept { return add(std::bit_cast<std::uint64_t>(v)); }
  /// Adds a string (its length, then its bytes).
  fingerprint& add(std::string_view s) noexcept {
    add(static_cast<std::uint64_t>(s.size()));
    for (char c : s) mix(static_cast<unsigned char>(c));
    return *this;
  }
  /// Adds raw bytes (their length, then the bytes).
  fingerprint& add_bytes(std::span<std::byte const> b) noexcept {
    add(static_cast<std::uint64_t>(b.size()));
    for (std::byte c : b) mix(static_cast<unsigned char>(c));
    return *this;
  }
  /// The fingerprint so far.
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  void mix(unsigned char c) noexcept {
    h_ ^= c;
    h_ *= 0x100000001b3ull;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

/// What a rank reports in the agreement round of a collective.
struct rank_report {
  std::uint64_t fingerprint = 0;  ///< configuration fingerprint; must be equal on all ranks
  std::uint64_t count = 0;        ///< tensor elements (for messages)
  std::uint32_t codec = 0;        ///< codec id, 0 for a dense path (for messages)
  std::uint32_t status = 0;       ///< 0: the local step succeeded; 1: it failed
  std::uint64_t bytes = 0;        ///< this rank's packet bytes (what an all-gather-v needs)
};

/// Bytes of one encoded `rank_report`.
inline constexpr std::size_t rank_report_bytes = 32;

namespace detail {

inline void encode_report(rank_report const& r, std::span<std::uint64_t const> extra, std::byte* out) {
  store_le<std::uint64_t>(out, r.fingerprint);
  store_le<std::uint64_t>(out + 8, r.count);
  store_le<std::uint32_t>(out + 16, r.codec);
  store_le<std::uint32_t>(out + 20, r.status);
  store_le<std::uint64_t>(out + 24, r.bytes);
  for (std::size_t i = 0; i < extra.size(); ++i) store_le<std::uint64_t>(out + 32 + 8 * i, extra[i]);
}

inline rank_report decode_report(std::byte const* in) {
  rank_report r;
  r.fingerprint = load_le<std::uint64_t>(in);
  r.count = load_le<std::uint64_t>(in + 8);
  r.codec = load_le<std::uint32_t>(in + 16);
  r.status = load_le<std::uint32_t>(in + 20);
  r.bytes = load_le<std::uint64_t>(in + 24);
  return r;
}

inline std::string describe_report(rank_report const& r) {
  std::string codec = r.codec == 0 ? std::string("dense")
                                   : std::string(codec_name(static_cast<codec_id>(r.codec))) + " (id " +
                                         std::to_string(r.codec) + ")";
  char hex[17];
  for (int i = 0; i < 16; ++i) hex[i] = "0123456789abcdef"[(r.fingerprint >> (60 - 4 * i)) & 15u];
  hex[16] = '\0';
  return "codec " + codec + ", " + std::to_string(r.count) + " elements, configuration fingerprint " + hex;
}

/// A packet size `reported` by rank `rank` for a message this rank is about to receive, checked
/// against `bound`, the most such a packet can hold (a codec's `max_compressed_bytes` for the
/// agreed size, which every rank computes alike). A larger one comes from a peer that does not
/// follow the wire format: `format_error`, before anything is allocated from it. `what` names
/// the collective.
inline std::size_t checked_peer_bytes(std::uint64_t reported, std::size_t bound, std::size_t rank,
                                      std::string_view what) {
  if (reported > bound) {
    throw format_error(
        "gradcomp: " + std::string(what) + ": rank " + std::to_string(rank) + " announces a " +
        std::to_string(reported) + "-byte packet, more than the " + std::to_string(bound) +
        " bytes its codec can produce for the agreed tensor size; no data was received");
  }
  return static_cast<std::size_t>(reported);
}

/// One agreement round in flight: each rank's report plus `extra` u64 values per rank.
class report_round {
 public:
  report_round() = default;

  /// Posts the all-gather of `mine` (and `extra`, the same length on every rank).
  template <communicator Comm>
  void post(Comm& comm, rank_report const& mine, std::span<std::uint64_t const> extra) {
    extra_ = extra.size();
    size_ = comm.size();
    rank_ = comm.rank();
    std::size_t const each = rank_report_bytes + 8 * extra_;
    send_.assign(each, std::byte{0});
    encode_report(mine, extra, send_.data());
    recv_.assign(each * static_cast<std::size_t>(size_), std::byte{0});
    req_ = comm.iall_gather(const_bytes(send_), writable_bytes(recv_));
  }

  /// Waits for the round and applies the rules of the file comment: rethrows `local` on this
  /// rank if it failed, throws `comm_error` if another rank failed, `config_error` if the
  /// fingerprints differ. `what` names the collective in messages.
  void finish(std::string_view what, std::exception_ptr local = nullptr) {
    req_.wait();
    std::size_t const each = rank_report_bytes + 8 * extra_;
    reports_.resize(static_cast<std::size_t>(size_));
    extras_.resize(static_cast<std::size_t>(size_) * extra_);
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      std::byte const* p = recv_.data() + r * each;
      reports_[r] = decode_report(p);
      for (std::size_t i = 0; i < extra_; ++i) extras_[r * extra_ + i] = load_le<std::uint64_t>(p + 32 + 8 * i);
    }
    if (local) std::rethrow_exception(local);
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      if (reports_[r].status != 0) {
        throw comm_error("gradcomp: " + std::string(what) + ": rank " + std::to_string(r) +
                         " failed in its local step before any data moved (see that rank's "
                         "exception); every rank abandons this collective");
      }
    }
    for (std::size_t r = 1; r < reports_.size(); ++r) {
      if (reports_[r].fingerprint != reports_[0].fingerprint) {
        throw config_error("gradcomp: " + std::string(what) + ": ranks disagree on the collective's "
                           "configuration: rank 0 has " + describe_report(reports_[0]) + ", rank " +
                           std::to_string(r) + " has " + describe_report(reports_[r]) +
                           " (every rank must use the same codec, parameters, tensor sizes and "
                           "options); no data moved");
      }
    }
  }

  /// The reports of all ranks (after `finish`).
  [[nodiscard]] std::span<rank_report const> reports() const noexcept { return reports_; }
  /// Extra value `i` of rank `r` (after `finish`).
  [[nodiscard]] std::uint64_t extra(std::size_t r, std::size_t i) const noexcept { return extras_[r * extra_ + i]; }
  /// Every rank's `bytes` (after `finish`).
  [[nodiscard]] std::vector<std::size_t> bytes() const {
    std::vector<std::size_t> b(reports_.size());
    for (std::size_t r = 0; r < b.size(); ++r) b[r] = static_cast<std::size_t>(reports_[r].bytes);
    return b;
  }
  /// Every rank's `bytes` (after `finish`), each checked to be at most `bound`
  /// (`checked_peer_bytes`).
  [[nodiscard]] std::vector<std::size_t> bytes(std::size_t bound, std::string_view what) const {
    std::vector<std::size_t> b(reports_.size());
    for (std::size_t r = 0; r < b.size(); ++r)
      b[r] = checked_peer_bytes(reports_[r].bytes, bound, r, what);
    return b;
  }
  /// Extra value `i` of rank `r` (after `finish`) as a packet size of at most `bound`
  /// (`checked_peer_bytes`).
  [[nodiscard]] std::size_t extra_bytes(std::size_t r, std::size_t i, std::size_t bound,
                                        std::string_view what) const {
    return checked_peer_bytes(extra(r, i), bound, r, what);
  }
  /// Ring traffic of the round for this rank.
  [[nodiscard]] std::size_t wire_bytes() const noexcept {
    if (size_ <= 1) return 0;
    return (rank_report_bytes + 8 * extra_) * static_cast<std::size_t>(size_ - 1);
  }

 private:
  std::size_t extra_ = 0;
  int size_ = 1;
  int rank_ = 0;
  std::vector<std::byte> send_, recv_;
  request req_;
  std::vector<rank_report> reports_;
  std::vector<std::uint64_t> extras_;
};

}  // namespace detail

/// Checks that every rank passed the same `fingerprint`; throws `config_error` on every rank
/// otherwise (and `comm_error` from the transport if a rank is gone). Collective: all ranks
/// call it. `what` names the decision in the message.
template <communicator Comm>
void agree(Comm& comm, std::uint64_t fingerprint, std::string_view what = "agreement") {
  detail::report_round round;
  rank_report mine;
  mine.fingerprint = fingerprint;
  round.post(comm, mine, {});
  round.finish(what);
}

/// Rank `root`'s `value` on every rank (a broadcast): the way for ranks to adopt one choice
/// made at run time, e.g. a controller's compression factor. Collective.
template <communicator Comm, class T>
  requires std::is_trivially_copyable_v<T>
T agree_on_value(Comm& comm, T const& value, int root = 0) {
  T out = value;
  comm.broadcast(std::as_writable_bytes(std::span<T>(&out, 1)), root);
  return out;
}

GRADCOMP_NAMESPACE_END
