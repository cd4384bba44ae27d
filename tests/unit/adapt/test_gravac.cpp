// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// adapt/gravac.hpp: GraVAC's exact decision traces under scripted statistics: candidate
// sequences of the exponential and geometric policies (the paper's numbers), the θmax cap,
// window boundaries, promotions of θmin (with the gain carried over), the saturation pick
// (the lower factor of the two best compressed throughputs; dense ignored), the three-way send
// with its residual rules, the EWMA (N/100, clamped, seeded with the first sample; ratio or
// separate averages), throughput bookkeeping, and parameter / statistics validation.

#include <catch2/catch.hpp>

#include "adapt_support.hpp"

#include <gradcomp/adapt/gravac.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace adapt_test;
namespace gc = gradcomp;

gc::gravac_config quick(std::uint64_t window) {
  gc::gravac_config c;
  c.window = window;
  c.smoothing = 1.0;  // no smoothing: each decision follows its own step's sample
  return c;
}

// θmin keeps gain 1, every other factor 0.9: the candidate is always sent, never promoted.
double min_one_rest_09(std::uint64_t, double f) { return f == 10.0 || f == 1.5 ? 1.0 : 0.9; }

std::string repeat(std::vector<std::string> const& per_window, std::size_t times) {
  std::string out;
  for (auto const& c : per_window)
    for (std::size_t i = 0; i < times; ++i) out += (out.empty() ? "" : " ") + c;
  return out;
}

}  // namespace

TEST_CASE("GraVAC models the controller concept", "[gravac][controller]") {
  STATIC_REQUIRE(gc::controller<gc::gravac_controller>);
  gc::gravac_controller c;
  CHECK(c.config().theta_min == 10.0);
  CHECK(c.config().theta_max == 1000.0);
  CHECK(c.config().epsilon == 0.7);
  CHECK(c.config().omega == 0.01);
  CHECK(c.config().window == 500);
  CHECK(c.config().step_factor == 2.0);
  CHECK(c.config().policy == gc::gravac_policy::exponential);
  CHECK(factors(c.plan()) == "10,20");
  CHECK(c.plan().step == 0);
  CHECK_FALSE(c.plan().accumulate_layers);
  CHECK_FALSE(c.plan().report_layers);
}

TEST_CASE("GraVAC exponential policy: candidates 20, 40, 160, 1000 from θmin 10, capped at θmax",
          "[gravac]") {
  gc::gravac_controller c(quick(4));
  auto const t = drive(c, 20, min_one_rest_09, throughput_timing([](double f) { return f; }));
  CHECK(codes(t) == repeat({"c20", "c40", "c160", "c1000", "c1000"}, 4));
  // Boundaries fall on steps 3, 7, 11, 15; each decision carries the next step's plan.
  CHECK(factors(t[3].next) == "10,40");
  CHECK(factors(t[2].next) == "10,20");
  CHECK(factors(t[11].next) == "10,1000");
  CHECK(t[19].next.step == 20);
  CHECK(c.last_window().step == 19);
  CHECK_FALSE(c.last_window().scaled);  // already at θmax
  CHECK(c.step_factor() == 256.0);      // 2, 4, 16, 256: factors 2^1, 2^2, 2^4, 2^8
  CHECK(c.theta_min() == 10.0);
  CHECK(c.searching());
  for (std::size_t i = 0; i < t.size(); ++i) {
    CHECK(t[i].step == i);
    CHECK(t[i].residual == gc::residual_rule::subtract_sent);
    CHECK(t[i].gain == 0.9);
    CHECK(t[i].packet(2) == 1);
  }
  auto const tp = c.throughput();
  REQUIRE(tp.size() == 4);
  CHECK(tp.at(20.0) == Approx(20.0));
  CHECK(tp.at(1000.0) == Approx(1000.0));
}

TEST_CASE("GraVAC geometric policy: 20 ... 1280 then 2000 (capped); Random-k's 3 ... 96 from 1.5",
          "[gravac]") {
  auto const tp = throughput_timing([](double f) { return f; });
  SECTION("[10x, 2000x], ratio 2") {
    auto cfg = quick(2);
    cfg.theta_max = 2000.0;
    cfg.policy = gc::gravac_policy::geometric;
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 20, min_one_rest_09, tp);
    CHECK(codes(t) == repeat({"c20", "c40", "c80", "c160", "c320", "c640", "c1280", "c2000",
                              "c2000", "c2000"},
                             2));
    CHECK(c.step_factor() == 256.0);  // stopped growing once the cap was reached
  }
  SECTION("[1.5x, 1000x]") {
    auto cfg = quick(3);
    cfg.theta_min = 1.5;
    cfg.policy = gc::gravac_policy::geometric;
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 18, min_one_rest_09, tp);
    CHECK(codes(t) == repeat({"c3", "c6", "c12", "c24", "c48", "c96"}, 3));
  }
  SECTION("ratio 3") {
    auto cfg = quick(1);
    cfg.policy = gc::gravac_policy::geometric;
    cfg.ratio = 3.0;
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 6, min_one_rest_09, tp);
    CHECK(codes(t) == "c20 c60 c180 c540 c1000 c1000");
  }
}

