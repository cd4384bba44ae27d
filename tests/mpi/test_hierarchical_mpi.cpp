// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Groups and the hierarchical all-reduce over MPI ranks grouped as nodes (2 or 4 ranks): group
// collectives on the MPI communicator's point-to-point messages; the identity codec equal to
// the dense all-reduce for every grouping that fits the world; mass conservation of the owners'
// error feedback; a grouping that is invalid on one rank and a non-finite node sum refused on
// every rank without a hang, each rank's state unchanged.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/comm/group.hpp>
#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include "check.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;

namespace {

mpi_options hier_mpi_options() {
  mpi_options o;
  o.timeout = 60s;
  return o;
}

// Deterministic gradient of `rank` at `step`: small integers (exact sums in any order) or real
// values of several magnitudes (sums round).
std::vector<float> grad_of(std::size_t n, int rank, int step, bool integers) {
  std::vector<float> g(n);
  std::uint32_t x =
      2654435761u * static_cast<std::uint32_t>(rank + 1) + 97u * static_cast<std::uint32_t>(step);
  for (auto& v : g) {
    x = x * 1664525u + 1013904223u;
    v = integers
            ? static_cast<float>(static_cast<int>((x >> 8) % 17) - 8)
            : (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * static_cast<float>(1u << (x % 5));
  }
  return g;
}

// The groupings that fit a world of `w` ranks.
std::vector<node_grouping> groupings(int w) {
  std::vector<node_grouping> out{node_grouping::uniform(1), node_grouping::uniform(w)};
  if (w % 2 == 0) out.push_back(node_grouping::uniform(2));
  if (w >= 3) {  // uneven: ranks 0 .. w-2 on one node, the last alone
    std::vector<int> labels(static_cast<std::size_t>(w), 0);
    labels.back() = 1;
    out.push_back(node_grouping::labelled(labels));
  }
  return out;
}

}  // namespace

MPI_TEST(group_all_reduce_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, hier_mpi_options());
  std::vector<int> members;
  for (int r = c.rank() % 2; r < c.size(); r += 2) members.push_back(r);
  group_communicator g(c, members);
  std::vector<std::int64_t> v(1001, c.rank() + 1);
  g.all_reduce(std::as_writable_bytes(std::span(v)), comm_type::i64, reduce_op::sum);
  std::int64_t want = 0;
  for (int r : members) want += r + 1;
  bool all = true;
  for (auto x : v) all = all && x == want;
  MPI_CHECK(all);
  // Two groups in flight at once: the world and the parity group.
  std::vector<int> everyone;
  for (int r = 0; r < c.size(); ++r) everyone.push_back(c.size() - 1 - r);
  group_communicator world(c, everyone, {.tag_base = 0x7400, .tag_count = 64});
  std::vector<float> a(33, 1.0f), b(17, 2.0f);
  request ra =
      world.iall_reduce(std::as_writable_bytes(std::span(a)), comm_type::f32, reduce_op::sum);
  request rb = g.iall_reduce(std::as_writable_bytes(std::span(b)), comm_type::f32, reduce_op::sum);
  ra.wait();
  rb.wait();
  MPI_CHECK(a[32] == static_cast<float>(c.size()));
  MPI_CHECK(b[16] == 2.0f * static_cast<float>(members.size()));
}

MPI_TEST(hierarchical_identity_equals_dense_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, hier_mpi_options());
  for (node_grouping const& nodes : groupings(c.size())) {
    for (dense_format intra : {dense_format::f32, dense_format::bf16}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{1001}}) {
        std::vector<float> const g = grad_of(n, c.rank(), 0, true);
        std::vector<float> out(n), dense(n);
        hierarchical_options opt;
        opt.nodes = nodes;
        opt.intra = intra;
        all_reduce_hierarchical(c, make_codec("identity"),
                                tensor_view<float const>(std::span<float const>(g), tensor_id{1}),
                                std::span<float>(out), {}, opt);
        all_reduce_dense(c, std::span<float const>(g), std::span<float>(dense));
        MPI_CHECK(out == dense);
      }
    }
  }
}

