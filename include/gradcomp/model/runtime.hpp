// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// A runtime model of one training iteration: dense all-reduce, compressed all-reduce (per
/// aggregation kind), two-way compression, hierarchical all-reduce and gossip, on an
/// alpha-beta network with fast intra-node and slower inter-node links, with straggling compute
/// and communication hidden behind compute. The formulas, their assumptions and their sources
/// are in docs/runtime-model.md; every function here names the one it implements.
///
/// Units: seconds, bytes, bytes per second. Ranks are laid out node by node.
///
/// Inputs the model can compute with (each `validate()` refuses anything else with
/// `config_error`, so that a prediction is always finite): ranks 1 to 2^24
/// (`topology::max_ranks`); latencies and compute times 0 or normal numbers up to
/// `model_limits::max_seconds`; bandwidths and codec speeds normal numbers in
/// [`model_limits::min_bandwidth`, `model_limits::max_bandwidth`] (infinity where a field says
/// so: a non-blocking fabric, a free codec); ratios normal numbers in
/// [`model_limits::min_ratio`, `model_limits::max_ratio`]; message sizes 0 to
/// `model_limits::max_bytes`. Denormal numbers are refused: divided by a flow count they
/// underflow to 0 and a prediction becomes infinite.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/topology/topology.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The ranges of the model's inputs (file comment).
struct model_limits {
  static constexpr double max_seconds = 1e6;     ///< latencies, compute and optimizer times
  static constexpr double min_bandwidth = 1.0;   ///< bytes per second
  static constexpr double max_bandwidth = 1e18;  ///< bytes per second (finite values)
  static constexpr double min_ratio = 1e-6;      ///< compression and intra-node ratios
  static constexpr double max_ratio = 1e12;
  static constexpr double max_bytes = 1e18;  ///< message size
};

namespace detail {

// `config_error` naming `what` unless v is 0 or a normal number in [0, hi].
inline void check_time(double v, double hi, std::string const& what) {
  if (!(v == 0.0 || (std::isnormal(v) && v > 0.0 && v <= hi))) {
    throw config_error("gradcomp: runtime model: " + what +
                       " must be 0 or a normal number in (0, " + std::to_string(hi) + "], got " +
                       std::to_string(v));
  }
}
// `config_error` unless v is a normal number in [lo, hi], or +infinity where `infinite_ok`.
inline void check_range(double v, double lo, double hi, bool infinite_ok, std::string const& what) {
  if (infinite_ok && v == std::numeric_limits<double>::infinity()) return;
  if (!(std::isnormal(v) && v >= lo && v <= hi)) {
    throw config_error("gradcomp: runtime model: " + what + " must be a normal number in [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "]" +
                       (infinite_ok ? " or infinity" : "") + ", got " + std::to_string(v));
  }
}

}  // namespace detail

/// One link class of the alpha-beta (Hockney) model.
struct link_params {
  double latency = 0.0;    ///< alpha: seconds per message, >= 0
  double bandwidth = 0.0;  ///< beta: bytes per second, > 0
};

/// The machines: `ranks` ranks, `ranks_per_node` per node, node by node.
struct cluster_params {
  int ranks = 1;
  int ranks_per_node = 1;
  link_params intra{1e-6, 100e9};  ///< between ranks of one node (NVLink / PCIe / shared memory)
  link_params inter{10e-6, 3e9};   ///< a node's network interface, shared by its ranks
  /// Capacity of the network core, shared by every flow between nodes (bytes per second): an
  /// oversubscribed switch, or one shared medium such as the network lab's single shaped
  /// loopback. Infinity (the default) is a non-blocking fabric, where only the nodes'
  /// interfaces limit a flow.
  double fabric_bandwidth = std::numeric_limits<double>::infinity();

  [[nodiscard]] int nodes() const noexcept { return ranks / ranks_per_node; }

