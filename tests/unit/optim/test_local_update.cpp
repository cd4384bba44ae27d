// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// local_update (DiLoCo, Streaming DiLoCo, SparseLoCo, averaging) on in-process ranks: agreement
// with a plain reference, the schedule, rollback of a failed sync, bit-for-bit resume, refusals.

#include <catch2/catch.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/local_update.hpp>

#include "local_update_support.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;
using namespace std::chrono_literals;

namespace {

using namespace local_update_test;

struct lu_result {
  std::vector<weights_t> weights;
  std::vector<std::vector<std::byte>> states;
  std::vector<std::vector<gc::local_update_stats>> stats;
};

// Runs steps [from, to] on W in-process ranks; `resume` (per rank: state, weights) replaces start.
lu_result lu_run(gc::local_update_options const& opt, int world, std::uint64_t to,
                 lu_result const* resume = nullptr, std::uint64_t from = 1) {
  lu_result res;
  res.weights.resize(static_cast<std::size_t>(world));
  res.states.resize(static_cast<std::size_t>(world));
  res.stats.resize(static_cast<std::size_t>(world));
  gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::local_update lu(opt);
    weights_t w;
    if (resume != nullptr) {
      lu.load(resume->states[r]);
      w = resume->weights[r];
    } else {
      w = lu_initial(comm.rank());
      auto s = lu_spans(w);
      lu.start(comm, s);
    }
    for (std::uint64_t t = from; t <= to; ++t) {
      lu_inner_step(w, comm.rank(), t);
      auto s = lu_spans(w);
      res.stats[r].push_back(lu.step(comm, s));
    }
    res.weights[r] = w;
    res.states[r] = lu.save();
  });
  return res;
}

gc::local_update_options lu_opts(std::string outer, std::uint64_t h) {
  gc::local_update_options o;
  o.outer = std::move(outer);
  o.sync_every = h;
  return o;
}

}  // namespace

TEST_CASE("local_update with the identity codec equals the reference DiLoCo / SparseLoCo / averaging math",
          "[optim][local_update]") {
  std::string const outer = GENERATE(std::string("nesterov"), std::string("sparseloco"), std::string("average"));
  int const world = GENERATE(2, 3);
  gc::local_update_options o = lu_opts(outer, 4);
  lu_result const got = lu_run(o, world, 13);
  lu_reference ref(o, world);
  ref.run(13);
  for (int r = 0; r < world; ++r) {
    INFO("outer " << outer << ", world " << world << ", rank " << r);
    REQUIRE(lu_same(got.weights[static_cast<std::size_t>(r)], ref.w[static_cast<std::size_t>(r)]));
    // 3 syncs (t = 4, 8, 12) in 13 steps
    std::size_t syncs = 0;
    for (auto const& st : got.stats[static_cast<std::size_t>(r)]) syncs += st.synced ? 1 : 0;
    REQUIRE(syncs == 3);
  }
  // after the last sync (t = 12) all replicas took theta_sync; t = 13 is rank-local again
  REQUIRE_FALSE(lu_same(got.weights[0], got.weights[1]));
}

TEST_CASE("local_update: H = 1, averaging, identity codec: every step is the synchronous mean of the weights",
          "[optim][local_update]") {
  int const world = 4;
  gc::local_update_options o = lu_opts("average", 1);
  lu_result const got = lu_run(o, world, 5);
  // the mean of the replicas' weights after their 5th inner step, from the 4th step's common weights
  lu_result const four = lu_run(o, world, 4);
  weights_t mean = four.weights[0];
  std::vector<weights_t> after(static_cast<std::size_t>(world), four.weights[0]);
  for (int r = 0; r < world; ++r) {
    REQUIRE(lu_same(four.weights[static_cast<std::size_t>(r)], four.weights[0]));
    lu_inner_step(after[static_cast<std::size_t>(r)], r, 5);
  }
  for (std::size_t k = 0; k < mean.size(); ++k)
    for (std::size_t i = 0; i < mean[k].size(); ++i) {
      double s = 0.0;
      for (auto const& a : after) s += a[k][i];
      double const m = s / world;
      // theta - (1/W) sum (theta - w_r) in float32: a few roundings of theta's magnitude
      double const bound = 4.0 * std::numeric_limits<float>::epsilon() * (std::fabs(mean[k][i]) + std::fabs(m) + 1.0);
      INFO("tensor " << k << " element " << i);
      REQUIRE(std::fabs(static_cast<double>(got.weights[0][k][i]) - m) <= bound);
    }
  for (int r = 1; r < world; ++r) REQUIRE(lu_same(got.weights[static_cast<std::size_t>(r)], got.weights[0]));
}

