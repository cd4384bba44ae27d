// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Hierarchical all-reduce: dense (or 16-bit) inside a node, compressed between nodes.
///
/// `all_reduce_hierarchical(comm, src, grad, out, ctx, options)` runs over any communicator
/// whose ranks `hierarchical_options::nodes` groups into nodes (`node_grouping`,
/// comm/group.hpp: ranks per node, a node label per rank, or a list of nodes; nodes may differ
/// in size). With L *lanes* (`hierarchical_options::lanes`, by default the size of the smallest
/// node), the tensor is cut into L shards (`shard_range`) and the j-th rank of every node owns
/// shard j (ranks beyond the L-th of a node own none):
///
/// 1. **intra-node reduce-scatter**: every rank sends shard j of its gradient, in the intra-node
///    format (`dense_format`: float32 by default, or binary16 / bfloat16), to its node's j-th
///    rank, which widens the node's contributions and sums them in float32 in rank order;
/// 2. **inter-node all-reduce of the node sums**: lane j (the j-th rank of every node, a
///    `group_communicator` over the parent's point-to-point messages) runs the compressed
///    all-reduce of `all_reduce_compressed` on shard j with `src` — any codec of the library
///    (summable, shared support or gather; not low-rank), an `any_codec`, or a `compressor`
///    with error feedback — so the L lanes cross the network at the same time, each through
///    its own rank's network interface;
/// 3. **intra-node all-gather**: each owner sends its reduced shard (in the intra-node format,
///    rounded once; the owner keeps the rounded bits too) to its node's ranks.
///
/// Every rank ends with the same bits. With `lanes = 1` the first rank of each node is its
/// leader: it receives the whole node's sum, all-reduces it between nodes, and sends it back
/// (one network interface per node). With one node the codec is not used at all: the result is
/// the node's exact float32 (or 16-bit) sum. A rank passing an empty gradient contributes zeros.
/// `reduction::average` divides by the number of ranks of `comm` (all of them).
///
/// **Error feedback** lives where the compression happens: on the owner of a shard, keyed by the
/// shard's tensor id `hierarchical_shard_id(id, j, L)` (also the key of the codec's random
/// streams, which the lane shares: a shared-support codec selects the same coordinates on every
/// node). For each shard, what its owner sent plus its residual equals the node sums plus its
/// previous residual, so over the steps the delivered result plus every residual equals the sum
/// of all gradients. A policy whose packets are increments (EF21) needs a receiver state on every
/// rank and is refused (`config_error`).
///
/// **Agreement and failures**: one agreement round over all ranks first checks that every rank
/// passes the same grouping (a dedicated `config_error` naming the first rank that differs),
/// lanes, formats, codec, size, tensor id and options, and that each rank's grouping is valid;
/// a rank whose grouping is invalid throws its `config_error` and the others a `comm_error`,
/// before any data moves. Each lane's collective then has its own agreement round (packet
/// sizes, and each owner's compression status: a codec that refuses a non-finite node sum
/// throws its `numeric_error` on that owner). Whatever fails after the first round is recorded,
/// the ranks go through the remaining phases, and one step-outcome round over all ranks ends
/// the call: the failed rank rethrows its exception, every other rank throws `comm_error`, and
/// no error feedback is committed on any rank. Nobody waits for a rank that has given up.
///
/// **Checksums** (`hierarchical_options::checksum`): the intra-node messages carry a CRC32C
/// trailer, each lane's collective runs with its checksums and its own outcome round (its sums
/// are checked per lane), and the final outcome round compares every rank's result.
///
/// **Messages**: the node and lane groups use the parent's point-to-point tags of
/// `hierarchical_options::groups` (`group_options`: [0x7000, 0x7400) by default); the
/// agreement and outcome rounds are collectives of `comm`.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/group.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/convert.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How `all_reduce_hierarchical` groups, formats and reduces.
struct hierarchical_options {
  /// Which node each rank lives on (required; every rank passes the same grouping).
  node_grouping nodes{};
  /// Shards per node, each owned by one rank that sends it between nodes: 0 (default) for the
  /// size of the smallest node (every network interface in use), 1 for one leader per node.
  int lanes = 0;
  /// Format of the messages inside a node (both directions). Sums are float32 either way.
  dense_format intra = dense_format::f32;
  /// Sum or average (over all ranks of the communicator).
  reduction op = reduction::sum;
  /// Integrity checks (see the file comment); every rank passes the same value.
  bool checksum = false;
  /// Parent tags of the node and lane groups' messages.
  group_options groups{};
};

