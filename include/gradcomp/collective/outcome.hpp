// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The step-outcome round and the optional checksums of the collectives (docs/collectives.md,
/// "Step outcome and checksums").
///
/// **Step outcome.** After its payload has moved, a rank still has local work that can fail:
/// decoding what it received (a corrupted packet is a `format_error`), a low-rank session's
/// next factor. If one rank failed there while the others succeeded, the others would commit
/// the step (residuals, server residuals, PowerSGD state, a controller) and carry on with a
/// state their failed peer does not share. So every collective ends with one more round before
/// anything is committed: every rank whose transport still works contributes whether its step
/// succeeded; a rank that failed rethrows its own exception and every other rank throws
/// `comm_error` naming it. Nobody commits, every rank fails the same step, and the state of
/// every rank is as before the step. A transport failure (`comm_error`) is the transport's to
/// report: such a rank leaves at once, its peers fail at their next operation on it (at once
/// in-process, at the timeout under MPI).
///
/// Cost: one all-reduce (max) of three 32-bit words per collective call (the pipeline: per
/// step), i.e. one more latency-bound message round; no bandwidth to speak of. The words are
/// the failure flag and a tag naming the round (see `agree_outcome`).
///
/// **Checksums** (`collective_options::checksum` and the same option of the bucketed
/// collective, the parameter-server mode and the pipeline; off by default). With it on:
/// - every packet that is delivered as it was sent (gathered packets, two-way shards and server
///   packets, parameter-server packets) carries a 4-byte CRC32C trailer in the collective's
///   framing, checked before the packet is decoded: a corrupted packet is a `format_error`;
/// - for payloads that are summed on the wire (summable values, shared-support values, dense
///   buckets, low-rank factors, a controller's statistics), where a per-packet checksum cannot
///   survive the sum, each rank
///   computes a random linear sketch (sum of w_i x_i, with weights in [1, 2) from a fixed
///   stream) of what it contributes and of the sum it got back; the sum of the contributions'
///   sketches must equal the sketch of the sum within the rounding bound of the sum
///   (2 W u sum |w_i x_i|, u the unit roundoff of the values' type);
/// - each rank's CRC32C of its result (outputs, reduced statistics) is compared with every other
///   rank's;
/// - the outcome round becomes an all-gather of 40 bytes per rank carrying these figures, and
///   every rank takes the same decision: a mismatch is a `format_error` on every rank (checked
///   before the ranks' own failures, which a corruption may have caused).
/// Cost: CRC32C over every packet and every output (SSE4.2 `crc32` where the CPU has it), one
/// pass over the summed values to sketch them, and 40 bytes per rank in the outcome round.
///
/// Limits: corruption inside the outcome round itself, delivered to one rank only, makes that
/// rank alone fail the step (no finite protocol can make ranks agree over a channel that may
/// corrupt its last message); a corruption smaller than the rounding error of a sum changes the
/// result by less than that rounding and is not detected.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/kernels/crc32c.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Bytes of the CRC32C trailer a packet carries under the `checksum` option.
inline constexpr std::size_t checksum_trailer_bytes = 4;

