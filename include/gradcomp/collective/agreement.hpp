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
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/kernels/crc32c.hpp>

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

/// Bytes a report gains under the `checksum` option: its CRC32C and 4 zero bytes.
inline constexpr std::size_t report_check_bytes = 8;

/// The CRC32C of a report's `body` bytes, seeded with the name of its round (`what`), so that a
/// report delivered to another round (a message repeated or reordered by the transport) fails
/// its check like a corrupted one.
inline std::uint32_t report_seal(std::byte const* p, std::size_t body, std::string_view what) {
  std::uint32_t const seed = cpu::kernels::crc32c(std::as_bytes(std::span<char const>(what.data(), what.size())));
  return cpu::kernels::crc32c(std::span<std::byte const>(p, body), seed);
}

/// Writes the seal of the report of `body` bytes at `p` into the 8 bytes after them (its CRC32C
/// and 4 zero bytes).
inline void seal_report(std::byte* p, std::size_t body, std::string_view what) {
  store_le<std::uint32_t>(p + body, report_seal(p, body, what));
  store_le<std::uint32_t>(p + body + 4, 0);
}

/// Checks a sealed report (`body` bytes and their 8-byte seal); `format_error` if it does not match.
inline void check_report_seal(std::byte const* p, std::size_t body, std::string_view what, std::size_t rank) {
  if (load_le<std::uint32_t>(p + body) != report_seal(p, body, what) || load_le<std::uint32_t>(p + body + 4) != 0) {
    throw format_error("gradcomp: " + std::string(what) + ": checksum mismatch on the agreement report of rank " +
                       std::to_string(rank) + ": it was corrupted on the way (or belongs to another round); every "
                       "rank that sees it abandons the collective");
  }
}

/// One agreement round in flight: each rank's report plus `extra` u64 values per rank.
class report_round {
 public:
  report_round() = default;

  /// Posts the all-gather of `mine` (and `extra`, the same length on every rank). With
  /// `checksum` each report carries its seal (`report_check_bytes` more: its CRC32C seeded with
  /// `what`, the name `finish` will be given), checked by `finish`.
  template <communicator Comm>
  void post(Comm& comm, rank_report const& mine, std::span<std::uint64_t const> extra, bool checksum = false,
            std::string_view what = {}) {
    extra_ = extra.size();
    size_ = comm.size();
    rank_ = comm.rank();
    checksum_ = checksum;
    std::size_t const each = each_bytes();
    send_.assign(each, std::byte{0});
    encode_report(mine, extra, send_.data());
    if (checksum_) seal_report(send_.data(), rank_report_bytes + 8 * extra_, what);
    recv_.assign(each * static_cast<std::size_t>(size_), std::byte{0});
    req_ = comm.iall_gather(const_bytes(send_), writable_bytes(recv_));
  }

  /// Waits for the round and applies the rules of the file comment: rethrows `local` on this
  /// rank if it failed, throws `format_error` if a report fails its checksum, `comm_error` if
  /// another rank failed, `config_error` if the fingerprints differ. `what` names the
  /// collective in messages.
  void finish(std::string_view what, std::exception_ptr local = nullptr) {
    req_.wait();
    std::size_t const each = each_bytes();
    reports_.resize(static_cast<std::size_t>(size_));
    extras_.resize(static_cast<std::size_t>(size_) * extra_);
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      std::byte const* p = recv_.data() + r * each;
      reports_[r] = decode_report(p);
      for (std::size_t i = 0; i < extra_; ++i) extras_[r * extra_ + i] = load_le<std::uint64_t>(p + 32 + 8 * i);
    }
    if (local) std::rethrow_exception(local);
    if (checksum_) {
      for (std::size_t r = 0; r < reports_.size(); ++r) {
        check_report_seal(recv_.data() + r * each, rank_report_bytes + 8 * extra_, what, r);
      }
    }
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
  /// Ring traffic of the round for this rank.
  [[nodiscard]] std::size_t wire_bytes() const noexcept {
    if (size_ <= 1) return 0;
    return each_bytes() * static_cast<std::size_t>(size_ - 1);
  }

