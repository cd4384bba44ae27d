// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_planner — predicts the time of one training iteration for dense all-reduce,
// compressed all-reduce, two-way compression, hierarchical all-reduce (dense inside a node,
// compressed between nodes) and gossip (decentralized) training on a given model size and
// cluster, with gradcomp's runtime model (docs/runtime-model.md), and recommends
// the fastest configuration.
//
// It predicts time only. Lossy codecs and decentralized training also change how many
// iterations reach a given accuracy; the table says which configurations do (column "kind").
//
// Usage: gradcomp_planner [--params N] [--ranks N] [--ranks-per-node N]
//                         [--intra-gbytes GB/s] [--inter-gbits Gb/s] [--fabric-gbits Gb/s]
//                         [--intra-latency-us US] [--inter-latency-us US]
//                         [--compute-ms MS] [--compute-std-ms MS] [--backward-fraction F]
//                         [--optimizer-ms MS] [--codec-speed X] [--no-overlap]

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/model/runtime.hpp>
#include <gradcomp/topology/topology.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace gc = gradcomp;

struct settings {
  double params = 25.6e6;  // ResNet-50
  int ranks = 32;
  int ranks_per_node = 8;
  double intra_gbytes = 100.0;  // GB/s
  double inter_gbits = 25.0;    // Gb/s
  double fabric_gbits = 0.0;    // Gb/s shared by all inter-node flows; 0 = non-blocking
  double intra_latency_us = 2.0;
  double inter_latency_us = 20.0;
  double compute_ms = 120.0;
  double compute_std_ms = 10.0;
  double backward_fraction = 2.0 / 3.0;
  double optimizer_ms = 2.0;
  double codec_speed = 1.0;  // multiplies the codec throughputs below (e.g. a GPU)
  bool overlap = true;
};

void usage() {
  std::puts(
      "usage: gradcomp_planner [--params N] [--ranks N] [--ranks-per-node N]\n"
      "                        [--intra-gbytes GB/s] [--inter-gbits Gb/s] [--fabric-gbits Gb/s]\n"
      "                        [--intra-latency-us US] [--inter-latency-us US]\n"
      "                        [--compute-ms MS] [--compute-std-ms MS] [--backward-fraction F]\n"
      "                        [--optimizer-ms MS] [--codec-speed X] [--no-overlap]\n"
      "defaults: ResNet-50 (25.6M fp32 parameters), 4 nodes x 8 ranks, 100 GB/s inside a node,\n"
      "25 Gb/s between nodes over a non-blocking fabric (--fabric-gbits: the capacity that all\n"
      "flows between nodes share, e.g. an oversubscribed switch), 120 +- 10 ms compute per iteration, codec speeds of one CPU core\n"
      "(docs/performance.md; --codec-speed scales them).");
}

double parse_number(char const* name, char const* text) {
  char* end = nullptr;
  double const v = std::strtod(text, &end);
  if (end == text || *end != '\0') {
    throw gc::config_error(std::string("gradcomp_planner: ") + name + " expects a number, got \"" +
                           text + "\"");
  }
  return v;
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    }
    if (a == "--no-overlap") {
      s.overlap = false;
      continue;
    }
    if (i + 1 >= argc)
      throw gc::config_error("gradcomp_planner: " + std::string(a) + " needs a value (see --help)");
    double const v = parse_number(argv[i], argv[i + 1]);
    ++i;
    if (a == "--params")
      s.params = v;
    else if (a == "--ranks")
      s.ranks = static_cast<int>(v);
    else if (a == "--ranks-per-node")
      s.ranks_per_node = static_cast<int>(v);
    else if (a == "--intra-gbytes")
      s.intra_gbytes = v;
    else if (a == "--inter-gbits")
      s.inter_gbits = v;
    else if (a == "--fabric-gbits")
      s.fabric_gbits = v;
    else if (a == "--intra-latency-us")
      s.intra_latency_us = v;
    else if (a == "--inter-latency-us")
      s.inter_latency_us = v;
    else if (a == "--compute-ms")
      s.compute_ms = v;
    else if (a == "--compute-std-ms")
      s.compute_std_ms = v;
    else if (a == "--backward-fraction")
      s.backward_fraction = v;
    else if (a == "--optimizer-ms")
      s.optimizer_ms = v;
    else if (a == "--codec-speed")
      s.codec_speed = v;
    else
      throw gc::config_error("gradcomp_planner: unknown option " + std::string(a) +
                             " (see --help)");
  }
  if (!(s.fabric_gbits >= 0))
    throw gc::config_error("gradcomp_planner: --fabric-gbits must be >= 0 (0: non-blocking)");
  if (!(s.params > 0)) throw gc::config_error("gradcomp_planner: --params must be > 0");
  if (!(s.codec_speed > 0)) throw gc::config_error("gradcomp_planner: --codec-speed must be > 0");
  return s;
}