  /// The link one of `flows` concurrent flows between nodes sees, each leaving its node's
  /// interface with `per_interface` flows on it: latency of `inter`, bandwidth
  /// min(inter.bandwidth / per_interface, fabric_bandwidth / flows).
  [[nodiscard]] link_params network_link(int flows, int per_interface = 1) const noexcept {
    double const f = flows < 1 ? 1.0 : static_cast<double>(flows);
    double const i = per_interface < 1 ? 1.0 : static_cast<double>(per_interface);
    return {inter.latency, std::min(inter.bandwidth / i, fabric_bandwidth / f)};
  }

  /// The slowest link of a ring over all ranks (laid out node by node): inside one node the
  /// intra link; else a network link, the ring's `nodes()` inter-node edges sharing the fabric.
  [[nodiscard]] link_params bottleneck() const noexcept {
    return nodes() > 1 ? network_link(nodes()) : intra;
  }

  void validate() const {
    auto fail = [](std::string const& what) {
      throw config_error("gradcomp: runtime model: " + what);
    };
    if (ranks < 1 || ranks > topology::max_ranks)
      fail("ranks must be 1 to 2^24, got " + std::to_string(ranks));
    if (ranks_per_node < 1 || ranks % ranks_per_node != 0) {
      fail("ranks_per_node must be >= 1 and divide ranks; got " + std::to_string(ranks_per_node) +
           " for " + std::to_string(ranks) + " ranks");
    }
    for (link_params const* l : {&intra, &inter}) {
      detail::check_time(l->latency, model_limits::max_seconds, "link latency");
      detail::check_range(l->bandwidth, model_limits::min_bandwidth, model_limits::max_bandwidth,
                          false, "link bandwidth");
    }
    detail::check_range(fabric_bandwidth, model_limits::min_bandwidth, model_limits::max_bandwidth,
                        true, "fabric bandwidth (infinity: non-blocking)");
  }
};

/// The computation of one iteration on one rank.
struct compute_params {
  double mean = 0.0;                     ///< forward + backward seconds, mean over ranks and steps
  double stddev = 0.0;                   ///< its standard deviation (i.i.d. normal across ranks)
  double backward_fraction = 2.0 / 3.0;  ///< share of `mean` that is the backward pass
  double optimizer = 0.0;                ///< optimizer step seconds
  bool overlap = true;                   ///< communication may run during the computation

  void validate() const {
    auto fail = [](std::string const& what) {
      throw config_error("gradcomp: runtime model: " + what);
    };
    detail::check_time(mean, model_limits::max_seconds, "compute mean");
    detail::check_time(stddev, model_limits::max_seconds, "compute stddev");
    if (!(backward_fraction >= 0.0 && backward_fraction <= 1.0) ||
        std::fpclassify(backward_fraction) == FP_SUBNORMAL)
      fail("backward_fraction must be 0, 1 or a normal number between");
    detail::check_time(optimizer, model_limits::max_seconds, "optimizer time");
  }
};

/// A codec as the model sees it.
struct codec_params {
  aggregation_kind aggregation = aggregation_kind::summable;
  double ratio = 1.0;  ///< uncompressed bytes / compressed bytes, > 0
  /// Compression speed in input (uncompressed) bytes per second; infinity = free.
  double compress_bandwidth = std::numeric_limits<double>::infinity();
  /// Decompression speed in output (uncompressed) bytes per second; infinity = free.
  double decompress_bandwidth = std::numeric_limits<double>::infinity();

  void validate() const {
    detail::check_range(ratio, model_limits::min_ratio, model_limits::max_ratio, false,
                        "codec ratio");
    detail::check_range(compress_bandwidth, model_limits::min_bandwidth,
                        model_limits::max_bandwidth, true, "codec compress bandwidth");
    detail::check_range(decompress_bandwidth, model_limits::min_bandwidth,
                        model_limits::max_bandwidth, true, "codec decompress bandwidth");
  }
};

