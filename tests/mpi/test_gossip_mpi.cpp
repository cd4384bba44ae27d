// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Gossip over MPI ranks: comm_mixer on an mpi_communicator against the one-thread gossip board
// (every rank simulates all ranks locally as the reference), on every topology that fits the
// number of ranks; DAdam overlapped over MPI, its exchange driven by test_mixing while the rank
// "computes", against DAdam on the board.

#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/optim/decentralized.hpp>
#include <gradcomp/optim/mixing.hpp>
#include <gradcomp/topology/topology.hpp>

#include "check.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;

namespace {

std::vector<float> start_value(int rank, std::size_t d) {
  std::vector<float> x(d);
  for (std::size_t k = 0; k < d; ++k) {
    x[k] = static_cast<float>((rank * 37 + static_cast<int>(k) * 11) % 23) * 0.375f - 4.0f;
  }
  return x;
}

// Gradient of rank r's quadratic 1/2 sum_k a_rk (x_k - c_rk)^2 (curvatures and centres differ
// per rank), plus a deterministic perturbation that changes with the step.
std::vector<float> gradient(int r, std::vector<float> const& x, std::uint64_t step) {
  std::vector<float> g(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    float const a = 0.5f + 0.25f * static_cast<float>((r + static_cast<int>(k)) % 5);
    float const c = static_cast<float>((r * 3 + static_cast<int>(k)) % 7) - 3.0f;
    float const wobble = 0.01f * static_cast<float>(static_cast<int>((step * 13 + k + static_cast<std::size_t>(r)) % 9) - 4);
    g[k] = a * (x[k] - c) + wobble;
  }
  return g;
}

std::vector<topology> topologies(int n) {
  std::vector<topology> t{topology::complete(n)};
  if (n % 2 == 0) t.push_back(topology::ring(n));
  if (n >= 3) t.push_back(topology::static_ring(n));
  if ((n & (n - 1)) == 0) t.push_back(topology::one_peer_exponential(n));
  return t;
}

mpi_options test_options() {
  mpi_options o;
  o.timeout = 30s;
  return o;
}

}  // namespace

MPI_TEST(comm_mixer_equals_the_gossip_board_on_every_topology) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size(), me = c.rank();
  std::size_t const d = 257;
  for (topology const& topo : topologies(n)) {
    std::uint64_t const steps = 2 * topo.period() + 1;
    // The reference: every rank's row mixed in this process.
    gossip_board board(topo);
    std::vector<gossip_board::endpoint> ends;
    std::vector<std::vector<float>> ref;
    for (int r = 0; r < n; ++r) {
      ends.push_back(board.mixer(r));
      ref.push_back(start_value(r, d));
    }
    for (std::uint64_t t = 0; t < steps; ++t) {
      for (int r = 0; r < n; ++r) ends[static_cast<std::size_t>(r)].start_mixing(ref[static_cast<std::size_t>(r)], t);
      for (int r = 0; r < n; ++r) ends[static_cast<std::size_t>(r)].wait_mixing(ref[static_cast<std::size_t>(r)]);
    }
    // Over MPI, polling the exchange to completion before mixing.
    comm_mixer<mpi_communicator> m(c, topo);
    std::vector<float> x = start_value(me, d);
    for (std::uint64_t t = 0; t < steps; ++t) {
      m.start_mixing(x, t);
      while (!m.test_mixing()) {
      }
      m.wait_mixing(x);
    }
    MPI_CHECK(x == ref[static_cast<std::size_t>(me)]);
    MPI_CHECK(m.bytes_sent() > 0);
  }
}

MPI_TEST(dadam_over_mpi_equals_dadam_on_the_board) {
  mpi_communicator c(MPI_COMM_WORLD, test_options());
  int const n = c.size(), me = c.rank();
  topology const topo = (n & (n - 1)) == 0 ? topology::one_peer_exponential(n) : topology::static_ring(n);
  adam_options o;
  o.lr = 0.05;
  std::size_t const d = 40;
  std::uint64_t const steps = 30;
  std::vector<std::vector<float>> ref(static_cast<std::size_t>(n), std::vector<float>(d, 0.0f));
  {
    gossip_board board(topo);
    std::vector<decentralized_optimizer<adam, gossip_board::endpoint>> ranks;
    for (int r = 0; r < n; ++r) ranks.emplace_back(adam(o), board.mixer(r));
    for (int r = 0; r < n; ++r) ranks[static_cast<std::size_t>(r)].start(ref[static_cast<std::size_t>(r)]);
    for (std::uint64_t s = 0; s < steps; ++s) {
      for (int r = 0; r < n; ++r) {
        auto& x = ref[static_cast<std::size_t>(r)];
        ranks[static_cast<std::size_t>(r)].step(x, gradient(r, x, s));
      }
    }
    for (int r = 0; r < n; ++r) ranks[static_cast<std::size_t>(r)].drain(ref[static_cast<std::size_t>(r)]);
  }
  // Over MPI: the gradient is computed while the previous mixing is in flight, polling it.
  decentralized_optimizer<adam, comm_mixer<mpi_communicator>> opt(adam(o), comm_mixer<mpi_communicator>(c, topo));
  std::vector<float> x(d, 0.0f);
  opt.start(x);
  for (std::uint64_t s = 0; s < steps; ++s) {
    (void)opt.mixer().test_mixing();
    std::vector<float> const g = gradient(me, x, s);
    (void)opt.mixer().test_mixing();
    opt.step(x, g);
  }
  opt.drain(x);
  MPI_CHECK(x == ref[static_cast<std::size_t>(me)]);
  // A control: the optimizer moved the parameters (an exchange that did nothing would leave
  // them at the start, and a wrong mix would not equal the board's bits above).
  MPI_CHECK(x != std::vector<float>(d, 0.0f));
}
