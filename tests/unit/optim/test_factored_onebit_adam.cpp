// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// 1-bit Adam with a factored second moment and no warm-up (optim/factored_onebit_adam.hpp): the
// factored v against a plain reference, the documented sync schedule and its bytes, identical
// ranks, error feedback that conserves the momentum's mass, bit-identical resumption before
// and after a sync, convergence on a heterogeneous quadratic, invalid options rejected.

#include <catch2/catch.hpp>

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/factored_onebit_adam.hpp>

#include "../support/rank_check.hpp"
#include "optim_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace {

namespace gc = gradcomp;
using gradcomp_test::quadratic_problem;
using gradcomp_test::two_way_residual_mass;
using fadam = gc::factored_onebit_adam<gc::any_codec>;

gc::tensor_view<float const> view(std::vector<float> const& g) {
  return gradcomp_test::tensor_of(g, gc::tensor_id{5});
}

gc::codec_context context(std::uint64_t step) { return gradcomp_test::step_context(step); }

}  // namespace

TEST_CASE("factored_onebit_adam: v is the ranks' mean of the factored statistics, as documented",
          "[optim][factored_onebit_adam]") {
  // The reference keeps, per rank, b2-averages of the row and column sums of g*g (vector: of
  // g*g), averages them over the ranks at the sync steps, and writes v_ij = R_i C_j / sum R out.
  constexpr std::size_t ranks = 3, rows = 6, cols = 10;
  quadratic_problem const p(ranks, rows * cols, true, 0.4, 77);
  for (std::size_t mrows : {rows, std::size_t{0}}) {
    INFO("rows " << mrows);
    gc::factored_onebit_adam_options const o{.adam = {.lr = 0.01, .weight_decay = 0.05},
                                             .rows = mrows,
                                             .sync_first = 2,
                                             .sync_every = 3};
    std::size_t const nstat = mrows == 0 ? p.d : rows + cols;
    // the ranks' trajectories, recorded by the ranks (the reference needs their gradients)
    std::mutex mu;
    std::vector<std::vector<std::vector<float>>> grads(ranks);  // [rank][step]
    std::vector<std::vector<std::vector<float>>> xs(ranks);     // x before each step
    std::vector<std::vector<float>> seen;                       // rank 0's v after each step
    std::vector<std::uint64_t> last;                            // rank 0's last sync
    REQUIRE_NOTHROW(
        gc::run_in_process(static_cast<int>(ranks), [&](gc::in_process_communicator& comm) {
          auto const r = static_cast<std::size_t>(comm.rank());
          fadam opt(gc::make_codec("onebit"), o);
          std::vector<float> x(p.d, 0.25f);
          std::vector<std::vector<float>> gs, before, vs;
          std::vector<std::uint64_t> ls;
          for (std::uint64_t s = 0; s < 12; ++s) {
            std::vector<float> const g = p.gradient(r, x, s);
            gs.push_back(g);
            before.push_back(x);
            opt.step(comm, x, view(g), context(s));
            vs.push_back(opt.second_moment());
            ls.push_back(opt.last_sync());
            RANK_REQUIRE(opt.local_statistics().size() == nstat);
            RANK_REQUIRE(opt.agreed_statistics().size() == nstat);
          }
          std::lock_guard<std::mutex> lock(mu);
          grads[r] = std::move(gs);
          xs[r] = std::move(before);
          if (r == 0) {
            seen = std::move(vs);
            last = std::move(ls);
          }
        }));
    std::vector<std::vector<double>> loc(ranks, std::vector<double>(nstat, 0.0));
    std::vector<double> agreed(nstat, 0.0);
    std::uint64_t const expected_syncs[] = {1, 2, 5, 8, 11};
    for (std::uint64_t t = 1; t <= 12; ++t) {
      INFO("step " << t);
      for (std::size_t r = 0; r < ranks; ++r) {
        std::vector<double> sq(nstat, 0.0);
        for (std::size_t i = 0; i < p.d; ++i) {
          double const g = static_cast<double>(grads[r][t - 1][i]) + 0.05 * xs[r][t - 1][i];
          if (mrows == 0) {
            sq[i] = g * g;
          } else {
            sq[i / cols] += g * g;
            sq[rows + i % cols] += g * g;
          }
        }
        for (std::size_t k = 0; k < nstat; ++k) loc[r][k] = 0.999 * loc[r][k] + 0.001 * sq[k];
      }
      bool const sync = std::find(std::begin(expected_syncs), std::end(expected_syncs), t) !=
                        std::end(expected_syncs);
      if (sync) {
        for (std::size_t k = 0; k < nstat; ++k) {
          agreed[k] = (loc[0][k] + loc[1][k] + loc[2][k]) / 3.0;
        }
      }
      std::uint64_t ls = 0;
      for (std::uint64_t s : expected_syncs) {
        if (s <= t) ls = s;
      }
      CHECK(last[t - 1] == ls);
      std::vector<double> v(p.d);
      double total = 0.0;
      for (std::size_t i = 0; i < rows; ++i) total += agreed[i];
      for (std::size_t i = 0; i < p.d; ++i) {
        v[i] = mrows == 0 ? agreed[i] : agreed[i / cols] * agreed[rows + i % cols] / total;
      }
      REQUIRE(seen[t - 1].size() == p.d);
      double worst = 0.0;
      for (std::size_t i = 0; i < p.d; ++i) {
        worst = std::max(worst, std::abs(seen[t - 1][i] - v[i]) / v[i]);
      }
      CHECK(worst < 1e-5);
    }
    // a control: the factored v is not the per-coordinate one (the quadratic's E[g*g] is not of
    // rank one), so the check above could fail
    if (mrows != 0) {
      double differs = 0.0;
      for (std::size_t i = 0; i < p.d; ++i) {
        double const plain = (loc[0][i / cols] + loc[1][i / cols] + loc[2][i / cols]) / 3.0;
        differs = std::max(differs, std::abs(seen.back()[i] - plain) / plain);
      }
      CHECK(differs > 0.1);
    }
  }
}

