// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Topologies: partitions, doubly stochastic symmetric mixing matrices, the documented
// schedules, exact averaging of the exponential graph and AER, consensus under gossip, and
// parameter validation.

#include <catch2/catch.hpp>

#include <gradcomp/optim/mixing.hpp>
#include <gradcomp/topology/topology.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <vector>

namespace {

namespace gc = gradcomp;

std::vector<gc::topology> every_topology() {
  std::vector<gc::topology> out;
  for (int n = 1; n <= 17; ++n) out.push_back(gc::topology::complete(n));
  for (int n = 2; n <= 32; n += 2) out.push_back(gc::topology::ring(n));
  for (int n = 1; n <= 17; ++n) out.push_back(gc::topology::static_ring(n));
  for (int n = 1; n <= 128; n *= 2) out.push_back(gc::topology::one_peer_exponential(n));
  for (int p : {1, 2, 3, 4, 8}) {
    for (int nodes : {2, 4, 8, 16}) out.push_back(gc::topology::alternating_exp_ring(p * nodes, p));
  }
  return out;
}

std::vector<double> multiply(std::vector<double> const& a, std::vector<double> const& b,
                             std::size_t n) {
  std::vector<double> c(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] += a[i * n + k] * b[k * n + j];
  return c;
}

std::set<std::vector<int>> group_set(gc::topology const& t, std::uint64_t step) {
  std::set<std::vector<int>> s;
  for (auto const& g : t.groups(step)) s.insert(g.ranks);
  return s;
}

double consensus_distance(std::vector<std::vector<float>> const& x) {
  std::size_t const d = x[0].size();
  double total = 0.0;
  for (std::size_t k = 0; k < d; ++k) {
    double mean = 0.0;
    for (auto const& xi : x) mean += xi[k];
    mean /= static_cast<double>(x.size());
    for (auto const& xi : x) total += (xi[k] - mean) * (xi[k] - mean);
  }
  return total;
}

// One synchronous gossip step of every rank with W^(step).
void mix_all(gc::topology const& t, std::uint64_t step, std::vector<std::vector<float>>& x) {
  std::vector<std::vector<float>> next = x;
  for (int i = 0; i < t.size(); ++i) {
    gc::mix_row(
        t.row(step, i),
        [&](int j) { return std::span<float const>(x[static_cast<std::size_t>(j)]); },
        std::span<float>(next[static_cast<std::size_t>(i)]));
  }
  x = std::move(next);
}

}  // namespace

TEST_CASE("mixing matrices are symmetric and doubly stochastic; groups partition the ranks",
          "[topology]") {
  for (auto const& t : every_topology()) {
    auto const n = static_cast<std::size_t>(t.size());
    INFO(t.name() << " n=" << n << " p=" << t.ranks_per_node());
    for (std::uint64_t step = 0; step < 2 * t.period() + 3; ++step) {
      std::vector<double> const w = gc::mixing_matrix(t, step);
      bool nonnegative = true;
      bool symmetric = true;
      double worst = 0.0;  // largest deviation of a row or column sum from 1
      for (std::size_t i = 0; i < n; ++i) {
        double row = 0.0;
        double col = 0.0;
        for (std::size_t j = 0; j < n; ++j) {
          nonnegative = nonnegative && w[i * n + j] >= 0.0;
          symmetric = symmetric && w[i * n + j] == w[j * n + i];
          row += w[i * n + j];
          col += w[j * n + i];
        }
        worst = std::max({worst, std::abs(row - 1.0), std::abs(col - 1.0)});
      }
      REQUIRE(nonnegative);
      REQUIRE(symmetric);
      REQUIRE(worst <= 1e-12);
      // Same phase, same matrix.
      REQUIRE(gc::mixing_matrix(t, step + t.period()) == w);
      if (t.group_based()) {
        auto const groups = t.groups(step);
        REQUIRE_NOTHROW(gc::check_partition(groups, t.size()));
        bool uniform = true;
        for (auto const& g : groups) {
          double const expect = 1.0 / static_cast<double>(g.ranks.size());
          for (int a : g.ranks) {
            for (int b : g.ranks) {
              uniform = uniform &&
                        std::abs(w[static_cast<std::size_t>(a) * n + static_cast<std::size_t>(b)] -
                                 expect) <= 1e-15;
            }
          }
        }
        REQUIRE(uniform);
      }
    }
  }
}