TEST_CASE("GraVAC promotes θmin to the evaluated candidate when the gains are within ω",
          "[gravac]") {
  // Equal gains everywhere: every boundary promotes. Throughput grows with the factor, so the
  // search never saturates.
  auto const equal = [](std::uint64_t, double) { return 0.95; };
  auto const tp = throughput_timing([](double f) { return f; });
  SECTION("candidate w.r.t. the initial θmin (default)") {
    gc::gravac_controller c(quick(2));
    auto const t = drive(c, 10, equal, tp);
    CHECK(codes(t) == "c20 c20 c40 c40 c160 c160 c1000 c1000 m1000 m1000");
    CHECK(factors(t[1].next) == "20,40");
    CHECK(factors(t[3].next) == "40,160");
    CHECK(factors(t[5].next) == "160,1000");
    CHECK(factors(t[7].next) == "1000");  // nothing left above θmin
    CHECK(c.theta_min() == 1000.0);
    CHECK(c.candidate() == 1000.0);
    CHECK(t[9].packet(1) == 0);
  }
  SECTION("candidate w.r.t. the current θmin (Algorithm 1 as written)") {
    auto cfg = quick(2);
    cfg.candidate_base = gc::gravac_base::current;
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 8, equal, tp);
    CHECK(codes(t) == "c20 c20 c80 c80 c1000 c1000 m1000 m1000");
    CHECK(factors(t[3].next) == "80,1000");
  }
  SECTION("no promotion when the gains differ by more than ω") {
    auto cfg = quick(2);
    cfg.omega = 0.099;  // gains 1 and 0.9 differ by 0.1 relative to θmin's
    gc::gravac_controller c(cfg);
    drive(c, 2, min_one_rest_09, tp);
    CHECK(c.theta_min() == 10.0);
    CHECK_FALSE(c.last_window().promoted);
    cfg.omega = 0.1;
    gc::gravac_controller c2(cfg);
    drive(c2, 2, min_one_rest_09, tp);
    CHECK(c2.theta_min() == 20.0);
    CHECK(c2.last_window().promoted);
  }
  SECTION("the candidate's smoothed gain carries over to θmin") {
    auto cfg = quick(2);
    cfg.smoothing = 0.5;
    cfg.omega = 0.2;
    gc::gravac_controller c(cfg);
    auto const gains = [](std::uint64_t step, double f) {
      if (f == 10.0) return 1.0;
      return step == 0 ? 0.8 : 0.9;
    };
    drive(c, 1, gains, tp);
    CHECK(c.gain_candidate() == 0.8);
    drive(c, 1, gains, tp);  // boundary: candidate EWMA 0.85, within 0.2 of 1
    CHECK(c.last_window().promoted);
    CHECK(c.theta_min() == 20.0);
    CHECK(c.gain_min() == 0.5 * 0.8 + 0.5 * 0.9);
    CHECK(c.gain_candidate() == 1.0);  // the new candidate (40) starts unmeasured
    CHECK(c.candidate() == 40.0);
  }
}

