// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Runtime model: every formula against hand-computed cases, the straggler term against the
// known expected maxima of normal samples, and parameter validation.

#include <catch2/catch.hpp>

#include <gradcomp/model/runtime.hpp>
#include <gradcomp/topology/topology.hpp>

#include <cmath>
#include <limits>

namespace {

namespace gc = gradcomp;

gc::cluster_params cluster16() {
  gc::cluster_params c;
  c.ranks = 16;
  c.ranks_per_node = 4;
  c.intra = {1e-6, 1e11};
  c.inter = {1e-5, 1.25e9};  // 10 Gb/s
  return c;
}

gc::compute_params compute100ms() {
  gc::compute_params c;
  c.mean = 0.1;
  c.stddev = 0.01;
  c.backward_fraction = 2.0 / 3.0;
  c.optimizer = 0.005;
  return c;
}

}  // namespace

TEST_CASE("runtime model: collective formulas", "[runtime_model]") {
  REQUIRE(gc::ring_allreduce_time(1e9, 4, {1e-5, 1e10}) == Approx(6e-5 + 0.15).epsilon(1e-12));
  REQUIRE(gc::ring_allreduce_time(1e9, 1, {1e-5, 1e10}) == 0.0);
  REQUIRE(gc::allgather_time(1e6, 8, {2e-6, 1e9}) == Approx(7 * (2e-6 + 1e-3)).epsilon(1e-12));
  REQUIRE(gc::reduce_scatter_time(8e6, 8, {0.0, 1e9}) == Approx(7e-3).epsilon(1e-12));
}

TEST_CASE("runtime model: expected maximum of normal samples", "[runtime_model]") {
  double const pi = 3.141592653589793;
  REQUIRE(gc::expected_max_standard_normal(1) == 0.0);
  REQUIRE(gc::expected_max_standard_normal(2) == Approx(1.0 / std::sqrt(pi)).epsilon(1e-7));
  REQUIRE(gc::expected_max_standard_normal(3) == Approx(1.5 / std::sqrt(pi)).epsilon(1e-7));
  // Tabulated values (e.g. Harter 1961).
  REQUIRE(gc::expected_max_standard_normal(4) == Approx(1.0293754).epsilon(1e-6));
  REQUIRE(gc::expected_max_standard_normal(10) == Approx(1.5387527).epsilon(1e-6));
  REQUIRE(gc::expected_max_standard_normal(100) == Approx(2.5075937).epsilon(1e-6));
  // Grows like sqrt(2 ln n) but stays below it.
  for (int n : {10, 100, 1000, 100000}) {
    REQUIRE(gc::expected_max_standard_normal(n) < std::sqrt(2.0 * std::log(n)));
    REQUIRE(gc::expected_max_standard_normal(n) > gc::expected_max_standard_normal(n / 2));
  }
  REQUIRE_THROWS_AS(gc::expected_max_standard_normal(0), gc::config_error);
}

