// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `all_reduce_compressed`: one entry point that picks the collective from the codec's
/// aggregation kind (docs/collectives.md has the table):
///
/// | kind           | algorithm                                                              |
/// |----------------|------------------------------------------------------------------------|
/// | summable       | all-reduce the packet's values in the compressed domain (header kept)  |
/// | shared support | all-reduce the values at the support all ranks share (same seed/step)  |
/// | gather         | all-gather-v of the packets, decompress-and-sum in rank order          |
/// | low-rank       | the factor all-reduces of a `low_rank_session` (pass the session)      |
///
/// Every call starts with one agreement round (collective/agreement.hpp): codec id, kind,
/// tensor size, packet bound, bits per element, reduction, the shared seed and step for shared
/// support, and the bytes around the summable values are fingerprinted and compared, and each
/// rank reports whether its compression succeeded and how large its packet is. Disagreement is
/// a `config_error` on every rank, a failed compression is its exception on its rank and a
/// `comm_error` on the others; no rank is left waiting.
///
/// With a `compressor` (error feedback) the residual is updated locally, as in a single-rank
/// step: what this rank sent plus its new residual equals its gradient plus its old residual.
/// With a policy whose packets are increments (EF21) the compressor's receiver side turns the
/// reduced increments into the gradient estimate, so the output is the estimate on every rank.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// Fingerprint of everything that fixes the shape of a compressed collective's messages.
template <class Source>
std::uint64_t codec_fingerprint(Source const& src, std::size_t n, reduction op, codec_context const& ctx,
                                std::string_view what) {
  auto const& c = codec_of(src);
  aggregation_kind const kind = aggregation_of(src);
  fingerprint f;
  f.add(what)
      .add(static_cast<std::uint64_t>(codec_id_of(src)))
      .add(static_cast<std::uint64_t>(kind))
      .add(n)
      .add(c.max_compressed_bytes(n))
      .add_double(static_cast<double>(c.bits_per_element()))
      .add(static_cast<std::uint64_t>(op));
  if (kind == aggregation_kind::shared_support) f.add(ctx.seed).add(ctx.step);
  return f.value();
}

/// One rank's compressed contribution, in a buffer of memory space `Mem`
/// (collective/memory.hpp).
template <class Mem>
struct basic_local_packet {
  typename Mem::buffer buf;
  std::size_t bytes = 0;    ///< packet size (0: no contribution, gather only)
  value_section section{};  ///< summable / shared support: the values

  [[nodiscard]] std::span<std::byte const> packet() const noexcept { return buf.span().first(bytes); }
  [[nodiscard]] std::span<std::byte> values() noexcept { return buf.span().subspan(section.offset, section.bytes); }

  /// Adds the bytes around the values (header, check words) to `f`, read through `mem`.
  void add_frame(fingerprint& f, Mem const& mem = {}) const {
    mem.read(packet().first(section.offset), [&](std::span<std::byte const> b) { f.add_bytes(b); });
    mem.read(packet().subspan(section.offset + section.bytes), [&](std::span<std::byte const> b) { f.add_bytes(b); });
  }
};

/// A contribution in host memory.
using local_packet = basic_local_packet<host_memory>;

/// A source whose error feedback commits in two phases (a `compressor`): the collectives stage
/// its step and make it current only once every rank has succeeded (`pending_commit`).
template <class X>
concept two_phase_source = requires(X& x, tensor_view<float const> g, std::span<std::byte> out,
                                    std::span<std::byte const> sent, codec_context const& ctx, tensor_id id) {
  { x.stage(g, out, ctx) } -> std::same_as<std::size_t>;
  x.prepare_commit(id, x.codec(), sent, ctx);
  x.apply_commit(id);
  x.discard(id);
};

/// The error-feedback steps a collective has staged: `apply` makes them current once the step
/// succeeded on every rank; otherwise they are discarded (the state stays as before the step).
template <class Source>
class pending_commit {
 public:
  explicit pending_commit(Source& src) noexcept : src_(src) {}
  pending_commit(pending_commit const&) = delete;
  pending_commit& operator=(pending_commit const&) = delete;
  ~pending_commit() {
    if constexpr (two_phase_source<Source>) {
      for (tensor_id id : ids_) src_.discard(id);
    }
  }
  /// Records a staged step of tensor `id`.
  void add(tensor_id id) { ids_.push_back(id); }
  /// Makes every staged step current.
  void apply() {
    if constexpr (two_phase_source<Source>) {
      for (tensor_id id : ids_) src_.apply_commit(id);
    }
    ids_.clear();
  }
  /// Hands the staged steps to the caller, who makes them current (`apply_commit`) or discards
  /// them itself; this object then has none left.
  [[nodiscard]] std::vector<tensor_id> release() noexcept { return std::exchange(ids_, {}); }