TEST_CASE("factored_onebit_adam: the update divides the mean momentum by the agreed sqrt(v)",
          "[optim][factored_onebit_adam]") {
  // With the identity codec the decoded momentum is the ranks' mean; every step must then be
  // x - lr/(1-b1^t) * clip(m / (sqrt(v)/sqrt(1-b2^T) + eps), -B, B) with T the last sync.
  constexpr std::size_t rows = 4, cols = 5;
  quadratic_problem const p(2, rows * cols, true, 0.3, 19);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    fadam opt(gc::make_codec("identity"),
              {.adam = {.lr = 0.02}, .rows = rows, .sync_first = 1, .sync_every = 4});
    std::vector<float> x(p.d, 0.5f);
    for (std::uint64_t s = 0; s < 10; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      std::vector<float> const before = x;
      opt.step(comm, x, view(g), context(s));
      std::uint64_t const t = s + 1;
      RANK_REQUIRE(opt.last_sync() == (t < 5 ? 1u : t < 9 ? 5u : 9u));
      std::vector<float> const v = opt.second_moment();
      double const bc1 = 1.0 - std::pow(0.9, static_cast<double>(t));
      double const bc2 = std::sqrt(1.0 - std::pow(0.999, static_cast<double>(opt.last_sync())));
      for (std::size_t i = 0; i < p.d; ++i) {
        double const d = std::sqrt(static_cast<double>(v[i])) / bc2 + 1e-8;
        double const u = std::clamp(opt.first_moment()[i] / d, -7.27, 7.27);
        double const want = before[i] - 0.02 / bc1 * u;
        RANK_REQUIRE(std::abs(x[i] - want) < 1e-5);
      }
    }
  }));
}

