// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// adapt/ef_window.hpp: the window controller for error feedback. On a model of error feedback
// whose delay grows with the factor it settles on the highest rung whose delay fits, from
// below and from above; it does not move up while the residual is still filling and moves
// down when the residual keeps growing; its window measurements are Little's law and the
// energy balance, checked by hand. The loss check: a falling or noisy loss changes nothing, a
// rise drops to the lowest rung under a ceiling that the ladder then climbs back to and not
// above, a rise at the lowest rung turns compression off, the threshold (a fraction of the
// progress and two standard errors) and the grace window hold exactly. Its state round-trips
// bit for bit and hostile states, specs, parameters and statistics are rejected with the
// library's errors.

#include <catch2/catch.hpp>

#include "adapt_support.hpp"

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/ef_window.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace adapt_test;
namespace gc = gradcomp;
using Catch::Matchers::Contains;

// Error feedback with a sparsifier, reduced to energies: each step a fresh gradient of energy
// `inflow` joins the residual (E = R + inflow: the fresh gradient is uncorrelated with the
// residual), the sent factor f keeps the fraction q(f) = 1 / (1 + f / kappa) of E, and the
// residual keeps the rest. In steady state R / C = f / kappa: the delay grows in proportion to
// the factor, as it does for top-k (docs/training.md).
// `loss` (NaN: none reported) is the training loss the step reports; a dense step (the loss
// check turned compression off) keeps the residual and sends the fresh gradient.
struct ef_model {
  double kappa = 8.0;
  double residual = 0.0;
  std::function<double(std::uint64_t)> inflow = [](std::uint64_t) { return 1.0; };
  std::function<double(std::uint64_t)> loss = [](std::uint64_t) {
    return std::numeric_limits<double>::quiet_NaN();
  };

  [[nodiscard]] double kept(double f) const { return 1.0 / (1.0 + f / kappa); }

  template <class C>
  gc::decision step(C& c) {
    gc::step_plan const p = c.plan();
    gc::step_stats s;
    s.step = p.step;
    s.ef_norm_sq = residual + inflow(p.step);
    for (double f : p.measure) s.compressed_norm_sq.push_back(kept(f) * s.ef_norm_sq);
    s.workers = 2;
    s.batch_size = 32;
    s.loss = loss(p.step);
    gc::decision d = c.decide(s);
    if (d.send != gc::send_kind::dense) residual = s.ef_norm_sq - kept(d.factor) * s.ef_norm_sq;
    return d;
  }
};

// A loss given block by block: `means[b]` for the steps of block b (block_steps steps each),
// the last mean for every later step.
std::function<double(std::uint64_t)> block_losses(std::vector<double> means,
                                                  std::uint64_t block_steps = 10) {
  return [means = std::move(means), block_steps](std::uint64_t step) {
    std::size_t const b = static_cast<std::size_t>(step / block_steps);
    return means[std::min(b, means.size() - 1)];
  };
}

// Runs `steps` steps; the factor of every step's decision (1 for dense).
template <class C>
std::vector<double> run_steps(C& c, ef_model& m, std::uint64_t steps) {
  std::vector<double> out;
  for (std::uint64_t i = 0; i < steps; ++i) out.push_back(m.step(c).factor);
  return out;
}

// The factor of every window boundary's next window, for `windows` windows.
template <class C>
std::vector<double> run_windows(C& c, ef_model& m, std::size_t windows, std::uint64_t window) {
  std::vector<double> out;
  for (std::size_t w = 0; w < windows; ++w) {
    for (std::uint64_t i = 0; i < window; ++i) (void)m.step(c);
    out.push_back(c.factor());
  }
  return out;
}

void put_u64_at(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}

}  // namespace