/// What `all_reduce_hierarchical` did on this rank.
struct hierarchical_result {
  /// Always `collective_path::hierarchical`.
  collective_path path = collective_path::hierarchical;
  /// The algorithm between nodes (summable, shared support or gather; `dense_f32` with one node,
  /// where no codec runs).
  collective_path inter_path = collective_path::dense_f32;
  /// Nodes and lanes of the step.
  int nodes = 1;
  int lanes = 1;
  /// Bytes of this rank's inter-node packet (0 for a rank that owns no shard, or one node).
  std::size_t packet_bytes = 0;
  /// Bytes this rank sends (`collective_result::wire_bytes`' model), all rounds included.
  std::size_t wire_bytes = 0;
  /// Of which to other nodes: its lane's collective (0 for a rank that owns no shard).
  std::size_t inter_node_bytes = 0;
};

/// Tensor id of shard `lane` of `lanes` of tensor `id` in the hierarchical all-reduce: the key
/// of the shard owner's error feedback and of the codec's random streams. It is the two-way
/// workers' stream of the same shard (collective/two_way.hpp): the owners of a lane are the
/// workers of that shard.
constexpr tensor_id hierarchical_shard_id(tensor_id id, int lane, int lanes) noexcept {
  return shard_stream_id(
      shard_key{id, static_cast<std::uint32_t>(lane), static_cast<std::uint32_t>(lanes)},
      two_way_side::worker);
}

