// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Calibrated 1-bit Adam (optim/calibrated_onebit_adam.hpp): bit-identical to Adam on one rank
// with the identity codec, each rank's exact momentum, the sketch energies against their
// definition and the estimator's two limits (identical and independent gradients), identical
// ranks, error feedback that conserves the momenta's mass, bit-identical resumption, and bad
// input rejected with the state untouched.

#include <catch2/catch.hpp>

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/calibrated_onebit_adam.hpp>

#include "../support/codec_support.hpp"
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
using cadam1 = gc::calibrated_onebit_adam<gc::any_codec>;

gc::tensor_view<float const> view(std::vector<float> const& g) {
  return gradcomp_test::tensor_of(g, gc::tensor_id{3});
}

gc::codec_context context(std::uint64_t step) { return gradcomp_test::step_context(step); }

}  // namespace

TEST_CASE("calibrated_onebit_adam: one rank, identity codec, a vector synced every step is Adam",
          "[optim][calibrated_onebit_adam]") {
  // W = 1: rho is clamped to [1, 1]; the exact momentum, V = b2-average of g*g and the bias
  // corrections of every step are Adam's, and the update bound never binds for Adam's moments.
  quadratic_problem const p(1, 40, false, 0.3, 11);
  REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
    gc::adam_options const ao{.lr = 0.05, .weight_decay = 0.01};
    cadam1 opt(gc::make_codec("identity"), {.adam = ao, .rows = 0, .sync_first = 1000});
    gc::adam ref(ao);
    std::vector<float> x(p.d, 0.3f), y = x;
    for (std::uint64_t s = 0; s < 30; ++s) {
      if (s == 20) {  // a learning-rate drop
        opt.set_lr(0.005);
        ref.set_lr(0.005);
      }
      std::vector<float> const g = p.gradient(0, x, s);
      opt.step(comm, x, view(g), context(s));
      ref.step(y, std::span<float const>(g));
      RANK_REQUIRE(x == y);
    }
    RANK_REQUIRE(opt.calibration(1) == 1.0);
    // control: Adam moved the parameters
    RANK_REQUIRE(std::abs(x[0] - 0.3f) > 1e-3f);
  }));
}

TEST_CASE("calibrated_onebit_adam: each rank keeps its exact momentum; the sketch energies are "
          "their definition",
          "[optim][calibrated_onebit_adam]") {
  constexpr int world = 3;
  constexpr std::size_t rows = 5, cols = 8, k = 16;
  quadratic_problem const p(world, rows * cols, true, 0.4, 23);
  std::mutex mu;
  std::vector<std::vector<std::vector<float>>> grads(world);  // [rank][step]
  std::vector<std::pair<double, double>> energies;           // rank 0's after each step
  std::vector<std::vector<float>> signs;                     // [step][i]
  REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    cadam1 opt(gc::make_codec("onebit"), {.adam = {.lr = 0.01}, .rows = rows, .sketch = k,
                                          .seed = 99});
    std::vector<float> x(p.d, 0.2f), m(p.d, 0.0f);
    std::vector<std::vector<float>> gs, ss;
    std::vector<std::pair<double, double>> es;
    for (std::uint64_t s = 0; s < 12; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      gs.push_back(g);
      opt.step(comm, x, view(g), context(s));
      for (std::size_t i = 0; i < p.d; ++i) m[i] = 0.9f * m[i] + 0.1f * g[i];
      RANK_REQUIRE(std::equal(m.begin(), m.end(), opt.local_momentum().begin()));
      es.push_back(opt.energies());
      std::vector<float> sg(p.d);
      for (std::size_t i = 0; i < p.d; ++i) sg[i] = opt.sketch_sign(s + 1, 3, i);
      ss.push_back(std::move(sg));
    }
    std::lock_guard<std::mutex> lock(mu);
    grads[r] = std::move(gs);
    if (r == 0) {
      energies = std::move(es);
      signs = std::move(ss);
    }
  }));
  double a = 0.0, b = 0.0;
  std::size_t flips = 0;
  for (std::size_t t = 0; t < 12; ++t) {
    std::vector<double> z(k, 0.0);
    double q = 0.0;
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < p.d; ++i) {
        double const g = grads[r][t][i];
        z[i % k] += signs[t][i] * g / world;
        q += g * g / world;
      }
    }
    double z2 = 0.0;
    for (double v : z) z2 += v * v;
    a = 0.999 * a + 0.001 * z2;
    b = 0.999 * b + 0.001 * q;
    INFO("step " << t + 1);
    CHECK(energies[t].first == Approx(a).epsilon(1e-5));
    CHECK(energies[t].second == Approx(b).epsilon(1e-5));
    if (t > 0) {
      for (std::size_t i = 0; i < p.d; ++i) flips += signs[t][i] != signs[t - 1][i] ? 1 : 0;
    }
  }
  // the signs are drawn afresh each step: about half of them change
  double const share = static_cast<double>(flips) / (11.0 * p.d);
  CHECK(share > 0.35);
  CHECK(share < 0.65);
}