/// Predicted time of one iteration, with its parts.
struct iteration_time {
  double compute = 0.0;        ///< expected slowest computation among the ranks waited for
  double codec = 0.0;          ///< compression and decompression on the critical path
  double communication = 0.0;  ///< collective time
  double exposed = 0.0;        ///< communication not hidden behind computation
  double optimizer = 0.0;
  double bytes_sent = 0.0;  ///< bytes each rank sends per iteration
  /// compute + codec + exposed + optimizer.
  [[nodiscard]] double total() const noexcept { return compute + codec + exposed + optimizer; }
};

/// E[max of n i.i.d. standard normals] (0 for n = 1; 1/sqrt(pi) for n = 2), by numerical
/// integration of x * n * phi(x) * Phi(x)^(n-1); accurate to about 1e-7.
[[nodiscard]] inline double expected_max_standard_normal(int n) {
  if (n < 1) throw config_error("gradcomp: expected maximum of " + std::to_string(n) + " samples");
  if (n == 1) return 0.0;
  double const lo = -10.0;
  double const hi = 12.0;
  int const steps = 8800;  // even, h = 0.0025
  double const h = (hi - lo) / steps;
  double const nn = static_cast<double>(n);
  auto f = [nn](double x) {
    double const phi = std::exp(-0.5 * x * x) * 0.3989422804014327;
    double const cdf = 0.5 * std::erfc(-x / 1.4142135623730951);
    if (cdf <= 0.0) return 0.0;
    return x * nn * phi * std::exp((nn - 1.0) * std::log(cdf));
  };
  double sum = f(lo) + f(hi);
  for (int i = 1; i < steps; ++i) sum += f(lo + i * h) * (i % 2 == 1 ? 4.0 : 2.0);
  return sum * h / 3.0;
}

/// Expected compute time of the slowest of `group` ranks: mean + stddev * E[max of group].
[[nodiscard]] inline double expected_max_compute(compute_params const& c, int group) {
  c.validate();
  return c.mean + c.stddev * expected_max_standard_normal(group);
}

/// Ring all-reduce of `bytes` over `g` ranks: 2(g-1) alpha + 2(g-1)/g bytes/beta.
[[nodiscard]] inline double ring_allreduce_time(double bytes, int g, link_params const& l) {
  if (g <= 1) return 0.0;
  double const gd = g;
  return 2.0 * (gd - 1.0) * l.latency + 2.0 * (gd - 1.0) / gd * bytes / l.bandwidth;
}

/// Ring reduce-scatter of `bytes` over `g` ranks: (g-1) alpha + (g-1)/g bytes/beta.
[[nodiscard]] inline double reduce_scatter_time(double bytes, int g, link_params const& l) {
  if (g <= 1) return 0.0;
  double const gd = g;
  return (gd - 1.0) * l.latency + (gd - 1.0) / gd * bytes / l.bandwidth;
}

/// Ring all-gather of `bytes_per_rank` from each of `g` ranks: (g-1) (alpha + bytes/beta).
[[nodiscard]] inline double allgather_time(double bytes_per_rank, int g, link_params const& l) {
  if (g <= 1) return 0.0;
  return (g - 1.0) * (l.latency + bytes_per_rank / l.bandwidth);
}

namespace detail {

inline void check_bytes(double bytes) {
  if (!(bytes >= 0.0 && bytes <= model_limits::max_bytes)) {
    throw config_error("gradcomp: runtime model: message bytes must be in [0, 1e18], got " +
                       std::to_string(bytes));
  }
}

inline double window(compute_params const& c, bool whole_compute) {
  if (!c.overlap) return 0.0;
  return whole_compute ? c.mean : c.backward_fraction * c.mean;
}

}  // namespace detail