TEST_CASE("ef_window models the controller concept; ladder, start and plan",
          "[ef_window][controller]") {
  STATIC_REQUIRE(gc::controller<gc::ef_window_controller>);
  gc::ef_window_controller c;
  CHECK(c.rungs() == std::vector<double>{10, 20, 40, 80, 160, 320, 640, 1000});
  CHECK(c.factor() == 80.0);  // highest rung <= sqrt(10 * 1000) = 100
  CHECK(factors(c.plan()) == "80,160");
  CHECK_FALSE(c.plan().accumulate_layers);
  CHECK_FALSE(c.plan().report_layers);

  gc::ef_window_config top;
  top.start = 1000.0;
  gc::ef_window_controller t(top);
  CHECK(t.factor() == 1000.0);
  CHECK(factors(t.plan()) == "640,1000");  // at the top the current rung is the candidate
  ef_model m;
  gc::decision const d = m.step(t);
  CHECK(code(d) == "c1000");
  CHECK(d.residual == gc::residual_rule::subtract_sent);

  gc::ef_window_config low;
  low.start = 33.0;
  CHECK(gc::ef_window_controller(low).factor() == 20.0);  // rounded down to a rung
}

TEST_CASE("ef_window window measurements: Little's law delay and energy-balance delivery",
          "[ef_window]") {
  gc::ef_window_config cfg;
  cfg.window = 2;
  gc::ef_window_controller c(cfg);
  auto step = [&](double e, double sent) {
    gc::step_stats s;
    s.step = c.plan().step;
    s.ef_norm_sq = e;
    s.compressed_norm_sq = {sent, sent / 2};
    return c.decide(s);
  };
  // R after each step: 6 - 2 = 4, then 10 - 4 = 6. Delay (4 + 6) / (2 + 4) = 5/3 steps;
  // inflow = sent 6 + residual growth (6 - 0) = 12, delivered 6 / 12.
  (void)step(6.0, 2.0);
  gc::decision const d = step(10.0, 4.0);
  CHECK(d.gain == Approx(0.4));
  CHECK(c.last_window().step == 1);
  CHECK(c.last_window().delay == Approx(10.0 / 6.0));
  CHECK(c.last_window().delivered == Approx(0.5));
  CHECK(c.last_window().from == 80.0);
  CHECK(c.last_window().to == 80.0);  // delay fits, but the residual is still filling
  // Next window: R goes 6 -> 5 -> 4; it shrank, so everything that came in went out.
  (void)step(8.0, 3.0);
  (void)step(8.0, 4.0);
  CHECK(c.last_window().delay == Approx(9.0 / 7.0));
  CHECK(c.last_window().delivered == 1.0);
  // Settled with delay 9/7 at 80: the delay model allows far more, one move is capped at 4x.
  CHECK(c.last_window().to == 320.0);
  CHECK(c.factor() == 320.0);
}

TEST_CASE("ef_window settles on the highest rung whose delay fits, from below and from above",
          "[ef_window]") {
  // Steady delay f / kappa against max_delay 20: the answer is the highest rung <= 20 kappa.
  struct row {
    double kappa, start, expect;
  };
  // (kappa is kept off the exact boundaries f / kappa = 20, where rounding would decide.)
  for (row const r :
       {row{8.5, 0.0, 160.0}, row{8.5, 10.0, 160.0}, row{8.5, 1000.0, 160.0}, row{2.2, 0.0, 40.0},
        row{4.4, 1000.0, 80.0}, row{100.0, 0.0, 1000.0}, row{0.25, 0.0, 10.0}}) {
    CAPTURE(r.kappa, r.start);
    gc::ef_window_config cfg;
    cfg.start = r.start;
    gc::ef_window_controller c(cfg);
    ef_model m;
    m.kappa = r.kappa;
    std::vector<double> const trace = run_windows(c, m, 30, cfg.window);
    // Settled, and stays: the last 20 windows all chose the expected rung.
    for (std::size_t w = 10; w < trace.size(); ++w) {
      CAPTURE(w);
      CHECK(trace[w] == r.expect);
    }
    if (r.expect < 1000.0) {
      double const next = r.expect * 2 > 1000.0 ? 1000.0 : r.expect * 2;
      CHECK(next / r.kappa > cfg.max_delay);  // the rung above would not fit
    }
    if (r.expect > 10.0) CHECK(c.last_window().delay <= cfg.max_delay);
    CHECK(c.last_window().delivered > 0.99);
  }
}