TEST_CASE("GraVAC saturation keeps the lower factor of the two best throughputs and stops",
          "[gravac]") {
  auto cfg = quick(2);
  cfg.theta_max = 2000.0;
  cfg.policy = gc::gravac_policy::geometric;
  SECTION("the paper's example: 1280x at 1029.9 vs 2000x at 1035.4 -> 1280x") {
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 24, min_one_rest_09, throughput_timing([](double f) {
                           return f == 1280.0 ? 1029.9 : f == 2000.0 ? 1035.4 : f;
                         }));
    CHECK(codes(t) == repeat({"c20", "c40", "c80", "c160", "c320", "c640", "c1280", "c2000",
                              "c1280", "c1280", "c1280", "c1280"},
                             2));
    CHECK_FALSE(c.searching());
    CHECK(c.candidate() == 1280.0);
    CHECK(c.theta_min() == 10.0);
    CHECK(c.last_window().step == 23);
    CHECK_FALSE(c.last_window().saturated);  // reported once, at step 15
  }
  SECTION("the lower factor also when it has the higher throughput") {
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 18, min_one_rest_09, throughput_timing([](double f) {
                           return f == 1280.0 ? 1035.4 : f == 2000.0 ? 1029.9 : f;
                         }));
    CHECK(code(t[15]) == "c2000");
    CHECK(c.last_window().step == 17);
    CHECK(code(t[16]) == "c1280");
    CHECK(c.candidate() == 1280.0);
  }
  SECTION("not saturated at a 1.1 % difference with ω = 1 %") {
    gc::gravac_controller c(cfg);
    drive(c, 16, min_one_rest_09, throughput_timing([](double f) {
            return f == 1280.0 ? 1000.0 : f == 2000.0 ? 1011.0 : f;
          }));
    CHECK(c.searching());
    CHECK(c.candidate() == 2000.0);
  }
  SECTION("dense throughput is recorded but never picked; a pick below θmin lowers θmin") {
    auto cfg2 = quick(2);
    gc::gravac_controller c(cfg2);
    // Steps 0-1: both gains below ε -> dense, at a huge throughput. Then θmin gain 1 and
    // candidate 0.9; 40x and 160x end within 1 %.
    auto const gains = [](std::uint64_t step, double f) {
      if (step < 2) return f == 10.0 ? 0.5 : 0.4;
      return f == 10.0 ? 1.0 : 0.9;
    };
    auto const t = drive(c, 8, gains, throughput_timing([](double f) {
                           return f == 1.0 ? 1e4 : f == 160.0 ? 100.5 : 100.0;
                         }));
    CHECK(codes(t) == "d d c40 c40 c160 c160 c40 c40");
    CHECK(c.throughput().at(1.0) == Approx(1e4));
    CHECK(c.last_window().step == 7);
    CHECK_FALSE(c.searching());

    gc::gravac_controller p(quick(2));  // equal gains: promotions every window
    auto const t2 = drive(p, 8, [](std::uint64_t, double) { return 0.95; },
                          throughput_timing([](double f) { return f == 40.0 ? 100.5 : 100.0; }));
    CHECK(codes(t2) == "c20 c20 c40 c40 m20 m20 m20 m20");
    CHECK(p.theta_min() == 20.0);
    CHECK(p.candidate() == 20.0);
    CHECK(factors(p.plan()) == "20");
  }
}

TEST_CASE("GraVAC three-way send: candidate, else θmin, else dense; residual rules",
          "[gravac]") {
  // Per-step samples {θmin gain, candidate gain}; smoothing 1 so each step decides on its own.
  std::vector<std::pair<double, double>> const g = {
      {1.0, 0.9}, {0.8, 0.6}, {0.6, 0.5}, {0.7, 0.7}, {0.69, 0.7}, {0.9, 0.69}};
  auto const gains = [&](std::uint64_t step, double f) {
    return f == 10.0 ? g[step].first : g[step].second;
  };
  auto const tp = throughput_timing([](double) { return 1.0; });
  gc::gravac_controller c(quick(1000));
  auto const t = drive(c, 6, gains, tp);
  CHECK(codes(t) == "c20 m10 d c20 c20 m10");
  CHECK(t[1].residual == gc::residual_rule::subtract_sent);
  CHECK(t[1].gain == 0.8);
  CHECK(t[1].packet(2) == 0);
  CHECK(t[2].residual == gc::residual_rule::zero);
  CHECK(t[2].factor == 1.0);
  CHECK(t[2].gain == 1.0);
  CHECK(t[2].packet(2) == gc::decision::npos);

  auto cfg = quick(1000);
  cfg.dense_fallback = gc::gravac_dense::keep;
  gc::gravac_controller k(cfg);
  auto const t2 = drive(k, 6, gains, tp);
  CHECK(codes(t2) == codes(t));
  CHECK(t2[2].residual == gc::residual_rule::keep);

  cfg.epsilon = 0.0;  // everything passes: always the candidate
  gc::gravac_controller z(cfg);
  CHECK(codes(drive(z, 6, gains, tp)) == "c20 c20 c20 c20 c20 c20");
  cfg.epsilon = 1.0;  // only lossless passes
  gc::gravac_controller o(cfg);
  CHECK(codes(drive(o, 6, gains, tp)) == "m10 d d d d d");
}