TEST_CASE("calibrated_onebit_adam: rho is 1 for identical gradients and about 1/W for "
          "independent noise",
          "[optim][calibrated_onebit_adam]") {
  // The sketch of the mean is unbiased for ||gbar||^2: with the same gradient on every rank
  // ||gbar||^2 = ||g_w||^2 (rho near 1, clamped to 1); with independent zero-mean noise
  // E||gbar||^2 = E||g_w||^2 / W.
  constexpr int world = 4;
  constexpr std::size_t d = 4096;
  for (bool same : {true, false}) {
    INFO((same ? "identical" : "independent"));
    std::mutex mu;
    std::vector<double> ratio(world, 0.0), rho(world, 0.0);
    REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      cadam1 opt(gc::make_codec("onebit"), {.adam = {.lr = 0.0}, .rows = 64});
      gradcomp_test::test_rng rng(same ? 5 : 5 + r);
      std::vector<float> x(d, 0.0f), g(d);
      for (std::uint64_t s = 0; s < 200; ++s) {
        for (float& v : g) v = static_cast<float>(rng.gaussian());
        opt.step(comm, x, view(g), context(s));
      }
      std::lock_guard<std::mutex> lock(mu);
      ratio[r] = opt.energies().first / opt.energies().second;
      rho[r] = opt.calibration(world);
    }));
    for (int r = 1; r < world; ++r) CHECK(rho[r] == rho[0]);
    if (same) {
      CHECK(ratio[0] == Approx(1.0).epsilon(0.1));
      CHECK(rho[0] > 0.9);
    } else {
      CHECK(ratio[0] == Approx(0.25).epsilon(0.1));
      CHECK(rho[0] == Approx(0.25).epsilon(0.1));
    }
  }
}

TEST_CASE("calibrated_onebit_adam: every rank holds the same parameters, decoded momentum and v",
          "[optim][calibrated_onebit_adam]") {
  quadratic_problem const p(4, 7 * 9, true, 0.3, 5);
  for (char const* codec : {"onebit", "topk:ratio=0.1"}) {
    INFO(codec);
    std::mutex mu;
    std::vector<std::vector<float>> xs(4), ms(4), vs(4), own(4);
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      cadam1 opt(gc::make_codec(codec),
                 {.adam = {.lr = 0.02}, .rows = 7, .sync_first = 2, .sync_every = 3});
      std::vector<float> x(p.d, 0.0f);
      for (std::uint64_t s = 0; s < 20; ++s) {
        opt.step(comm, x, view(p.gradient(r, x, s)), context(s));
      }
      std::lock_guard<std::mutex> lock(mu);
      xs[r] = x;
      ms[r].assign(opt.decoded_momentum().begin(), opt.decoded_momentum().end());
      vs[r] = opt.second_moment();
      own[r].assign(opt.local_momentum().begin(), opt.local_momentum().end());
    }));
    for (std::size_t r = 1; r < 4; ++r) {
      CHECK(xs[r] == xs[0]);
      CHECK(ms[r] == ms[0]);
      CHECK(vs[r] == vs[0]);
      CHECK(own[r] != own[0]);  // control: the ranks' own momenta differ
    }
  }
}

TEST_CASE("calibrated_onebit_adam: error feedback conserves the ranks' momenta",
          "[optim][calibrated_onebit_adam]") {
  // Summed over the steps: what was delivered (W * decoded momentum) plus every worker and
  // server residual equals the sum of the ranks' exact momenta, so the parameters lag the
  // uncompressed trajectory by the residuals only.
  constexpr int world = 2;  // a power of two: W * m is the decoded sum exactly
  quadratic_problem const p(world, 5 * 9, true, 0.5, 9);
  gradcomp_test::conservation_result const c = gradcomp_test::check_two_way_conservation(
      p, world, gc::tensor_id{3}, 25,
      [] { return cadam1(gc::make_codec("onebit"), {.adam = {.lr = 0.01}, .rows = 5}); },
      [](auto const& o) { return o.local_momentum(); }, [](auto const& o) { return o.decoded_momentum(); });
  double const worst = c.worst, scale = c.scale, lag = c.lag;
  INFO(worst << " of " << scale << ", residuals up to " << lag);
  CHECK(scale > 1.0);
  CHECK(lag > 1e-3 * scale);  // control: onebit did leave mass in the residuals
  CHECK(worst < 1e-5 * scale);
}

