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

/// Writes `x` in the intra-node format `f` at `out` (`x.size() * intra_element_bytes(f)`).
inline void encode_intra(dense_format f, std::span<float const> x, std::byte* out,
                         codec_context const& ctx) {
  if (x.empty()) return;
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
}

/// `out = x` or, with `add`, `out += x` (float32 arithmetic) for `x` in the intra-node format.
inline void decode_intra(dense_format f, std::byte const* x, std::span<float> out, bool add,
                         codec_context const& ctx) {
  if (out.empty()) return;
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

/// The hierarchical all-reduce after its agreement round and without its outcome round: the
/// three phases of the file comment. Failures after the data started moving are recorded in
/// `check` (and the phases go on, so every rank reaches the outcome round); error feedback is
/// staged into `pending`.
template <communicator Comm, class Source>
void hierarchical_exchange(Comm& comm, hierarchical_plan const& plan, Source& src,
                           tensor_view<float const> grad, std::span<float> out,
                           codec_context const& ctx, hierarchical_options const& opt,
                           step_check& check, pending_commit<Source>& pending,
                           hierarchical_result& res) {
  std::size_t const n = out.size();
  int const me = comm.rank();
  int const node = plan.layout.node_of(me);
  auto const local = static_cast<std::size_t>(plan.layout.local_rank(me));
  std::vector<int> const& mates = plan.layout.node_ranks(node);
  std::size_t const p = mates.size();
  auto const lanes = static_cast<std::size_t>(plan.lanes);
  bool const owner = local < lanes;
  std::size_t const es = intra_element_bytes(opt.intra);
  std::size_t const tail = opt.checksum ? checksum_trailer_bytes : 0;
  char const* const what = "all_reduce_hierarchical";
  res.nodes = plan.layout.nodes();
  res.lanes = plan.lanes;

  auto shard = [&](std::size_t j) { return shard_range(n, j, lanes); };
  auto const [sb, se] = owner ? shard(local) : std::pair<std::size_t, std::size_t>{0, 0};
  std::size_t const m = se - sb;

  group_communicator<Comm> node_comm(comm, mates, opt.groups);

  // 1. Intra-node reduce-scatter: slice j of this rank's gradient to the node's j-th rank.
  std::vector<std::size_t> send_counts(p, 0), recv_counts(p, 0);
  for (std::size_t j = 0; j < lanes; ++j) {
    auto const [b, e] = shard(j);
    send_counts[j] = (e - b) * es + tail;
  }
  if (owner) std::fill(recv_counts.begin(), recv_counts.end(), m * es + tail);
  raw_buffer send, recv;
  std::span<std::byte const> outgoing;
  if (opt.intra == dense_format::f32 && tail == 0 && !grad.empty()) {
    outgoing = std::as_bytes(grad.span());  // the slices are the gradient's consecutive bytes
  } else {
    std::vector<float> const zero(grad.empty() ? n : 0, 0.0f);
    std::span<float const> const g = grad.empty() ? std::span<float const>(zero) : grad.span();
    send.resize(n * es + lanes * tail);
    std::size_t at = 0;
    for (std::size_t j = 0; j < lanes; ++j) {
      auto const [b, e] = shard(j);
      encode_intra(opt.intra, g.subspan(b, e - b), send.data() + at, ctx);
      at += tail != 0 ? add_trailer(send.span().subspan(at), (e - b) * es) : (e - b) * es;
    }
    outgoing = std::as_const(send).span();
  }
  recv.resize(owner ? p * (m * es + tail) : 0);
  node_comm.all_to_all_v(outgoing, std::span<std::size_t const>(send_counts), recv.span(),
                         std::span<std::size_t const>(recv_counts));
  for (std::size_t j = 0; j < lanes; ++j) res.wire_bytes += j == local ? 0 : send_counts[j];

  // The node's sum of this rank's shard, in rank order.
  std::vector<float> sum(m, 0.0f), reduced(m, 0.0f);
  if (owner) {
    check.guard([&] {
      for (std::size_t q = 0; q < p; ++q) {
        std::span<std::byte const> slice =
            std::as_const(recv).span().subspan(q * (m * es + tail), m * es + tail);
        if (tail != 0) slice = strip_trailer(slice, what);
        decode_intra(opt.intra, slice.data(), std::span<float>(sum), q != 0, ctx);
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
    reduced = sum;
  } else if (owner) {
    group_communicator<Comm> lane_comm(comm, plan.layout.lane(static_cast<int>(local)), opt.groups);
    tensor_view<float const> const node_sum(
        std::span<float const>(sum),
        hierarchical_shard_id(grad.id(), static_cast<int>(local), plan.lanes));
    step_check lane_check(opt.checksum);
    try {
      collective_result const r = compressed_exchange(
          lane_comm, src, node_sum, std::span<float>(reduced), ctx,
          collective_options{reduction::sum, opt.checksum}, lane_check, pending);
      res.packet_bytes = r.packet_bytes;
      res.inter_node_bytes = r.wire_bytes;
      if (opt.checksum) {
        // The lane's sums are checked within the lane (the ranks of other lanes summed others).
        agree_outcome(lane_comm, lane_check, what);
        res.inter_node_bytes += outcome_wire_bytes(true, lane_comm.size());
      } else if (lane_check.failed()) {
        check.fail(lane_check.failure());
      }
    } catch (comm_error const& e) {
      // Name the lane in parent ranks: the lane's own messages number its members from 0.
      std::string members;
      for (int r : lane_comm.members())
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
    float const alpha = reduction_scale(opt.op, comm.size());
    for (float& v : reduced) v *= alpha;
  }

  // 3. Intra-node all-gather of the reduced shards (the owner keeps the rounded bits too).
  std::vector<std::size_t> counts(p, 0);
  for (std::size_t j = 0; j < lanes; ++j) counts[j] = send_counts[j];
  raw_buffer mine(owner ? m * es + tail : 0);
  if (owner) {
    encode_intra(opt.intra, std::span<float const>(reduced), mine.data(), ctx);
    if (tail != 0) add_trailer(mine.span(), m * es);
  }
  if (opt.intra == dense_format::f32 && tail == 0) {
    node_comm.all_gather_v(std::as_const(mine).span(), std::as_writable_bytes(out),
                           std::span<std::size_t const>(counts));
  } else {
    raw_buffer all(n * es + lanes * tail);
    node_comm.all_gather_v(std::as_const(mine).span(), all.span(),
                           std::span<std::size_t const>(counts));
    check.guard([&] {
      std::size_t at = 0;
      for (std::size_t j = 0; j < lanes; ++j) {
        auto const [b, e] = shard(j);
        std::span<std::byte const> block = std::as_const(all).span().subspan(at, counts[j]);
        if (tail != 0) block = strip_trailer(block, what);
        decode_intra(opt.intra, block.data(), out.subspan(b, e - b), false, ctx);
        at += counts[j];
      }
    });
  }
  res.wire_bytes +=
      ring_all_gather_bytes(std::span<std::size_t const>(counts), static_cast<int>(local));
  if (!check.failed()) check.output(out);
}

}  // namespace detail

/// Hierarchical all-reduce of `grad` into `out` (see the file comment): dense or 16-bit inside
/// the nodes of `opt.nodes`, compressed with `src` between them. `src` is a codec, an
/// `any_codec` or a `compressor` (error feedback, kept by the shard owners); `grad` empty: this
/// rank contributes zeros; otherwise `grad.size() == out.size()`; `grad` may alias `out`.
/// Collective over `comm`: every rank passes the same grouping, codec, size, tensor id and
/// options; for a shared-support codec the same `ctx.seed` and `ctx.step`.
/// @return the paths and this rank's traffic.
template <communicator Comm, class Source>
  requires(detail::packet_source<std::remove_cvref_t<Source>>)
hierarchical_result all_reduce_hierarchical(Comm& comm, Source&& src, tensor_view<float const> grad,
                                            std::span<float> out, codec_context const& ctx = {},
                                            hierarchical_options const& opt = {}) {
  detail::check_contribution(grad.size(), out.size(), "all_reduce_hierarchical");
  using source_type = std::remove_reference_t<Source>;
  std::size_t const n = out.size();
  hierarchical_result res;
  detail::hierarchical_plan plan;
  std::uint64_t config = 0;
  std::exception_ptr local;
  try {
    plan = detail::plan_hierarchy(opt, comm.size());
    aggregation_kind const kind = detail::aggregation_of(src);
    if (kind == aggregation_kind::low_rank) {
      throw config_error(std::string("gradcomp: all_reduce_hierarchical: codec '") +
                         codec_name(detail::codec_id_of(src)) +
                         "' is low-rank; the hierarchical all-reduce takes "
                         "codecs whose packets are summed or gathered");
    }
    using plain = std::remove_cv_t<source_type>;
    if constexpr (requires { plain::receives; }) {
      if (plain::receives) {
        throw config_error(
            "gradcomp: all_reduce_hierarchical: error feedback whose packets are increments "
            "(EF21) needs a receiver state on every rank; use residual feedback or none");
      }
    }
    fingerprint f;
    f.add("all_reduce_hierarchical").add(static_cast<std::uint64_t>(plan.lanes));
    f.add(static_cast<std::uint64_t>(opt.intra)).add(static_cast<std::uint64_t>(opt.op));
    f.add(opt.checksum ? 1 : 0).add(static_cast<std::uint64_t>(opt.groups.tag_base));
    f.add(static_cast<std::uint64_t>(opt.groups.tag_count))
        .add(static_cast<std::uint64_t>(grad.id()));
    f.add(detail::codec_fingerprint(src, n, reduction::sum, ctx, "hierarchical"));
    config = f.value();
  } catch (...) {
    local = std::current_exception();
  }
  detail::agree_hierarchy(comm, plan, config, static_cast<std::uint32_t>(detail::codec_id_of(src)),
                          n, opt.checksum, local, res.wire_bytes);

  detail::pending_commit<source_type> pending(src);
  detail::step_check check(opt.checksum);
  detail::hierarchical_exchange(comm, plan, src, grad, out, ctx, opt, check, pending, res);
  detail::agree_outcome(comm, check, "all_reduce_hierarchical");
  res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
  pending.apply();
  return res;
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