namespace detail {

/// `packet` followed by room for its trailer: writes the CRC32C of `packet` into the 4 bytes
/// after it (the caller sized the buffer) and returns the framed size.
inline std::size_t add_trailer(std::span<std::byte> buf, std::size_t packet_bytes) {
  if (buf.size() < packet_bytes + checksum_trailer_bytes) {
    throw config_error("gradcomp: no room for the checksum trailer of a " +
                       std::to_string(packet_bytes) + "-byte packet");
  }
  std::uint32_t const crc =
      cpu::kernels::crc32c(std::span<std::byte const>(buf.first(packet_bytes)));
  store_le<std::uint32_t>(buf.data() + packet_bytes, crc);
  return packet_bytes + checksum_trailer_bytes;
}

/// The packet inside a framed packet (packet + CRC32C trailer); `format_error` if the trailer
/// is missing or does not match. An empty framed packet (no contribution) stays empty.
inline std::span<std::byte const> strip_trailer(std::span<std::byte const> framed,
                                                char const* what) {
  if (framed.empty()) return framed;
  if (framed.size() < checksum_trailer_bytes) {
    throw format_error(std::string("gradcomp: ") + what + ": a checksummed packet of " +
                       std::to_string(framed.size()) + " bytes has no room for its 4-byte trailer");
  }
  std::span<std::byte const> const packet = framed.first(framed.size() - checksum_trailer_bytes);
  std::uint32_t const want = load_le<std::uint32_t>(framed.data() + packet.size());
  std::uint32_t const got = cpu::kernels::crc32c(packet);
  if (want != got) {
    throw format_error(std::string("gradcomp: ") + what + ": checksum mismatch on a " +
                       std::to_string(packet.size()) + "-byte packet (CRC32C " +
                       std::to_string(got) + ", its trailer says " + std::to_string(want) +
                       "): the packet was corrupted on the way");
  }
  return packet;
}

/// What one rank knows at the end of a collective step: its first local failure after the data
/// moved, and under the `checksum` option the sketches and CRC of the file comment. Every
/// collective of the library fills one and hands it to `agree_outcome`.
class step_check {
 public:
  explicit step_check(bool checksum = false) noexcept : checksum_(checksum) {}

  [[nodiscard]] bool checksum() const noexcept { return checksum_; }

  /// Records `e` as this rank's failure (the first one wins).
  void fail(std::exception_ptr e) noexcept {
    if (!failure_) failure_ = std::move(e);
  }
  /// Runs local work `f`, recording (not throwing) its failure. Skipped after a failure.
  template <class F>
  void guard(F&& f) noexcept {
    if (failure_) return;
    try {
      f();
    } catch (...) {
      fail(std::current_exception());
    }
  }
  [[nodiscard]] bool failed() const noexcept { return static_cast<bool>(failure_); }
  [[nodiscard]] std::exception_ptr failure() const noexcept { return failure_; }

  /// This rank's contribution to a sum, just before it is posted (`t`: f32, f16, bf16 or f64).
  void before_sum(std::span<std::byte const> values, comm_type t) {
    if (!checksum_) return;
    sketch(values, t, before_sections_++, own_, &own_abs_);
    note_type(t);
    sums_ = true;
  }
  /// The same buffer once the sum has arrived (called in the same order as `before_sum`).
  void after_sum(std::span<std::byte const> values, comm_type t) {
    if (!checksum_) return;
    sketch(values, t, after_sections_++, result_, nullptr);
  }
  /// A piece of this rank's result (chained into one CRC32C).
  void output(std::span<float const> out) { result(std::as_bytes(out)); }
  /// A piece of this rank's result that every rank must hold alike (an output, a reduced
  /// statistic), chained into the CRC32C the outcome round compares.
  void result(std::span<std::byte const> bytes) {
    if (!checksum_ || bytes.empty()) return;
    crc_ = cpu::kernels::crc32c(bytes, crc_);
    has_output_ = true;
  }

  /// The record this rank contributes to the outcome round under the checksum option.
  void encode(std::byte* out) const {
    std::uint32_t flags = failed() ? 1u : 0u;
    if (has_output_) flags |= 2u;
    if (sums_) flags |= 4u;
    store_le<std::uint32_t>(out, flags);
    store_le<std::uint32_t>(out + 4, crc_);
    store_le<std::uint64_t>(out + 8, std::bit_cast<std::uint64_t>(own_));
    store_le<std::uint64_t>(out + 16, std::bit_cast<std::uint64_t>(own_abs_));
    store_le<std::uint64_t>(out + 24, std::bit_cast<std::uint64_t>(result_));
  }
  /// `encode`, then the round's tag (see `agree_outcome`) and 4 zero bytes.
  void encode(std::byte* out, std::uint32_t tag) const {
    encode(out);
    store_le<std::uint32_t>(out + 32, tag);
    store_le<std::uint32_t>(out + 36, 0);
  }
  /// The unit roundoff of the least precise summed type (the sum check's tolerance).
  [[nodiscard]] double unit() const noexcept { return unit_; }