/// Dense all-reduce of the gradient (`bytes`), hidden behind the backward pass:
/// compute = E[max over n], comm = ring_allreduce(bytes, n, bottleneck),
/// exposed = max(0, comm - backward_fraction * mean).
[[nodiscard]] inline iteration_time predict_allreduce(double bytes, cluster_params const& cl,
                                                      compute_params const& c) {
  detail::check_bytes(bytes);
  cl.validate();
  c.validate();
  iteration_time t;
  t.compute = expected_max_compute(c, cl.ranks);
  t.communication = ring_allreduce_time(bytes, cl.ranks, cl.bottleneck());
  t.exposed = std::max(0.0, t.communication - detail::window(c, false));
  t.optimizer = c.optimizer;
  t.bytes_sent = cl.ranks > 1 ? 2.0 * (cl.ranks - 1.0) / cl.ranks * bytes : 0.0;
  return t;
}

/// Compressed all-reduce of a `bytes` gradient with a codec of the given aggregation kind;
/// M_c = bytes / ratio:
/// - summable, shared support: ring all-reduce of M_c; codec = compress M + decompress M;
/// - gather: all-gather of n packets of M_c; codec = compress M + decompress n * M;
/// - low-rank: two ring all-reduces of M_c / 2 (the two factors); codec = compress M +
///   decompress M.
/// Codec time is not hidden (it runs on the computing device); communication is, behind the
/// backward pass.
[[nodiscard]] inline iteration_time predict_compressed_allreduce(double bytes,
                                                                 cluster_params const& cl,
                                                                 compute_params const& c,
                                                                 codec_params const& k) {
  detail::check_bytes(bytes);
  cl.validate();
  c.validate();
  k.validate();
  int const n = cl.ranks;
  double const mc = bytes / k.ratio;
  link_params const l = cl.bottleneck();
  iteration_time t;
  t.compute = expected_max_compute(c, n);
  double decoded = bytes;
  switch (k.aggregation) {
    case aggregation_kind::summable:
    case aggregation_kind::shared_support:
      t.communication = ring_allreduce_time(mc, n, l);
      t.bytes_sent = n > 1 ? 2.0 * (n - 1.0) / n * mc : 0.0;
      break;
    case aggregation_kind::gather:
      t.communication = allgather_time(mc, n, l);
      t.bytes_sent = (n - 1.0) * mc;
      decoded = n * bytes;
      break;
    case aggregation_kind::low_rank:
      t.communication = 2.0 * ring_allreduce_time(mc / 2.0, n, l);
      t.bytes_sent = n > 1 ? 2.0 * (n - 1.0) / n * mc : 0.0;
      break;
  }
  t.codec = bytes / k.compress_bandwidth + decoded / k.decompress_bandwidth;
  t.exposed = std::max(0.0, t.communication - detail::window(c, false));
  t.optimizer = c.optimizer;
  return t;
}

/// Two-way compression (BytePS-Compress over the ranks themselves): every rank compresses its
/// gradient, sends shard s of the packet to rank s (reduce-scatter of M_c), each rank decodes
/// and sums its n shard packets, re-compresses its shard, and the compressed shards are
/// all-gathered. comm = reduce_scatter(M_c) + allgather(M_c / n);
/// codec = (M + M/n) / compress + 2 M / decompress.
[[nodiscard]] inline iteration_time predict_two_way(double bytes, cluster_params const& cl,
                                                    compute_params const& c,
                                                    codec_params const& k) {
  detail::check_bytes(bytes);
  cl.validate();
  c.validate();
  k.validate();
  int const n = cl.ranks;
  double const mc = bytes / k.ratio;
  link_params const l = cl.bottleneck();
  iteration_time t;
  t.compute = expected_max_compute(c, n);
  t.communication = reduce_scatter_time(mc, n, l) + allgather_time(mc / n, n, l);
  t.bytes_sent = n > 1 ? 2.0 * (n - 1.0) / n * mc : 0.0;
  t.codec = (bytes + bytes / n) / k.compress_bandwidth + 2.0 * bytes / k.decompress_bandwidth;
  t.exposed = std::max(0.0, t.communication - detail::window(c, false));
  t.optimizer = c.optimizer;
  return t;
}

