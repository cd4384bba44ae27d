// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Parameter-server mode of two-way compression, with BytePS-Compress semantics: the last
/// `servers` ranks of the communicator are servers, the others workers. The tensor is split
/// into one contiguous shard per server (`shard_range`). Each step:
///
/// 1. every worker compresses each shard with its worker error feedback and pushes it to the
///    server owning it (`ps_push_pull`);
/// 2. each server (`ps_serve`) receives one packet per worker, decompresses and **sums** them
///    (in worker order; `reduction::average` divides by the number of workers, a documented
///    choice of the caller: BytePS itself sums and lets workers pre-scale), re-compresses the
///    sum with its server error feedback and pushes the same packet back to every worker;
/// 3. every worker decompresses the server packets into its result.
///
/// Messages are point-to-point (`isend`/`irecv`) on tags `tag` (a 32-byte report) and
/// `tag + 1` (the packet). The reports carry a configuration fingerprint and a status, so a
/// worker whose codec or tensor size differs, or whose compression failed, makes every
/// server answer with an error instead of a packet, and every rank throws (`config_error` for a
/// disagreement, `comm_error` for a failure elsewhere) instead of hanging. Each worker and
/// server always sends its reports, whatever happened before, so no rank waits for a message
/// that never comes. Every rank, worker or server, then takes part in the step-outcome round
/// (collective/outcome.hpp, one all-reduce of 12 bytes over the whole communicator): a worker
/// that could not decode a server's packet makes every rank fail the step, and the residuals
/// of both sides are restored (the compressor's step is rolled back) on every rank.
///
/// Device codecs (a two-way compressor over `cuda::stream_codec`, cuda/collective.cuh) go through
/// the same code: the packets, the servers' sums and the results live in the codecs' memory
/// space (collective/memory.hpp) and travel as device payloads; the reports stay host messages.
/// A device codec does not take the `checksum` option (a `config_error` on every rank: it reads
/// every payload on the host). A communicator that does not match point-to-point messages by
/// tag (NCCL) still pairs them right: between two ranks the messages go in one order, the
/// report before its packet.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of the parameter-server mode.
struct ps_options {
  /// Number of server ranks: the communicator's last `servers` ranks (1 <= servers < size()).
  int servers = 1;
  /// Tags `tag` and `tag + 1` carry the reports and packets (>= 0).
  int tag = 0x6770;
  /// `sum` (BytePS) or `average` (the server divides by the number of workers).
  reduction op = reduction::sum;
  /// A CRC32C trailer on every packet, checked before decoding, and the workers' results
  /// compared (collective/outcome.hpp). Every rank passes the same value.
  bool checksum = false;
};

/// True if this rank is a server under `opt`.
template <communicator Comm>
bool is_server(Comm const& comm, ps_options const& opt) {
  return comm.rank() >= comm.size() - opt.servers;
}

namespace detail {

inline constexpr std::uint32_t ps_ok = 0;
inline constexpr std::uint32_t ps_failed = 1;
inline constexpr std::uint32_t ps_mismatch = 2;

template <communicator Comm>
void check_ps(Comm const& comm, ps_options const& opt) {
  if (opt.servers < 1 || opt.servers >= comm.size()) {
    throw config_error("gradcomp: parameter-server mode needs 1 <= servers < size() (" + std::to_string(comm.size()) +
                       " ranks), got servers = " + std::to_string(opt.servers));
  }
  if (opt.tag < 0 || opt.tag == INT32_MAX) throw config_error("gradcomp: parameter-server tags must be >= 0");
}

/// Bytes of a report message (sealed with its CRC32C under the checksum option).
inline std::size_t ps_report_bytes(ps_options const& opt) noexcept {
  return rank_report_bytes + (opt.checksum ? report_check_bytes : 0);
}

/// Reads a report from `peer` and checks its seal and its packet size against `bound`. A report
/// that fails is a `format_error`: this rank cannot follow the protocol any further (it does
/// not know what comes next) and leaves it; its peers fail on the transport.
inline rank_report ps_read_report(std::span<std::byte const> in, ps_options const& opt, std::uint64_t bound, int peer,
                                  char const* what) {
  if (opt.checksum) check_report_seal(in.data(), rank_report_bytes, what, static_cast<std::size_t>(peer));
  rank_report const r = decode_report(in.data());
  if (r.bytes > bound) {
    throw format_error(std::string("gradcomp: ") + what + ": the report of rank " + std::to_string(peer) + " announces a " +
                       std::to_string(r.bytes) + "-byte packet, more than the bound of " + std::to_string(bound) +
                       ": it was corrupted on the way");
  }
  return r;
}

template <class TwoWay>
std::uint64_t ps_fingerprint(TwoWay const& tw, tensor_id id, std::size_t n, ps_options const& opt, int size,
                             codec_context const& ctx) {
  return two_way_fingerprint(tw, opt.checksum ? "parameter_server+checksum" : "parameter_server", id, n,
                             static_cast<std::size_t>(opt.servers), static_cast<std::size_t>(size), opt.op, ctx);
}

/// A device codec takes no checksum (it would read every payload on the host).
template <class Mem, class TwoWay>
void check_ps_memory(TwoWay const& tw, ps_options const& opt) {
  if (!Mem::on_host && opt.checksum) {
    throw config_error(std::string("gradcomp: parameter-server mode: codec '") +
                       codec_name(id_of_codec(tw.worker_codec())) +
                       "' keeps its packets in device memory; the checksum option reads every payload on the "
                       "host and is available for host codecs only");
  }
}

}  // namespace detail

