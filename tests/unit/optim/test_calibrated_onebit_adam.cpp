// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Calibrated 1-bit Adam (optim/calibrated_onebit_adam.hpp): bit-identical to Adam on one rank
// with the identity codec, each rank's exact momentum, the sketch energies against their
// definition and the estimator's two limits (identical and independent gradients), the
// sketch's schedule and buckets, an unbiased estimate of a fixed mean gradient over many
// Philox draws whose spread does not follow the columns' energies, identical ranks, error
// feedback that conserves the momenta's mass, bit-identical resumption, and bad input
// rejected with the state untouched.

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
    // steps 1..4 (sync_first): min(sketch_first, n) = n buckets, one per element; then k
    std::size_t const kt = t < 4 ? p.d : k;
    std::vector<double> z(kt, 0.0);
    double q = 0.0;
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < p.d; ++i) {
        double const g = grads[r][t][i];
        z[cadam1::sketch_bucket(i, kt, p.d)] += signs[t][i] * g / world;
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

TEST_CASE("calibrated_onebit_adam: the sketch's size per step and its buckets",
          "[optim][calibrated_onebit_adam]") {
  cadam1 const opt(gc::make_codec("onebit"), {.rows = 8, .sync_first = 3, .sketch = 64,
                                              .sketch_first = 1024});
  for (std::uint64_t t : {1u, 2u, 3u}) {
    CHECK(opt.sketch_buckets(t, 4096) == 1024);
    CHECK(opt.sketch_buckets(t, 100) == 100);  // at most one bucket per element
  }
  CHECK(opt.sketch_buckets(4, 4096) == 64);
  CHECK(opt.sketch_buckets(400, 10) == 10);
  cadam1 const flat(gc::make_codec("onebit"), {.sketch = 64, .sketch_first = 0});
  CHECK(flat.sketch_buckets(1, 4096) == 64);
  cadam1 const none(gc::make_codec("onebit"), {.sketch = 0});
  CHECK(none.sketch_buckets(1, 4096) == 0);
  CHECK(none.calibration(4) == 1.0);
  // k = n: one element per bucket; else every bucket in range, and each column of a
  // row-major matrix spread over the buckets (i mod k would put a 512-wide matrix's column
  // into one bucket of 64, or, with 1024 buckets, give a bucket one column's elements alone)
  for (std::size_t i = 0; i < 10; ++i) CHECK(cadam1::sketch_bucket(i, 10, 10) == i);
  constexpr std::size_t rows = 256, cols = 512;
  for (std::size_t k : {std::size_t{64}, std::size_t{1024}}) {
    INFO(k << " buckets");
    std::vector<std::size_t> per_bucket(k, 0);
    std::size_t worst_column = 0;  // the most elements of one column in one bucket
    for (std::size_t c = 0; c < cols; ++c) {
      std::vector<std::size_t> hits(k, 0);
      for (std::size_t r = 0; r < rows; ++r) {
        std::size_t const b = cadam1::sketch_bucket(r * cols + c, k, rows * cols);
        REQUIRE(b < k);
        ++hits[b];
        ++per_bucket[b];
      }
      worst_column = std::max(worst_column, *std::max_element(hits.begin(), hits.end()));
    }
    // rows / k (4) or rows / k rounded up (1) elements of a column per bucket on average
    CHECK(worst_column <= (k == 64 ? 12u : 3u));
    auto const [lo, hi] = std::minmax_element(per_bucket.begin(), per_bucket.end());
    double const mean = static_cast<double>(rows * cols) / static_cast<double>(k);
    CHECK(static_cast<double>(*lo) > 0.9 * mean);
    CHECK(static_cast<double>(*hi) < 1.1 * mean);
  }
}

TEST_CASE("calibrated_onebit_adam: the sketched energy of a fixed mean gradient is unbiased over "
          "many Philox draws, with a spread set by the buckets, not the columns",
          "[optim][calibrated_onebit_adam]") {
  // Two ranks pass the same fixed gradients at every step (lr 0), so each step's sketch
  // estimate z2_t = (A_t - b2 A_(t-1)) / (1 - b2) is a fresh draw of signs on the same mean
  // gbar. Its mean over the draws is ||gbar||^2 (the cross terms have random signs), and its
  // relative spread is about sqrt(2 / k) when the buckets' energies are even, which the
  // Fibonacci buckets make them here although 8 of the 512 columns carry 60 % of the energy
  // (with i mod 64 each of those 8 columns would share a bucket with 7 light ones only, and
  // the spread be about twice as large).
  constexpr int world = 2;
  constexpr std::size_t rows = 64, cols = 512, n = rows * cols, k = 64, draws = 400;
  std::vector<std::vector<float>> grads(world, std::vector<float>(n));
  for (int r = 0; r < world; ++r) {
    gradcomp_test::test_rng rng(41 + static_cast<std::uint64_t>(r));
    for (std::size_t i = 0; i < n; ++i) {
      double const scale = i % cols < 8 ? 10.0 : 1.0;  // 8 heavy columns
      grads[static_cast<std::size_t>(r)][i] = static_cast<float>(scale * rng.gaussian());
    }
  }
  double mean2 = 0.0, own2 = 0.0;  // ||gbar||^2 and mean_w ||g_w||^2
  for (std::size_t i = 0; i < n; ++i) {
    double const a = grads[0][i], b = grads[1][i], m = 0.5 * (a + b);
    mean2 += m * m;
    own2 += 0.5 * (a * a + b * b);
  }
  std::mutex mu;
  std::vector<double> z2;  // rank 0's per-step estimates
  double ratio = 0.0;
  REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    cadam1 opt(gc::make_codec("onebit"),
               {.adam = {.lr = 0.0}, .rows = rows, .sketch = k, .sketch_first = 0, .seed = 7});
    std::vector<float> x(n, 0.0f);
    std::vector<double> est;
    double prev = 0.0;
    for (std::uint64_t s = 0; s < draws; ++s) {
      opt.step(comm, x, view(grads[r]), context(s));
      double const a = opt.energies().first;
      est.push_back((a - 0.999 * prev) / 0.001);
      prev = a;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (r == 0) {
      z2 = std::move(est);
      ratio = opt.energies().first / opt.energies().second;
    }
  }));
  double sum = 0.0, sq = 0.0;
  for (double v : z2) {
    sum += v / mean2;
    sq += (v / mean2) * (v / mean2);
  }
  double const avg = sum / draws, sd = std::sqrt(sq / draws - avg * avg);
  INFO("mean " << avg << ", relative spread " << sd << " (sqrt(2/k) = " << std::sqrt(2.0 / k)
                << ")");
  CHECK(avg == Approx(1.0).epsilon(0.05));                 // about 5 standard errors
  CHECK(ratio == Approx(mean2 / own2).epsilon(0.05));
  CHECK(sd > 0.5 * std::sqrt(2.0 / k));  // control: the signs do change between draws
  CHECK(sd < 1.4 * std::sqrt(2.0 / k));
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
      gc::calibrated_onebit_adam_options other_seed = o, other_sketch = o, other_first = o,
                                         other_rows = o;
      other_seed.seed = 5;
      other_sketch.sketch = 16;
      other_first.sketch_first = 32;
      other_rows.rows = 4;
      for (auto const& other : {other_seed, other_sketch, other_first, other_rows}) {
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

TEST_CASE("calibrated_onebit_adam: by default the ranks average v at steps 1..4 and every 4 after",
          "[optim][calibrated_onebit_adam]") {
  // half of factored_onebit_adam's period: the training example's byte budget at 30x has room
  // for it, and the v is fresher (docs/training.md, "Fresher second moments")
  cadam1 const o(gc::make_codec("onebit"), {});
  CHECK(o.options().sync_first == 4);
  CHECK(o.options().sync_every == 4);
  CHECK(gc::factored_onebit_adam_options{}.sync_every == 8);
  for (std::uint64_t t : {1u, 2u, 3u, 4u, 8u, 12u, 100u}) CHECK(o.sync_at(t));
  for (std::uint64_t t : {5u, 6u, 7u, 9u, 10u, 11u, 99u}) CHECK_FALSE(o.sync_at(t));
}