TEST_CASE("runtime model: all-reduce, compressed all-reduce and two-way", "[runtime_model]") {
  auto const cl = cluster16();
  auto const cp = compute100ms();
  double const e16 = gc::expected_max_standard_normal(16);
  double const m = 1e8;

  auto const ar = gc::predict_allreduce(m, cl, cp);
  double const comm = 2 * 15 * 1e-5 + 2.0 * 15 / 16 * m / 1.25e9;
  REQUIRE(ar.communication == Approx(comm).epsilon(1e-12));
  REQUIRE(ar.exposed == Approx(comm - 0.1 * 2 / 3).epsilon(1e-12));
  REQUIRE(ar.compute == Approx(0.1 + 0.01 * e16).epsilon(1e-12));
  REQUIRE(ar.total() == Approx(ar.compute + ar.exposed + 0.005).epsilon(1e-12));
  REQUIRE(ar.bytes_sent == Approx(2.0 * 15 / 16 * m));
  // Without overlap everything is exposed.
  auto serial = cp;
  serial.overlap = false;
  REQUIRE(gc::predict_allreduce(m, cl, serial).exposed == Approx(comm));
  // One node: the intra link.
  auto one = cl;
  one.ranks = 4;
  REQUIRE(gc::predict_allreduce(m, one, cp).communication == Approx(2 * 3 * 1e-6 + 1.5 * m / 1e11));

  gc::codec_params k;
  k.ratio = 32;
  k.compress_bandwidth = 1e10;
  k.decompress_bandwidth = 2e10;
  double const mc = m / 32;

  k.aggregation = gc::aggregation_kind::gather;
  auto const g = gc::predict_compressed_allreduce(m, cl, cp, k);
  REQUIRE(g.communication == Approx(15 * (1e-5 + mc / 1.25e9)).epsilon(1e-12));
  REQUIRE(g.codec == Approx(m / 1e10 + 16 * m / 2e10).epsilon(1e-12));
  REQUIRE(g.exposed == 0.0);
  REQUIRE(g.bytes_sent == Approx(15 * mc));

  k.aggregation = gc::aggregation_kind::summable;
  auto const s = gc::predict_compressed_allreduce(m, cl, cp, k);
  REQUIRE(s.communication == Approx(gc::ring_allreduce_time(mc, 16, cl.inter)).epsilon(1e-12));
  REQUIRE(s.codec == Approx(m / 1e10 + m / 2e10).epsilon(1e-12));
  k.aggregation = gc::aggregation_kind::shared_support;
  REQUIRE(gc::predict_compressed_allreduce(m, cl, cp, k).communication == Approx(s.communication));
  k.aggregation = gc::aggregation_kind::low_rank;
  REQUIRE(gc::predict_compressed_allreduce(m, cl, cp, k).communication ==
          Approx(2 * gc::ring_allreduce_time(mc / 2, 16, cl.inter)).epsilon(1e-12));

  auto const tw = gc::predict_two_way(m, cl, cp, k);
  REQUIRE(
      tw.communication ==
      Approx(15 * 1e-5 + 15.0 / 16 * mc / 1.25e9 + 15 * (1e-5 + mc / 16 / 1.25e9)).epsilon(1e-12));
  REQUIRE(tw.communication == Approx(gc::ring_allreduce_time(mc, 16, cl.inter)).epsilon(1e-12));
  REQUIRE(tw.codec == Approx((m + m / 16) / 1e10 + 2 * m / 2e10).epsilon(1e-12));
}

TEST_CASE("runtime model: gossip over the topologies", "[runtime_model]") {
  auto const cl = cluster16();
  auto const cp = compute100ms();
  double const m = 1e8;

  // One-peer exponential, 4 ranks per node: phases 0 and 1 stay in the node; in phases 2 and 3
  // all 4 ranks of a node cross, sharing the interface (bandwidth / 4).
  auto const exp = gc::predict_gossip(m, cl, cp, gc::topology::one_peer_exponential(16));
  double const intra = 2 * 1e-6 + m / 1e11;
  double const inter = 2 * 1e-5 + m / (1.25e9 / 4);
  REQUIRE(exp.communication == Approx((2 * intra + 2 * inter) / 4).epsilon(1e-12));
  REQUIRE(exp.exposed == Approx(2 * (inter - 0.1) / 4).epsilon(1e-12));
  REQUIRE(exp.compute == Approx(0.1 + 0.01 / std::sqrt(3.141592653589793)).epsilon(1e-7));
  REQUIRE(exp.bytes_sent == Approx(m));

  // AER: every phase has an inter-node group of 8 (one crossing edge per node) and intra groups.
  auto const aer = gc::predict_gossip(m, cl, cp, gc::topology::alternating_exp_ring(16, 4));
  double const group8 = 2 * 7 * 1e-5 + 2.0 * 7 / 8 * m / 1.25e9;
  REQUIRE(aer.communication == Approx(group8).epsilon(1e-12));
  REQUIRE(aer.exposed == Approx(group8 - 0.1).epsilon(1e-12));
  REQUIRE(aer.compute == Approx(0.1 + 0.01 * gc::expected_max_standard_normal(8)).epsilon(1e-12));

  // Complete: one all-reduce of the parameters, hidden behind the whole computation.
  auto const comp = gc::predict_gossip(m, cl, cp, gc::topology::complete(16));
  REQUIRE(comp.communication ==
          Approx(gc::predict_allreduce(m, cl, cp).communication).epsilon(1e-12));
  REQUIRE(comp.exposed == Approx(comp.communication - 0.1).epsilon(1e-12));

  // Static ring: two sends in turn; ranks 3 -> 4 etc. cross nodes.
  auto const sr = gc::predict_gossip(m, cl, cp, gc::topology::static_ring(16));
  REQUIRE(sr.communication == Approx((1e-6 + m / 1e11) + (1e-5 + m / 1.25e9)).epsilon(1e-12));
  REQUIRE(sr.bytes_sent == Approx(2 * m));

  // CHOCO-style compressed gossip on the ring: packets of m / 8 to each peer.
  gc::codec_params k;
  k.aggregation = gc::aggregation_kind::gather;
  k.ratio = 8;
  k.compress_bandwidth = 1e10;
  k.decompress_bandwidth = 1e10;
  auto const cg = gc::predict_gossip(m, cl, cp, gc::topology::static_ring(16), &k);
  REQUIRE(cg.communication ==
          Approx((1e-6 + m / 8 / 1e11) + (1e-5 + m / 8 / 1.25e9)).epsilon(1e-12));
  REQUIRE(cg.codec == Approx(m / 1e10 + 2 * m / 1e10).epsilon(1e-12));

  // Decentralized wins here: the all-reduce is exposed, AER's gossip much less.
  REQUIRE(aer.total() < gc::predict_allreduce(m, cl, cp).total());
}