/// Worker side of one parameter-server step for tensor `grad` (see file comment): pushes the
/// compressed shards, pulls the servers' packets into `out`. `grad` empty: this worker
/// contributes nothing. Called by every worker while every server calls `ps_serve` with the
/// same tensor id and size.
template <communicator Comm, class TwoWay>
collective_result ps_push_pull(Comm& comm, TwoWay& tw, tensor_view<float const> grad, std::span<float> out,
                               codec_context const& ctx = {}, ps_options const& opt = {}) {
  using mem_type = typename TwoWay::memory_type;
  mem_type const mem = detail::memory_of(tw.worker_codec());
  detail::check_ps(comm, opt);
  if (is_server(comm, opt)) throw config_error("gradcomp: ps_push_pull called on server rank " + std::to_string(comm.rank()));
  detail::check_contribution(grad.size(), out.size(), "ps_push_pull");
  std::size_t const n = out.size();
  auto const k = static_cast<std::size_t>(opt.servers);
  int const first_server = comm.size() - opt.servers;
  std::size_t const tail = opt.checksum ? checksum_trailer_bytes : 0;
  collective_result res;
  res.path = collective_path::parameter_server;
  detail::two_way_step<TwoWay> step(tw);
  detail::step_check check(opt.checksum);

  std::vector<typename mem_type::buffer> packets;
  std::vector<std::size_t> sizes(k, 0);
  rank_report mine;
  mine.count = n;
  mine.codec = static_cast<std::uint32_t>(detail::id_of_codec(tw.worker_codec()));
  std::exception_ptr local;
  try {
    mine.fingerprint = detail::ps_fingerprint(tw, grad.id(), n, opt, comm.size(), ctx);
    detail::check_two_way_codec(tw.worker_codec(), "parameter-server mode");
    detail::check_two_way_codec(tw.server_codec(), "parameter-server mode");
    detail::check_ps_memory<mem_type>(tw, opt);
    for (std::size_t s = 0; s < k; ++s) {
      auto const [b, e] = shard_range(n, s, k);
      packets.push_back(mem.make_buffer());
      packets[s].resize(tw.worker_codec().max_compressed_bytes(e - b) + tail);
      if (!grad.empty()) {
        sizes[s] = tw.compress_shard(grad.span().subspan(b, e - b),
                                     shard_key{grad.id(), static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(k)},
                                     packets[s].span(), ctx);
        if constexpr (mem_type::on_host) {
          if (opt.checksum) sizes[s] = detail::add_trailer(packets[s].span(), sizes[s]);
        }
      }
    }
  } catch (...) {
    local = std::current_exception();
    mine.status = detail::ps_failed;
    sizes.assign(k, 0);
  }
  // Push: a report to every server, then the packet when there is one.
  std::size_t const rb = detail::ps_report_bytes(opt);
  std::vector<std::vector<std::byte>> reports(k, std::vector<std::byte>(rb));
  std::vector<request> pending;
  for (std::size_t s = 0; s < k; ++s) {
    rank_report r = mine;
    r.bytes = sizes[s];
    detail::encode_report(r, {}, reports[s].data());
    if (opt.checksum) detail::seal_report(reports[s].data(), rank_report_bytes, "ps worker report");
    int const server = first_server + static_cast<int>(s);
    pending.push_back(comm.isend(detail::const_bytes(reports[s]), server, opt.tag));
    if (sizes[s] != 0) pending.push_back(comm.isend(std::as_const(packets[s]).span().first(sizes[s]), server, opt.tag + 1));
    res.packet_bytes += sizes[s];
    res.wire_bytes += rb + sizes[s];
  }
  // Pull: every server's report, then its packet when it has one.
  std::uint32_t worst = detail::ps_ok;
  std::vector<std::byte> in(rb);
  typename mem_type::buffer pkt = mem.make_buffer();
  for (std::size_t s = 0; s < k; ++s) {
    int const server = first_server + static_cast<int>(s);
    comm.recv(std::span<std::byte>(in), server, opt.tag);
    auto const [sb, se] = shard_range(n, s, k);
    rank_report const r = detail::ps_read_report(in, opt, tw.server_codec().max_compressed_bytes(se - sb) + tail, server,
                                                 "ps server report");
    if (r.status != detail::ps_ok) {
      worst = std::max(worst, r.status);
      continue;
    }
    pkt.resize(static_cast<std::size_t>(r.bytes));
    comm.recv(pkt.span(), server, opt.tag + 1);
    if (worst == detail::ps_ok && !local) {
      check.guard([&] {
        auto const [b, e] = shard_range(n, s, k);
        std::span<std::byte const> p = std::as_const(pkt).span();
        if constexpr (mem_type::on_host) {
          if (opt.checksum) p = detail::strip_trailer(p, "ps_push_pull");
        }
        tw.server_codec().decompress(p, out.subspan(b, e - b), ctx);
      });
    }
  }
  wait_all(pending);
  // Every rank, worker or server, ends with the outcome round: a worker whose decoding failed
  // makes every rank fail the step, servers included, before anyone commits a residual.
  if (local) {
    check.fail(local);
  } else if (worst == detail::ps_mismatch) {
    check.fail(std::make_exception_ptr(config_error(
        "gradcomp: parameter-server step: the servers found that workers disagree on the codec, its "
        "parameters or the tensor size (every rank must use the same); no result")));
  } else if (worst != detail::ps_ok) {
    check.fail(std::make_exception_ptr(comm_error(
        "gradcomp: parameter-server step: a worker or server failed in its local step (see that "
        "rank's exception); no result")));
  }
  if (!check.failed()) check.output(out);
  detail::agree_outcome(comm, check, "parameter_server");
  res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
  step.commit();
  return res;
}