TEST_CASE("ef_window moves down while the residual keeps growing and never moves up",
          "[ef_window]") {
  gc::ef_window_controller c;
  std::uint64_t step = 0;
  double residual = 0.0;
  std::vector<double> factors_seen;
  // Each step the residual grows by one unit and the sent energy stays at 0.05: nothing that
  // arrives is delivered, whatever the factor.
  for (int w = 0; w < 8; ++w) {
    for (std::uint64_t i = 0; i < c.config().window; ++i) {
      gc::step_stats s;
      s.step = step++;
      s.ef_norm_sq = residual + 1.05;
      s.compressed_norm_sq = {0.05, 0.025};
      (void)c.decide(s);
      residual += 1.0;
    }
    CHECK(c.last_window().delivered < 0.1);
    factors_seen.push_back(c.factor());
  }
  for (std::size_t i = 1; i < factors_seen.size(); ++i)
    CHECK(factors_seen[i] <= factors_seen[i - 1]);
  CHECK(factors_seen.front() < 80.0);
  CHECK(factors_seen.back() == 10.0);
}

TEST_CASE("ef_window stays while the residual fills, then moves up once it is settled",
          "[ef_window]") {
  gc::ef_window_config cfg;
  cfg.window = 10;
  gc::ef_window_controller c(cfg);
  std::uint64_t step = 0;
  auto window = [&](double r0, double dr) {  // R goes r0 + dr, r0 + 2 dr, ...; sent 1 a step
    for (int i = 1; i <= 10; ++i) {
      gc::step_stats s;
      s.step = step++;
      double const r = r0 + dr * i;
      s.ef_norm_sq = r + 1.0;
      s.compressed_norm_sq = {1.0, 0.5};
      (void)c.decide(s);
    }
  };
  window(0.0, 0.5);  // R 0.5 ... 5: delay 2.75, delivered 10 / 15
  CHECK(c.last_window().delay == Approx(2.75));
  CHECK(c.last_window().delivered == Approx(10.0 / 15.0));
  CHECK(c.factor() == 80.0);
  window(5.0, 0.0);  // R stays at 5: delay 5, delivered 1; 80 * 20 / 5 = 320 = the 4x cap
  CHECK(c.last_window().delivered == 1.0);
  CHECK(c.factor() == 320.0);
}

TEST_CASE(
    "ef_window: no gradient keeps the factor; nothing sent of a non-zero gradient falls "
    "to the bottom",
    "[ef_window]") {
  gc::ef_window_config cfg;
  cfg.window = 2;
  gc::ef_window_controller c(cfg);
  for (int i = 0; i < 2; ++i) {
    gc::step_stats s;
    s.step = c.plan().step;
    s.compressed_norm_sq = {0.0, 0.0};
    (void)c.decide(s);
  }
  CHECK(c.last_window().delay == 0.0);
  CHECK(c.factor() == 320.0);  // zero delay, settled: one capped move up
  for (int i = 0; i < 2; ++i) {
    gc::step_stats s;
    s.step = c.plan().step;
    s.ef_norm_sq = 1.0;
    s.compressed_norm_sq = {0.0, 0.0};
    (void)c.decide(s);
  }
  CHECK(std::isinf(c.last_window().delay));
  CHECK(c.factor() == 10.0);
}

TEST_CASE("ef_window state: bit-identical round trip, the same decisions afterwards",
          "[ef_window]") {
  gc::any_controller a = gc::make_controller("ef_window:window=7");
  ef_model m;
  m.kappa = 6.0;
  for (int i = 0; i < 53; ++i) (void)m.step(a);  // mid-window, after several moves
  std::vector<std::byte> const saved = a.save();
  gc::any_controller b = gc::make_controller("ef_window:window=7");
  b.load(saved);
  CHECK(b.save() == saved);
  ef_model mb = m;
  for (int i = 0; i < 40; ++i) {
    gc::decision const da = m.step(a), db = mb.step(b);
    CHECK(code(da) == code(db));
    CHECK(da.gain == db.gain);
    CHECK(da.next == db.next);
  }
  CHECK(a.save() == b.save());
}

