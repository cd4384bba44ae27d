// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Gossip over a real communicator (in-process ranks as threads): bit-identical to the
// one-thread gossip board for every topology, exact consensus of one-peer exponential gossip,
// DAdam over the communicator equal to DAdam on the board, and misuse rejected.

#include <catch2/catch.hpp>

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/optim/decentralized.hpp>
#include <gradcomp/optim/mixing.hpp>
#include <gradcomp/topology/topology.hpp>

#include "../support/rank_check.hpp"
#include "optim_support.hpp"

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

namespace gc = gradcomp;
using mixer = gc::comm_mixer<gc::in_process_communicator>;
static_assert(gc::parameter_mixer<mixer>);

std::vector<float> start_value(int rank, std::size_t d) {
  std::vector<float> x(d);
  for (std::size_t k = 0; k < d; ++k) x[k] = static_cast<float>((rank * 37 + static_cast<int>(k) * 11) % 23) - 11.0f;
  return x;
}

// The reference: every rank starts, then every rank waits, on the one-thread board.
std::vector<std::vector<float>> board_gossip(gc::topology const& topo, std::size_t d, std::uint64_t steps) {
  gc::gossip_board board(topo);
  int const n = topo.size();
  std::vector<gc::gossip_board::endpoint> ends;
  std::vector<std::vector<float>> x;
  for (int r = 0; r < n; ++r) {
    ends.push_back(board.mixer(r));
    x.push_back(start_value(r, d));
  }
  for (std::uint64_t t = 0; t < steps; ++t) {
    for (int r = 0; r < n; ++r) ends[static_cast<std::size_t>(r)].start_mixing(x[static_cast<std::size_t>(r)], t);
    for (int r = 0; r < n; ++r) ends[static_cast<std::size_t>(r)].wait_mixing(x[static_cast<std::size_t>(r)]);
  }
  return x;
}

std::vector<std::vector<float>> comm_gossip(gc::topology const& topo, std::size_t d, std::uint64_t steps) {
  std::vector<std::vector<float>> x(static_cast<std::size_t>(topo.size()));
  gc::run_in_process(topo.size(), [&](gc::in_process_communicator& comm) {
    mixer m(comm, topo);
    std::vector<float> v = start_value(comm.rank(), d);
    for (std::uint64_t t = 0; t < steps; ++t) {
      m.start_mixing(v, t);
      m.wait_mixing(v);
    }
    RANK_REQUIRE(m.bytes_sent() > 0 || topo.size() == 1);
    x[static_cast<std::size_t>(comm.rank())] = v;
  });
  return x;
}

}  // namespace

TEST_CASE("comm_mixer over in-process ranks equals the gossip board bit for bit", "[optim][topology][comm_mixer]") {
  for (auto const& topo : {gc::topology::one_peer_exponential(8), gc::topology::ring(6), gc::topology::static_ring(5),
                           gc::topology::complete(4), gc::topology::alternating_exp_ring(8, 2)}) {
    std::vector<std::vector<float>> got;
    REQUIRE_NOTHROW(got = comm_gossip(topo, 37, 7));
    REQUIRE(got == board_gossip(topo, 37, 7));
  }
}

TEST_CASE("comm_mixer: one-peer exponential gossip reaches the exact average in log2(n) steps", "[optim][topology][comm_mixer]") {
  auto const topo = gc::topology::one_peer_exponential(8);
  std::vector<std::vector<float>> got;
  REQUIRE_NOTHROW(got = comm_gossip(topo, 16, 3));
  for (std::size_t k = 0; k < 16; ++k) {
    double mean = 0;
    for (int r = 0; r < 8; ++r) mean += start_value(r, 16)[k];
    mean /= 8;
    for (auto const& x : got) REQUIRE(x[k] == static_cast<float>(mean));  // integer inputs: exact
  }
}

