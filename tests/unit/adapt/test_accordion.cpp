// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// adapt/accordion.hpp: Accordion's exact decision traces: low compression at the start, the
// accumulate/report schedule, critical-regime detection per layer with η, the whole-model
// scope, a zero earlier norm, the learning-rate-decay rule; validation.

#include <catch2/catch.hpp>

#include "adapt_support.hpp"

#include <gradcomp/adapt/accordion.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace adapt_test;
namespace gc = gradcomp;

gc::accordion_config small(gc::accordion_scope scope = gc::accordion_scope::any_layer) {
  gc::accordion_config c;
  c.low_factor = 2.0;
  c.high_factor = 100.0;
  c.interval = 5;
  c.accumulation = 2;
  c.scope = scope;
  return c;
}

// Plays the pipeline: at report steps, the accumulated per-layer norms (not squared) come from
// `norms[report index]`; `lr[step]` is the learning rate of each step (default 0.1).
struct player {
  std::vector<std::vector<double>> norms;
  std::map<std::uint64_t, double> lr;
  std::size_t reports = 0;

  double rate(std::uint64_t step) const {
    auto it = lr.upper_bound(step);
    return it == lr.begin() ? 0.1 : std::prev(it)->second;
  }

  template <class C>
  std::string run(C& c, std::uint64_t steps) {
    std::vector<gc::decision> out;
    for (std::uint64_t i = 0; i < steps; ++i) {
      gc::step_plan const p = c.plan();
      gc::step_stats s;
      s.step = p.step;
      if (p.report_layers) {
        for (double n : norms.at(reports)) s.layer_norms_sq.push_back(n * n);
        ++reports;
      }
      s.learning_rate = rate(p.step);
      s.next_learning_rate = rate(p.step + 1);
      out.push_back(c.decide(s));
    }
    return codes(out);
  }
};

std::string repeat(std::string const& code, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (out.empty() ? "" : " ") + code;
  return out;
}

}  // namespace

TEST_CASE("Accordion models the controller concept; defaults as in the authors' code",
          "[accordion]") {
  STATIC_REQUIRE(gc::controller<gc::accordion_controller>);
  gc::accordion_controller c;
  CHECK(c.config().eta == 0.5);
  CHECK(c.config().low_factor == 100.0 / 99.0);
  CHECK(c.config().high_factor == 10.0);
  CHECK(c.critical());
  CHECK(c.factor() == 100.0 / 99.0);
}

TEST_CASE("Accordion accumulates at the start of each interval and reports at its end",
          "[accordion]") {
  gc::accordion_controller c(small());
  std::vector<bool> acc, rep;
  player p{{{1.0}, {1.0}, {1.0}}, {}};
  for (int i = 0; i < 12; ++i) {
    acc.push_back(c.plan().accumulate_layers);
    rep.push_back(c.plan().report_layers);
    p.run(c, 1);
  }
  CHECK(acc == std::vector<bool>{1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1});
  CHECK(rep == std::vector<bool>{0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});

  gc::accordion_config whole = small();
  whole.accumulation = whole.interval;
  gc::accordion_controller w(whole);
  for (int i = 0; i < 5; ++i) {
    CHECK(w.plan().accumulate_layers);
    CHECK(w.plan().report_layers == (i == 4));
    player{{{1.0}}, {}}.run(w, 1);
  }
}

TEST_CASE("Accordion: low at the start, high once the norms settle, low in critical regimes",
          "[accordion]") {
  // Reports at steps 1, 6, 11, 16, 21. Layer norms per report.
  player p{{{10.0, 4.0}, {6.0, 4.0}, {4.0, 3.0}, {4.0, 2.0}, {4.0, 2.5}}, {}};
  gc::accordion_controller c(small());
  std::string const t = p.run(c, 25);
  // Steps 0-6: low (start; the first report has no earlier one; the second report's change
  // |10-6|/10 = 0.4 < 0.5 for layer 0 and 0 for layer 1 -> high from step 7).
  // Report 3 (step 11): |6-4|/6 = 0.33, |4-3|/4 = 0.25 -> high.
  // Report 4 (step 16): 0, |3-2|/3 = 0.33 -> high.  Report 5 (step 21): 0, 0.25 -> high.
  CHECK(t == repeat("m2", 7) + " " + repeat("m100", 18));
  CHECK_FALSE(c.critical());

  // Now a layer jumps: |2-1|/2 = 0.5 >= η is critical (the threshold is inclusive).
  player q{{{10.0, 2.0}, {10.0, 2.0}, {10.0, 1.0}, {10.0, 1.0}}, {}};
  gc::accordion_controller d(small());
  std::string const u = q.run(d, 20);
  CHECK(u == repeat("m2", 7) + " " + repeat("m100", 5) + " " + repeat("m2", 5) + " " +
                 repeat("m100", 3));
  CHECK(d.relative_changes() == std::vector<double>{0.0, 0.0});
  CHECK(d.layer_factors() == std::vector<double>{100.0, 100.0});
}