 private:
  Source& src_;
  std::vector<tensor_id> ids_;
};

/// Compresses `grad` (or, when it is empty, this rank's zero contribution) into `p`, leaving
/// `tail` spare bytes after the packet's bound (for a checksum trailer). A `two_phase_source`
/// stages the step (recorded in `pending`; its state changes only at `pending.apply()`);
/// another source compresses in one go. `p`'s memory space is the source's.
template <class Source, class Mem>
void compress_contribution(Source& src, aggregation_kind kind, tensor_view<float const> grad, std::size_t n,
                           basic_local_packet<Mem>& p, codec_context const& ctx,
                           pending_commit<Source>* pending = nullptr, std::size_t tail = 0) {
  static_assert(std::same_as<Mem, memory_of_t<Source>>, "a packet in another memory space than its source's");
  auto const& codec = codec_of(src);
  Mem const mem = memory_of(src);
  p.buf.resize(codec.max_compressed_bytes(n) + tail);
  p.section = {};
  if (!grad.empty()) {
    if constexpr (two_phase_source<Source>) {
      if (pending != nullptr) {
        p.bytes = src.stage(grad, p.buf.span(), ctx);
        src.prepare_commit(grad.id(), src.codec(), p.packet(), ctx);
        pending->add(grad.id());
      } else {
        p.bytes = src.compress(grad, p.buf.span(), ctx);
      }
    } else {
      p.bytes = src.compress(grad, p.buf.span(), ctx);
    }
  } else if (kind == aggregation_kind::gather) {
    p.bytes = 0;
  } else {
    // Summable and shared-support ranks all take part in the all-reduce: a rank without a
    // gradient sends the packet of a zero tensor (same header, zero values), bypassing its
    // error feedback, whose state stays as it was.
    if constexpr (Mem::on_host) {
      std::vector<float> const zero(n, 0.0f);
      p.bytes = codec.compress(tensor_view<float const>(std::span<float const>(zero), grad.id()), p.buf.span(), ctx);
    } else {
      typename Mem::buffer zero = mem.make_buffer();
      zero.resize(n * sizeof(float));
      mem.zero(zero.span());
      std::span<float const> const z(reinterpret_cast<float const*>(zero.data()), n);
      p.bytes = codec.compress(tensor_view<float const>(z, grad.id()), p.buf.span(), ctx);
    }
  }
  if (kind == aggregation_kind::summable || kind == aggregation_kind::shared_support) {
    p.section = section_of(codec, p.packet());
    if (p.section.offset > p.bytes || p.section.bytes > p.bytes - p.section.offset ||
        p.section.bytes % dtype_size(p.section.type) != 0 ||
        !(p.section.type == dtype::f32 || p.section.type == dtype::f16 || p.section.type == dtype::bf16)) {
      throw format_error("gradcomp: a codec's value section (offset " + std::to_string(p.section.offset) +
                         ", " + std::to_string(p.section.bytes) + " bytes) does not fit its packet of " +
                         std::to_string(p.bytes) + " bytes");
    }
    if (grad.empty()) mem.zero(p.values());
  }
}

/// Sets the floats of `out`, in memory space `mem`, to +0.
template <class Mem>
void zero_floats(Mem const& mem, std::span<float> out) {
  if constexpr (Mem::on_host) {
    std::fill(out.begin(), out.end(), 0.0f);
  } else {
    mem.zero(std::as_writable_bytes(out));
  }
}

/// Decodes the summed packet `p` (summable / shared support) into `out` times `alpha`.
template <class Codec, class Mem>
void decode_summed(Codec const& codec, basic_local_packet<Mem> const& p, std::span<float> out, float alpha,
                   codec_context const& ctx, Mem const& mem = {}) {
  if (alpha != 1.0f) {
    zero_floats(mem, out);
    codec.decompress_add(p.packet(), out, alpha, ctx);
  } else {
    codec.decompress(p.packet(), out, ctx);
  }
}