TEST_CASE("comm_mixer: DAdam over the communicator equals DAdam on the gossip board", "[optim][comm_mixer]") {
  gradcomp_test::quadratic_problem const p(4, 12, true, 0.0, 5);
  auto const topo = gc::topology::one_peer_exponential(4);
  gc::adam_options o;
  o.lr = 0.05;
  std::uint64_t const steps = 40;
  // On the board, all ranks in one thread.
  std::vector<std::vector<float>> ref(p.n, std::vector<float>(p.d, 0.0f));
  {
    gc::gossip_board board(topo);
    std::vector<gc::decentralized_optimizer<gc::adam, gc::gossip_board::endpoint>> ranks;
    for (std::size_t i = 0; i < p.n; ++i) ranks.emplace_back(gc::adam(o), board.mixer(static_cast<int>(i)));
    for (std::size_t i = 0; i < p.n; ++i) ranks[i].start(ref[i]);
    for (std::uint64_t s = 0; s < steps; ++s)
      for (std::size_t i = 0; i < p.n; ++i) ranks[i].step(ref[i], p.gradient(i, ref[i], s));
    for (std::size_t i = 0; i < p.n; ++i) ranks[i].drain(ref[i]);
  }
  std::vector<std::vector<float>> got(p.n);
  REQUIRE_NOTHROW(gc::run_in_process(static_cast<int>(p.n), [&](gc::in_process_communicator& comm) {
    auto const i = static_cast<std::size_t>(comm.rank());
    gc::decentralized_optimizer<gc::adam, mixer> opt(gc::adam(o), mixer(comm, topo));
    std::vector<float> x(p.d, 0.0f);
    opt.start(x);
    for (std::uint64_t s = 0; s < steps; ++s) opt.step(x, p.gradient(i, x, s));
    opt.drain(x);
    got[i] = x;
  }));
  REQUIRE(got == ref);
}

TEST_CASE("comm_mixer rejects misuse", "[optim][comm_mixer][errors]") {
  gc::in_process_world world(2);
  auto c = world.communicator(0);
  REQUIRE_THROWS_AS(mixer(c, gc::topology::complete(3)), gc::config_error);
  REQUIRE_THROWS_AS(mixer(c, gc::topology::complete(2), -1), gc::config_error);
  mixer m(c, gc::topology::complete(2));
  std::vector<float> x(4);
  REQUIRE_THROWS_AS(m.wait_mixing(x), gc::config_error);
  // A peer that sends another length: the receive fails with comm_error, not a wrong mix.
  REQUIRE_THROWS_AS(gc::run_in_process(2,
                                       [](gc::in_process_communicator& comm) {
                                         mixer mm(comm, gc::topology::complete(2));
                                         std::vector<float> v(comm.rank() == 0 ? 4 : 5, 1.0f);
                                         mm.start_mixing(v, 0);
                                         mm.wait_mixing(v);
                                       }),
                    gc::comm_error);
}

TEST_CASE("comm_mixer: test_mixing reports completion without changing the result", "[optim][comm_mixer]") {
  gc::topology const topo = gc::topology::one_peer_exponential(4);
  auto const reference = board_gossip(topo, 33, 4);
  std::vector<std::vector<float>> x(4);
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    mixer m(comm, topo);
    std::vector<float> v = start_value(comm.rank(), 33);
    RANK_REQUIRE(!m.test_mixing());  // nothing outstanding
    for (std::uint64_t t = 0; t < 4; ++t) {
      m.start_mixing(v, t);
      // Polling until done must terminate: the peer posts its half of the exchange.
      std::uint64_t polls = 0;
      while (!m.test_mixing()) {
        ++polls;
        RANK_REQUIRE(polls < 100000000);
      }
      RANK_REQUIRE(m.pending());  // done, but still to be mixed
      m.wait_mixing(v);
      RANK_REQUIRE(!m.test_mixing());
    }
    x[static_cast<std::size_t>(comm.rank())] = v;
  }));
  REQUIRE(x == reference);
}

TEST_CASE("comm_mixer: wait_seconds counts the time blocked waiting for a late peer", "[optim][comm_mixer]") {
  using clock = std::chrono::steady_clock;
  std::vector<double> waited(2, -1.0);
  std::vector<clock::time_point> posted(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    mixer m(comm, gc::topology::complete(2));
    RANK_REQUIRE(m.wait_seconds() == 0.0);
    std::vector<float> x(64, static_cast<float>(comm.rank()));
    // Both ranks leave the barrier together; rank 1 then starts its half of the exchange
    // 100 ms late, so rank 0 has to wait for it. Each rank notes when it posted its half: on a
    // loaded machine rank 0's thread may itself start late, and what rank 0 must have waited is
    // the gap between the two posts, not the 100 ms.
    comm.barrier();
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    posted[static_cast<std::size_t>(comm.rank())] = clock::now();
    m.start_mixing(x, 0);
    m.wait_mixing(x);
    RANK_REQUIRE(x[0] == 0.5f);
    waited[static_cast<std::size_t>(comm.rank())] = m.wait_seconds();
  }));
  const double gap = std::chrono::duration<double>(posted[1] - posted[0]).count();
  INFO("rank 1 posted " << gap << " s after rank 0");
  REQUIRE(gap > 0.02);  // the barrier and the sleep leave rank 1 behind (by about 100 ms)
  CHECK(waited[0] >= gap - 0.02);
  CHECK(waited[1] >= 0.0);
  CHECK(waited[1] < waited[0]);
}