TEST_CASE("ef_window rejects hostile states with format_error and keeps its own", "[ef_window]") {
  gc::any_controller a = gc::make_controller("ef_window");
  ef_model m;
  for (int i = 0; i < 45; ++i) (void)m.step(a);
  std::vector<std::byte> const good = a.save();
  std::vector<std::byte> const before = gc::make_controller("ef_window").save();
  // Layout from the end of the body (before the 4-byte CRC32C trailer): plan 48 bytes (step, 2
  // factors with their count, 2 flags), event 40, residual sums 32, window count 8, rung 8,
  // fingerprint 8. Each edited state is sealed again, so that its field, not its checksum, is
  // what the loader refuses.
  std::size_t const n = good.size() - 4;
  std::size_t const rung = n - 136, count = n - 128, sums = n - 120, event = n - 88, plan = n - 48;
  auto rejected = [&](std::vector<std::byte> const& bytes, char const* why) {
    gc::any_controller c = gc::make_controller("ef_window");
    std::string const msg = thrown<gc::format_error>([&] { c.load(bytes); });
    CHECK_THAT(msg, Contains(why));
    CHECK(c.save() == before);
  };
  auto with = [&](std::size_t at, std::uint64_t v) {
    std::vector<std::byte> b = good;
    put_u64_at(b, at, v);
    gc::detail::seal_state(b);
    return b;
  };
  auto const nan = std::bit_cast<std::uint64_t>(std::numeric_limits<double>::quiet_NaN());
  rejected(with(rung, 8), "off the ladder");
  rejected(with(count, 44), "the window holds");
  rejected(with(sums + 8, std::bit_cast<std::uint64_t>(-1.0)), "window sum");
  rejected(with(sums, nan), "window sum");
  rejected(with(event + 16, std::bit_cast<std::uint64_t>(1.5)), "last window event");
  rejected(with(plan + 16, std::bit_cast<std::uint64_t>(3.0)), "plan is not the one");
  rejected(with(plan + 40, 1), "plan is not the one");
  rejected(std::vector<std::byte>(good.begin(), good.end() - 9), "length");
  // The loss check's fields, between the fingerprint and the rung: the last rise (step and 5
  // values, 48 bytes), lowest and first block means, the block's sum of squares, sum and count,
  // rises, first step judged, window start, ceiling, loss up, compression off.
  std::size_t const lowest = n - 192, first = n - 200, block_sq = n - 208, block_n = n - 224,
                    rises = n - 232, start = n - 248, ceiling = n - 256, up = n - 264,
                    off = n - 272;
  rejected(with(ceiling, 8), "ceiling 8 is off the ladder");
  rejected(with(ceiling, 2), "above the ceiling");  // the saved rung is 80 (index 3)
  rejected(with(block_n, 10), "loss check's block");
  rejected(with(block_sq, std::bit_cast<std::uint64_t>(-1.0)), "loss check's block");
  rejected(with(first, std::bit_cast<std::uint64_t>(1.0)), "loss check's block");  // lowest NaN
  rejected(with(lowest, std::bit_cast<std::uint64_t>(std::numeric_limits<double>::infinity())),
           "loss check's block");
  rejected(with(rises, 1), "count of rises");
  rejected(with(start, 7), "the window holds");
  rejected(with(off, 1), "plan is not the one");  // compression off with a compressed plan
  rejected(with(off, 2), "flag");
  rejected(with(up, 3), "flag");
  {
    gc::any_controller other = gc::make_controller("ef_window:max_delay=10");
    CHECK_THAT(thrown<gc::format_error>([&] { other.load(good); }),
               Contains("another configuration"));
  }
  {
    gc::any_controller g = gc::make_controller("gravac");
    CHECK_THAT(thrown<gc::format_error>([&] { g.load(good); }), Contains("another kind"));
  }
}