 private:
  static double value(std::byte const* p, comm_type t) {
    switch (t) {
      case comm_type::f32: return static_cast<double>(load_f32(p));
      case comm_type::f16:
        return static_cast<double>(half_bits_to_float(load_le<std::uint16_t>(p)));
      case comm_type::bf16:
        return static_cast<double>(bfloat16_bits_to_float(load_le<std::uint16_t>(p)));
      case comm_type::f64: return std::bit_cast<double>(load_le<std::uint64_t>(p));
      default: break;
    }
    throw config_error(
        std::string("gradcomp: the checksum of a sum takes f32, f16, bf16 or f64 values, not ") +
        comm_type_name(t));
  }
  static void sketch(std::span<std::byte const> v, comm_type t, std::uint64_t section, double& sum,
                     double* abs) {
    std::size_t const es = comm_type_size(t);
    std::uint64_t x = 0x9E3779B97F4A7C15ull * (section + 1) ^ 0xD1B54A32D192ED03ull;
    double s = 0.0, a = 0.0;
    for (std::size_t i = 0; i + es <= v.size(); i += es) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      double const w = 1.0 + static_cast<double>(x >> 40) * 0x1p-24;
      double const y = value(v.data() + i, t);
      s += w * y;
      a += w * std::fabs(y);
    }
    sum += s;
    if (abs != nullptr) *abs += a;
  }
  void note_type(comm_type t) noexcept {
    double const u = t == comm_type::f16    ? 0x1p-11
                     : t == comm_type::bf16 ? 0x1p-8
                     : t == comm_type::f64  ? 0x1p-52
                                            : 0x1p-24;
    if (u > unit_) unit_ = u;
  }

  bool checksum_;
  std::exception_ptr failure_;
  bool sums_ = false, has_output_ = false;
  std::uint64_t before_sections_ = 0, after_sections_ = 0;
  double own_ = 0.0, own_abs_ = 0.0, result_ = 0.0, unit_ = 0.0;
  std::uint32_t crc_ = 0;

 public:
  /// Bytes of one rank's record in the outcome round under the checksum option.
  static constexpr std::size_t record_bytes = 40;
};

/// Modeled traffic of the outcome round for this rank (ring all-reduce of 12 bytes, or ring
/// all-gather of the records).
inline std::size_t outcome_wire_bytes(bool checksum, int w) noexcept {
  if (w <= 1) return 0;
  return checksum ? step_check::record_bytes * static_cast<std::size_t>(w - 1)
                  : ring_all_reduce_bytes(12, w);
}

/// The tag of an outcome round: CRC32C of the collective's name, seeded with `round`.
inline std::uint32_t outcome_tag(std::string_view what, std::uint64_t round) {
  std::byte r[8];
  store_le<std::uint64_t>(r, round);
  return cpu::kernels::crc32c(std::as_bytes(std::span<char const>(what.data(), what.size())),
                              cpu::kernels::crc32c(std::span<std::byte const>(r, 8)));
}