TEST_CASE("local_update: Streaming DiLoCo fragments sync exactly on their schedule; overlap applies late",
          "[optim][local_update]") {
  std::uint64_t const tau = GENERATE(std::uint64_t{0}, std::uint64_t{2});
  gc::local_update_options o = lu_opts("nesterov", 6);
  o.fragments = 3;
  o.overlap = tau;
  o.mix = 0.25;
  int const world = 2;
  std::uint64_t const steps = 20;
  lu_result const got = lu_run(o, world, steps);
  for (std::uint64_t t = 1; t <= steps; ++t) {
    gc::local_update_stats const& st = got.stats[0][t - 1];
    std::vector<std::uint64_t> want;
    for (std::uint64_t f = 0; f < 3; ++f)
      if (t >= 2 * f && (t - 2 * f) % 6 == 0) want.push_back(f);
    INFO("step " << t);
    REQUIRE(st.fragments == want);
    REQUIRE(st.synced == !want.empty());
    std::size_t tensors = 0;
    for (std::uint64_t f : want) tensors += f == 0 ? 2 : f == 1 ? 2 : 1;  // 5 tensors: 0,3 | 1,4 | 2
    REQUIRE(st.tensors == tensors);
    std::vector<std::uint64_t> applied;
    if (tau != 0)
      for (std::uint64_t f = 0; f < 3; ++f)
        if (t > tau && t - tau >= 2 * f && (t - tau - 2 * f) % 6 == 0 && t - tau >= 1) applied.push_back(f);
    REQUIRE(st.applied == applied);
    REQUIRE(got.stats[1][t - 1].fragments == want);
  }
  lu_reference ref(o, world);
  ref.run(steps);
  for (int r = 0; r < world; ++r) REQUIRE(lu_same(got.weights[static_cast<std::size_t>(r)], ref.w[static_cast<std::size_t>(r)]));
}

TEST_CASE("local_update: save mid-run, load, continue == the uninterrupted run, bit for bit",
          "[optim][local_update]") {
  struct cfg {
    char const* outer;
    char const* codec;
    char const* feedback;
    std::uint64_t fragments, overlap;
  };
  cfg const c = GENERATE(cfg{"nesterov", "int8:bucket=64", "residual", 1, 0},
                         cfg{"sparseloco", "chunk_topk:chunk=64,k=2,values=int2", "none", 1, 0},
                         cfg{"nesterov", "int4:bucket=32", "residual", 2, 1},
                         cfg{"average", "topk:ratio=0.05", "ef21", 1, 0});
  gc::local_update_options o = lu_opts(c.outer, 4);
  o.codec = c.codec;
  o.feedback = c.feedback;
  o.fragments = c.fragments;
  o.overlap = c.overlap;
  int const world = 3;
  INFO(c.outer << " " << c.codec << " " << c.feedback);
  lu_result const whole = lu_run(o, world, 17);
  lu_result const first = lu_run(o, world, 9);
  lu_result const rest = lu_run(o, world, 17, &first, 10);
  for (int r = 0; r < world; ++r) {
    auto const rr = static_cast<std::size_t>(r);
    REQUIRE(lu_same(rest.weights[rr], whole.weights[rr]));
    REQUIRE(rest.states[rr] == whole.states[rr]);
  }
  // a lossy codec: the replicas still hold identical theta_sync (and weights right after a sync)
  lu_result const at16 = lu_run(o, world, c.overlap == 0 ? 16 : 17);
  for (int r = 1; r < world; ++r) {
    gc::local_update a(o), b(o);
    a.load(at16.states[0]);
    b.load(at16.states[static_cast<std::size_t>(r)]);
    for (std::size_t k = 0; k < lu_sizes().size(); ++k) {
      auto const x = a.synchronized_weights(k), y = b.synchronized_weights(k);
      REQUIRE(std::memcmp(x.data(), y.data(), x.size_bytes()) == 0);
    }
    if (c.overlap == 0) REQUIRE(lu_same(at16.weights[static_cast<std::size_t>(r)], at16.weights[0]));
  }
  REQUIRE(whole.stats[0].back().step == 17);
}

TEST_CASE("local_update: a damaged or foreign state is refused and changes nothing", "[optim][local_update]") {
  gc::local_update_options o = lu_opts("nesterov", 2);
  o.codec = "int8";
  o.feedback = "residual";
  lu_result const got = lu_run(o, 2, 5);
  gc::local_update lu(o);
  lu.load(got.states[0]);
  std::vector<std::byte> const before = lu.save();
  REQUIRE(before == got.states[0]);
  std::vector<std::byte> bad = got.states[0];
  bad[bad.size() / 2] ^= std::byte{0x10};
  REQUIRE_THROWS_AS(lu.load(bad), gc::format_error);
  REQUIRE(lu.save() == before);
  gc::local_update_options other = o;
  other.sync_every = 3;
  gc::local_update lu2(other);
  REQUIRE_THROWS_WITH(lu2.load(got.states[0]), Catch::Contains("other options"));
  REQUIRE_FALSE(lu2.started());
}