/// Decompress-and-sum of gathered packets (rank order; empty ones skipped), in memory space
/// `mem`.
template <class Codec, class Mem = host_memory>
void decode_gathered(Codec const& codec, std::span<std::span<std::byte const> const> packets, std::span<float> out,
                     float alpha, codec_context const& ctx, Mem const& mem = {}) {
  // The first packet is decoded in place of a zero fill when no scaling is needed (one pass
  // over the output less; x and 0 + 1 * x agree except for the sign of zero).
  bool first = alpha == 1.0f;
  if (!first) zero_floats(mem, out);
  for (auto const& p : packets) {
    if (p.empty()) continue;
    if (first) codec.decompress(p, out, ctx);
    else codec.decompress_add(p, out, alpha, ctx);
    first = false;
  }
  if (first) zero_floats(mem, out);
}

/// Splits `all` into consecutive packets of `sizes` bytes.
inline std::vector<std::span<std::byte const>> split_packets(std::span<std::byte const> all,
                                                             std::span<std::size_t const> sizes) {
  std::vector<std::span<std::byte const>> out;
  out.reserve(sizes.size());
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    out.push_back(all.subspan(at, s));
    at += s;
  }
  return out;
}

}  // namespace detail

namespace detail {

/// `all_reduce_compressed` of a packet source without its outcome round and its commit: the
/// agreement round, the payload and the decoding into `out` (whose failure is recorded in
/// `check`, with the result's checksum). Error feedback is staged into `pending`, to be applied
/// by the caller once every rank has succeeded (the hierarchical all-reduce runs it on a group
/// of ranks and settles the step over all of them).
///
/// The payload (packets, summed values, gathered packets) lives in the source's memory space
/// (collective/memory.hpp); the agreement round is a host message either way. A source whose
/// payloads are not on the host takes no `checksum` option (the checksums read every payload
/// byte on the host): a `config_error`, reported through the agreement round.
template <communicator Comm, class Source>
collective_result compressed_exchange(Comm& comm, Source& src, tensor_view<float const> grad, std::span<float> out,
                                      codec_context const& ctx, collective_options const& opt, step_check& check,
                                      pending_commit<Source>& pending) {
  check_contribution(grad.size(), out.size(), "all_reduce_compressed");
  using mem_type = memory_of_t<Source>;
  mem_type const mem = memory_of(src);
  std::size_t const n = out.size();
  auto const& codec = codec_of(src);
  aggregation_kind const kind = aggregation_of(src);
  fingerprint fp;
  rank_report mine;
  mine.count = n;
  mine.codec = static_cast<std::uint32_t>(codec_id_of(src));
  std::exception_ptr local;
  basic_local_packet<mem_type> p;
  p.buf = mem.make_buffer();
  bool const trailer = opt.checksum && kind == aggregation_kind::gather;
  if (opt.checksum) fp.add("checksum");
  try {
    fp.add(codec_fingerprint(src, n, opt.op, ctx, "all_reduce_compressed")).add(static_cast<std::uint64_t>(grad.id()));
    if (kind == aggregation_kind::low_rank) {
      throw config_error(std::string("gradcomp: codec '") + codec_name(codec_id_of(src)) +
                         "' is low-rank: all_reduce_compressed needs its low_rank_session (the "
                         "stateful factor object), not the codec");
    }
    if (!mem_type::on_host && opt.checksum) {
      throw config_error(std::string("gradcomp: all_reduce_compressed: codec '") + codec_name(codec_id_of(src)) +
                         "' keeps its packets in device memory; the checksum option reads every payload on the "
                         "host and is available for host codecs only");
    }
    compress_contribution(src, kind, grad, n, p, ctx, &pending, trailer ? checksum_trailer_bytes : 0);
    if (kind != aggregation_kind::gather) p.add_frame(fp, mem);
    if constexpr (mem_type::on_host) {
      if (trailer && p.bytes != 0) p.bytes = add_trailer(p.buf.span(), p.bytes);
    }
    mine.bytes = p.bytes;
  } catch (...) {
    local = std::current_exception();
    mine.status = 1;
  }
  mine.fingerprint = fp.value();
  report_round round;
  round.post(comm, mine, {}, opt.checksum, "all_reduce_compressed");
  round.finish("all_reduce_compressed", local);
  round.check_sizes("all_reduce_compressed", codec.max_compressed_bytes(n) + (trailer ? checksum_trailer_bytes : 0),
                    mine.bytes);

  float const alpha = reduction_scale(opt.op, comm.size());
  collective_result res;
  res.packet_bytes = grad.empty() ? 0 : p.bytes;
  res.wire_bytes = round.wire_bytes();
  // Decoding may fail on this rank alone (a packet corrupted on its way here): it is recorded,
  // and the outcome round makes every rank fail the step before anything is committed.
  if (kind == aggregation_kind::gather) {
    res.path = collective_path::gather;
    std::vector<std::size_t> const sizes = round.bytes();
    std::size_t total = 0;
    for (std::size_t s : sizes) total += s;
    typename mem_type::buffer all = mem.make_buffer();
    all.resize(total);
    comm.all_gather_v(p.packet(), all.span(), std::span<std::size_t const>(sizes));
    check.guard([&] {
      auto packets = split_packets(std::as_const(all).span(), sizes);
      if constexpr (mem_type::on_host) {
        if (trailer) {
          for (auto& pk : packets) pk = strip_trailer(pk, "all_reduce_compressed");
        }
      }
      decode_gathered(codec, std::span<std::span<std::byte const> const>(packets), out, alpha, ctx, mem);
    });
    res.wire_bytes += ring_all_gather_bytes(sizes, comm.rank());
  } else {
    res.path = kind == aggregation_kind::summable ? collective_path::summable : collective_path::shared_support;
    comm_type const vt = comm_type_of_dtype(p.section.type);
    if constexpr (mem_type::on_host) check.before_sum(p.values(), vt);
    comm.all_reduce(p.values(), vt, reduce_op::sum);
    if constexpr (mem_type::on_host) check.after_sum(p.values(), vt);
    check.guard([&] { decode_summed(codec, p, out, alpha, ctx, mem); });
    res.wire_bytes += ring_all_reduce_bytes(p.section.bytes, comm.size());
  }
  if constexpr (mem_type::on_host) check.output(out);
  return res;
}

}  // namespace detail