/// The step-outcome round (file comment): every rank learns whether every rank's step
/// succeeded and, under the checksum option, whether the data arrived intact. Rethrows this
/// rank's own failure; throws `comm_error` on the others for a failed rank, `format_error` on
/// every rank for a checksum mismatch. Collective. `what` names the collective in messages.
///
/// The round also carries a tag, the CRC32C of `what` seeded with `round` (a step number every
/// rank shares, where the caller has one; 0 otherwise): a rank whose round met another round
/// (a collective repeated or reordered by the transport) gets `comm_error` instead of a stale
/// "success". Without the checksum option the round is an all-reduce (max) of three 32-bit
/// words: failed, tag, ~tag (every tag equal exactly when both maxima are this rank's).
template <communicator Comm>
void agree_outcome(Comm& comm, step_check const& check, std::string_view what,
                   std::uint64_t round = 0) {
  std::uint32_t const tag = outcome_tag(what, round);
  auto desync = [&] {
    return comm_error(
        "gradcomp: " + std::string(what) +
        ": the step-outcome round met a round of another step or collective (a message "
        "repeated or reordered by the transport); no rank commits this step");
  };
  if (!check.checksum()) {
    std::uint32_t words[3] = {check.failed() ? 1u : 0u, tag, ~tag};
    comm.all_reduce(std::as_writable_bytes(std::span<std::uint32_t>(words)), comm_type::u32,
                    reduce_op::max);
    if (check.failed()) std::rethrow_exception(check.failure());
    if (words[1] != tag || words[2] != ~tag) throw desync();
    if (words[0] != 0) {
      throw comm_error("gradcomp: " + std::string(what) +
                       ": a rank failed after the data moved (see that rank's "
                       "exception); no rank commits this step");
    }
    return;
  }
  auto const w = static_cast<std::size_t>(comm.size());
  std::vector<std::byte> mine(step_check::record_bytes), all(step_check::record_bytes * w);
  check.encode(mine.data(), tag);
  comm.all_gather(std::span<std::byte const>(mine), std::span<std::byte>(all));
  for (std::size_t r = 0; r < w; ++r) {
    if (load_le<std::uint32_t>(all.data() + r * step_check::record_bytes + 32) != tag)
      throw desync();
  }
  auto flags = [&](std::size_t r) {
    return load_le<std::uint32_t>(all.data() + r * step_check::record_bytes);
  };
  auto f64 = [&](std::size_t r, std::size_t at) {
    return std::bit_cast<double>(
        load_le<std::uint64_t>(all.data() + r * step_check::record_bytes + at));
  };
  auto crc = [&](std::size_t r) {
    return load_le<std::uint32_t>(all.data() + r * step_check::record_bytes + 4);
  };
  // Corrupted data first: a rank whose local step failed because of them (a decoder, a
  // factor) reports the corruption like the others, not its consequence.
  double own = 0.0, abs = 0.0;
  bool sums = false;
  for (std::size_t r = 0; r < w; ++r) {
    if ((flags(r) & 4u) == 0) continue;
    sums = true;
    own += f64(r, 8);
    abs += f64(r, 16);
  }
  if (sums) {
    double const tol = 2.0 * static_cast<double>(w) * check.unit() * abs;
    for (std::size_t r = 0; r < w; ++r) {
      if ((flags(r) & 4u) == 0 || std::fabs(own - f64(r, 24)) <= tol) continue;
      throw format_error(
          "gradcomp: " + std::string(what) + ": checksum mismatch: the sums rank " +
          std::to_string(r) + " received do not add up to the ranks' contributions (sketch " +
          std::to_string(f64(r, 24)) + ", expected " + std::to_string(own) + " within " +
          std::to_string(tol) + "): data were corrupted in transit; no rank commits this step");
    }
  }
  std::size_t first = w;
  for (std::size_t r = 0; r < w; ++r) {
    if ((flags(r) & 3u) != 2u) continue;  // a result, and no failure
    if (first == w) {
      first = r;
    } else if (crc(r) != crc(first)) {
      throw format_error(
          "gradcomp: " + std::string(what) + ": checksum mismatch: the result of rank " +
          std::to_string(r) + " (CRC32C " + std::to_string(crc(r)) +
          ") differs from that of rank " + std::to_string(first) + " (" +
          std::to_string(crc(first)) +
          "): data were corrupted on the way to one of them; no rank commits this step");
    }
  }
  if (check.failed()) std::rethrow_exception(check.failure());
  for (std::size_t r = 0; r < w; ++r) {
    if ((flags(r) & 1u) != 0) {
      throw comm_error(
          "gradcomp: " + std::string(what) + ": rank " + std::to_string(r) +
          " failed after the data moved (see that rank's exception); no rank commits this step");
    }
  }
}

}  // namespace detail

/// The step-outcome round for a collective of one's own (file comment): call it on every rank
/// after the payload moved and before committing any state, with this rank's failure since
/// (nullptr: none). Rethrows `local` on this rank and throws `comm_error` on every other rank if
/// any rank failed. Collective; costs one all-reduce of 12 bytes.
template <communicator Comm>
void agree_on_outcome(Comm& comm, std::exception_ptr local, std::string_view what = "step") {
  detail::step_check check;
  check.fail(std::move(local));
  detail::agree_outcome(comm, check, what);
}

GRADCOMP_NAMESPACE_END