namespace detail {

inline std::size_t intra_element_bytes(dense_format f) noexcept {
  return f == dense_format::f32 ? 4 : 2;
}

/// Writes `x` in the intra-node format `f` at `out` (`x.size() * intra_element_bytes(f)`
/// bytes), both in the memory space `mem`: the host kernels on the host, the space's `copy` /
/// `narrow` elsewhere (the same bits: one rounding to nearest even).
template <class M>
void encode_intra(M const& mem, dense_format f, std::span<float const> x, std::byte* out,
                  codec_context const& ctx) {
  if (x.empty()) return;
  if constexpr (M::on_host) {
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    switch (f) {
      case dense_format::f32: std::memcpy(out, x.data(), x.size_bytes()); return;
      case dense_format::f16:
        cpu::kernels::narrow<cpu::kernels::half_format::f16>(x.data(), out, x.size(), level);
        return;
      case dense_format::bf16:
        cpu::kernels::narrow<cpu::kernels::half_format::bf16>(x.data(), out, x.size(), level);
        return;
    }
  } else {
    switch (f) {
      case dense_format::f32: mem.copy(std::span<std::byte>(out, x.size_bytes()), std::as_bytes(x)); return;
      case dense_format::f16:
        mem.narrow(x, std::span<half>(reinterpret_cast<half*>(out), x.size()));
        return;
      case dense_format::bf16:
        mem.narrow(x, std::span<bfloat16>(reinterpret_cast<bfloat16*>(out), x.size()));
        return;
    }
  }
}

/// `out = x` or, with `add`, `out += x` (float32 arithmetic) for `x` in the intra-node format,
/// both in the memory space `mem` (on the device: the space's `copy`, `widen` and `add`).
template <class M>
void decode_intra(M const& mem, dense_format f, std::byte const* x, std::span<float> out, bool add,
                  codec_context const& ctx) {
  if (out.empty()) return;
  if constexpr (M::on_host) {
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    switch (f) {
      case dense_format::f32:
        if (add)
          cpu::kernels::axpy_f32(x, out.data(), out.size(), 1.0f, level);
        else
          std::memcpy(out.data(), x, out.size_bytes());
        return;
      case dense_format::f16:
        cpu::kernels::widen<cpu::kernels::half_format::f16>(x, out.data(), out.size(), 1.0f, add,
                                                            level);
        return;
      case dense_format::bf16:
        cpu::kernels::widen<cpu::kernels::half_format::bf16>(x, out.data(), out.size(), 1.0f, add,
                                                             level);
        return;
    }
  } else {
    auto run = [&]<class T>(T const* v) {
      std::span<T const> const in(v, out.size());
      if (add)
        mem.add(in, out);
      else if constexpr (std::is_same_v<T, float>)
        mem.copy(std::as_writable_bytes(out), std::as_bytes(in));
      else
        mem.widen(in, out);
    };
    switch (f) {
      case dense_format::f32: run(reinterpret_cast<float const*>(x)); return;
      case dense_format::f16: run(reinterpret_cast<half const*>(x)); return;
      case dense_format::bf16: run(reinterpret_cast<bfloat16 const*>(x)); return;
    }
  }
}

/// What the first agreement round settles: the layout and the lanes.
struct hierarchical_plan {
  node_layout layout;
  int lanes = 1;
  std::uint64_t grouping = 0;  ///< fingerprint of the layout
};

inline hierarchical_plan plan_hierarchy(hierarchical_options const& opt, int size) {
  hierarchical_plan p;
  p.layout = opt.nodes.layout(size);
  int const smallest = p.layout.min_node_size();
  if (opt.lanes < 0 || opt.lanes > smallest) {
    throw config_error(
        "gradcomp: all_reduce_hierarchical: lanes must be 0 (the smallest node's size) or 1 to " +
        std::to_string(smallest) + " (the smallest node's size), got " + std::to_string(opt.lanes));
  }
  if (opt.intra != dense_format::f32 && opt.intra != dense_format::f16 &&
      opt.intra != dense_format::bf16) {
    throw config_error("gradcomp: all_reduce_hierarchical got an unknown intra-node format " +
                       std::to_string(static_cast<unsigned>(opt.intra)));
  }
  p.lanes = opt.lanes == 0 ? smallest : opt.lanes;
  fingerprint f;
  f.add("node grouping").add(static_cast<std::uint64_t>(size));
  for (int k : p.layout.node_indices()) f.add(static_cast<std::uint64_t>(k));
  p.grouping = f.value();
  return p;
}

/// The round over all ranks that starts the hierarchical all-reduce (file comment); throws on
/// every rank unless every rank's plan is valid and alike.
template <communicator Comm>
void agree_hierarchy(Comm& comm, hierarchical_plan const& plan, std::uint64_t config,
                     std::uint32_t codec, std::size_t n, bool checksum, std::exception_ptr local,
                     std::size_t& wire) {
  char const* const what = "all_reduce_hierarchical";
  rank_report mine;
  mine.count = n;
  mine.codec = codec;
  mine.status = local ? 1 : 0;
  mine.fingerprint = fingerprint{}.add(config).add(plan.grouping).value();
  std::uint64_t const extra[1] = {plan.grouping};
  report_round round;
  round.post(comm, mine, std::span<std::uint64_t const>(extra), checksum, what);
  try {
    round.finish(what, local);
  } catch (config_error const&) {
    if (local) throw;
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm.size()); ++r) {
      if (round.extra(r, 0) != round.extra(0, 0)) {
        throw config_error(
            "gradcomp: all_reduce_hierarchical: ranks disagree on the node grouping (rank " +
            std::to_string(r) +
            "'s differs from rank 0's): every rank must pass the same "
            "hierarchical_options::nodes; no data moved");
      }
    }
    throw;
  }
  wire += round.wire_bytes();
}