/// How a hierarchical all-reduce (collective/hierarchical.hpp) is set up, as the model sees it.
struct hierarchical_params {
  /// Shards per node, each sent between nodes by its own rank: 0 for `ranks_per_node` (every
  /// network interface in use), 1 for one leader per node; at most `ranks_per_node`.
  int lanes = 0;
  /// Float32 gradient bytes per byte on the intra-node wire: 1 for float32, 2 for binary16 or
  /// bfloat16 (`hierarchical_options::intra`).
  double intra_ratio = 1.0;
  /// Speed of the conversions to and from the intra-node format, in float32 bytes per second;
  /// infinity (the default, and what float32 costs) is free.
  double intra_convert_bandwidth = std::numeric_limits<double>::infinity();

  void validate(cluster_params const& cl) const {
    auto fail = [](std::string const& what) {
      throw config_error("gradcomp: runtime model: " + what);
    };
    if (lanes < 0 || lanes > cl.ranks_per_node) {
      fail("hierarchical lanes must be 0 (ranks_per_node) or 1 to ranks_per_node (" +
           std::to_string(cl.ranks_per_node) + "), got " + std::to_string(lanes));
    }
    detail::check_range(intra_ratio, model_limits::min_ratio, model_limits::max_ratio, false,
                        "hierarchical intra_ratio");
    detail::check_range(intra_convert_bandwidth, model_limits::min_bandwidth,
                        model_limits::max_bandwidth, true, "hierarchical intra_convert_bandwidth");
  }
};

/// Hierarchical all-reduce of a `bytes` gradient (docs/runtime-model.md): p = ranks_per_node,
/// N = nodes, L lanes, M_i = bytes / intra_ratio, M_c = bytes / ratio:
/// - intra-node reduce-scatter, each shard owner receiving p - 1 slices of M_i / L:
///   T_rs = (p - 1) alpha_intra + (p - 1) (M_i / L) / beta_intra;
/// - inter-node: the L lanes at once, each a compressed all-reduce of M_c / L over N nodes on
///   the link `network_link(L N, L)` (L flows per interface, L N sharing the fabric): summable and
///   shared support T_ar(N, M_c / L), gather T_ag(N, M_c / L); low-rank is not supported;
/// - intra-node all-gather, each owner sending M_i / L to p - 1 ranks:
///   T_ag = (p - 1) (alpha_intra + (M_i / L) / beta_intra).
/// comm = T_rs + T_inter + T_ag, hidden behind the backward pass; codec (on a shard owner) =
/// (M / L) / compress + decoded / decompress (decoded = M / L, or N M / L for gather), plus the
/// intra-node conversions (2 M + (p + 1) M / L) / intra_convert_bandwidth; with one node no
/// codec runs. bytes_sent: the larger of an owner's ((L - 1) / L M_i + inter + (p - 1) M_i / L)
/// and a non-owner's (M_i). With p = 1 this is `predict_compressed_allreduce`.
[[nodiscard]] inline iteration_time predict_hierarchical_allreduce(
    double bytes, cluster_params const& cl, compute_params const& c, codec_params const& k,
    hierarchical_params const& h = {}) {
  detail::check_bytes(bytes);
  cl.validate();
  c.validate();
  k.validate();
  h.validate(cl);
  if (k.aggregation == aggregation_kind::low_rank) {
    throw config_error(
        "gradcomp: runtime model: the hierarchical all-reduce takes summable, shared-support or "
        "gather codecs, not low-rank ones");
  }
  double const p = cl.ranks_per_node;
  int const nodes = cl.nodes();
  double const n_nodes = nodes;
  double const lanes = h.lanes == 0 ? p : static_cast<double>(h.lanes);
  double const slice = bytes / h.intra_ratio / lanes;  // M_i / L
  double const shard = bytes / k.ratio / lanes;        // M_c / L
  iteration_time t;
  t.compute = expected_max_compute(c, cl.ranks);
  double const intra =
      p > 1.0 ? (p - 1.0) * cl.intra.latency + (p - 1.0) * slice / cl.intra.bandwidth : 0.0;
  double const gather = p > 1.0 ? (p - 1.0) * (cl.intra.latency + slice / cl.intra.bandwidth) : 0.0;
  double inter = 0.0, inter_bytes = 0.0;
  if (nodes > 1) {
    link_params const l = cl.network_link(static_cast<int>(lanes) * nodes, static_cast<int>(lanes));
    if (k.aggregation == aggregation_kind::gather) {
      inter = allgather_time(shard, nodes, l);
      inter_bytes = (n_nodes - 1.0) * shard;
    } else {
      inter = ring_allreduce_time(shard, nodes, l);
      inter_bytes = 2.0 * (n_nodes - 1.0) / n_nodes * shard;
    }
    double const decoded =
        k.aggregation == aggregation_kind::gather ? n_nodes * bytes / lanes : bytes / lanes;
    t.codec = bytes / lanes / k.compress_bandwidth + decoded / k.decompress_bandwidth;
  }
  if (p > 1.0) t.codec += (2.0 * bytes + (p + 1.0) * bytes / lanes) / h.intra_convert_bandwidth;
  t.communication = intra + inter + gather;
  double const owner = (lanes - 1.0) * slice + inter_bytes + (p - 1.0) * slice;
  t.bytes_sent = std::max(owner, lanes < p ? lanes * slice : 0.0);
  t.exposed = std::max(0.0, t.communication - detail::window(c, false));
  t.optimizer = c.optimizer;
  return t;
}