TEST_CASE(
    "factored_onebit_adam: syncs at steps 1..sync_first and every sync_every, and pays "
    "exactly their all-reduce",
    "[optim][factored_onebit_adam]") {
  constexpr std::size_t rows = 8, cols = 12;
  quadratic_problem const p(4, rows * cols, true, 0.3, 3);
  for (std::uint64_t every : {5u, 0u}) {
    INFO("sync_every " << every);
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      fadam opt(gc::make_codec("onebit"),
                {.adam = {.lr = 0.01}, .rows = rows, .sync_first = 3, .sync_every = every});
      std::vector<float> x(p.d, 0.2f);
      std::size_t const extra = gc::detail::ring_all_reduce_bytes((rows + cols) * 4, 4);
      std::size_t quiet = 0;  // wire bytes of a step without a sync
      std::vector<float> agreed;
      for (std::uint64_t s = 0; s < 26; ++s) {
        std::uint64_t const t = s + 1;
        bool const want = t <= 3 || (every != 0 && (t == 8 || t == 13 || t == 18 || t == 23));
        RANK_REQUIRE(opt.sync_at(t) == want);
        gc::collective_result const res = opt.step(comm, x, view(p.gradient(r, x, s)), context(s));
        std::vector<float> const now(opt.agreed_statistics().begin(),
                                     opt.agreed_statistics().end());
        RANK_REQUIRE((now != agreed) == want);  // the local statistics move every step
        agreed = now;
        if (t == 4) quiet = res.wire_bytes;
        if (t >= 4) RANK_REQUIRE(res.wire_bytes == (want ? quiet + extra : quiet));
      }
      RANK_REQUIRE(quiet > 0 && extra > 0);
    }));
  }
}

TEST_CASE("factored_onebit_adam: every rank holds the same parameters, momentum and v",
          "[optim][factored_onebit_adam]") {
  quadratic_problem const p(4, 7 * 9, true, 0.3, 5);
  for (char const* codec : {"onebit", "topk:ratio=0.1"}) {
    INFO(codec);
    std::mutex mu;
    std::vector<std::vector<float>> xs(4), ms(4), vs(4), locs(4);
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      fadam opt(gc::make_codec(codec),
                {.adam = {.lr = 0.02}, .rows = 7, .sync_first = 2, .sync_every = 3});
      std::vector<float> x(p.d, 0.0f);
      for (std::uint64_t s = 0; s < 20; ++s) {
        opt.step(comm, x, view(p.gradient(r, x, s)), context(s));
      }
      std::lock_guard<std::mutex> lock(mu);
      xs[r] = x;
      ms[r].assign(opt.first_moment().begin(), opt.first_moment().end());
      vs[r] = opt.second_moment();
      locs[r].assign(opt.local_statistics().begin(), opt.local_statistics().end());
    }));
    for (std::size_t r = 1; r < 4; ++r) {
      CHECK(xs[r] == xs[0]);
      CHECK(ms[r] == ms[0]);
      CHECK(vs[r] == vs[0]);
      CHECK(locs[r] != locs[0]);  // control: the ranks' own statistics differ
    }
  }
}

TEST_CASE("factored_onebit_adam: error feedback conserves the momentum's mass",
          "[optim][factored_onebit_adam]") {
  // Summed over the steps: what was delivered (W * m) plus every worker and server residual
  // equals the sum of the ranks' local momenta.
  constexpr int world = 2;  // a power of two: W * m is the decoded sum exactly
  quadratic_problem const p(world, 5 * 9, true, 0.5, 9);
  gradcomp_test::conservation_result const c = gradcomp_test::check_two_way_conservation(
      p, world, gc::tensor_id{5}, 25,
      [] { return fadam(gc::make_codec("onebit"), {.adam = {.lr = 0.01}, .rows = 5}); },
      [](auto const& o) { return o.local_momentum(); }, [](auto const& o) { return o.first_moment(); });
  double const worst = c.worst, scale = c.scale, lag = c.lag;
  INFO(worst << " of " << scale << ", residuals up to " << lag);
  CHECK(scale > 1.0);
  CHECK(lag > 1e-3 * scale);  // control: onebit did leave mass in the residuals
  CHECK(worst < 1e-5 * scale);
}