TEST_CASE("Accordion scope: any layer vs the whole model's norm", "[accordion]") {
  // Layer 1 is tiny and changes a lot; the whole model barely changes.
  std::vector<std::vector<double>> const n = {{100.0, 1.0}, {100.0, 1.0}, {100.0, 3.0}};
  player a{n, {}};
  gc::accordion_controller any(small(gc::accordion_scope::any_layer));
  CHECK(a.run(any, 15) == repeat("m2", 7) + " " + repeat("m100", 5) + " " + repeat("m2", 3));
  CHECK(any.layer_factors() == std::vector<double>{100.0, 2.0});
  CHECK(any.relative_changes()[1] == 2.0);

  player w{n, {}};
  gc::accordion_controller whole(small(gc::accordion_scope::whole_model));
  CHECK(w.run(whole, 15) == repeat("m2", 7) + " " + repeat("m100", 8));
  CHECK(whole.model_relative_change() ==
        std::fabs(std::sqrt(100.0 * 100.0 + 1.0) - std::sqrt(100.0 * 100.0 + 9.0)) /
            std::sqrt(100.0 * 100.0 + 1.0));
  CHECK(whole.layer_factors() == std::vector<double>{100.0, 2.0});  // still reported per layer
}

TEST_CASE("Accordion: an earlier norm of zero counts as critical", "[accordion]") {
  player p{{{0.0}, {0.0}, {0.0}}, {}};
  gc::accordion_controller c(small());
  CHECK(p.run(c, 15) == repeat("m2", 15));
  CHECK(std::isinf(c.relative_changes()[0]));
}

TEST_CASE("Accordion: a learning-rate decay switches to low until the next report",
          "[accordion]") {
  // Steady norms (high compression from step 7); the learning rate drops at step 9 and 19
  // (reports at 1, 6, 11, 16, 21).
  player p{{{5.0}, {5.0}, {5.0}, {5.0}, {5.0}}, {{9, 0.01}, {19, 0.001}}};
  gc::accordion_controller c(small());
  std::string const t = p.run(c, 25);
  // Step 8 announces the decay (next 0.01 < 0.1): steps 9-11 low; report at 11 -> high from 12.
  // Step 18 announces the second: steps 19-21 low; report 21 -> high.
  CHECK(t == repeat("m2", 7) + " m100 m100 " + repeat("m2", 3) + " " + repeat("m100", 7) +
                 " " + repeat("m2", 3) + " " + repeat("m100", 3));
  // A learning-rate increase does nothing.
  player up{{{5.0}, {5.0}, {5.0}}, {{9, 1.0}}};
  gc::accordion_controller u(small());
  CHECK(up.run(u, 12) == repeat("m2", 7) + " " + repeat("m100", 5));
}

TEST_CASE("Accordion: an unreported next learning rate (0) is no decay", "[accordion][regression]") {
  // Regression: next_learning_rate == 0 means "not reported" (adapt/protocol.hpp), but was read
  // as a decay below learning_rate, so a pipeline reporting only learning_rate stayed at the low
  // factor forever (0 of 100 steps at the high factor).
  gc::accordion_controller c(small());
  int high = 0;
  for (int i = 0; i < 100; ++i) {
    gc::step_plan const p = c.plan();
    gc::step_stats s;
    s.step = p.step;
    if (p.report_layers) s.layer_norms_sq.push_back(25.0);  // steady norms
    s.learning_rate = 0.1;                                  // next_learning_rate left at 0
    if (c.factor() == 100.0) ++high;
    c.decide(s);
  }
  // Reports at steps 1 and 6 find the norm steady: high from step 7 on.
  CHECK(high == 93);
}

TEST_CASE("Accordion with a dense low level", "[accordion]") {
  auto cfg = small();
  cfg.low_factor = 1.0;
  gc::accordion_controller c(cfg);
  CHECK(c.plan().measure.empty());
  player p{{{5.0}, {5.0}}, {}};
  gc::step_plan const first = c.plan();
  CHECK(p.run(c, 8) == repeat("d", 7) + " m100");
  CHECK(first.measure.empty());
}

TEST_CASE("Accordion rejects invalid parameters and malformed statistics", "[accordion]") {
  using Catch::Matchers::Contains;
  auto bad = [](auto change, char const* what) {
    gc::accordion_config cfg;
    change(cfg);
    CHECK_THAT(thrown<gc::config_error>([&] { gc::accordion_controller{cfg}; }), Contains(what));
  };
  double const nan = std::numeric_limits<double>::quiet_NaN();
  bad([](auto& c) { c.low_factor = 0.5; }, "low_factor");
  bad([&](auto& c) { c.low_factor = nan; }, "low_factor");
  bad([](auto& c) { c.high_factor = 1.0; }, "high_factor");
  bad([](auto& c) { c.eta = 0.0; }, "eta");
  bad([](auto& c) { c.interval = 0; }, "interval");
  bad([](auto& c) { c.accumulation = 0; }, "accumulation");
  bad([](auto& c) { c.accumulation = c.interval + 1; }, "accumulation");
  bad([](auto& c) { c.scope = static_cast<gc::accordion_scope>(9); }, "scope");

  gc::accordion_controller c(small());
  gc::step_stats s;
  s.step = 0;
  c.decide(s);
  s.step = 1;  // a report step
  CHECK_THAT(thrown<gc::config_error>([&] { c.decide(s); }), Contains("layer_norms_sq"));
  s.layer_norms_sq = {1.0, nan};
  CHECK(thrown<gc::numeric_error>([&] { c.decide(s); }) != "(nothing thrown)");
  s.layer_norms_sq = {1.0, 4.0};
  c.decide(s);
  for (std::uint64_t i = 2; i < 6; ++i) {
    s.step = i;
    s.layer_norms_sq.clear();
    c.decide(s);
  }
  s.step = 6;
  s.layer_norms_sq = {1.0, 4.0, 9.0};
  CHECK_THAT(thrown<gc::config_error>([&] { c.decide(s); }), Contains("expected 2"));
  CHECK(c.plan().step == 6);
  s.layer_norms_sq = {1.0, 4.0};
  CHECK(c.decide(s).step == 6);
}
