// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// adapt/schedule.hpp: the static controller (one factor, 1 = dense), the step schedule
// (piecewise constant, exact traces at the piece boundaries) and DGC's exponential warm-up
// (sparsities 75 %, 93.75 %, 98.4375 %, 99.6 %, 99.9 %); parameter validation.

#include <catch2/catch.hpp>

#include "adapt_support.hpp"

#include <gradcomp/adapt/schedule.hpp>

#include <limits>
#include <string>
#include <vector>

namespace {

using namespace adapt_test;
namespace gc = gradcomp;

double no_gain(std::uint64_t, double) { return 0.0; }  // ignored by these controllers
gc::step_timing no_time(std::uint64_t, gc::decision const&) { return {}; }

}  // namespace

TEST_CASE("static controller: one factor every step; factor 1 is dense", "[schedule]") {
  STATIC_REQUIRE(gc::controller<gc::static_controller>);
  gc::static_controller c(100.0);
  CHECK(factors(c.plan()) == "100");
  auto const t = drive(c, 3, no_gain, no_time);
  CHECK(codes(t) == "m100 m100 m100");
  for (auto const& d : t) {
    CHECK(d.residual == gc::residual_rule::subtract_sent);
    CHECK(factors(d.next) == "100");
    CHECK(d.packet(1) == 0);
  }
  CHECK(c.plan().step == 3);

  gc::static_controller dense(1.0);
  CHECK(dense.plan().measure.empty());
  auto const td = drive(dense, 2, no_gain, no_time);
  CHECK(codes(td) == "d d");
  CHECK(td[0].residual == gc::residual_rule::zero);
  CHECK(td[0].factor == 1.0);
}

TEST_CASE("schedule controller: piecewise by step, exact at each boundary", "[schedule]") {
  STATIC_REQUIRE(gc::controller<gc::schedule_controller>);
  gc::schedule_controller c({{0, 1.0}, {3, 10.0}, {5, 100.0}});
  CHECK(c.plan().measure.empty());
  auto const t = drive(c, 7, no_gain, no_time);
  CHECK(codes(t) == "d d d m10 m10 m100 m100");
  CHECK(factors(t[2].next) == "10");
  CHECK(factors(t[4].next) == "100");
  CHECK(c.factor_at(0) == 1.0);
  CHECK(c.factor_at(2) == 1.0);
  CHECK(c.factor_at(3) == 10.0);
  CHECK(c.factor_at(4) == 10.0);
  CHECK(c.factor_at(std::numeric_limits<std::uint64_t>::max()) == 100.0);
  gc::schedule_controller one({{0, 8.0}});
  CHECK(codes(drive(one, 2, no_gain, no_time)) == "m8 m8");
}

TEST_CASE("dgc_warmup: 75 %, 93.75 %, 98.4375 %, 99.6 % sparsity, then 99.9 %", "[schedule]") {
  gc::schedule_controller c = gc::dgc_warmup(2);
  auto const t = drive(c, 11, no_gain, no_time);
  CHECK(codes(t) == "m4 m4 m16 m16 m64 m64 m256 m256 m1000 m1000 m1000");
  std::vector<double> const sparsity = {0.75, 0.9375, 0.984375, 0.99609375, 0.999};
  std::size_t k = 0;
  for (auto const& p : c.points()) {
    REQUIRE(k < sparsity.size());
    CHECK(1.0 - 1.0 / p.factor == Approx(sparsity[k++]).margin(1e-12));
  }
  CHECK(k == sparsity.size());
  // A final factor below the warm-up's stages caps them (equal stages merged).
  auto const capped = gc::dgc_warmup(3, 50.0);
  CHECK(capped.points() == std::vector<gc::schedule_point>{{0, 4.0}, {3, 16.0}, {6, 50.0}});
  // No warm-up stages: the final factor from step 0.
  CHECK(gc::dgc_warmup(5, 100.0, 0).points() == std::vector<gc::schedule_point>{{0, 100.0}});
  // A final factor equal to the last stage adds no extra point.
  CHECK(gc::dgc_warmup(1, 256.0).points().size() == 4);
  // Other bases: 2, 4, 8.
  CHECK(gc::dgc_warmup(1, 8.0, 3, 2.0).points() ==
        std::vector<gc::schedule_point>{{0, 2.0}, {1, 4.0}, {2, 8.0}});
}

TEST_CASE("schedule controllers reject invalid parameters and out-of-order steps",
          "[schedule]") {
  double const nan = std::numeric_limits<double>::quiet_NaN();
  using v = std::vector<gc::schedule_point>;
  auto msg = [](auto f) { return thrown<gc::config_error>(f); };
  using Catch::Matchers::Contains;
  CHECK_THAT(msg([] { gc::static_controller{0.5}; }), Contains("factor"));
  CHECK_THAT(msg([&] { gc::static_controller{nan}; }), Contains("factor"));
  CHECK_THAT(msg([] { gc::schedule_controller{v{}}; }), Contains("at least one"));
  CHECK_THAT(msg([] { gc::schedule_controller{v{{1, 4.0}}}; }), Contains("expected 0"));
  CHECK_THAT(msg([] { gc::schedule_controller{v{{0, 4.0}, {5, 8.0}, {5, 9.0}}}; }),
             Contains("strictly increasing"));
  CHECK_THAT(msg([] { gc::schedule_controller{v{{0, 4.0}, {5, 0.0}}}; }), Contains("factor"));
  CHECK_THAT(msg([] { gc::dgc_warmup(0); }), Contains("stage_steps"));
  CHECK_THAT(msg([] { gc::dgc_warmup(1, 0.5); }), Contains("final_factor"));
  CHECK_THAT(msg([] { gc::dgc_warmup(1, 1000.0, 4, 1.0); }), Contains("base"));

  gc::static_controller c(10.0);
  gc::step_stats s;
  s.step = 1;
  CHECK_THAT(msg([&] { c.decide(s); }), Contains("expected step 0"));
  s.step = 0;
  s.last_step.compress = -1.0;
  CHECK(thrown<gc::numeric_error>([&] { c.decide(s); }) != "(nothing thrown)");
  CHECK(c.plan().step == 0);
}