TEST_CASE("runtime model: a shared fabric divides its bandwidth among concurrent flows",
          "[runtime_model]") {
  // The network lab: n single-rank nodes whose traffic all crosses one link of rate R.
  double const r = 1.25e8, a = 5e-5, m = 1.6e7;
  gc::cluster_params lab;
  lab.ranks = 4;
  lab.ranks_per_node = 1;
  lab.inter = {a, r};
  lab.intra = {a, r};
  gc::compute_params idle;  // communication only
  // A non-blocking fabric (the default) leaves the per-interface results unchanged.
  REQUIRE(gc::predict_allreduce(m, lab, idle).communication ==
          Approx(gc::ring_allreduce_time(m, 4, {a, r})).epsilon(1e-12));
  lab.fabric_bandwidth = r;
  REQUIRE(lab.bottleneck().bandwidth == Approx(r / 4).epsilon(1e-15));
  // Ring all-reduce: every rank sends 2(n-1)/n m at once; all of it crosses the one link.
  REQUIRE(gc::predict_allreduce(m, lab, idle).total() ==
          Approx(6 * a + 6 * m / r).epsilon(1e-12));
  // All-gather of n packets (gather kind): n (n-1) packets cross the link.
  gc::codec_params k;
  k.aggregation = gc::aggregation_kind::gather;
  k.ratio = 32;
  auto const g = gc::predict_compressed_allreduce(m, lab, idle, k);
  REQUIRE(g.communication == Approx(3 * (a + 4 * (m / 32) / r)).epsilon(1e-12));
  // One-peer exponential: 4 flows at once, each m.
  auto const e = gc::predict_gossip(m, lab, idle, gc::topology::one_peer_exponential(4));
  REQUIRE(e.communication == Approx(2 * a + 4 * m / r).epsilon(1e-12));
  // Static ring: each rank sends m to two peers in turn, 4 flows at any moment.
  auto const s = gc::predict_gossip(m, lab, idle, gc::topology::static_ring(4));
  REQUIRE(s.communication == Approx(2 * (a + 4 * m / r)).epsilon(1e-12));
  // A fabric faster than the interfaces changes nothing; a slower one caps every flow.
  gc::cluster_params c = cluster16();
  double const base = gc::predict_allreduce(1e8, c, compute100ms()).communication;
  c.fabric_bandwidth = 1e12;
  REQUIRE(gc::predict_allreduce(1e8, c, compute100ms()).communication == Approx(base));
  c.fabric_bandwidth = 1.25e9;  // 4 node-crossing ring edges share one interface's worth
  REQUIRE(c.bottleneck().bandwidth == Approx(1.25e9 / 4));
  REQUIRE(gc::predict_allreduce(1e8, c, compute100ms()).communication > 3.9 * base - 1e-3);
  c.fabric_bandwidth = 0.0;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1e8, c, compute100ms()), gc::config_error);
}