/// `ps_push_pull` of a 16-bit gradient into a 16-bit output: the worker widens the gradient to
/// float32 (exact) and runs the float32 step (servers sum in float32 whatever the workers'
/// element type; `ps_serve` is unchanged), then rounds the decoded result once into `out`.
template <communicator Comm, class TwoWay, element T>
  requires(!std::same_as<T, float>)
collective_result ps_push_pull(Comm& comm, TwoWay& tw, tensor_view<T const> grad, std::span<T> out,
                               codec_context const& ctx = {}, ps_options const& opt = {}) {
  detail::check_ps(comm, opt);
  return detail::through_f32(grad, out, ctx, "ps_push_pull",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return ps_push_pull(comm, tw, g, o, ctx, opt);
                             });
}

/// Server side of one parameter-server step for tensor `id` of `n` elements (see file
/// comment). Called by every server while every worker calls `ps_push_pull`.
template <communicator Comm, class TwoWay>
collective_result ps_serve(Comm& comm, TwoWay& tw, tensor_id id, std::size_t n, codec_context const& ctx = {},
                           ps_options const& opt = {}) {
  using mem_type = typename TwoWay::memory_type;
  mem_type const mem = detail::memory_of(tw.worker_codec());
  detail::check_ps(comm, opt);
  if (!is_server(comm, opt)) throw config_error("gradcomp: ps_serve called on worker rank " + std::to_string(comm.rank()));
  auto const k = static_cast<std::size_t>(opt.servers);
  int const workers = comm.size() - opt.servers;
  std::size_t const s = static_cast<std::size_t>(comm.rank() - workers);
  auto const [b, e] = shard_range(n, s, k);
  collective_result res;
  res.path = collective_path::parameter_server;
  detail::two_way_step<TwoWay> step(tw);
  detail::step_check check(opt.checksum);

  std::vector<typename mem_type::buffer> got;
  for (int w = 0; w < workers; ++w) got.push_back(mem.make_buffer());
  std::uint32_t status = detail::ps_ok;
  std::uint64_t fp = 0;
  std::exception_ptr local;
  try {
    fp = detail::ps_fingerprint(tw, id, n, opt, comm.size(), ctx);
    detail::check_ps_memory<mem_type>(tw, opt);
  } catch (...) {
    local = std::current_exception();
    status = detail::ps_failed;
  }
  std::size_t const rb = detail::ps_report_bytes(opt);
  std::uint64_t const bound = tw.worker_codec().max_compressed_bytes(e - b) + (opt.checksum ? checksum_trailer_bytes : 0);
  std::vector<std::byte> in(rb);
  for (int w = 0; w < workers; ++w) {
    comm.recv(std::span<std::byte>(in), w, opt.tag);
    rank_report const r = detail::ps_read_report(in, opt, bound, w, "ps worker report");
    got[static_cast<std::size_t>(w)].resize(static_cast<std::size_t>(r.bytes));
    if (r.bytes != 0) comm.recv(got[static_cast<std::size_t>(w)].span(), w, opt.tag + 1);
    if (r.status != detail::ps_ok) status = std::max(status, detail::ps_failed);
    else if (r.fingerprint != fp || r.count != n) status = std::max(status, detail::ps_mismatch);
  }
  typename mem_type::buffer out = mem.make_buffer();
  std::size_t bytes = 0;
  if (status == detail::ps_ok) {
    try {
      std::vector<std::span<std::byte const>> packets;
      for (auto const& g : got) packets.push_back(g.span());
      if constexpr (mem_type::on_host) {
        if (opt.checksum) {
          for (auto& p : packets) p = detail::strip_trailer(p, "ps_serve");
        }
      }
      out.resize(tw.server_codec().max_compressed_bytes(e - b) + (opt.checksum ? checksum_trailer_bytes : 0));
      bytes = tw.reduce_shard(packets, e - b, shard_key{id, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(k)},
                              opt.op == reduction::average ? 1.0f / static_cast<float>(workers) : 1.0f,
                              out.span(), ctx);
      if constexpr (mem_type::on_host) {
        if (opt.checksum) bytes = detail::add_trailer(out.span(), bytes);
      }
    } catch (...) {
      local = std::current_exception();
      status = detail::ps_failed;
    }
  }
  rank_report reply;
  reply.fingerprint = fp;
  reply.count = n;
  reply.codec = static_cast<std::uint32_t>(detail::id_of_codec(tw.server_codec()));
  reply.status = status;
  reply.bytes = status == detail::ps_ok ? bytes : 0;
  std::vector<std::byte> rep(rb);
  detail::encode_report(reply, {}, rep.data());
  if (opt.checksum) detail::seal_report(rep.data(), rank_report_bytes, "ps server report");
  std::vector<request> pending;
  for (int w = 0; w < workers; ++w) {
    pending.push_back(comm.isend(detail::const_bytes(rep), w, opt.tag));
    if (status == detail::ps_ok) pending.push_back(comm.isend(std::as_const(out).span().first(bytes), w, opt.tag + 1));
    res.wire_bytes += rb + (status == detail::ps_ok ? bytes : 0);
  }
  wait_all(pending);
  res.packet_bytes = status == detail::ps_ok ? bytes : 0;
  if (local) {
    check.fail(local);
  } else if (status == detail::ps_mismatch) {
    check.fail(std::make_exception_ptr(config_error(
        "gradcomp: parameter-server step: workers disagree with server rank " + std::to_string(comm.rank()) +
        " on the codec, its parameters or the tensor size; no result")));
  } else if (status != detail::ps_ok) {
    check.fail(std::make_exception_ptr(
        comm_error("gradcomp: parameter-server step: a worker failed in its local step (see that rank's exception)")));
  }
  detail::agree_outcome(comm, check, "parameter_server");
  res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
  step.commit();
  return res;
}

GRADCOMP_NAMESPACE_END