/// The node and lane communicators of this rank as the caller made them (see
/// `hierarchical_groups`) checked against the plan: throws `config_error` if they do not match.
template <class Node, class Lane>
void check_groups(hierarchical_plan const& plan, int me, Node const* node, Lane const* lane) {
  int const k = plan.layout.node_of(me);
  int const local = plan.layout.local_rank(me);
  auto const p = static_cast<int>(plan.layout.node_ranks(k).size());
  std::string const who = "gradcomp: all_reduce_hierarchical: rank " + std::to_string(me) + " (rank " +
                          std::to_string(local) + " of node " + std::to_string(k) + ")";
  if (node == nullptr) throw config_error(who + " got no node communicator");
  if (node->size() != p || node->rank() != local) {
    throw config_error(who + ": its node communicator has rank " + std::to_string(node->rank()) + " of " +
                       std::to_string(node->size()) + ", the grouping says rank " + std::to_string(local) +
                       " of " + std::to_string(p));
  }
  if (local >= plan.lanes) return;  // owns no shard: no lane
  if (lane == nullptr) {
    throw config_error(who + " owns shard " + std::to_string(local) + " and got no lane communicator");
  }
  if (lane->size() != plan.layout.nodes() || lane->rank() != k) {
    throw config_error(who + ": its lane communicator has rank " + std::to_string(lane->rank()) + " of " +
                       std::to_string(lane->size()) + ", lane " + std::to_string(local) +
                       " has rank " + std::to_string(k) + " of " + std::to_string(plan.layout.nodes()));
  }
}