TEST_CASE("topology schedules follow the documented pairings", "[topology]") {
  using S = std::set<std::vector<int>>;
  auto const ring = gc::topology::ring(6);
  REQUIRE(ring.period() == 2);
  REQUIRE(group_set(ring, 0) == S{{0, 1}, {2, 3}, {4, 5}});
  REQUIRE(group_set(ring, 1) == S{{0, 5}, {1, 2}, {3, 4}});
  REQUIRE(group_set(ring, 2) == group_set(ring, 0));

  auto const exp = gc::topology::one_peer_exponential(8);
  REQUIRE(exp.period() == 3);
  REQUIRE(group_set(exp, 0) == S{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  REQUIRE(group_set(exp, 1) == S{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  REQUIRE(group_set(exp, 2) == S{{0, 4}, {1, 5}, {2, 6}, {3, 7}});

  // 4 nodes of 2: round 0 pairs nodes (0,1) and (2,3); round 1 pairs (0,2) and (1,3). The first
  // pair of a round goes intra-node first, the second inter-node first.
  auto const aer = gc::topology::alternating_exp_ring(8, 2);
  REQUIRE(aer.period() == 4);
  REQUIRE(aer.nodes() == 4);
  REQUIRE(group_set(aer, 0) == S{{0, 1}, {2, 3}, {4, 5, 6, 7}});
  REQUIRE(group_set(aer, 1) == S{{0, 1, 2, 3}, {4, 5}, {6, 7}});
  REQUIRE(group_set(aer, 2) == S{{0, 1}, {4, 5}, {2, 3, 6, 7}});
  REQUIRE(group_set(aer, 3) == S{{0, 1, 4, 5}, {2, 3}, {6, 7}});
  REQUIRE(aer.degree(0, 0) == 1);
  REQUIRE(aer.degree(0, 4) == 3);
  REQUIRE(aer.max_degree() == 3);

  auto const sr = gc::topology::static_ring(5);
  auto const row = sr.row(7, 0);
  REQUIRE(row.peers() == std::vector<int>{1, 4});
  REQUIRE(row.self_weight() == Approx(1.0 / 3.0));
  REQUIRE(sr.max_degree() == 2);
  REQUIRE(gc::topology::static_ring(2).row(0, 0).entries.size() == 2);
  REQUIRE(gc::topology::complete(5).degree(3, 2) == 4);
  REQUIRE(gc::topology::from_name("aer", 16, 4).nodes() == 4);
}

TEST_CASE("one-peer exponential and AER average exactly over one period", "[topology]") {
  // Matrix product: exactly J/n for powers of two (every entry a power of two).
  for (int n = 2; n <= 64; n *= 2) {
    auto const t = gc::topology::one_peer_exponential(n);
    auto const un = static_cast<std::size_t>(n);
    std::vector<double> p = gc::mixing_matrix(t, 0);
    for (std::uint64_t s = 1; s < t.period(); ++s) p = multiply(gc::mixing_matrix(t, s), p, un);
    for (double v : p) REQUIRE(v == 1.0 / n);
  }
  for (int pn : {1, 2, 3, 4}) {
    for (int nodes : {2, 4, 8}) {
      auto const t = gc::topology::alternating_exp_ring(pn * nodes, pn);
      auto const un = static_cast<std::size_t>(t.size());
      std::vector<double> p = gc::mixing_matrix(t, 0);
      for (std::uint64_t s = 1; s < t.period(); ++s) p = multiply(gc::mixing_matrix(t, s), p, un);
      for (double v : p) REQUIRE(v == Approx(1.0 / t.size()).margin(1e-14));
    }
  }
  // In float32 with mix_row: after log2(n) steps every rank holds the same bits. With integer
  // inputs every partial average is a dyadic rational that fits, so the result is the exact
  // mean; with Gaussian inputs it is within log2(n) roundings of it (each pair average is
  // rounded once: |error| <= log2(n) * 2^-24 * max|x|).
  for (int n = 2; n <= 64; n *= 2) {
    auto const t = gc::topology::one_peer_exponential(n);
    gradcomp_test::test_rng rng(static_cast<std::uint64_t>(n));
    std::vector<std::vector<float>> xi(static_cast<std::size_t>(n), std::vector<float>(33));
    std::vector<std::vector<float>> xg = xi;
    double maxabs = 0.0;
    for (std::size_t r = 0; r < xi.size(); ++r) {
      for (std::size_t k = 0; k < 33; ++k) {
        xi[r][k] = static_cast<float>(static_cast<int>(rng.below(2001)) - 1000);
        xg[r][k] = static_cast<float>(rng.gaussian());
        maxabs = std::max(maxabs, std::abs(static_cast<double>(xg[r][k])));
      }
    }
    std::vector<double> mean_i(33, 0.0), mean_g(33, 0.0);
    for (std::size_t k = 0; k < 33; ++k) {
      for (std::size_t r = 0; r < xi.size(); ++r) {
        mean_i[k] += xi[r][k];
        mean_g[k] += xg[r][k];
      }
      mean_i[k] /= n;
      mean_g[k] /= n;
    }
    for (std::uint64_t s = 0; s < t.period(); ++s) {
      mix_all(t, s, xi);
      mix_all(t, s, xg);
    }
    double const bound = static_cast<double>(t.period()) * 0x1p-24 * maxabs;
    for (std::size_t r = 0; r < xi.size(); ++r) {
      REQUIRE(xg[r] == xg[0]);
      for (std::size_t k = 0; k < 33; ++k) {
        REQUIRE(static_cast<double>(xi[r][k]) == mean_i[k]);
        REQUIRE(std::abs(xg[r][k] - mean_g[k]) <= bound);
      }
    }
  }
}

TEST_CASE("gossip shrinks the consensus distance and keeps the mean", "[topology]") {
  std::vector<gc::topology> const tops = {gc::topology::ring(8), gc::topology::static_ring(7),
                                          gc::topology::alternating_exp_ring(12, 3),
                                          gc::topology::one_peer_exponential(16)};
  for (auto const& t : tops) {
    INFO(t.name());
    std::vector<std::vector<float>> x;
    for (int r = 0; r < t.size(); ++r)
      x.push_back(gradcomp_test::gaussian(20, 100 + static_cast<std::uint64_t>(r)));
    double mean0 = 0.0;
    for (auto const& xi : x) mean0 += xi[3];
    double const d0 = consensus_distance(x);
    double prev = d0;
    for (std::uint64_t s = 0; s < 60; ++s) {
      mix_all(t, s, x);
      double const d = consensus_distance(x);
      REQUIRE(d <=
              prev + 1e-12 * d0);  // ||W z|| <= ||z|| for symmetric stochastic W (float rounding)
      prev = d;
    }
    REQUIRE(prev < 1e-3 * d0);
    double mean1 = 0.0;
    for (auto const& xi : x) mean1 += xi[3];
    REQUIRE(mean1 == Approx(mean0).margin(1e-4));
  }
}

TEST_CASE("topologies reject invalid parameters", "[topology]") {
  REQUIRE_THROWS_AS(gc::topology::complete(0), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::ring(7), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::static_ring(-1), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::one_peer_exponential(6), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::alternating_exp_ring(12, 4), gc::config_error);  // 3 nodes
  REQUIRE_THROWS_AS(gc::topology::alternating_exp_ring(8, 3),
                    gc::config_error);  // 3 does not divide 8
  REQUIRE_THROWS_AS(gc::topology::alternating_exp_ring(4, 4), gc::config_error);  // one node
  REQUIRE_THROWS_AS(gc::topology::alternating_exp_ring(8, 0), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::from_name("star", 4), gc::config_error);
  REQUIRE_THROWS_WITH(gc::topology::one_peer_exponential(12), Catch::Contains("power-of-two"));
  auto const t = gc::topology::ring(4);
  REQUIRE_THROWS_AS(t.row(0, 4), gc::config_error);
  REQUIRE_THROWS_AS(t.group_of(0, -1), gc::config_error);
  REQUIRE_THROWS_AS(gc::topology::static_ring(5).groups(0), gc::config_error);

  using G = gc::mixing_group;
  REQUIRE_NOTHROW(gc::check_partition({G{{0, 1}, 0.5}, G{{2}, 1.0}}, 3));
  REQUIRE_THROWS_AS(gc::check_partition({G{{0, 1}, 0.5}}, 3), gc::config_error);  // 2 missing
  REQUIRE_THROWS_AS(gc::check_partition({G{{0, 1}, 0.5}, G{{1, 2}, 0.5}}, 3),
                    gc::config_error);  // 1 twice
  REQUIRE_THROWS_AS(gc::check_partition({G{{1, 0}, 0.5}, G{{2}, 1.0}}, 3),
                    gc::config_error);                                               // order
  REQUIRE_THROWS_AS(gc::check_partition({G{{0, 1, 2}, 0.0}}, 3), gc::config_error);  // keep 0
  REQUIRE_THROWS_AS(gc::check_partition({G{{0, 3}, 0.5}}, 3), gc::config_error);     // rank 3
}

TEST_CASE("group all-reduce coefficients reproduce the mixing row", "[topology]") {
  std::vector<gc::mixing_group> const groups = {gc::mixing_group{{0, 2, 5}, 0.5}, gc::mixing_group{{1, 3}, 0.5},
                                                gc::mixing_group{{4}, 1.0},
                                                gc::mixing_group{{0, 1, 2, 3}, 0.25}};
  std::vector<double> const x = {1.5, -2.0, 4.0, 0.25, 8.0, -3.0};
  for (auto const& g : groups) {
    auto const c = gc::group_mixing(g);
    double sum = 0.0;
    for (int r : g.ranks) sum += c.send_scale * x[static_cast<std::size_t>(r)];
    for (int i : g.ranks) {
      double expect = 0.0;
      for (int j : g.ranks) expect += g.weight(i, j) * x[static_cast<std::size_t>(j)];
      REQUIRE(c.self_scale * x[static_cast<std::size_t>(i)] + sum == Approx(expect).epsilon(1e-12));
    }
  }
  REQUIRE(gc::group_mixing(gc::mixing_group{{0, 1}, 0.5}).self_scale == 0.0);
  REQUIRE_THROWS_AS(gc::group_mixing(gc::mixing_group{}), gc::config_error);
}

TEST_CASE("topologies refuse rank counts they cannot index; at the limit the rows are right",
          "[topology]") {
  int const big = std::numeric_limits<int>::max();
  for (char const* name : {"complete", "ring", "static-ring", "exp", "aer"}) {
    CAPTURE(name);
    // INT_MAX - 1 ranks overflowed rank + n - 1 (static ring, ring phase 1)
    CHECK_THROWS_AS(gc::topology::from_name(name, big - 1, 2), gc::config_error);
    CHECK_THROWS_AS(gc::topology::from_name(name, big, 1), gc::config_error);
    CHECK_THROWS_AS(gc::topology::from_name(name, gc::topology::max_ranks * 2, 2),
                    gc::config_error);
  }
  int const n = gc::topology::max_ranks;
  auto const sr = gc::topology::from_name("static-ring", n);
  std::vector<int> const peers0 = sr.row(0, 0).peers();
  CHECK(peers0 == std::vector<int>{1, n - 1});
  std::vector<int> const peers_last = sr.row(0, n - 1).peers();
  CHECK(peers_last == std::vector<int>{0, n - 2});
  auto const ring = gc::topology::from_name("ring", n);
  CHECK(ring.group_of(1, 0).ranks == std::vector<int>{0, n - 1});
  CHECK(ring.group_of(1, n - 2).ranks == std::vector<int>{n - 3, n - 2});
  auto const exp = gc::topology::from_name("exp", n);
  CHECK(exp.group_of(23, n - 1).ranks == std::vector<int>{(n - 1) ^ (1 << 23), n - 1});
}