TEST_CASE("GraVAC with θmax = θmin measures one factor: θmin or dense", "[gravac]") {
  auto cfg = quick(2);
  cfg.theta_max = 10.0;
  gc::gravac_controller c(cfg);
  CHECK(factors(c.plan()) == "10");
  auto const gains = [](std::uint64_t step, double) { return step % 3 == 2 ? 0.5 : 0.8; };
  auto const t = drive(c, 6, gains, throughput_timing([](double f) { return f; }));
  CHECK(codes(t) == "m10 m10 d m10 m10 d");
  CHECK(factors(c.plan()) == "10");
  CHECK(c.searching());
}

TEST_CASE("GraVAC gain EWMA: weight N/100 clamped to 1, seeded with the first sample",
          "[gravac]") {
  auto cfg = quick(1000);
  cfg.smoothing = 0.0;  // automatic
  auto const tp = throughput_timing([](double) { return 1.0; });
  std::vector<double> const s = {1.0, 0.5, 0.5, 0.5};
  auto const gains = [&](std::uint64_t step, double f) { return f == 10.0 ? s[step] : 0.1; };
  SECTION("32 workers: 0.32") {
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 4, gains, tp, 32);
    double const a = 32.0 / 100.0;
    double e = 1.0;
    std::vector<double> expect = {e};
    for (int i = 1; i < 4; ++i) expect.push_back(e = (1.0 - a) * e + a * 0.5);
    CHECK(c.gain_min() == expect[3]);
    for (int i = 0; i < 4; ++i) CHECK(t[static_cast<std::size_t>(i)].gain ==
                                      (expect[static_cast<std::size_t>(i)] >= 0.7 ? expect[static_cast<std::size_t>(i)] : 1.0));
    // 1, 0.84, 0.7312 pass ε = 0.7; 0.657 does not: smoothing delays the fallback.
    CHECK(codes(t) == "m10 m10 m10 d");
  }
  SECTION("200 workers: clamped to 1") {
    gc::gravac_controller c(cfg);
    auto const t = drive(c, 4, gains, tp, 200);
    CHECK(c.gain_min() == 0.5);
    CHECK(codes(t) == "m10 d d d");
  }
  SECTION("explicit smoothing overrides N/100") {
    cfg.smoothing = 0.5;
    gc::gravac_controller c(cfg);
    drive(c, 2, gains, tp, 32);
    CHECK(c.gain_min() == 0.75);
  }
}

TEST_CASE("GraVAC gain: ratio vs separate averages, clamp to [0, 1], zero gradient",
          "[gravac]") {
  auto run = [](gc::gravac_gain_average mode, std::vector<std::pair<double, double>> const& es) {
    gc::gravac_config cfg;
    cfg.smoothing = 0.5;
    cfg.gain_average = mode;
    cfg.theta_max = 10.0;
    gc::gravac_controller c(cfg);
    for (auto const& [ef, cn] : es) {
      gc::step_stats s;
      s.step = c.plan().step;
      s.ef_norm_sq = ef;
      s.compressed_norm_sq = {cn};
      s.workers = 1;
      s.batch_size = 1;
      c.decide(s);
    }
    return c.gain_min();
  };
  using m = gc::gravac_gain_average;
  // ‖g_ef‖² 1 then 3, ‖C‖² 1 both times.
  CHECK(run(m::ratio, {{1.0, 1.0}, {3.0, 1.0}}) == 0.5 * 1.0 + 0.5 * (1.0 / 3.0));
  CHECK(run(m::separate, {{1.0, 1.0}, {3.0, 1.0}}) == 1.0 / (0.5 * 1.0 + 0.5 * 3.0));
  CHECK(run(m::ratio, {{1.0, 2.0}}) == 1.0);     // a codec that inflates the norm: clamped
  CHECK(run(m::separate, {{1.0, 2.0}}) == 1.0);
  CHECK(run(m::ratio, {{0.0, 0.0}}) == 1.0);     // nothing to lose
  CHECK(run(m::separate, {{0.0, 0.0}}) == 1.0);
  CHECK(run(m::ratio, {{4.0, 0.0}}) == 0.0);
}