/// The hierarchical all-reduce after its agreement round and without its outcome round: the
/// three phases of the file comment, over `node_comm` (this rank's node, numbered as the
/// layout numbers it) and `lane_comm` (this rank's lane, owners only; rank k = node k's owner).
/// Payloads live in the source's memory space. Failures after the data started moving are
/// recorded in `check` (and the phases go on, so every rank reaches the outcome round); error
/// feedback is staged into `pending`.
template <communicator Comm, communicator Node, communicator Lane, class Source>
void hierarchical_exchange_over(Comm& comm, Node& node_comm, Lane* lane_comm,
                                hierarchical_plan const& plan, Source& src,
                                tensor_view<float const> grad, std::span<float> out,
                                codec_context const& ctx, hierarchical_options const& opt,
                                step_check& check, pending_commit<Source>& pending,
                                hierarchical_result& res) {
  using mem_type = memory_of_t<Source>;
  mem_type const mem = memory_of(src);
  std::size_t const n = out.size();
  int const me = comm.rank();
  int const node = plan.layout.node_of(me);
  auto const local = static_cast<std::size_t>(plan.layout.local_rank(me));
  std::size_t const p = plan.layout.node_ranks(node).size();
  auto const lanes = static_cast<std::size_t>(plan.lanes);
  bool const owner = local < lanes;
  std::size_t const es = intra_element_bytes(opt.intra);
  std::size_t const tail = opt.checksum ? checksum_trailer_bytes : 0;  // host payloads only
  char const* const what = "all_reduce_hierarchical";
  res.nodes = plan.layout.nodes();
  res.lanes = plan.lanes;

  auto shard = [&](std::size_t j) { return shard_range(n, j, lanes); };
  auto const [sb, se] = owner ? shard(local) : std::pair<std::size_t, std::size_t>{0, 0};
  std::size_t const m = se - sb;

  // 1. Intra-node reduce-scatter: slice j of this rank's gradient to the node's j-th rank.
  std::vector<std::size_t> send_counts(p, 0), recv_counts(p, 0);
  for (std::size_t j = 0; j < lanes; ++j) {
    auto const [b, e] = shard(j);
    send_counts[j] = (e - b) * es + tail;
  }
  if (owner) std::fill(recv_counts.begin(), recv_counts.end(), m * es + tail);
  typename mem_type::buffer send = mem.make_buffer(), recv = mem.make_buffer(),
                            zero = mem.make_buffer();
  std::span<std::byte const> outgoing;
  if (opt.intra == dense_format::f32 && tail == 0 && !grad.empty()) {
    outgoing = std::as_bytes(grad.span());  // the slices are the gradient's consecutive bytes
  } else {
    std::span<float const> g = grad.span();
    if (grad.empty()) {  // this rank contributes zeros
      zero.resize(n * sizeof(float));
      mem.zero(zero.span());
      g = float_span(zero, n);
    }
    send.resize(n * es + lanes * tail);
    std::size_t at = 0;
    for (std::size_t j = 0; j < lanes; ++j) {
      auto const [b, e] = shard(j);
      encode_intra(mem, opt.intra, g.subspan(b, e - b), send.data() + at, ctx);
      at += tail != 0 ? add_trailer(send.span().subspan(at), (e - b) * es) : (e - b) * es;
    }
    outgoing = std::as_const(send).span();
  }
  recv.resize(owner ? p * (m * es + tail) : 0);
  node_comm.all_to_all_v(outgoing, std::span<std::size_t const>(send_counts), recv.span(),
                         std::span<std::size_t const>(recv_counts));
  for (std::size_t j = 0; j < lanes; ++j) res.wire_bytes += j == local ? 0 : send_counts[j];

  // The node's sum of this rank's shard, in rank order.
  typename mem_type::buffer sum_buf = mem.make_buffer(), reduced_buf = mem.make_buffer();
  sum_buf.resize(m * sizeof(float));
  reduced_buf.resize(m * sizeof(float));
  mem.zero(sum_buf.span());
  mem.zero(reduced_buf.span());
  std::span<float> const sum = float_span(sum_buf, m), reduced = float_span(reduced_buf, m);
  if (owner) {
    check.guard([&] {
      for (std::size_t q = 0; q < p; ++q) {
        std::span<std::byte const> slice =
            std::as_const(recv).span().subspan(q * (m * es + tail), m * es + tail);
        if (tail != 0) slice = strip_trailer(slice, what);
        decode_intra(mem, opt.intra, slice.data(), sum, q != 0, ctx);
      }
    });
  }

  // 2. Inter-node all-reduce of the node sums, lane by lane.
  aggregation_kind const kind = aggregation_of(src);
  if (plan.layout.nodes() > 1) {
    res.inter_path = kind == aggregation_kind::summable         ? collective_path::summable
                     : kind == aggregation_kind::shared_support ? collective_path::shared_support
                                                                : collective_path::gather;
  }
  if (owner && plan.layout.nodes() == 1) {
    mem.copy(std::as_writable_bytes(reduced), std::as_bytes(std::span<float const>(sum)));
  } else if (owner) {
    tensor_view<float const> const node_sum(
        std::span<float const>(sum),
        hierarchical_shard_id(grad.id(), static_cast<int>(local), plan.lanes));
    step_check lane_check(opt.checksum);
    try {
      collective_result const r = compressed_exchange(
          *lane_comm, src, node_sum, reduced, ctx,
          collective_options{reduction::sum, opt.checksum}, lane_check, pending);
      res.packet_bytes = r.packet_bytes;
      res.inter_node_bytes = r.wire_bytes;
      if (opt.checksum) {
        // The lane's sums are checked within the lane (the ranks of other lanes summed others).
        agree_outcome(*lane_comm, lane_check, what);
        res.inter_node_bytes += outcome_wire_bytes(true, lane_comm->size());
      } else if (lane_check.failed()) {
        check.fail(lane_check.failure());
      }
    } catch (comm_error const& e) {
      // Name the lane in parent ranks: the lane's own messages number its members from 0.
      std::string members;
      for (int r : plan.layout.lane(static_cast<int>(local)))
        members += (members.empty() ? "" : ", ") + std::to_string(r);
      check.fail(std::make_exception_ptr(comm_error(
          "gradcomp: all_reduce_hierarchical: the inter-node all-reduce of "
          "lane " +
          std::to_string(local) + " (ranks " + members + ", in lane order) failed: " + e.what())));
    } catch (...) {
      check.fail(std::current_exception());
    }
    res.wire_bytes += res.inter_node_bytes;
  }
  if (owner && opt.op == reduction::average) {
    try {
      mem.scale(reduced, reduction_scale(opt.op, comm.size()));
    } catch (...) {
      check.fail(std::current_exception());
    }
  }

  // 3. Intra-node all-gather of the reduced shards (the owner keeps the rounded bits too).
  std::vector<std::size_t> counts(p, 0);
  for (std::size_t j = 0; j < lanes; ++j) counts[j] = send_counts[j];
  typename mem_type::buffer mine = mem.make_buffer();
  mine.resize(owner ? m * es + tail : 0);
  if (owner) {
    // Even after a failure (the mates then fail on the outcome round, not on this message).
    try {
      encode_intra(mem, opt.intra, std::span<float const>(reduced), mine.data(), ctx);
      if (tail != 0) add_trailer(mine.span(), m * es);
    } catch (...) {
      check.fail(std::current_exception());
    }
  }
  if (opt.intra == dense_format::f32 && tail == 0) {
    node_comm.all_gather_v(std::as_const(mine).span(), std::as_writable_bytes(out),
                           std::span<std::size_t const>(counts));
  } else {
    typename mem_type::buffer all = mem.make_buffer();
    all.resize(n * es + lanes * tail);
    node_comm.all_gather_v(std::as_const(mine).span(), all.span(),
                           std::span<std::size_t const>(counts));
    check.guard([&] {
      std::size_t at = 0;
      for (std::size_t j = 0; j < lanes; ++j) {
        auto const [b, e] = shard(j);
        std::span<std::byte const> block = std::as_const(all).span().subspan(at, counts[j]);
        if (tail != 0) block = strip_trailer(block, what);
        decode_intra(mem, opt.intra, block.data(), out.subspan(b, e - b), false, ctx);
        at += counts[j];
      }
    });
  }
  res.wire_bytes +=
      ring_all_gather_bytes(std::span<std::size_t const>(counts), static_cast<int>(local));
  if (!check.failed()) check.output(out);
}