TEST_CASE("local_update: a failed sync (transport fault) leaves every rank's state as it was; a retry "
          "continues the uninterrupted run", "[optim][local_update]") {
  auto const kind = GENERATE(gc::fault_kind::truncate, gc::fault_kind::corrupt);
  gc::local_update_options o = lu_opts("nesterov", 3);
  o.codec = "int8:bucket=64";
  o.feedback = "residual";
  o.checksum = true;
  int const world = 3;
  lu_result const whole = lu_run(o, world, 7);
  lu_result const two = lu_run(o, world, 2);  // the state before the sync at t = 3
  // step 3 fails at rank 1's payload of tensor 1 (int8 packets are gathered), after tensor 0's
  // exchange went through and staged its error feedback
  gc::in_process_world broken(world, 2000ms);
  gc::fault f;
  f.kind = kind;
  f.rank = 1;
  f.of = gc::comm_operation::all_gather_v;
  f.index = 1;
  f.byte = 40;
  f.mask = 0x40;
  gc::fault_plan plan;
  plan.faults.push_back(f);
  std::vector<int> threw(world, 0);
  std::vector<weights_t> after(static_cast<std::size_t>(world));
  std::vector<std::vector<std::byte>> state_after(static_cast<std::size_t>(world));
  std::vector<weights_t> weights_in(static_cast<std::size_t>(world));
  auto body = [&](int r) {
    auto const rr = static_cast<std::size_t>(r);
    gc::local_update lu(o);
    lu.load(two.states[rr]);
    weights_t w = two.weights[rr];
    lu_inner_step(w, r, 3);
    weights_in[rr] = w;
    gc::fault_injecting_communicator<gc::in_process_communicator> comm(broken.communicator(r), plan);
    try {
      auto s = lu_spans(w);
      (void)lu.step(comm, s);
    } catch (gc::error const&) {
      threw[rr] = 1;
    }
    after[rr] = w;
    state_after[rr] = lu.save();
    broken.leave(r);
  };
  std::vector<std::thread> th;
  for (int r = 1; r < world; ++r) th.emplace_back(body, r);
  body(0);
  for (auto& x : th) x.join();
  for (int r = 0; r < world; ++r) {
    auto const rr = static_cast<std::size_t>(r);
    INFO("rank " << r);
    REQUIRE(threw[rr] == 1);
    REQUIRE(state_after[rr] == two.states[rr]);
    REQUIRE(lu_same(after[rr], weights_in[rr]));
  }
  // the retry in a working world: steps 3..7 == the uninterrupted run
  lu_result const rest = lu_run(o, world, 7, &two, 3);
  for (int r = 0; r < world; ++r) {
    REQUIRE(lu_same(rest.weights[static_cast<std::size_t>(r)], whole.weights[static_cast<std::size_t>(r)]));
    REQUIRE(rest.states[static_cast<std::size_t>(r)] == whole.states[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("local_update: a NaN weight or a wrong size fails the sync on every rank, nothing changed",
          "[optim][local_update]") {
  bool const nan = GENERATE(true, false);
  gc::local_update_options o = lu_opts("sparseloco", 2);
  o.codec = "chunk_topk:chunk=64,k=4,values=int2";
  int const world = 3;
  lu_result const one = lu_run(o, world, 1);
  std::vector<int> how(world, 0);  // 1 numeric, 2 config, 3 comm
  std::vector<std::vector<std::byte>> state_after(static_cast<std::size_t>(world));
  gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    auto const rr = static_cast<std::size_t>(comm.rank());
    gc::local_update lu(o);
    lu.load(one.states[rr]);
    weights_t w = one.weights[rr];
    lu_inner_step(w, comm.rank(), 2);
    if (comm.rank() == 2) {
      if (nan) w[4][17] = std::numeric_limits<float>::quiet_NaN();
      else w[1].push_back(0.0f);
    }
    weights_t const in = w;
    try {
      auto s = lu_spans(w);
      (void)lu.step(comm, s);
    } catch (gc::numeric_error const& e) {
      how[rr] = 1;
      CHECK(std::string(e.what()).find("tensor 4") != std::string::npos);
      CHECK(std::string(e.what()).find("element 17") != std::string::npos);
    } catch (gc::config_error const& e) {
      how[rr] = 2;
      CHECK(std::string(e.what()).find("tensor 1 has 8 elements") != std::string::npos);
    } catch (gc::comm_error const&) {
      how[rr] = 3;
    }
    CHECK(lu_same(w, in));
    state_after[rr] = lu.save();
  });
  for (int r = 0; r < world; ++r) {
    auto const rr = static_cast<std::size_t>(r);
    REQUIRE(how[rr] == (r == 2 ? (nan ? 1 : 2) : 3));
    REQUIRE(state_after[rr] == one.states[rr]);
  }
}

TEST_CASE("local_update: ranks on different steps or options are refused before data moves",
          "[optim][local_update]") {
  gc::local_update_options const o = lu_opts("nesterov", 2);
  lu_result const two = lu_run(o, 2, 2);
  SECTION("options") {
    std::vector<std::string> msg(2);
    gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::local_update_options mine = o;
      if (comm.rank() == 1) mine.codec = "int8";
      gc::local_update lu(mine);
      weights_t w = lu_initial(comm.rank());
      auto s = lu_spans(w);
      try {
        lu.start(comm, s);
      } catch (gc::config_error const& e) {
        msg[static_cast<std::size_t>(comm.rank())] = e.what();
      }
      CHECK_FALSE(lu.started());
    });
    for (auto const& m : msg) REQUIRE(m.find("disagree") != std::string::npos);
  }
  SECTION("steps") {
    std::vector<std::string> msg(2);
    gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      auto const rr = static_cast<std::size_t>(comm.rank());
      gc::local_update lu(o);
      weights_t w = lu_initial(comm.rank());
      auto s = lu_spans(w);
      lu.start(comm, s);
      if (comm.rank() == 1) {  // rank 1 resumes from step 2: its next sync is step 4
        lu.load(two.states[1]);
        w = two.weights[1];
        s = lu_spans(w);
        (void)lu.step(comm, s);  // t = 3: local
      }
      try {
        (void)lu.step(comm, s);  // rank 0: t = 1 (local); then both reach a sync
        (void)lu.step(comm, s);
      } catch (gc::config_error const& e) {
        msg[rr] = e.what();
      }
      CHECK(lu.steps() == (comm.rank() == 0 ? 1u : 3u));
    });
    for (auto const& m : msg) {
      REQUIRE(m.find("rank 0 is at step 2") != std::string::npos);
      REQUIRE(m.find("rank 1 at step 4") != std::string::npos);
    }
  }
}