TEST_CASE("GraVAC throughput: N·b/t_iter × gain; dense excludes compression time",
          "[gravac]") {
  auto cfg = quick(1000);
  cfg.throughput = gc::gravac_throughput::last;
  auto const gains = [](std::uint64_t step, double f) {
    if (step == 1) return 0.5;  // dense
    return f == 10.0 ? 1.0 : 0.9;
  };
  // Every step: backprop 1 s, compression 0.5 s, sync 0.5 s (step 2: 1.5 s sync).
  auto const timing = [](std::uint64_t step, gc::decision const&) {
    return gc::step_timing{1.0, 0.5, step == 2 ? 1.5 : 0.5};
  };
  gc::gravac_controller c(cfg);
  auto const t = drive(c, 4, gains, timing, 4, 8);
  CHECK(codes(t) == "c20 d c20 c20");
  auto tp = c.throughput();
  REQUIRE(tp.size() == 2);
  CHECK(tp.at(1.0) == 32.0 / 1.5 * 1.0);  // compression time not counted on the dense path
  CHECK(tp.at(20.0) == 32.0 / 3.0 * 0.9);  // last value: step 2's (step 3's arrives later)

  cfg.throughput = gc::gravac_throughput::window_mean;
  cfg.window = 4;
  gc::gravac_controller w(cfg);
  drive(w, 4, gains, timing, 4, 8);
  tp = w.throughput();
  REQUIRE(tp.size() == 2);
  CHECK(tp.at(20.0) == Approx((32.0 / 2.0 * 0.9 + 32.0 / 3.0 * 0.9) / 2.0));

  // No time reported (e.g. a pipeline that does not time its steps): no throughput sample.
  gc::gravac_controller z(cfg);
  drive(z, 4, gains, [](std::uint64_t, gc::decision const&) { return gc::step_timing{}; });
  CHECK(z.throughput().empty());
}

TEST_CASE("GraVAC rejects invalid parameters with config_error", "[gravac]") {
  auto bad = [](auto change, char const* what) {
    gc::gravac_config cfg;
    change(cfg);
    CHECK_THAT(thrown<gc::config_error>([&] { gc::gravac_controller{cfg}; }),
               Catch::Matchers::Contains(what));
  };
  double const nan = std::numeric_limits<double>::quiet_NaN();
  double const inf = std::numeric_limits<double>::infinity();
  bad([](auto& c) { c.theta_min = 1.0; }, "theta_min");
  bad([&](auto& c) { c.theta_min = nan; }, "theta_min");
  bad([](auto& c) { c.theta_max = 9.0; }, "theta_max");
  bad([&](auto& c) { c.theta_max = inf; }, "theta_max");
  bad([](auto& c) { c.epsilon = -0.1; }, "epsilon");
  bad([](auto& c) { c.epsilon = 1.01; }, "epsilon");
  bad([](auto& c) { c.omega = 1.0; }, "omega");
  bad([](auto& c) { c.omega = -0.01; }, "omega");
  bad([](auto& c) { c.window = 0; }, "window");
  bad([](auto& c) { c.step_factor = 1.0; }, "step_factor");
  bad([](auto& c) { c.ratio = 0.5; }, "ratio");
  bad([](auto& c) { c.smoothing = 1.5; }, "smoothing");
  bad([](auto& c) { c.smoothing = -0.5; }, "smoothing");
  bad([](auto& c) { c.policy = static_cast<gc::gravac_policy>(7); }, "enum");
  gc::gravac_config ok;
  ok.theta_max = ok.theta_min;
  ok.epsilon = 0.0;
  ok.omega = 0.0;
  ok.window = 1;
  CHECK_NOTHROW(gc::gravac_controller(ok));
}

TEST_CASE("GraVAC rejects malformed statistics and is unchanged afterwards", "[gravac]") {
  gc::gravac_controller c(quick(2));
  gc::step_stats good;
  good.step = 0;
  good.ef_norm_sq = 1.0;
  good.compressed_norm_sq = {1.0, 0.9};
  good.workers = 2;
  good.batch_size = 4;
  auto with = [&](auto change) {
    gc::step_stats s = good;
    change(s);
    return s;
  };
  double const nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.step = 1; })), gc::config_error);
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.compressed_norm_sq = {1.0}; })),
                  gc::config_error);
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.workers = 0; })), gc::config_error);
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.batch_size = 0; })), gc::config_error);
  CHECK_THROWS_AS(c.decide(with([&](auto& s) { s.ef_norm_sq = nan; })), gc::numeric_error);
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.compressed_norm_sq[1] = -1.0; })),
                  gc::numeric_error);
  CHECK_THROWS_AS(c.decide(with([](auto& s) { s.last_step.sync = -1.0; })), gc::numeric_error);
  CHECK_THROWS_AS(c.decide(with([&](auto& s) { s.last_step.backprop = nan; })),
                  gc::numeric_error);
  // Still at step 0, with nothing measured: same decision as a fresh controller.
  gc::gravac_controller fresh(quick(2));
  CHECK(c.plan() == fresh.plan());
  auto const a = c.decide(good), b = fresh.decide(good);
  CHECK(code(a) == code(b));
  CHECK(a.gain == b.gain);
  CHECK(c.gain_min() == fresh.gain_min());
}