struct row {
  std::string name;
  char const* kind;  // "exact", "lossy" (compressed gradients), "decentral" (gossip)
  gc::iteration_time t;
};

// A codec as the model sees it: bytes per fp32 element on the wire and one-core throughput
// (GB/s of fp32 input) from docs/performance.md (2^24 elements, one thread).
gc::codec_params codec(gc::aggregation_kind k, double bytes_per_element, double compress_gbs,
                       double decompress_gbs, double speed) {
  gc::codec_params c;
  c.aggregation = k;
  c.ratio = 4.0 / bytes_per_element;
  c.compress_bandwidth = compress_gbs * 1e9 * speed;
  c.decompress_bandwidth = decompress_gbs * 1e9 * speed;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    settings const s = parse(argc, argv);
    gc::cluster_params cl;
    cl.ranks = s.ranks;
    cl.ranks_per_node = s.ranks_per_node;
    cl.intra = {s.intra_latency_us * 1e-6, s.intra_gbytes * 1e9};
    cl.inter = {s.inter_latency_us * 1e-6, s.inter_gbits * 1e9 / 8.0};
    if (s.fabric_gbits > 0) cl.fabric_bandwidth = s.fabric_gbits * 1e9 / 8.0;
    gc::compute_params cp;
    cp.mean = s.compute_ms * 1e-3;
    cp.stddev = s.compute_std_ms * 1e-3;
    cp.backward_fraction = s.backward_fraction;
    cp.optimizer = s.optimizer_ms * 1e-3;
    cp.overlap = s.overlap;
    cl.validate();
    cp.validate();
    double const bytes = s.params * 4.0;
    double const sp = s.codec_speed;
    using ak = gc::aggregation_kind;

    std::vector<row> rows;
    rows.push_back({"all-reduce fp32", "exact", gc::predict_allreduce(bytes, cl, cp)});
    rows.push_back({"all-reduce fp16", "lossy",
                    gc::predict_compressed_allreduce(bytes, cl, cp,
                                                     codec(ak::summable, 2.0, 12.5, 14.0, sp))});
    rows.push_back({"int8 (gather)", "lossy",
                    gc::predict_compressed_allreduce(bytes, cl, cp,
                                                     codec(ak::gather, 1.016, 12.6, 17.2, sp))});
    rows.push_back({"qsgd s=7 (gather)", "lossy",
                    gc::predict_compressed_allreduce(bytes, cl, cp,
                                                     codec(ak::gather, 0.508, 5.46, 13.3, sp))});
    rows.push_back({"onebit (gather)", "lossy",
                    gc::predict_compressed_allreduce(bytes, cl, cp,
                                                     codec(ak::gather, 0.125, 23.2, 23.1, sp))});
    // top-k speeds are an estimate (no measured row in docs/performance.md yet).
    rows.push_back(
        {"top-k 1% (gather)", "lossy",
         gc::predict_compressed_allreduce(bytes, cl, cp, codec(ak::gather, 0.08, 2.0, 20.0, sp))});
    rows.push_back({"two-way onebit", "lossy",
                    gc::predict_two_way(bytes, cl, cp, codec(ak::gather, 0.125, 23.2, 23.1, sp))});
    rows.push_back({"two-way top-k 1%", "lossy",
                    gc::predict_two_way(bytes, cl, cp, codec(ak::gather, 0.08, 2.0, 20.0, sp))});
    // Hierarchical all-reduce (collective/hierarchical.hpp): float32 inside the nodes (or
    // bfloat16, converted at the fp16 codec's speed), the codec between them, every rank of a
    // node sending its shard (or one leader per node).
    if (cl.nodes() >= 2 && s.ranks_per_node >= 2) {
      gc::hierarchical_params leaders;
      leaders.lanes = 1;
      gc::hierarchical_params bf16_inside;
      bf16_inside.intra_ratio = 2.0;
      bf16_inside.intra_convert_bandwidth = 12.5e9 * sp;
      rows.push_back({"hier. fp16", "lossy",
                      gc::predict_hierarchical_allreduce(
                          bytes, cl, cp, codec(ak::summable, 2.0, 12.5, 14.0, sp))});
      rows.push_back({"hier. onebit", "lossy",
                      gc::predict_hierarchical_allreduce(
                          bytes, cl, cp, codec(ak::gather, 0.125, 23.2, 23.1, sp))});
      rows.push_back({"hier. onebit, bf16 in node", "lossy",
                      gc::predict_hierarchical_allreduce(
                          bytes, cl, cp, codec(ak::gather, 0.125, 23.2, 23.1, sp), bf16_inside)});
      rows.push_back({"hier. top-k 1%", "lossy",
                      gc::predict_hierarchical_allreduce(bytes, cl, cp,
                                                         codec(ak::gather, 0.08, 2.0, 20.0, sp))});
      rows.push_back({"hier. top-k 1%, leaders", "lossy",
                      gc::predict_hierarchical_allreduce(
                          bytes, cl, cp, codec(ak::gather, 0.08, 2.0, 20.0, sp), leaders)});
    }

    std::vector<gc::topology> tops;
    tops.push_back(gc::topology::complete(s.ranks));
    if (s.ranks % 2 == 0) tops.push_back(gc::topology::ring(s.ranks));
    tops.push_back(gc::topology::static_ring(s.ranks));
    if (std::has_single_bit(static_cast<unsigned>(s.ranks)))
      tops.push_back(gc::topology::one_peer_exponential(s.ranks));
    int const nodes = cl.nodes();
    if (nodes >= 2 && std::has_single_bit(static_cast<unsigned>(nodes))) {
      tops.push_back(gc::topology::alternating_exp_ring(s.ranks, s.ranks_per_node));
    }
    for (auto const& t : tops) {
      rows.push_back(
          {std::string("gossip ") + t.name(), "decentral", gc::predict_gossip(bytes, cl, cp, t)});
    }
    auto const choco = codec(ak::gather, 0.125, 23.2, 23.1, sp);
    rows.push_back({"CHOCO onebit static-ring", "decentral",
                    gc::predict_gossip(bytes, cl, cp, gc::topology::static_ring(s.ranks), &choco)});

    double const base = rows.front().t.total();
    std::printf(
        "model %.1fM parameters (%.1f MB fp32), %d ranks on %d node(s), intra %.0f GB/s, inter "
        "%.1f Gb/s",
        s.params / 1e6, bytes / 1e6, s.ranks, nodes, s.intra_gbytes, s.inter_gbits);
    if (s.fabric_gbits > 0) {
      std::printf(", fabric %.1f Gb/s shared by all inter-node flows\n", s.fabric_gbits);
    } else {
      std::printf(" (non-blocking fabric)\n");
    }
    std::printf("compute %.1f +- %.1f ms (backward %.0f%%), optimizer %.1f ms, overlap %s\n\n",
                s.compute_ms, s.compute_std_ms, 100.0 * s.backward_fraction, s.optimizer_ms,
                s.overlap ? "on" : "off");
    std::printf("%-26s %-9s %10s %9s %9s %9s %9s %9s %8s\n", "configuration", "kind", "MB/rank",
                "comm ms", "exposed", "codec ms", "compute", "total ms", "speedup");
    for (auto const& r : rows) {
      std::printf("%-26s %-9s %10.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7.2fx\n", r.name.c_str(),
                  r.kind, r.t.bytes_sent / 1e6, r.t.communication * 1e3, r.t.exposed * 1e3,
                  r.t.codec * 1e3, r.t.compute * 1e3, r.t.total() * 1e3, base / r.t.total());
    }
    if (cl.nodes() >= 2 && s.ranks_per_node >= 2) {
      std::puts(
          "(hier.: dense inside the node, the codec between nodes; its MB/rank counts the bytes "
          "sent inside the node too)");
    }
    auto const best = std::min_element(rows.begin(), rows.end(), [](row const& a, row const& b) {
      return a.t.total() < b.t.total();
    });
    std::printf("\nrecommended: %s (%.2f ms per iteration, %.2fx over dense all-reduce)\n",
                best->name.c_str(), best->t.total() * 1e3, base / best->t.total());
    if (best->t.total() > 0.95 * base) {
      std::puts(
          "communication is (nearly) hidden already: compression or gossip gains little here.");
    } else if (std::string_view(best->kind) != "exact") {
      std::puts(
          "note: this option changes the optimization (lossy gradients or gossip averaging); check "
          "that it reaches your accuracy in the same number of iterations "
          "(docs/decentralized.md).");
    }
    return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