/// Compressed all-reduce of `grad` into `out`, the algorithm chosen by the aggregation kind of
/// `src` (a codec, an `any_codec`, a `compressor` with error feedback, or a
/// `low_rank_session`); see the file comment. `grad` empty: this rank contributes nothing
/// (its error feedback is untouched); otherwise `grad.size() == out.size()`. `grad` may alias
/// `out`. Collective: all ranks call it with the same codec, size, tensor id (also on an empty
/// `grad`) and options.
///
/// For shared support every rank must pass the same `ctx.seed` and `ctx.step` (checked); for
/// the other kinds seeds may differ between ranks (independent rounding noise).
/// @return the path taken and this rank's traffic.
template <communicator Comm, class Source>
  requires detail::packet_source<std::remove_cvref_t<Source>> || low_rank_session<std::remove_cvref_t<Source>>
collective_result all_reduce_compressed(Comm& comm, Source&& src, tensor_view<float const> grad,
                                        std::span<float> out, codec_context const& ctx = {},
                                        collective_options const& opt = {}) {
  if constexpr (low_rank_session<std::remove_cvref_t<Source>>) {
    return all_reduce_low_rank(comm, src, grad, out, ctx, opt);
  } else {
    using source_type = std::remove_reference_t<Source>;
    detail::pending_commit<source_type> pending(src);
    detail::step_check check(opt.checksum);
    collective_result res = detail::compressed_exchange(comm, src, grad, out, ctx, opt, check, pending);
    detail::agree_outcome(comm, check, "all_reduce_compressed");
    res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
    pending.apply();
    detail::receive_output(src, grad.id(), out);
    return res;
  }
}

/// `all_reduce_compressed` of a 16-bit gradient (`half` or `bfloat16`) into a 16-bit output:
/// the gradient is widened to float32 (exact), compressed, reduced and decoded exactly as the
/// float32 overload does (every packet decoded and summed in a float32 buffer, in rank order),
/// and the float32 result is rounded once into `out` (nearest even). The result is therefore
/// bit-identical to the float32 collective on the widened gradient, rounded once. Error
/// feedback sees the widened gradient (residuals stay float32). Same collective contract as the
/// float32 overload; every rank passes the same element type.
template <communicator Comm, class Source, element T>
  requires(!std::same_as<T, float>) &&
          (detail::packet_source<std::remove_cvref_t<Source>> || low_rank_session<std::remove_cvref_t<Source>>)
collective_result all_reduce_compressed(Comm& comm, Source&& src, tensor_view<T const> grad, std::span<T> out,
                                        codec_context const& ctx = {}, collective_options const& opt = {}) {
  static_assert(detail::host_payloads<std::remove_cvref_t<Source>>,
                "all_reduce_compressed of a 16-bit gradient widens it on the host: pass a float32 device "
                "gradient to a device codec");
  return detail::through_f32(grad, out, ctx, "all_reduce_compressed",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return all_reduce_compressed(comm, src, g, o, ctx, opt);
                             });
}

GRADCOMP_NAMESPACE_END