TEST_CASE("local_update: invalid options are refused, naming the option", "[optim][local_update]") {
  auto refused = [](std::function<void(gc::local_update_options&)> const& set, std::string const& option) {
    gc::local_update_options o;
    set(o);
    INFO(option);
    REQUIRE_THROWS_WITH(gc::local_update(o), Catch::Contains("'" + option + "'"));
  };
  refused([](auto& o) { o.outer = "adam"; }, "outer");
  refused([](auto& o) { o.outer_lr = 0.0; }, "outer_lr");
  refused([](auto& o) { o.outer_lr = std::nan(""); }, "outer_lr");
  refused([](auto& o) { o.outer_momentum = 1.0; }, "outer_momentum");
  refused([](auto& o) { o.outer = "average"; o.outer_momentum = 0.9; }, "outer_momentum");
  refused([](auto& o) { o.outer = "sparseloco"; o.outer_momentum = 1.5; }, "outer_momentum");
  refused([](auto& o) { o.sync_every = 0; }, "sync_every");
  refused([](auto& o) { o.fragments = 0; }, "fragments");
  refused([](auto& o) { o.sync_every = 4; o.fragments = 5; }, "fragments");
  refused([](auto& o) { o.sync_every = 4; o.overlap = 4; }, "overlap");
  refused([](auto& o) { o.mix = 1.5; }, "mix");
  refused([](auto& o) { o.codec = "int9"; }, "codec");
  refused([](auto& o) { o.codec = "int8:bucket=x"; }, "codec");
  refused([](auto& o) { o.feedback = "nope"; }, "feedback");
  refused([](auto& o) { o.outer = "sparseloco"; o.feedback = "residual"; }, "feedback");
  gc::local_update_options ok;
  ok.outer = "sparseloco";
  gc::local_update const lu(ok);
  REQUIRE(*lu.options().outer_lr == 1.0);
  REQUIRE(*lu.options().outer_momentum == 0.95);
  gc::local_update const d{gc::local_update_options{}};
  REQUIRE(*d.options().outer_lr == 0.7);
  REQUIRE(*d.options().outer_momentum == 0.9);
  // step before start, and more fragments than tensors
  std::vector<float> x(4);
  std::vector<std::span<float>> one{std::span<float>(x)};
  gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
    gc::local_update a{gc::local_update_options{}};
    REQUIRE_THROWS_WITH(a.step(comm, one), Catch::Contains("'start'"));
    gc::local_update_options two;
    two.fragments = 2;
    gc::local_update b(two);
    REQUIRE_THROWS_WITH(b.start(comm, one), Catch::Contains("'fragments'"));
  });
}