/// Time of one group all-reduce of `bytes` in one phase of a group-based topology, with the
/// network interfaces shared: a group is a ring over its members (ascending rank); a ring edge
/// between nodes gets inter.bandwidth divided by the number of edges leaving its source node
/// in this phase; edges inside a node get the intra link.
[[nodiscard]] inline std::vector<double> gossip_group_times(double bytes, cluster_params const& cl,
                                                            topology const& topo,
                                                            std::uint64_t step) {
  auto node = [&](int r) { return r / cl.ranks_per_node; };
  std::vector<mixing_group> const groups = topo.groups(step);
  std::vector<int> leaving(static_cast<std::size_t>(cl.nodes()), 0);
  int flows = 0;  // inter-node ring edges of the phase, all sharing the fabric
  for (auto const& g : groups) {
    std::size_t const m = g.ranks.size();
    if (m < 2) continue;
    for (std::size_t i = 0; i < m; ++i) {
      int const u = g.ranks[i];
      int const v = g.ranks[(i + 1) % m];
      if (node(u) != node(v)) {
        ++leaving[static_cast<std::size_t>(node(u))];
        ++flows;
      }
    }
  }
  std::vector<double> out;
  for (auto const& g : groups) {
    std::size_t const m = g.ranks.size();
    if (m < 2) {
      out.push_back(0.0);
      continue;
    }
    double bw = std::numeric_limits<double>::infinity();
    double alpha = 0.0;
    for (std::size_t i = 0; i < m; ++i) {
      int const u = g.ranks[i];
      int const v = g.ranks[(i + 1) % m];
      if (node(u) != node(v)) {
        link_params const l = cl.network_link(flows, leaving[static_cast<std::size_t>(node(u))]);
        bw = std::min(bw, l.bandwidth);
        alpha = std::max(alpha, l.latency);
      } else {
        bw = std::min(bw, cl.intra.bandwidth);
        alpha = std::max(alpha, cl.intra.latency);
      }
    }
    out.push_back(ring_allreduce_time(bytes, static_cast<int>(m), link_params{alpha, bw}));
  }
  return out;
}