TEST_CASE("factored_onebit_adam: a checkpoint resumes bit-identically, before and after a sync",
          "[optim][factored_onebit_adam]") {
  quadratic_problem const p(2, 6 * 6, true, 0.3, 17);
  gc::factored_onebit_adam_options const o{
      .adam = {.lr = 0.02}, .rows = 6, .sync_first = 2, .sync_every = 4};
  // syncs at 1, 2, 6, 10, 14: saved inside the first syncs, just after one (next step quiet),
  // just before one, right after one later on
  for (std::uint64_t at : {0u, 1u, 2u, 5u, 6u, 9u}) {
    INFO(at);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      fadam a(gc::make_codec("onebit"), o);
      std::vector<float> x(p.d, 0.1f);
      for (std::uint64_t s = 0; s < at; ++s) a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      std::vector<std::byte> const saved = a.save();
      fadam b(gc::make_codec("onebit"), o);
      b.load(saved);
      RANK_REQUIRE(b.save() == saved);
      std::vector<float> y = x;
      for (std::uint64_t s = at; s < 16; ++s) {
        a.step(comm, x, view(p.gradient(r, x, s)), context(s));
        b.step(comm, y, view(p.gradient(r, y, s)), context(s));
        RANK_REQUIRE(x == y);
      }
      RANK_REQUIRE(a.save() == b.save());
      // another shape or schedule, a truncated buffer: format_error, nothing changed
      for (auto const& other :
           {gc::factored_onebit_adam_options{.rows = 4, .sync_first = 2, .sync_every = 4},
            gc::factored_onebit_adam_options{.rows = 6, .sync_first = 3, .sync_every = 4}}) {
        fadam c(gc::make_codec("onebit"), other);
        bool threw = false;
        try {
          c.load(saved);
        } catch (gc::format_error const&) {
          threw = true;
        }
        RANK_REQUIRE(threw);
      }
      bool threw = false;
      try {
        b.load(std::span<std::byte const>(saved).first(saved.size() - 3));
      } catch (gc::format_error const&) {
        threw = true;
      }
      RANK_REQUIRE(threw && b.save() == a.save());
    }));
  }
}

TEST_CASE(
    "factored_onebit_adam reaches the optimum of a heterogeneous quadratic; bad options "
    "are errors",
    "[optim][factored_onebit_adam]") {
  quadratic_problem const p(4, 8 * 8, true, 0.05, 32);
  std::vector<double> const opt = p.optimum();
  double start = 0.0;
  for (double v : opt) start = std::max(start, std::abs(v));
  for (auto const& run :
       {std::pair{"onebit", std::size_t{8}}, std::pair{"onebit", std::size_t{0}},
        std::pair{"topk:ratio=0.1", std::size_t{8}}, std::pair{"identity", std::size_t{8}}}) {
    std::mutex mu;
    double err = 0.0;
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      fadam a(gc::make_codec(run.first), {.adam = {.lr = 0.05}, .rows = run.second});
      std::vector<float> x(p.d, 0.0f);
      for (std::uint64_t s = 0; s < 1500; ++s) {
        a.set_lr(gradcomp_test::cosine_lr(0.05, s, 1500) + 1e-5);
        a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      }
      std::lock_guard<std::mutex> lock(mu);
      err = std::max(err, gradcomp_test::max_abs_error(x, opt));
    }));
    INFO(run.first << ", rows " << run.second << ": " << err << " (start " << start << ")");
    CHECK(start > 1.0);  // x = 0 is far from the optimum
    CHECK(err < 3e-2);
  }
  CHECK_THROWS_AS(fadam(gc::make_codec("onebit"), {.sync_first = 0}), gc::config_error);
  CHECK_THROWS_AS(fadam(gc::make_codec("onebit"), {.adam = {.lr = -1.0}}), gc::config_error);
  CHECK_THROWS_AS(fadam(gc::make_codec("onebit"), {.adam = {.beta2 = 1.0}}), gc::config_error);
  REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
    auto throws = [&](fadam& a, std::size_t nx, std::size_t ng) {
      std::vector<float> x(nx, 0.0f), g(ng, 1.0f);
      try {
        a.step(comm, x, view(g));
      } catch (gc::config_error const&) {
        return true;
      }
      return false;
    };
    fadam a(gc::make_codec("onebit"), {.rows = 3});
    RANK_REQUIRE(throws(a, 10, 10));   // 10 is not 3 rows of anything
    RANK_REQUIRE(throws(a, 12, 13));   // gradient of another size
    RANK_REQUIRE(!throws(a, 12, 12));  // 3 x 4
    RANK_REQUIRE(throws(a, 15, 15));   // another size than the first step's
    RANK_REQUIRE(a.steps() == 1);
  }));
}