TEST_CASE("ef_window spec, parameters and statistics are checked", "[ef_window][controller]") {
  gc::any_controller a = gc::make_controller(
      "ef_window:min=4,max=512,ratio=4,window=9,max_delay=12.5,settled=0.5,climb=16,start=64");
  auto const* c = a.target<gc::ef_window_controller>();
  REQUIRE(c != nullptr);
  CHECK(c->config().factor_min == 4.0);
  CHECK(c->config().factor_max == 512.0);
  CHECK(c->config().window == 9);
  CHECK(c->config().max_delay == 12.5);
  CHECK(c->config().settled == 0.5);
  CHECK(c->config().climb == 16.0);
  CHECK(c->rungs() == std::vector<double>{4, 16, 64, 256, 512});
  CHECK(c->factor() == 64.0);

  auto msg = [](char const* spec) {
    return thrown<gc::config_error>([&] { (void)gc::make_controller(spec); });
  };
  CHECK_THAT(msg("ef_window:window=1"), Contains("window"));
  CHECK_THAT(msg("ef_window:max=10"), Contains("factor_max"));
  CHECK_THAT(msg("ef_window:min=1"), Contains("factor_min"));
  CHECK_THAT(msg("ef_window:ratio=1"), Contains("ratio"));
  CHECK_THAT(msg("ef_window:max_delay=0"), Contains("max_delay"));
  CHECK_THAT(msg("ef_window:settled=0"), Contains("settled"));
  CHECK_THAT(msg("ef_window:settled=1.5"), Contains("settled"));
  CHECK_THAT(msg("ef_window:climb=1.5"), Contains("climb"));
  CHECK_THAT(msg("ef_window:start=2000"), Contains("start"));
  CHECK_THAT(msg("ef_window:ratio=1.0000001"), Contains("4096 rungs"));
  CHECK_THAT(msg("ef_window:delay=3"), Contains("delay"));
  CHECK_THAT(msg("ef_window:loss_block=1"), Contains("loss_block"));
  CHECK_THAT(msg("ef_window:loss_rise=0"), Contains("loss_rise"));
  CHECK_THAT(msg("ef_window:loss_rise=inf"), Contains("loss_rise"));
  CHECK_THAT(msg("nosuch"), Contains("ef_window"));

  gc::ef_window_controller w;
  gc::step_plan const p0 = w.plan();
  gc::step_stats s;
  s.step = 0;
  s.compressed_norm_sq = {1.0};
  CHECK_THAT(thrown<gc::config_error>([&] { (void)w.decide(s); }),
             Contains("one per measured factor"));
  s.compressed_norm_sq = {1.0, -1.0};
  CHECK_THROWS_AS(w.decide(s), gc::numeric_error);
  s.compressed_norm_sq = {1.0, 0.5};
  s.ef_norm_sq = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(w.decide(s), gc::numeric_error);
  s.step = 3;
  s.ef_norm_sq = 1.0;
  CHECK_THAT(thrown<gc::config_error>([&] { (void)w.decide(s); }), Contains("expected step 0"));
  s.step = 0;
  s.loss = std::numeric_limits<double>::infinity();
  CHECK_THAT(thrown<gc::numeric_error>([&] { (void)w.decide(s); }), Contains("loss = inf"));
  CHECK(w.plan() == p0);
  CHECK(w.last_window() == gc::ef_window_event{});
  {
    gc::any_controller b = gc::make_controller("ef_window:loss_block=4,loss_rise=0.5");
    CHECK(b.target<gc::ef_window_controller>()->config().loss_block == 4);
    CHECK(b.target<gc::ef_window_controller>()->config().loss_rise == 0.5);
  }
}

TEST_CASE("ef_window loss check: a falling or noisy loss leaves the decisions as without one",
          "[ef_window]") {
  // Falling with noise: each block's 10 values alternate +-30 % around a mean that decays
  // from 2.3 to 0.3; a few blocks end slightly above an earlier one (never by a quarter of the
  // progress and two standard errors at once).
  auto noisy = [](std::uint64_t step) {
    double const mean = 0.3 + 2.0 * std::exp(-static_cast<double>(step) / 150.0);
    double const wobble = (step % 2 == 0 ? 0.3 : -0.3) + 0.1 * std::sin(0.37 * step);
    return mean * (1.0 + wobble);
  };
  for (double kappa : {2.2, 8.5, 100.0}) {
    CAPTURE(kappa);
    gc::ef_window_controller with, without;
    ef_model a, b;
    a.kappa = b.kappa = kappa;
    a.loss = noisy;
    CHECK(run_steps(with, a, 600) == run_steps(without, b, 600));
    CHECK(with.backoffs() == 0);
    CHECK(with.ceiling() == 1000.0);
  }
}