/// `hierarchical_exchange_over` with the node and lane groups over the parent's point-to-point
/// messages (`group_communicator`, tags of `opt.groups`): host payloads only (a group's own
/// block and its reductions are host code).
template <communicator Comm, class Source>
void hierarchical_exchange(Comm& comm, hierarchical_plan const& plan, Source& src,
                           tensor_view<float const> grad, std::span<float> out,
                           codec_context const& ctx, hierarchical_options const& opt,
                           step_check& check, pending_commit<Source>& pending,
                           hierarchical_result& res) {
  if constexpr (!host_payloads<Source>) {
    throw config_error(
        "gradcomp: all_reduce_hierarchical: a source whose payloads live on the device needs "
        "the node and lane communicators of its transport (hierarchical_groups)");
  } else {
    int const me = comm.rank();
    int const local = plan.layout.local_rank(me);
    group_communicator<Comm> node_comm(comm, plan.layout.node_ranks(plan.layout.node_of(me)),
                                       opt.groups);
    if (local < plan.lanes) {
      group_communicator<Comm> lane_comm(comm, plan.layout.lane(local), opt.groups);
      hierarchical_exchange_over(comm, node_comm, &lane_comm, plan, src, grad, out, ctx, opt,
                                 check, pending, res);
    } else {
      hierarchical_exchange_over(comm, node_comm, static_cast<group_communicator<Comm>*>(nullptr),
                                 plan, src, grad, out, ctx, opt, check, pending, res);
    }
  }
}

}  // namespace detail

/// The node and lane communicators of one rank for `all_reduce_hierarchical`, made once by the
/// caller from its transport (for NCCL, `nccl_communicator::split`; any `communicator` works):
/// - `node`: the ranks of this rank's node, numbered as the grouping numbers them (its i-th
///   rank in ascending parent rank has rank i);
/// - `lane`: on a rank that owns a shard (its rank in the node below the number of lanes), the
///   j-th ranks of every node, numbered by node (node k's has rank k, nodes ordered by their
///   lowest parent rank); `nullptr` on the others.
/// With a device source the phases' payloads then stay in device memory on these
/// communicators; the agreement and outcome rounds still run on the parent.
template <communicator Node, communicator Lane = Node>
struct hierarchical_groups {
  /// This rank's node.
  Node* node = nullptr;
  /// This rank's lane, or `nullptr` where the rank owns no shard.
  Lane* lane = nullptr;
};