  /// After `finish`: checks that every rank's `bytes` (or, with `extra_index`, its extra value
  /// `extra_index`) is at most `bound` and this rank's equals `own`. A size that breaks this
  /// was corrupted on the way: `format_error` (on every rank when it was corrupted at its
  /// sender), before any buffer is sized from it or a payload posted with it.
  void check_sizes(std::string_view what, std::uint64_t bound, std::uint64_t own,
                   std::size_t extra_index = static_cast<std::size_t>(-1)) const {
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      std::uint64_t const v = extra_index == static_cast<std::size_t>(-1) ? reports_[r].bytes : extra(r, extra_index);
      bool const mine = r == static_cast<std::size_t>(rank_);
      if (v > bound || (mine && v != own)) {
        throw format_error("gradcomp: " + std::string(what) + ": the agreement round reports " + std::to_string(v) +
                           " bytes for rank " + std::to_string(r) + (mine ? " (this rank sent " + std::to_string(own) + ")" : "") +
                           ", more than the bound of " + std::to_string(bound) +
                           " or not what was sent: the report was corrupted on the way");
      }
    }
  }

 private:
  [[nodiscard]] std::size_t each_bytes() const noexcept {
    return rank_report_bytes + 8 * extra_ + (checksum_ ? report_check_bytes : 0);
  }

  std::size_t extra_ = 0;
  int size_ = 1;
  int rank_ = 0;
  bool checksum_ = false;
  std::vector<std::byte> send_, recv_;
  request req_;
  std::vector<rank_report> reports_;
  std::vector<std::uint64_t> extras_;
};

}  // namespace detail

/// Checks that every rank passed the same `fingerprint`; throws `config_error` on every rank
/// otherwise (and `comm_error` from the transport if a rank is gone). Collective: all ranks
/// call it. `what` names the decision in the message. With `checksum` (the same on every
/// rank) each report carries its CRC32C: a report corrupted on the way is a `format_error`
/// rather than a disagreement.
template <communicator Comm>
void agree(Comm& comm, std::uint64_t fingerprint, std::string_view what = "agreement", bool checksum = false) {
  detail::report_round round;
  rank_report mine;
  mine.fingerprint = fingerprint;
  round.post(comm, mine, {}, checksum, what);
  round.finish(what);
}

/// Rank `root`'s `value` on every rank (a broadcast): the way for ranks to adopt one choice
/// made at run time, e.g. a controller's compression factor. Collective. With `checksum` (the
/// same on every rank) the value travels with its CRC32C, and a rank that receives a corrupted
/// one throws `format_error` instead of adopting it.
template <communicator Comm, class T>
  requires std::is_trivially_copyable_v<T>
T agree_on_value(Comm& comm, T const& value, int root = 0, bool checksum = false) {
  T out = value;
  if (!checksum) {
    comm.broadcast(std::as_writable_bytes(std::span<T>(&out, 1)), root);
    return out;
  }
  std::vector<std::byte> buf(sizeof(T) + 4);
  std::memcpy(buf.data(), &value, sizeof(T));
  detail::store_le<std::uint32_t>(buf.data() + sizeof(T),
                                  cpu::kernels::crc32c(std::span<std::byte const>(buf.data(), sizeof(T))));
  comm.broadcast(std::span<std::byte>(buf), root);
  if (detail::load_le<std::uint32_t>(buf.data() + sizeof(T)) !=
      cpu::kernels::crc32c(std::span<std::byte const>(buf.data(), sizeof(T)))) {
    throw format_error("gradcomp: agree_on_value: the value broadcast by rank " + std::to_string(root) +
                       " fails its checksum: it was corrupted on the way");
  }
  std::memcpy(&out, buf.data(), sizeof(T));
  return out;
}

GRADCOMP_NAMESPACE_END