TEST_CASE(
    "ef_window loss check: a rise drops to the lowest rung and caps the ladder below the "
    "rung that rose",
    "[ef_window]") {
  gc::ef_window_controller c;
  ef_model m;
  m.kappa = 100.0;  // every rung's delay fits: without the loss check it climbs to 1000
  // Block means: 2.0, then falling to 1.0 by block 12; block 13 (steps 130..139) rises to
  // 1.8 (80 % of the progress back), then the loss falls again.
  std::vector<double> means;
  for (int b = 0; b <= 12; ++b) means.push_back(2.0 - b / 12.0);
  means.push_back(1.8);
  for (int b = 0; b < 60; ++b) means.push_back(0.95 - 0.005 * b);
  m.loss = block_losses(means);
  std::vector<double> const f = run_steps(c, m, 400);
  CHECK(f[39] == 80.0);
  CHECK(f[40] == 320.0);
  CHECK(f[80] == 1000.0);
  CHECK(f[139] == 1000.0);  // the step that completes the rising block still sends 1000
  CHECK(f[140] == 10.0);    // the next one the lowest rung, and a new window starts there
  CHECK(c.backoffs() == 1);
  gc::ef_window_backoff const& b = c.last_backoff();
  CHECK(b.step == 139);
  CHECK(b.loss == Approx(1.8));  // the block's mean, summed in double
  CHECK(b.lowest == Approx(1.0));
  CHECK(b.first == 2.0);
  CHECK(b.from == 1000.0);
  CHECK(b.to == 10.0);
  CHECK(c.ceiling() == 640.0);
  // Climbing back by the delay rules, 4x a window: 40 from 180, 160 from 220, then the cap.
  CHECK(f[179] == 10.0);
  CHECK(f[180] == 40.0);
  CHECK(f[220] == 160.0);
  CHECK(f[260] == 640.0);
  CHECK(*std::max_element(f.begin() + 140, f.end()) == 640.0);
  CHECK(f.back() == 640.0);
}

TEST_CASE("ef_window loss check: a rise at the lowest rung turns compression off for good",
          "[ef_window]") {
  gc::ef_window_config cfg;
  cfg.start = 10.0;
  gc::ef_window_controller c(cfg);
  ef_model m;
  m.loss = block_losses({2.0, 1.5, 2.5, 0.5});
  for (std::uint64_t i = 0; i < 30; ++i) {
    gc::decision const d = m.step(c);
    CHECK(code(d) == "m10");
  }
  CHECK(c.backoffs() == 1);
  CHECK(c.last_backoff().step == 29);
  CHECK(c.last_backoff().loss == 2.5);
  CHECK(c.last_backoff().lowest == 1.5);
  CHECK(c.last_backoff().from == 10.0);
  CHECK(c.last_backoff().to == 1.0);
  CHECK(c.factor() == 1.0);
  CHECK(c.ceiling() == 1.0);
  CHECK(c.plan().measure.empty());
  double const residual = m.residual;
  for (int i = 0; i < 100; ++i) {  // the loss falls again: compression stays off
    gc::decision const d = m.step(c);
    CHECK(d.send == gc::send_kind::dense);
    CHECK(d.residual == gc::residual_rule::keep);
    CHECK(d.factor == 1.0);
    CHECK(d.next.measure.empty());
  }
  CHECK(m.residual == residual);  // kept, not sent
  CHECK(c.backoffs() == 1);
}

