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
/// that never comes.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/common.hpp>
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

template <class TwoWay>
std::uint64_t ps_fingerprint(TwoWay const& tw, tensor_id id, std::size_t n, ps_options const& opt, int size,
                             codec_context const& ctx) {
  return two_way_fingerprint(tw, "parameter_server", id, n, static_cast<std::size_t>(opt.servers),
                             static_cast<std::size_t>(size), opt.op, ctx);
}

}  // namespace detail

/// Worker side of one parameter-server step for tensor `grad` (see file comment): pushes the
/// compressed shards, pulls the servers' packets into `out`. `grad` empty: this worker
/// contributes nothing. Called by every worker while every server calls `ps_serve` with the
/// same tensor id and size.
template <communicator Comm, class TwoWay>
collective_result ps_push_pull(Comm& comm, TwoWay& tw, tensor_view<float const> grad, std::span<float> out,
                               codec_context const& ctx = {}, ps_options const& opt = {}) {
  detail::check_ps(comm, opt);
  if (is_server(comm, opt)) throw config_error("gradcomp: ps_push_pull called on server rank " + std::to_string(comm.rank()));
  detail::check_contribution(grad.size(), out.size(), "ps_push_pull");
  std::size_t const n = out.size();
  auto const k = static_cast<std::size_t>(opt.servers);
  int const first_server = comm.size() - opt.servers;
  collective_result res;
  res.path = collective_path::parameter_server;

  std::vector<std::vector<std::byte>> packets(k);
  std::vector<std::size_t> sizes(k, 0);
  rank_report mine;
  mine.count = n;
  mine.codec = static_cast<std::uint32_t>(detail::id_of_codec(tw.worker_codec()));
  std::exception_ptr local;
  try {
    mine.fingerprint = detail::ps_fingerprint(tw, grad.id(), n, opt, comm.size(), ctx);
    detail::check_two_way_codec(tw.worker_codec(), "parameter-server mode");
    detail::check_two_way_codec(tw.server_codec(), "parameter-server mode");
    for (std::size_t s = 0; s < k; ++s) {
      auto const [b, e] = shard_range(n, s, k);
      packets[s].resize(tw.worker_codec().max_compressed_bytes(e - b));
      if (!grad.empty()) {
        sizes[s] = tw.compress_shard(grad.span().subspan(b, e - b),
                                     shard_key{grad.id(), static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(k)},
                                     std::span<std::byte>(packets[s]), ctx);
      }
    }
  } catch (...) {
    local = std::current_exception();
    mine.status = detail::ps_failed;
    sizes.assign(k, 0);
  }
  // Push: a report to every server, then the packet when there is one.
  std::vector<std::vector<std::byte>> reports(k, std::vector<std::byte>(rank_report_bytes));
  std::vector<request> pending;
  for (std::size_t s = 0; s < k; ++s) {
    rank_report r = mine;
    r.bytes = sizes[s];
    detail::encode_report(r, {}, reports[s].data());
    int const server = first_server + static_cast<int>(s);
    pending.push_back(comm.isend(detail::const_bytes(reports[s]), server, opt.tag));
    if (sizes[s] != 0) pending.push_back(comm.isend(std::span<std::byte const>(packets[s]).first(sizes[s]), server, opt.tag + 1));
    res.packet_bytes += sizes[s];
    res.wire_bytes += rank_report_bytes + sizes[s];
  }
  // Pull: every server's report, then its packet when it has one.
  std::uint32_t worst = detail::ps_ok;
  std::exception_ptr malformed;  // a server's reply that breaks the wire format
  std::vector<std::byte> in(rank_report_bytes), pkt;
  for (std::size_t s = 0; s < k; ++s) {
    int const server = first_server + static_cast<int>(s);
    comm.recv(std::span<std::byte>(in), server, opt.tag);
    rank_report const r = detail::decode_report(in.data());
    if (r.status != detail::ps_ok) {
      worst = std::max(worst, r.status);
      continue;
    }
    auto const [b, e] = shard_range(n, s, k);
    try {
      pkt.resize(detail::checked_peer_bytes(r.bytes, tw.server_codec().max_compressed_bytes(e - b),
                                            static_cast<std::size_t>(server),
                                            "parameter-server step (pull)"));
    } catch (format_error const&) {
      if (!malformed) malformed = std::current_exception();
      continue;
    }
    comm.recv(std::span<std::byte>(pkt), server, opt.tag + 1);
    if (worst == detail::ps_ok && !local && !malformed) {
      tw.server_codec().decompress(std::span<std::byte const>(pkt), out.subspan(b, e - b), ctx);
    }
  }
  wait_all(pending);
  if (local) std::rethrow_exception(local);
  if (malformed) std::rethrow_exception(malformed);
  if (worst == detail::ps_mismatch) {
    throw config_error("gradcomp: parameter-server step: the servers found that workers disagree on the codec, its "
                       "parameters or the tensor size (every rank must use the same); no result");
  }
  if (worst != detail::ps_ok) {
    throw comm_error("gradcomp: parameter-server step: a worker or server failed in its local step (see that "
                     "rank's exception); no result");
  }
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
  detail::check_ps(comm, opt);
  if (!is_server(comm, opt)) throw config_error("gradcomp: ps_serve called on worker rank " + std::to_string(comm.rank()));
  auto const k = static_cast<std::size_t>(opt.servers);
  int const workers = comm.size() - opt.servers;
  std::size_t const s = static_cast<std::size_t>(comm.rank() - workers);
  auto const [b, e] = shard_range(n, s, k);
  collective_result res;
  res.path = collective_path::parameter_server;

  std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(workers));
  std::uint32_t status = detail::ps_ok;
  std::uint64_t fp = 0;
  std::exception_ptr local;
  try {
    fp = detail::ps_fingerprint(tw, id, n, opt, comm.size(), ctx);
  } catch (...) {
    local = std::current_exception();
    status = detail::ps_failed;
  }
  std::exception_ptr malformed;  // a worker's push that breaks the wire format
  std::size_t const bound = tw.worker_codec().max_compressed_bytes(e - b);
  std::vector<std::byte> in(rank_report_bytes);
  for (int w = 0; w < workers; ++w) {
    comm.recv(std::span<std::byte>(in), w, opt.tag);
    rank_report const r = detail::decode_report(in.data());
    try {
      got[static_cast<std::size_t>(w)].resize(detail::checked_peer_bytes(
          r.bytes, bound, static_cast<std::size_t>(w), "parameter-server step (push)"));
    } catch (format_error const&) {
      if (!malformed) malformed = std::current_exception();
      status = std::max(status, detail::ps_failed);
      continue;
    }
    if (r.bytes != 0) comm.recv(std::span<std::byte>(got[static_cast<std::size_t>(w)]), w, opt.tag + 1);
    if (r.status != detail::ps_ok) status = std::max(status, detail::ps_failed);
    else if (r.fingerprint != fp || r.count != n) status = std::max(status, detail::ps_mismatch);
  }
  std::vector<std::byte> out;
  std::size_t bytes = 0;
  if (status == detail::ps_ok) {
    try {
      std::vector<std::span<std::byte const>> packets(got.begin(), got.end());
      out.resize(tw.server_codec().max_compressed_bytes(e - b));
      bytes = tw.reduce_shard(packets, e - b, shard_key{id, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(k)},
                              opt.op == reduction::average ? 1.0f / static_cast<float>(workers) : 1.0f,
                              std::span<std::byte>(out), ctx);
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
  std::vector<std::byte> rep(rank_report_bytes);
  detail::encode_report(reply, {}, rep.data());
  std::vector<request> pending;
  for (int w = 0; w < workers; ++w) {
    pending.push_back(comm.isend(detail::const_bytes(rep), w, opt.tag));
    if (status == detail::ps_ok) pending.push_back(comm.isend(std::span<std::byte const>(out).first(bytes), w, opt.tag + 1));
    res.wire_bytes += rank_report_bytes + (status == detail::ps_ok ? bytes : 0);
  }
  wait_all(pending);
  res.packet_bytes = status == detail::ps_ok ? bytes : 0;
  if (local) std::rethrow_exception(local);
  if (malformed) std::rethrow_exception(malformed);
  if (status == detail::ps_mismatch) {
    throw config_error("gradcomp: parameter-server step: workers disagree with server rank " + std::to_string(comm.rank()) +
                       " on the codec, its parameters or the tensor size; no result");
  }
  if (status != detail::ps_ok) {
    throw comm_error("gradcomp: parameter-server step: a worker failed in its local step (see that rank's exception)");
  }
  return res;
}

GRADCOMP_NAMESPACE_END