TEST_CASE("calibrated_onebit_adam: a checkpoint resumes bit-identically; bad input leaves the "
          "state untouched",
          "[optim][calibrated_onebit_adam]") {
  quadratic_problem const p(2, 6 * 6, true, 0.3, 17);
  gc::calibrated_onebit_adam_options const o{
      .adam = {.lr = 0.02}, .rows = 6, .sync_first = 2, .sync_every = 4, .sketch = 8, .seed = 4};
  for (std::uint64_t at : {0u, 1u, 2u, 5u, 6u, 9u}) {
    INFO(at);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      cadam1 a(gc::make_codec("onebit"), o);
      std::vector<float> x(p.d, 0.1f);
      for (std::uint64_t s = 0; s < at; ++s) a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      std::vector<std::byte> const saved = a.save();
      cadam1 b(gc::make_codec("onebit"), o);
      b.load(saved);
      RANK_REQUIRE(b.save() == saved);
      std::vector<float> y = x;
      for (std::uint64_t s = at; s < 16; ++s) {
        a.step(comm, x, view(p.gradient(r, x, s)), context(s));
        b.step(comm, y, view(p.gradient(r, y, s)), context(s));
        RANK_REQUIRE(x == y);
      }
      RANK_REQUIRE(a.save() == b.save());
      // other options or a truncated buffer: format_error, nothing changed
      gc::calibrated_onebit_adam_options other_seed = o, other_sketch = o, other_rows = o;
      other_seed.seed = 5;
      other_sketch.sketch = 16;
      other_rows.rows = 4;
      for (auto const& other : {other_seed, other_sketch, other_rows}) {
        cadam1 c(gc::make_codec("onebit"), other);
        std::vector<std::byte> const before = c.save();
        bool threw = false;
        try {
          c.load(saved);
        } catch (gc::format_error const&) {
          threw = true;
        }
        RANK_REQUIRE(threw && c.save() == before);
      }
      bool threw = false;
      try {
        b.load(std::span<std::byte const>(saved).first(saved.size() - 3));
      } catch (gc::format_error const&) {
        threw = true;
      }
      RANK_REQUIRE(threw && b.save() == a.save());
      // a gradient of another size, and a size that is no 6-row matrix: config_error, with
      // the parameters and the state as they were
      std::vector<float> const before = x;
      std::vector<std::byte> const state = a.save();
      for (std::size_t n : {p.d - 6, std::size_t{35}}) {
        std::vector<float> xs(n, 0.1f), gs(n, 1.0f);
        bool bad = false;
        try {
          a.step(comm, xs, view(gs), context(16));
        } catch (gc::config_error const&) {
          bad = true;
        }
        RANK_REQUIRE(bad && a.save() == state);
      }
      std::vector<float> const wrong(p.d + 1, 1.0f);
      bool bad = false;
      try {
        a.step(comm, x, view(wrong), context(16));
      } catch (gc::config_error const&) {
        bad = true;
      }
      RANK_REQUIRE(bad && a.save() == state && x == before);
    }));
  }
}

TEST_CASE("calibrated_onebit_adam: reaches the optimum of a heterogeneous quadratic; bad options",
          "[optim][calibrated_onebit_adam]") {
  quadratic_problem const p(4, 8 * 8, true, 0.05, 32);
  std::vector<double> const opt = p.optimum();
  double start = 0.0;
  for (double v : opt) start = std::max(start, std::abs(v));
  std::mutex mu;
  double err = 0.0;
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    cadam1 o(gc::make_codec("onebit"), {.adam = {.lr = 0.05}, .rows = 8});
    std::vector<float> x(p.d, 0.0f);
    for (std::uint64_t s = 0; s < 600; ++s) {
      o.set_lr(gradcomp_test::cosine_lr(0.05, s, 600));
      o.step(comm, x, view(p.gradient(r, x, s)), context(s));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (r == 0) err = gradcomp_test::max_abs_error(x, opt);
  }));
  INFO("error " << err << " from a start " << start << " away");
  CHECK(err < 0.05 * start);
  CHECK_THROWS_AS(cadam1(gc::make_codec("onebit"), {.sync_first = 0}), gc::config_error);
  CHECK_THROWS_AS(cadam1(gc::make_codec("onebit"), {.adam = {.lr = -1.0}}), gc::config_error);
}