namespace detail {

/// The checks before the first agreement round: the plan, the codec family, EF21, and a
/// device source's options. Returns the configuration fingerprint every rank must share.
template <class Source>
std::uint64_t prepare_hierarchy(Source const& src, hierarchical_options const& opt, int size,
                                std::size_t n, tensor_id id, codec_context const& ctx,
                                hierarchical_plan& plan) {
  plan = plan_hierarchy(opt, size);
  aggregation_kind const kind = aggregation_of(src);
  if (kind == aggregation_kind::low_rank) {
    throw config_error(std::string("gradcomp: all_reduce_hierarchical: codec '") +
                       codec_name(codec_id_of(src)) +
                       "' is low-rank; the hierarchical all-reduce takes "
                       "codecs whose packets are summed or gathered");
  }
  using plain = std::remove_cv_t<Source>;
  if constexpr (requires { plain::receives; }) {
    if (plain::receives) {
      throw config_error(
          "gradcomp: all_reduce_hierarchical: error feedback whose packets are increments "
          "(EF21) needs a receiver state on every rank; use residual feedback or none");
    }
  }
  if constexpr (!host_payloads<Source>) {
    if (opt.checksum) {
      throw config_error(
          "gradcomp: all_reduce_hierarchical: checksums read every payload on the host; a "
          "source whose payloads live on the device takes checksum = false");
    }
  }
  fingerprint f;
  f.add("all_reduce_hierarchical").add(static_cast<std::uint64_t>(plan.lanes));
  f.add(static_cast<std::uint64_t>(opt.intra)).add(static_cast<std::uint64_t>(opt.op));
  f.add(opt.checksum ? 1 : 0).add(static_cast<std::uint64_t>(opt.groups.tag_base));
  f.add(static_cast<std::uint64_t>(opt.groups.tag_count)).add(static_cast<std::uint64_t>(id));
  f.add(codec_fingerprint(src, n, reduction::sum, ctx, "hierarchical"));
  return f.value();
}

/// The whole call: checks, agreement round, `exchange(plan, check, pending, res)`, outcome
/// round, then the error feedback made current.
template <communicator Comm, class Source, class Local, class Exchange>
hierarchical_result run_hierarchy(Comm& comm, Source& src, tensor_view<float const> grad,
                                  std::span<float> out, codec_context const& ctx,
                                  hierarchical_options const& opt, Local&& local_checks,
                                  Exchange&& exchange) {
  check_contribution(grad.size(), out.size(), "all_reduce_hierarchical");
  std::size_t const n = out.size();
  hierarchical_result res;
  hierarchical_plan plan;
  std::uint64_t config = 0;
  std::exception_ptr local;
  try {
    config = prepare_hierarchy(src, opt, comm.size(), n, grad.id(), ctx, plan);
    local_checks(plan);
  } catch (...) {
    local = std::current_exception();
  }
  agree_hierarchy(comm, plan, config, static_cast<std::uint32_t>(codec_id_of(src)), n,
                  opt.checksum, local, res.wire_bytes);

  pending_commit<Source> pending(src);
  step_check check(opt.checksum);
  exchange(plan, check, pending, res);
  agree_outcome(comm, check, "all_reduce_hierarchical");
  res.wire_bytes += outcome_wire_bytes(opt.checksum, comm.size());
  pending.apply();
  return res;
}

}  // namespace detail