TEST_CASE("runtime model rejects invalid parameters", "[runtime_model]") {
  auto const cp = compute100ms();
  auto cl = cluster16();
  REQUIRE_THROWS_AS(gc::predict_allreduce(-1.0, cl, cp), gc::config_error);
  REQUIRE_THROWS_AS(gc::predict_allreduce(std::nan(""), cl, cp), gc::config_error);
  cl.ranks_per_node = 3;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, cp), gc::config_error);
  cl = cluster16();
  cl.inter.bandwidth = 0.0;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, cp), gc::config_error);
  cl = cluster16();
  cl.intra.latency = -1.0;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, cp), gc::config_error);
  cl = cluster16();
  cl.ranks = 0;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, cp), gc::config_error);
  cl = cluster16();
  auto bad = cp;
  bad.backward_fraction = 1.5;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, bad), gc::config_error);
  bad = cp;
  bad.stddev = -0.1;
  REQUIRE_THROWS_AS(gc::predict_allreduce(1.0, cl, bad), gc::config_error);
  gc::codec_params k;
  k.ratio = 0.0;
  REQUIRE_THROWS_AS(gc::predict_compressed_allreduce(1.0, cl, cp, k), gc::config_error);
  k = {};
  k.compress_bandwidth = 0.0;
  REQUIRE_THROWS_AS(gc::predict_two_way(1.0, cl, cp, k), gc::config_error);
  REQUIRE_THROWS_AS(gc::predict_gossip(1.0, cl, cp, gc::topology::ring(8)), gc::config_error);
  REQUIRE_THROWS_AS(gc::predict_gossip(1.0, cl, cp, gc::topology::alternating_exp_ring(16, 8)),
                    gc::config_error);
}

namespace {

gc::codec_params gather_codec(double ratio, double compress, double decompress) {
  gc::codec_params k;
  k.aggregation = gc::aggregation_kind::gather;
  k.ratio = ratio;
  k.compress_bandwidth = compress;
  k.decompress_bandwidth = decompress;
  return k;
}

}  // namespace

TEST_CASE("runtime model: hierarchical all-reduce against hand-computed figures",
          "[runtime_model]") {
  // 2 nodes of 4 ranks, 100 MB gradient, a gather codec of ratio 32 (10 / 20 GB/s).
  gc::cluster_params cl;
  cl.ranks = 8;
  cl.ranks_per_node = 4;
  cl.intra = {1e-6, 100e9};
  cl.inter = {10e-6, 3e9};
  gc::compute_params cp = compute100ms();
  gc::codec_params k = gather_codec(32, 10e9, 20e9);
  double const m = 100e6;

  // Every lane (L = 4): 25 MB slices inside the node; 4 lanes share each interface (3e9 / 4).
  gc::iteration_time const t = gc::predict_hierarchical_allreduce(m, cl, cp, k);
  double const rs = 3 * 1e-6 + 3 * 25e6 / 100e9;  // 7.53e-4
  double const inter = 1e-5 + 781250.0 / 7.5e8;   // T_ag(2 nodes, 3.125 MB / 4)
  double const ag = 3 * (1e-6 + 25e6 / 100e9);    // 7.53e-4
  CHECK(t.communication == Approx(rs + inter + ag).epsilon(1e-12));
  CHECK(t.communication == Approx(2.5576666667e-3).epsilon(1e-9));
  CHECK(t.codec == Approx(25e6 / 10e9 + 2 * 25e6 / 20e9).epsilon(1e-12));  // 5 ms
  CHECK(t.bytes_sent == Approx(75e6 + 781250.0 + 75e6).epsilon(1e-12));
  CHECK(t.compute == Approx(gc::expected_max_compute(cp, 8)).epsilon(1e-12));
  CHECK(t.exposed == 0.0);  // hidden behind the backward pass (66.7 ms)

  // A leader per node (L = 1): the whole 100 MB to the leader, one flow per interface.
  gc::hierarchical_params leader;
  leader.lanes = 1;
  gc::iteration_time const u = gc::predict_hierarchical_allreduce(m, cl, cp, k, leader);
  CHECK(u.communication == Approx(2 * (3e-6 + 3e-3) + (1e-5 + 3.125e6 / 3e9)).epsilon(1e-12));
  CHECK(u.codec == Approx(100e6 / 10e9 + 2 * 100e6 / 20e9).epsilon(1e-12));
  CHECK(u.bytes_sent == Approx(3.125e6 + 3 * 100e6).epsilon(1e-12));  // the leader's

  // 16-bit inside the node, converted at 10 GB/s: half the intra bytes, the conversions charged.
  gc::hierarchical_params half;
  half.intra_ratio = 2;
  half.intra_convert_bandwidth = 10e9;
  gc::iteration_time const v = gc::predict_hierarchical_allreduce(m, cl, cp, k, half);
  CHECK(v.communication == Approx(2 * (3e-6 + 3 * 12.5e6 / 100e9) + inter).epsilon(1e-12));
  CHECK(v.codec == Approx(t.codec + (2 * m + 5 * m / 4) / 10e9).epsilon(1e-12));

  // A summable codec: each lane ring-all-reduces its shard between the nodes.
  k.aggregation = gc::aggregation_kind::summable;
  k.ratio = 2;
  gc::iteration_time const w = gc::predict_hierarchical_allreduce(m, cl, cp, k);
  CHECK(w.communication ==
        Approx(rs + gc::ring_allreduce_time(12.5e6, 2, {10e-6, 7.5e8}) + ag).epsilon(1e-12));
  CHECK(w.codec == Approx(25e6 / 10e9 + 25e6 / 20e9).epsilon(1e-12));

  // A shared fabric of 1.5 GB/s: 8 flows between the nodes share it (1.5e9 / 8 < 3e9 / 4).
  cl.fabric_bandwidth = 1.5e9;
  k.aggregation = gc::aggregation_kind::gather;
  k.ratio = 32;
  gc::iteration_time const f = gc::predict_hierarchical_allreduce(m, cl, cp, k);
  CHECK(f.communication == Approx(rs + 1e-5 + 781250.0 / 1.875e8 + ag).epsilon(1e-12));
}