MPI_TEST(hierarchical_error_feedback_conserves_mass_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, hier_mpi_options());
  std::size_t const n = 777;
  int const steps = 5;
  tensor_id const id{4};
  for (node_grouping const& nodes : groupings(c.size())) {
    node_layout const layout = nodes.layout(c.size());
    if (layout.nodes() < 2) continue;  // one node: no codec, nothing to conserve
    compressor<any_codec, residual_feedback> ef(make_codec("topk:ratio=0.05"));
    hierarchical_options opt;
    opt.nodes = nodes;
    std::vector<double> delivered(n, 0.0), inputs(n, 0.0), magnitude(n, 1.0);
    for (int t = 0; t < steps; ++t) {
      codec_context ctx;
      ctx.step = static_cast<std::uint32_t>(t);
      std::vector<float> const g = grad_of(n, c.rank(), t, false);
      std::vector<float> out(n);
      all_reduce_hierarchical(c, ef, tensor_view<float const>(std::span<float const>(g), id),
                              std::span<float>(out), ctx, opt);
      for (std::size_t i = 0; i < n; ++i) delivered[i] += out[i];
      for (int r = 0; r < c.size(); ++r) {
        std::vector<float> const gr = grad_of(n, r, t, false);
        for (std::size_t i = 0; i < n; ++i) {
          inputs[i] += gr[i];
          magnitude[i] += std::fabs(gr[i]);
        }
      }
    }
    // Every owner's residual at its shard, summed over the ranks.
    std::vector<double> residuals(n, 0.0);
    int const lanes = layout.min_node_size();
    int const j = layout.local_rank(c.rank());
    if (j < lanes) {
      auto const [b, e] =
          shard_range(n, static_cast<std::size_t>(j), static_cast<std::size_t>(lanes));
      auto const st = ef.state(hierarchical_shard_id(id, j, lanes)).values();
      MPI_CHECK(st.size() == e - b);
      for (std::size_t i = b; i < e && i - b < st.size(); ++i) residuals[i] = st[i - b];
    }
    c.all_reduce(std::as_writable_bytes(std::span(residuals)), comm_type::f64, reduce_op::sum);
    bool conserved = true;
    double lost = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      conserved =
          conserved && std::fabs(delivered[i] + residuals[i] - inputs[i]) <= 2e-5 * magnitude[i];
      lost += std::fabs(residuals[i]);
    }
    MPI_CHECK(conserved);
    MPI_CHECK(lost > 1e-3);
  }
}

MPI_TEST(hierarchical_failures_over_mpi) {
  mpi_communicator c(MPI_COMM_WORLD, hier_mpi_options());
  std::size_t const n = 64;
  std::vector<float> out(n);
  // A grouping that is invalid on the last rank only: its config_error, comm_error elsewhere.
  {
    hierarchical_options opt;
    opt.nodes = c.rank() == c.size() - 1 ? node_grouping::labelled({0}) : node_grouping::uniform(1);
    std::vector<float> const g = grad_of(n, c.rank(), 0, true);
    if (c.rank() == c.size() - 1 && c.size() > 1) {
      MPI_CHECK_THROWS_WITH(
          all_reduce_hierarchical(c, make_codec("onebit"),
                                  tensor_view<float const>(std::span<float const>(g), tensor_id{2}),
                                  std::span<float>(out), {}, opt),
          config_error, "node labels");
    } else if (c.size() > 1) {
      MPI_CHECK_THROWS_WITH(
          all_reduce_hierarchical(c, make_codec("onebit"),
                                  tensor_view<float const>(std::span<float const>(g), tensor_id{2}),
                                  std::span<float>(out), {}, opt),
          comm_error, "failed in its local step");
    }
  }
  // A NaN in the last rank's gradient: onebit refuses the node sum that holds it, on the rank
  // that compresses it (with one rank per node: the last rank itself); every rank throws and
  // keeps its residuals.
  {
    compressor<any_codec, residual_feedback> ef(make_codec("onebit"));
    hierarchical_options opt;
    opt.nodes = node_grouping::uniform(1);
    std::vector<float> g = grad_of(n, c.rank(), 0, false);
    all_reduce_hierarchical(c, ef,
                            tensor_view<float const>(std::span<float const>(g), tensor_id{3}),
                            std::span<float>(out), {}, opt);
    std::vector<std::byte> const before = ef.save();
    if (c.rank() == c.size() - 1) g[5] = std::numeric_limits<float>::quiet_NaN();
    if (c.rank() == c.size() - 1) {
      MPI_CHECK_THROWS_AS(
          all_reduce_hierarchical(c, ef,
                                  tensor_view<float const>(std::span<float const>(g), tensor_id{3}),
                                  std::span<float>(out), {}, opt),
          numeric_error);
    } else {
      MPI_CHECK_THROWS_AS(
          all_reduce_hierarchical(c, ef,
                                  tensor_view<float const>(std::span<float const>(g), tensor_id{3}),
                                  std::span<float>(out), {}, opt),
          comm_error);
    }
    MPI_CHECK(ef.save() == before);
  }
}