/// Hierarchical all-reduce of `grad` into `out` (see the file comment): dense or 16-bit inside
/// the nodes of `opt.nodes`, compressed with `src` between them. `src` is a codec, an
/// `any_codec` or a `compressor` (error feedback, kept by the shard owners); `grad` empty: this
/// rank contributes zeros; otherwise `grad.size() == out.size()`; `grad` may alias `out`.
/// Collective over `comm`: every rank passes the same grouping, codec, size, tensor id and
/// options; for a shared-support codec the same `ctx.seed` and `ctx.step`. The node and lane
/// groups run over `comm`'s point-to-point messages (host payloads; a device source passes
/// its transport's communicators, the overload below).
/// @return the paths and this rank's traffic.
template <communicator Comm, class Source>
  requires(detail::packet_source<std::remove_cvref_t<Source>>)
hierarchical_result all_reduce_hierarchical(Comm& comm, Source&& src, tensor_view<float const> grad,
                                            std::span<float> out, codec_context const& ctx = {},
                                            hierarchical_options const& opt = {}) {
  using source_type = std::remove_reference_t<Source>;
  static_assert(detail::host_payloads<source_type>,
                "gradcomp: all_reduce_hierarchical of a device source needs the node and lane "
                "communicators of its transport: pass hierarchical_groups");
  return detail::run_hierarchy(
      comm, src, grad, out, ctx, opt, [](detail::hierarchical_plan const&) {},
      [&](detail::hierarchical_plan const& plan, detail::step_check& check,
          detail::pending_commit<source_type>& pending, hierarchical_result& res) {
        detail::hierarchical_exchange(comm, plan, src, grad, out, ctx, opt, check, pending, res);
      });
}

/// `all_reduce_hierarchical` over node and lane communicators the caller made once
/// (`hierarchical_groups`): the same bits as the overload above, with every payload of the
/// three phases on `groups.node` and `groups.lane` and in the source's memory space, so a
/// device source (cuda/collective.cuh) keeps its gradient, node sums, packets and result on
/// the device, over NCCL communicators from `nccl_communicator::split`. The agreement and
/// outcome rounds run on `comm`. A rank whose communicators do not match the grouping (sizes,
/// ranks, a missing lane on a shard owner) throws `config_error` and the others `comm_error`
/// before any data moves. A device source takes no `checksum` (`config_error` on every rank).
template <communicator Comm, communicator Node, communicator Lane, class Source>
  requires(detail::packet_source<std::remove_cvref_t<Source>>)
hierarchical_result all_reduce_hierarchical(Comm& comm, hierarchical_groups<Node, Lane> groups,
                                            Source&& src, tensor_view<float const> grad,
                                            std::span<float> out, codec_context const& ctx = {},
                                            hierarchical_options const& opt = {}) {
  using source_type = std::remove_reference_t<Source>;
  return detail::run_hierarchy(
      comm, src, grad, out, ctx, opt,
      [&](detail::hierarchical_plan const& plan) {
        detail::check_groups(plan, comm.rank(), groups.node, groups.lane);
      },
      [&](detail::hierarchical_plan const& plan, detail::step_check& check,
          detail::pending_commit<source_type>& pending, hierarchical_result& res) {
        detail::hierarchical_exchange_over(comm, *groups.node,
                                           plan.layout.local_rank(comm.rank()) < plan.lanes ? groups.lane : nullptr,
                                           plan, src, grad, out, ctx, opt, check, pending, res);
      });
}

/// `all_reduce_hierarchical` of a 16-bit gradient (`half` or `bfloat16`) into a 16-bit output:
/// widened to float32 (exact), reduced as the float32 overload does, and rounded once into
/// `out`. Every rank passes the same element type.
template <communicator Comm, class Source, element T>
  requires(!std::same_as<T, float> && detail::packet_source<std::remove_cvref_t<Source>>)
hierarchical_result all_reduce_hierarchical(Comm& comm, Source&& src, tensor_view<T const> grad,
                                            std::span<T> out, codec_context const& ctx = {},
                                            hierarchical_options const& opt = {}) {
  return detail::through_f32(grad, out, ctx, "all_reduce_hierarchical",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return all_reduce_hierarchical(comm, src, g, o, ctx, opt);
                             });
}

GRADCOMP_NAMESPACE_END