TEST_CASE("runtime model: hierarchical all-reduce at the edges", "[runtime_model]") {
  gc::compute_params cp = compute100ms();
  gc::codec_params k = gather_codec(16, 5e9, 8e9);
  // One rank per node: exactly the flat compressed all-reduce.
  gc::cluster_params flat = cluster16();
  flat.ranks_per_node = 1;
  flat.fabric_bandwidth = 4e9;
  gc::iteration_time const h = gc::predict_hierarchical_allreduce(64e6, flat, cp, k);
  gc::iteration_time const c = gc::predict_compressed_allreduce(64e6, flat, cp, k);
  CHECK(h.communication == Approx(c.communication).epsilon(1e-12));
  CHECK(h.codec == Approx(c.codec).epsilon(1e-12));
  CHECK(h.bytes_sent == Approx(c.bytes_sent).epsilon(1e-12));
  CHECK(h.total() == Approx(c.total()).epsilon(1e-12));
  // One node: no codec, only the intra-node reduce-scatter and all-gather.
  gc::cluster_params one = cluster16();
  one.ranks = 4;
  gc::iteration_time const o = gc::predict_hierarchical_allreduce(64e6, one, cp, k);
  CHECK(o.codec == 0.0);
  CHECK(o.communication == Approx(2 * (3e-6 + 3 * 16e6 / 1e11)).epsilon(1e-12));
  // On cluster16 (4 nodes of 4, 10 Gb/s) hierarchical onebit-like gather beats the flat one:
  // 4 lanes of a quarter each instead of 16 ranks all-gathering full packets.
  gc::cluster_params cl = cluster16();
  CHECK(gc::predict_hierarchical_allreduce(64e6, cl, cp, k).communication <
        gc::predict_compressed_allreduce(64e6, cl, cp, k).communication);
  // What is refused.
  gc::hierarchical_params bad;
  bad.lanes = 5;
  CHECK_THROWS_WITH(gc::predict_hierarchical_allreduce(64e6, cl, cp, k, bad),
                    Catch::Contains("lanes"));
  bad.lanes = 0;
  bad.intra_ratio = 0;
  CHECK_THROWS_WITH(gc::predict_hierarchical_allreduce(64e6, cl, cp, k, bad),
                    Catch::Contains("intra_ratio"));
  k.aggregation = gc::aggregation_kind::low_rank;
  CHECK_THROWS_WITH(gc::predict_hierarchical_allreduce(64e6, cl, cp, k),
                    Catch::Contains("not low-rank"));
}