TEST_CASE(
    "ef_window loss check: the threshold is a fraction of the progress and two standard "
    "errors, and a block after a drop is judged a window later",
    "[ef_window]") {
  // kappa 0.25: every rung's delay is too long, the delay rules keep the lowest rung; 100:
  // every rung's delay fits, they climb 4x a window.
  auto play = [](gc::ef_window_config cfg, std::function<double(std::uint64_t)> loss,
                 std::uint64_t steps, double kappa = 0.25) {
    gc::ef_window_controller c(cfg);
    ef_model m;
    m.kappa = kappa;
    m.loss = std::move(loss);
    (void)run_steps(c, m, steps);
    return c;
  };
  gc::ef_window_config cfg;
  cfg.start = 160.0;
  cfg.window = 1000;  // no window ends: only the loss check moves
  // Progress 1.0 (2.0 -> 1.0): a block at 1.2 gave back 20 %, at 1.3 30 %.
  CHECK(play(cfg, block_losses({2.0, 1.0, 1.2}), 30).backoffs() == 0);
  gc::ef_window_controller const r = play(cfg, block_losses({2.0, 1.0, 1.3}), 30);
  CHECK(r.backoffs() == 1);
  CHECK(r.factor() == 10.0);
  CHECK(r.ceiling() == 80.0);
  cfg.loss_rise = 0.35;  // the fraction is the option
  CHECK(play(cfg, block_losses({2.0, 1.0, 1.3}), 30).backoffs() == 0);
  cfg.loss_rise = 0.25;
  // Before the loss has fallen to half its start, the bar is a quarter of the loss itself
  // (max(L0 - L*, L*)): after 2.4 (no progress yet) a block at 2.66, 11 % up (ResNet-18's
  // second block, which then falls with top-k as without), is no rise, one at 3.1 is (a bar
  // of 0.6); after 2.0 -> 1.6 (progress 0.4, bar 0.25 * 1.6 = 0.4) 1.95 is none, 2.05 is one;
  // after 2.0 -> 0.2 the bar is the progress again (0.45): 0.6 is none, 0.7 is one.
  CHECK(play(cfg, block_losses({2.4, 2.66}), 20).backoffs() == 0);
  CHECK(play(cfg, block_losses({2.4, 3.1}), 20).backoffs() == 1);
  CHECK(play(cfg, block_losses({2.0, 1.6, 1.95}), 30).backoffs() == 0);
  CHECK(play(cfg, block_losses({2.0, 1.6, 2.05}), 30).backoffs() == 1);
  CHECK(play(cfg, block_losses({2.0, 0.2, 0.6}), 30).backoffs() == 0);
  CHECK(play(cfg, block_losses({2.0, 0.2, 0.7}), 30).backoffs() == 1);
  // Lowest 1.0 after 2.0; a block with mean 1.5 is a rise of half the progress, but with
  // values 1.5 +- 1.2 its standard error is 1.2 * sqrt(10 / 9) / sqrt(10) = 0.4 and two of
  // them 0.8 > 0.5 (one would not be); with +- 0.7 two standard errors are 0.47 < 0.5 (three
  // would not be).
  auto wobbly = [](double amplitude) {
    return [amplitude](std::uint64_t step) {
      if (step < 20) return step < 10 ? 2.0 : 1.0;
      return 1.5 + (step % 2 == 0 ? amplitude : -amplitude);
    };
  };
  CHECK(play(cfg, wobbly(1.2), 30).backoffs() == 0);
  CHECK(play(cfg, wobbly(0.7), 30).backoffs() == 1);
  // After a drop at step 29, blocks ending before step 29 + 1 + window are not judged. With a
  // window of 40: the blocks ending at 39 ... 69 stay high and are not rises; the one ending
  // at 79 is, at the lowest rung: compression off.
  cfg.window = 40;
  auto high = block_losses({2.0, 1.0, 2.0});
  CHECK(play(cfg, high, 70).backoffs() == 1);
  gc::ef_window_controller const twice = play(cfg, high, 80);
  CHECK(twice.backoffs() == 2);
  CHECK(twice.factor() == 1.0);
  CHECK(twice.last_backoff().step == 79);
  // With delays that fit, the window ending at step 69 would climb from 10 (to 40, under the
  // ceiling 80), but the loss is still up: it stays at 10, and the rise at 79 is at the lowest
  // rung. Once the loss is back down it climbs.
  gc::ef_window_controller const held = play(cfg, high, 80, 100.0);
  CHECK(held.backoffs() == 2);
  CHECK(held.last_backoff().from == 10.0);
  CHECK(held.factor() == 1.0);
  gc::ef_window_controller const healed = play(cfg, block_losses({2.0, 1.0, 2.0, 0.9}), 80, 100.0);
  CHECK(healed.backoffs() == 1);
  CHECK(healed.factor() == 40.0);
  // loss_block = 0: no check at all.
  cfg.loss_block = 0;
  CHECK(play(cfg, high, 200).backoffs() == 0);
  CHECK(play(cfg, high, 200).factor() == 10.0);
  // Steps without a reported loss do not count: with every other loss missing, the block of
  // the rise completes 20 steps later.
  cfg.loss_block = 10;
  auto sparse = [](std::uint64_t step) {
    return step % 2 == 1 ? std::numeric_limits<double>::quiet_NaN()
                         : (step < 20   ? 2.0
                            : step < 40 ? 1.0
                                        : 2.0);
  };
  CHECK(play(cfg, sparse, 58).backoffs() == 0);  // the third block ends at step 58
  CHECK(play(cfg, sparse, 59).backoffs() == 1);
}