/// Gossip (decentralized) training with `topo`, averaged over the topology's period. The
/// parameters (`bytes`) are exchanged during the whole forward + backward pass (overlap
/// window = mean compute), and a rank only waits for the members of its group.
/// Per phase: compute = mean + stddev * E[max over the largest group];
/// exposed = max over groups of max(0, T_group - mean).
/// - Without a codec (group-based topologies): T_group = ring all-reduce over the group with
///   shared network interfaces (`gossip_group_times`).
/// - With a codec (CHOCO / DeepSqueeze), or for static-ring: each rank sends its packet to each
///   peer in turn, T = sum over peers of (alpha + M_c / beta) on the link to that peer;
///   codec = compress M + decompress (degree) * M.
[[nodiscard]] inline iteration_time predict_gossip(double bytes, cluster_params const& cl,
                                                   compute_params const& c, topology const& topo,
                                                   codec_params const* k = nullptr) {
  detail::check_bytes(bytes);
  cl.validate();
  c.validate();
  if (k != nullptr) k->validate();
  if (topo.size() != cl.ranks) {
    throw config_error("gradcomp: runtime model: the topology has " + std::to_string(topo.size()) +
                       " ranks but the cluster " + std::to_string(cl.ranks));
  }
  if (topo.kind() == topology_kind::alternating_exp_ring &&
      topo.ranks_per_node() != cl.ranks_per_node) {
    throw config_error("gradcomp: runtime model: the aer topology has " +
                       std::to_string(topo.ranks_per_node()) + " ranks per node but the cluster " +
                       std::to_string(cl.ranks_per_node));
  }
  auto node = [&](int r) { return r / cl.ranks_per_node; };
  double const mc = k != nullptr ? bytes / k->ratio : bytes;
  double const win = detail::window(c, true);
  std::uint64_t const period = topo.period();
  iteration_time sum;
  for (std::uint64_t s = 0; s < period; ++s) {
    iteration_time t;
    int largest = 1;
    double comm = 0.0;
    double sent = 0.0;
    std::size_t max_degree = 0;
    if (k == nullptr && topo.group_based()) {
      std::vector<mixing_group> const groups = topo.groups(s);
      std::vector<double> const times = gossip_group_times(bytes, cl, topo, s);
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        int const m = static_cast<int>(groups[gi].ranks.size());
        largest = std::max(largest, m);
        comm = std::max(comm, times[gi]);
        sent = std::max(sent, m > 1 ? 2.0 * (m - 1.0) / m * bytes : 0.0);
      }
    } else {
      // Each rank sends to its peers one after the other: at any moment one flow per rank
      // with a peer on another node, all of them sharing the fabric.
      int flows = 0;
      for (int r = 0; r < cl.ranks; ++r) {
        for (int p : topo.row(s, r).peers()) {
          if (node(p) != node(r)) {
            ++flows;
            break;
          }
        }
      }
      link_params const net = cl.network_link(flows);
      for (int r = 0; r < cl.ranks; ++r) {
        mixing_row const row = topo.row(s, r);
        largest = std::max(largest, static_cast<int>(row.entries.size()));
        max_degree = std::max(max_degree, row.degree());
        double tr = 0.0;
        for (int p : row.peers()) {
          link_params const& l = node(p) == node(r) ? cl.intra : net;
          tr += l.latency + mc / l.bandwidth;
        }
        comm = std::max(comm, tr);
        sent = std::max(sent, static_cast<double>(row.degree()) * mc);
      }
    }
    t.compute = expected_max_compute(c, largest);
    t.communication = comm;
    t.exposed = std::max(0.0, comm - win);
    t.bytes_sent = sent;
    if (k != nullptr) {
      t.codec = bytes / k->compress_bandwidth +
                static_cast<double>(max_degree) * bytes / k->decompress_bandwidth;
    }
    sum.compute += t.compute;
    sum.communication += t.communication;
    sum.exposed += t.exposed;
    sum.codec += t.codec;
    sum.bytes_sent += t.bytes_sent;
  }
  double const p = static_cast<double>(period);
  sum.compute /= p;
  sum.communication /= p;
  sum.exposed /= p;
  sum.codec /= p;
  sum.bytes_sent /= p;
  sum.optimizer = c.optimizer;
  return sum;
}

GRADCOMP_NAMESPACE_END