TEST_CASE("runtime model refuses non-normal and out-of-range inputs; at the limits it stays finite",
          "[runtime_model]") {
  auto const cp = compute100ms();
  double const denormal = std::numeric_limits<double>::denorm_min();
  auto refuses = [&](auto change) {
    auto cl = cluster16();
    auto c = cp;
    gc::codec_params k;
    gc::hierarchical_params h;
    change(cl, c, k, h);
    CHECK_THROWS_AS(gc::predict_allreduce(1e6, cl, c), gc::config_error);
    CHECK_THROWS_AS(gc::predict_hierarchical_allreduce(1e6, cl, c, k, h), gc::config_error);
  };
  using C = gc::cluster_params;
  using P = gc::compute_params;
  using K = gc::codec_params;
  using H = gc::hierarchical_params;
  // A denormal fabric bandwidth divided by the flow count underflowed to 0: NaN or inf.
  refuses([&](C& cl, P&, K&, H&) { cl.fabric_bandwidth = denormal; });
  refuses([&](C& cl, P&, K&, H&) { cl.fabric_bandwidth = 1e-300; });
  refuses([&](C& cl, P&, K&, H&) { cl.inter.bandwidth = denormal; });
  refuses([&](C& cl, P&, K&, H&) { cl.intra.bandwidth = 1e300; });
  refuses([&](C& cl, P&, K&, H&) { cl.inter.latency = denormal; });
  refuses([&](C& cl, P&, K&, H&) { cl.inter.latency = 1e300; });
  // Rank counts a topology cannot index (from_name accepted them up to INT_MAX).
  refuses([&](C& cl, P&, K&, H&) {
    cl.ranks = std::numeric_limits<int>::max() - 1;
    cl.ranks_per_node = 1;
  });
  refuses([&](C&, P& c, K&, H&) { c.mean = denormal; });
  refuses([&](C&, P& c, K&, H&) { c.stddev = 1e300; });
  refuses([&](C&, P& c, K&, H&) { c.backward_fraction = denormal; });
  refuses([&](C&, P& c, K&, H&) { c.optimizer = denormal; });
  auto codec_refuses = [&](auto change) {
    gc::codec_params k;
    change(k);
    CHECK_THROWS_AS(gc::predict_compressed_allreduce(1e6, cluster16(), cp, k), gc::config_error);
  };
  codec_refuses([&](K& k) { k.ratio = denormal; });
  codec_refuses([&](K& k) { k.ratio = 1e300; });
  codec_refuses([&](K& k) { k.compress_bandwidth = denormal; });
  codec_refuses([&](K& k) { k.decompress_bandwidth = 1e-300; });
  gc::hierarchical_params h;
  h.intra_ratio = denormal;
  CHECK_THROWS_AS(gc::predict_hierarchical_allreduce(1e6, cluster16(), cp, {}, h),
                  gc::config_error);
  h = {};
  h.intra_convert_bandwidth = denormal;
  CHECK_THROWS_AS(gc::predict_hierarchical_allreduce(1e6, cluster16(), cp, {}, h),
                  gc::config_error);
  CHECK_THROWS_AS(gc::predict_allreduce(1e300, cluster16(), cp), gc::config_error);

  // The most extreme accepted inputs give finite predictions.
  gc::cluster_params cl;
  cl.ranks = gc::topology::max_ranks;
  cl.ranks_per_node = 1;
  cl.inter = {gc::model_limits::max_seconds, gc::model_limits::min_bandwidth};
  cl.intra = {gc::model_limits::max_seconds, gc::model_limits::min_bandwidth};
  cl.fabric_bandwidth = gc::model_limits::min_bandwidth;
  gc::codec_params k;
  k.ratio = gc::model_limits::min_ratio;
  k.compress_bandwidth = gc::model_limits::min_bandwidth;
  k.decompress_bandwidth = gc::model_limits::min_bandwidth;
  for (double bytes : {0.0, 1.0, gc::model_limits::max_bytes}) {
    CAPTURE(bytes);
    CHECK(std::isfinite(gc::predict_allreduce(bytes, cl, cp).total()));
    CHECK(std::isfinite(gc::predict_compressed_allreduce(bytes, cl, cp, k).total()));
    CHECK(std::isfinite(gc::predict_two_way(bytes, cl, cp, k).total()));
    CHECK(std::isfinite(gc::predict_hierarchical_allreduce(bytes, cl, cp, k).total()));
  }
}