TEST_CASE(
    "ef_window state with the loss check: bit-identical round trips mid-block, under a "
    "ceiling and with compression off",
    "[ef_window]") {
  std::vector<double> means;
  for (int b = 0; b <= 8; ++b) means.push_back(2.0 - b / 8.0);
  means.push_back(1.9);  // a rise at steps 90..99
  std::vector<double> lingering = means;
  for (int b = 0; b < 30; ++b) means.push_back(0.9 - 0.01 * b);
  // The loss stays up through the grace window (blocks ending at 109 and 119), then falls: a
  // restored controller that forgot the grace window would drop again.
  lingering.push_back(1.9);
  lingering.push_back(1.9);
  for (int b = 0; b < 30; ++b) lingering.push_back(0.9 - 0.01 * b);
  struct run {
    char const* spec;
    double kappa;
    std::uint64_t cut;
    double factor, ceiling;  // at the cut
    bool linger;
    std::uint64_t rises;  // after the 60 steps that follow the cut
  };
  // From 160 the rise drops to 10 under a ceiling of 80; from 10 it turns compression off.
  for (run const r : {run{"ef_window:window=20,start=160", 8.5, 45, 160, 1000, false, 1},
                      run{"ef_window:window=20,start=160", 8.5, 97, 160, 1000, false, 1},
                      run{"ef_window:window=20,start=160", 8.5, 103, 10, 80, true, 1},
                      // between the still-high block ending at 109 and the window ending at 114,
                      // which must not climb
                      run{"ef_window:window=15,start=160", 8.5, 112, 10, 80, true, 2},
                      run{"ef_window:window=20,start=160", 8.5, 125, 40, 80, false, 1},
                      run{"ef_window:window=20,start=160", 8.5, 163, 80, 80, false, 1},
                      run{"ef_window:window=20,start=10", 0.25, 150, 1, 1, false, 1}}) {
    CAPTURE(r.spec, r.cut);
    gc::any_controller a = gc::make_controller(r.spec);
    ef_model m;
    m.kappa = r.kappa;
    m.loss = block_losses(r.linger ? lingering : means);
    for (std::uint64_t i = 0; i < r.cut; ++i) (void)m.step(a);
    auto const* c = a.target<gc::ef_window_controller>();
    CHECK(c->factor() == r.factor);
    CHECK(c->ceiling() == r.ceiling);
    std::vector<std::byte> const saved = a.save();
    gc::any_controller b = gc::make_controller(r.spec);
    b.load(saved);
    CHECK(b.save() == saved);
    ef_model mb = m;
    for (int i = 0; i < 60; ++i) {
      gc::decision const da = m.step(a), db = mb.step(b);
      CHECK(code(da) == code(db));
      CHECK(da.next == db.next);
    }
    CHECK(a.save() == b.save());
    CHECK(c->backoffs() == r.rises);
  }
}
