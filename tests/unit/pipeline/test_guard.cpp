// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The divergence guard (pipeline/guard.hpp) on scripted gradients, through gradient_pipeline.
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

constexpr std::size_t big = 1000, small = 50;  // tensor 0 compressed, tensor 1 sent dense

// A gradient of norm about `scale` (times sqrt of the size), varying with rank and step.
std::vector<std::vector<float>> grads(int rank, std::uint64_t step, double scale) {
  std::vector<std::vector<float>> g{std::vector<float>(big), std::vector<float>(small)};
  for (std::size_t t = 0; t < g.size(); ++t) {
    for (std::size_t i = 0; i < g[t].size(); ++i) {
      double const x = std::sin(0.37 * static_cast<double>(i) + 0.9 * static_cast<double>(step) +
                                0.5 * rank + t);
      g[t][i] = static_cast<float>(scale * (0.5 + 0.5 * x * x) * (i % 2 == 0 ? 1.0 : -1.0));
    }
  }
  return g;
}

std::vector<gc::tensor_view<float>> views(std::vector<std::vector<float>>& g) {
  std::vector<gc::tensor_view<float>> v;
  for (std::size_t t = 0; t < g.size(); ++t)
    v.emplace_back(std::span<float>(g[t]), static_cast<gc::tensor_id>(t));
  return v;
}

gc::pipeline_options options(std::string guard, std::string codec = "topk:ratio=0.05") {
  gc::pipeline_options o;
  o.codec = std::move(codec);
  o.feedback = "residual";
  o.guard = std::move(guard);
  o.measured_timing = false;
  o.buckets.min_compress_elements = 100;
  o.context.parallel_threshold = std::numeric_limits<std::size_t>::max();
  return o;
}

std::vector<float> state_of(gc::gradient_pipeline& p, std::size_t t) {
  auto const s = p.feedback_state(static_cast<gc::tensor_id>(t));
  return {s.begin(), s.end()};
}

// Runs `steps` stable steps (scale 1).
void warm(gc::gradient_pipeline& p, gc::in_process_communicator& comm, std::uint64_t steps) {
  for (std::uint64_t s = 0; s < steps; ++s) {
    auto g = grads(comm.rank(), s, 1.0);
    gc::pipeline_stats const st = p.step(comm, views(g));
    RANK_REQUIRE(st.guard == gc::guard_action::none);
    RANK_REQUIRE(std::isfinite(st.gradient_norm) == p.guard().enabled());
  }
}

// The numeric_error message each rank got (rank threads record into it).
struct rank_errors {
  std::mutex mu;
  std::vector<std::string> what;
  explicit rank_errors(int world) : what(static_cast<std::size_t>(world)) {}
  // Runs `f` on rank `rank`, which must throw numeric_error; keeps its message.
  template <class F>
  void expect(int rank, F&& f) {
    std::string msg;
    try {
      f();
    } catch (gc::numeric_error const& e) {
      msg = e.what();
    }
    RANK_REQUIRE(!msg.empty());
    std::lock_guard<std::mutex> lock(mu);
    what[static_cast<std::size_t>(rank)] = msg;
  }
};

}  // namespace

TEST_CASE("guard: specs and their defaults", "[pipeline][guard]") {
  gc::guard_options const d = gc::parse_guard("raise");
  CHECK(d.policy == gc::guard_policy::raise);
  CHECK(d.factor == 10.0);
  CHECK(d.residual_factor == 100.0);
  CHECK(d.window == 50);
  CHECK(d.warmup == 10);
  CHECK(d.max_skips == 10);
  CHECK(gc::parse_guard("off").policy == gc::guard_policy::off);
  gc::guard_options const s =
      gc::parse_guard("skip:factor=4,residual_factor=7,window=8,warmup=3,max_skips=2");
  CHECK(s.residual_factor == 7.0);
  CHECK(s.policy == gc::guard_policy::skip);
  CHECK(s.factor == 4.0);
  CHECK(s.window == 8);
  CHECK(s.warmup == 3);
  CHECK(s.max_skips == 2);
  CHECK(d.loss_span == 2.0);
  CHECK(gc::parse_guard("raise:loss_span=3.5").loss_span == 3.5);
  CHECK(gc::parse_guard("dense:factor=20").policy == gc::guard_policy::dense);
  CHECK(gc::pipeline_options{}.guard == "raise");
  for (char const* bad : {"", "panic", "raise:factor=1", "raise:factor=nan",
                          "raise:residual_factor=0.5", "raise:window=0", "raise:warmup=9,window=8",
                          "off:factor=3", "skip:patience=3", "raise:factor=",
                          "raise:loss_span=0.5", "raise:loss_span=nan", "raise:loss_span=inf"}) {
    INFO(bad);
    CHECK_THROWS_AS(gc::parse_guard(bad), gc::config_error);
    CHECK_THROWS_AS(gc::gradient_pipeline(options(bad)), gc::config_error);
  }
}

TEST_CASE(
    "guard: a NaN or an infinity on one rank raises on every rank, naming the tensor, state "
    "untouched",
    "[pipeline][guard]") {
  for (float const bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    rank_errors errors(3);
    REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      warm(p, comm, 3);
      std::vector<std::byte> const before = p.save();
      auto g = grads(comm.rank(), 3, 1.0);
      auto const raw = g;
      if (comm.rank() == 1) g[1][7] = bad;  // the small tensor, sent dense
      errors.expect(comm.rank(), [&] { p.step(comm, views(g)); });
      RANK_REQUIRE(p.save() == before);
      RANK_REQUIRE(p.step_count() == 3);
      if (comm.rank() != 1) RANK_REQUIRE(g == raw);  // nothing was sent
      auto h = grads(comm.rank(), 3, 1.0);
      p.step(comm, views(h));  // the next step works
      RANK_REQUIRE(p.step_count() == 4);
    }));
    for (auto const& e : errors.what) {
      INFO(e);
      CHECK(e == errors.what[0]);  // the same message on every rank
      CHECK(e.find("step 3: the gradient norm is") != std::string::npos);
      CHECK(e.find("(tensor 1: ") != std::string::npos);
      CHECK(e.find("not finite") != std::string::npos);
      CHECK(e.find("Nothing was sent") != std::string::npos);
    }
  }
}

TEST_CASE("guard off: a NaN fails as before the guard (the codec's error on its rank)",
          "[pipeline][guard]") {
  std::mutex mu;
  std::vector<std::string> errors(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("off"));
    warm(p, comm, 2);
    auto g = grads(comm.rank(), 2, 1.0);
    if (comm.rank() == 1) g[0][3] = std::numeric_limits<float>::quiet_NaN();
    try {
      p.step(comm, views(g));
    } catch (gc::numeric_error const&) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] = "numeric";
    } catch (gc::comm_error const&) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] = "comm";
    }
    RANK_REQUIRE(std::isnan(p.last_stats().gradient_norm));
    RANK_REQUIRE(p.guard().counters().checked == 0);
  }));
  CHECK(errors == std::vector<std::string>{"comm", "numeric"});
}

TEST_CASE("guard: an explosion after a stable history trips; slow growth does not",
          "[pipeline][guard]") {
  SECTION("a jump of 40x the median raises on every rank") {
    rank_errors errors(2);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      warm(p, comm, 12);
      std::vector<double> const hist = p.guard().history(gc::guard_quantity::gradient);
      RANK_REQUIRE(hist.size() == 12);
      auto g = grads(comm.rank(), 12, 40.0);
      errors.expect(comm.rank(), [&] { p.step(comm, views(g)); });
      RANK_REQUIRE(p.guard().history(gc::guard_quantity::gradient) == hist);
    }));
    INFO(errors.what[0]);
    CHECK(errors.what[0] == errors.what[1]);
    CHECK(errors.what[0].find("the gradient norm is") != std::string::npos);
    CHECK(errors.what[0].find("x the median") != std::string::npos);
    CHECK(errors.what[0].find("of its last 12 steps (limit 10x)") != std::string::npos);
    CHECK(errors.what[0].find("(tensor 0: ") != std::string::npos);  // the larger tensor
  }
  SECTION("within the warm-up nothing but non-finite values trips") {
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      warm(p, comm, 5);
      auto g = grads(comm.rank(), 5, 1000.0);
      RANK_REQUIRE(p.step(comm, views(g)).guard == gc::guard_action::none);
    }));
  }
  SECTION(
      "growth of 4 % a step for 300 steps (x130000) never trips, and the peak ratio says how far "
      "it was") {
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      for (std::uint64_t s = 0; s < 300; ++s) {
        auto g = grads(comm.rank(), s, std::pow(1.04, static_cast<double>(s)));
        RANK_REQUIRE(p.step(comm, views(g)).guard == gc::guard_action::none);
      }
      double const peak = p.guard().counters().peak_ratio[0];
      RANK_REQUIRE(peak > 2.0 && peak < 4.0);  // about 1.04^25, the median lagging half a window
      RANK_REQUIRE(p.guard().counters().checked == 300);
      RANK_REQUIRE(p.guard().history(gc::guard_quantity::gradient).size() == 50);
    }));
  }
}

TEST_CASE("guard skip: nothing sent, state untouched, every rank agrees, and a stall raises",
          "[pipeline][guard]") {
  rank_errors errors(3);
  REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("skip:max_skips=2"));
    std::vector<gc::guard_verdict> logged;
    p.on_guard([&](gc::guard_verdict const& v) { logged.push_back(v); });
    warm(p, comm, 12);
    std::vector<float> const e0 = state_of(p, 0);
    std::vector<double> const hist = p.guard().history(gc::guard_quantity::gradient);
    for (std::uint64_t k = 0; k < 3; ++k) {
      // only rank 2 explodes: the sum over ranks trips the guard on all of them
      auto g = grads(comm.rank(), 12, comm.rank() == 2 ? 100.0 : 1.0);
      if (k < 2) {
        gc::pipeline_stats const st = p.step(comm, views(g));
        RANK_REQUIRE(st.guard == gc::guard_action::skipped);
        RANK_REQUIRE(st.bytes_sent == 0);
        for (auto const& t : g) {
          for (float v : t) RANK_REQUIRE(v == 0.0f);  // zeroed: an optimizer step applies nothing
        }
        RANK_REQUIRE(p.step_count() == 12);
        RANK_REQUIRE(state_of(p, 0) == e0);
        RANK_REQUIRE(p.guard().history(gc::guard_quantity::gradient) == hist);
        RANK_REQUIRE(p.guard().counters().skipped == k + 1 &&
                     p.guard().counters().in_a_row == k + 1);
        RANK_REQUIRE(logged.size() == k + 1 && logged.back().action == gc::guard_action::skipped);
        RANK_REQUIRE(logged.back().message.find("Step skipped") != std::string::npos);
      } else {
        errors.expect(comm.rank(), [&] { p.step(comm, views(g)); });
      }
    }
    // a good step goes through and ends the run of skips
    auto g = grads(comm.rank(), 12, 1.0);
    gc::pipeline_stats const st = p.step(comm, views(g));
    RANK_REQUIRE(st.guard == gc::guard_action::none && st.step == 12);
    RANK_REQUIRE(p.guard().counters().in_a_row == 0 && p.guard().counters().skipped == 2);
  }));
  INFO(errors.what[0]);
  CHECK(errors.what[0] == errors.what[2]);
  CHECK(errors.what[0].find("skipped the last 2 steps in a row (max_skips), so it raises") !=
        std::string::npos);
}

TEST_CASE("guard skip: a NaN is skipped, with 16-bit gradients too", "[pipeline][guard]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("skip"));
    for (std::uint64_t s = 0; s < 3; ++s) {
      std::vector<std::vector<gc::half>> h(2);
      auto g = grads(comm.rank(), s, 1.0);
      for (std::size_t t = 0; t < 2; ++t) {
        for (float v : g[t]) h[t].push_back(gc::from_float<gc::half>(v));
      }
      if (s == 2 && comm.rank() == 0)
        h[0][5] = gc::from_float<gc::half>(std::numeric_limits<float>::infinity());
      std::vector<gc::tensor_view<gc::half>> v;
      for (std::size_t t = 0; t < 2; ++t)
        v.emplace_back(std::span<gc::half>(h[t]), static_cast<gc::tensor_id>(t));
      gc::pipeline_stats const st = p.step(comm, v);
      RANK_REQUIRE(st.guard == (s == 2 ? gc::guard_action::skipped : gc::guard_action::none));
      if (s == 2) {
        for (auto const& t : h) {
          for (gc::half x : t) RANK_REQUIRE(gc::to_float(x) == 0.0f);
        }
      }
    }
    RANK_REQUIRE(p.step_count() == 2);
  }));
}

TEST_CASE("guard dense: the exploded step goes dense with the residual kept", "[pipeline][guard]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("dense"));
    warm(p, comm, 12);
    std::vector<float> const e0 = state_of(p, 0);
    RANK_REQUIRE(!e0.empty());
    auto g = grads(comm.rank(), 12, 50.0);
    auto const mine = g;
    auto const other = grads(1 - comm.rank(), 12, 50.0);
    gc::pipeline_stats const st = p.step(comm, views(g));
    RANK_REQUIRE(st.guard == gc::guard_action::dense);
    RANK_REQUIRE(st.sent == gc::send_kind::dense && st.factor == 1.0 && st.compressed_tensors == 0);
    RANK_REQUIRE(st.step == 12 && p.step_count() == 13);
    for (std::size_t t = 0; t < g.size();
         ++t) {  // the average of the raw gradients (2 ranks: exact)
      for (std::size_t i = 0; i < g[t].size(); ++i) {
        float const a = comm.rank() == 0 ? mine[t][i] : other[t][i];
        float const b = comm.rank() == 0 ? other[t][i] : mine[t][i];
        RANK_REQUIRE(g[t][i] == (a + b) * 0.5f);
      }
    }
    RANK_REQUIRE(state_of(p, 0) == e0);  // the residual is kept
    RANK_REQUIRE(p.guard().counters().dense == 1 && p.guard().counters().resets == 0);
    RANK_REQUIRE(p.guard().history(gc::guard_quantity::gradient).size() ==
                 12);  // the outlier stays out
  }));
}

TEST_CASE("guard dense: an exploded residual is reset to zero on every rank", "[pipeline][guard]") {
  // top-k of one element sends the spike of each gradient; the rest (tiny for 12 steps) stays
  // in the residual. Then one flat gradient of a similar norm leaves most of its mass behind:
  // the next step sees a residual far above its history and goes dense, resetting it.
  auto spiky = [](int rank, std::uint64_t step, double flat) {
    std::vector<std::vector<float>> g{std::vector<float>(big, static_cast<float>(flat)),
                                      std::vector<float>(small, 0.1f)};
    g[0][(step * 7 + static_cast<std::uint64_t>(rank)) % big] = 100.0f;
    return g;
  };
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("dense", "topk:k=1"));
    for (std::uint64_t s = 0; s < 12; ++s) {
      auto g = spiky(comm.rank(), s, 1e-4);
      RANK_REQUIRE(p.step(comm, views(g)).guard == gc::guard_action::none);
    }
    auto g = spiky(comm.rank(), 12, 3.0);  // norm about 130: under 10x the gradient history's
    RANK_REQUIRE(p.step(comm, views(g)).guard == gc::guard_action::none);
    auto h = spiky(comm.rank(), 13, 1e-4);
    gc::pipeline_stats const st = p.step(comm, views(h));
    RANK_REQUIRE(st.guard == gc::guard_action::dense);
    for (float v : state_of(p, 0)) RANK_REQUIRE(v == 0.0f);
    RANK_REQUIRE(p.guard().counters().resets == 1);
    RANK_REQUIRE(p.last_stats().residual_norm > 50.0);
  }));
}

TEST_CASE("guard: the reported loss is watched (non-finite on one rank, explosion)",
          "[pipeline][guard]") {
  rank_errors errors(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("dense"));
    for (std::uint64_t s = 0; s < 12; ++s) {
      auto g = grads(comm.rank(), s, 1.0);
      gc::pipeline_stats const st = p.step(comm, views(g), {.loss = 2.0 + comm.rank()});
      RANK_REQUIRE(st.loss == 2.5);  // the mean over the ranks
    }
    auto g = grads(comm.rank(), 12, 1.0);
    gc::pipeline_stats const st = p.step(comm, views(g), {.loss = 100.0});
    RANK_REQUIRE(st.guard == gc::guard_action::dense);
    // a non-finite loss cannot be sent dense: skipped
    auto h = grads(comm.rank(), 13, 1.0);
    double const nan = std::numeric_limits<double>::quiet_NaN();
    gc::pipeline_stats const st2 = p.step(comm, views(h), {.loss = comm.rank() == 1 ? nan : 2.0});
    RANK_REQUIRE(st2.guard == gc::guard_action::skipped);
    // only one rank reporting is enough
    gc::gradient_pipeline q(options("raise"));
    for (std::uint64_t s = 0; s < 12; ++s) {
      auto k = grads(comm.rank(), s, 1.0);
      q.step(comm, views(k),
             {.loss = comm.rank() == 0 ? std::optional<double>(1.0) : std::nullopt});
    }
    auto k = grads(comm.rank(), 12, 1.0);
    errors.expect(comm.rank(), [&] {
      q.step(comm, views(k),
             {.loss = comm.rank() == 0 ? std::optional<double>(30.0) : std::nullopt});
    });
  }));
  INFO(errors.what[0]);
  CHECK(errors.what[0] == errors.what[1]);
  CHECK(errors.what[0].find("step 12: the loss is 30, 30x the median 1 of its last 12 steps") !=
        std::string::npos);
}

namespace {

// Steps `p` with the scripted losses `loss` (every rank reports the same), stable gradients,
// and returns each step's action; a raise ends the script, its message in `*raised`.
std::vector<gc::guard_action> run_losses(gc::gradient_pipeline& p, gc::in_process_communicator& comm,
                                         std::vector<double> const& loss, std::string* raised) {
  std::vector<gc::guard_action> out;
  for (std::size_t s = 0; s < loss.size(); ++s) {
    auto g = grads(comm.rank(), p.step_count(), 1.0);
    try {
      out.push_back(p.step(comm, views(g), {.loss = loss[s]}).guard);
    } catch (gc::numeric_error const& e) {
      *raised = e.what();
      break;
    }
  }
  return out;
}

// 49 losses of a falling curve that ends near zero: 0.3 e^(-i/6) + 0.005 plus a little noise,
// as ResNet-18's before step 182 (docs/training.md): median about 0.01, range about 0.005 .. 0.3.
std::vector<double> falling_history() {
  std::vector<double> l;
  for (int i = 0; i < 49; ++i)
    l.push_back(0.3 * std::exp(-i / 6.0) + 0.005 + 0.002 * ((i * 7) % 10) / 9.0);
  return l;
}

// The loss `spans` history ranges above the minimum of `h`.
double above(std::vector<double> const& h, double spans) {
  auto const [lo, hi] = std::minmax_element(h.begin(), h.end());
  return *lo + spans * (*hi - *lo);
}

}  // namespace

TEST_CASE("guard: a loss within its history's range does not trip, however far above the median",
          "[pipeline][guard]") {
  for (double const spans : {0.87, 1.0, 1.75}) {  // 0.87: ResNet-18's 0.2506 at step 182
    INFO(spans);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      std::string raised;
      std::vector<double> l = falling_history();
      double const next = above(l, spans);
      l.push_back(next);  // > 20x the median
      l.push_back(0.008);
      std::vector<gc::guard_action> const acts = run_losses(p, comm, l, &raised);
      RANK_REQUIRE(raised.empty());
      RANK_REQUIRE(acts.size() == l.size());
      RANK_REQUIRE(p.guard().counters().checked == l.size());
      std::vector<double> const h = p.guard().history(gc::guard_quantity::loss);
      RANK_REQUIRE(h[h.size() - 2] == next);  // accepted into the history
      RANK_REQUIRE(p.guard().counters().peak_ratio[2] > 20.0);
    }));
  }
}

TEST_CASE("guard: a loss that leaves its history's range trips; both conditions are needed",
          "[pipeline][guard]") {
  SECTION("near zero: 2.1 ranges above the minimum and 50x the median raises") {
    rank_errors errors(2);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      std::string raised;
      std::vector<double> l = falling_history();
      l.push_back(above(l, 2.1));
      run_losses(p, comm, l, &raised);
      RANK_REQUIRE(!raised.empty());
      RANK_REQUIRE(p.step_count() == 49);  // the last step raised, nothing changed
      std::lock_guard<std::mutex> lock(errors.mu);
      errors.what[static_cast<std::size_t>(comm.rank())] = raised;
    }));
    INFO(errors.what[0]);
    CHECK(errors.what[0] == errors.what[1]);
    CHECK(errors.what[0].find("step 49: the loss is 0.6") != std::string::npos);
    CHECK(errors.what[0].find("2.1 history ranges above its minimum (limit 2)") !=
          std::string::npos);
  }
  SECTION("the Fashion-MNIST MLP at x40 (docs/training.md): 5.652 after 0.336 .. 2.289 raises") {
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      std::string raised;
      std::vector<double> l;
      for (int i = 0; i < 50; ++i) l.push_back(i == 10 ? 2.289 : i == 30 ? 0.3358 : 0.5544);
      l.push_back(5.652);
      run_losses(p, comm, l, &raised);
      RANK_REQUIRE(raised.find("the loss is 5.652, 10.19x the median 0.5544") != std::string::npos);
      RANK_REQUIRE(raised.find("2.722 history ranges above its minimum") != std::string::npos);
    }));
  }
  SECTION("far outside the range but below factor x the median: no trip") {
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(options("raise"));
      std::string raised;
      std::vector<double> l;
      for (int i = 0; i < 20; ++i) l.push_back(1.0 + 0.001 * (i % 3));
      l.push_back(9.5);  // 4250 ranges above the minimum, 9.5x the median
      std::vector<gc::guard_action> const acts = run_losses(p, comm, l, &raised);
      RANK_REQUIRE(raised.empty() && acts.size() == l.size());
    }));
  }
  SECTION("loss_span sets the bar: 1.75 ranges trips with loss_span=1.5, not with the default") {
    for (std::string const spec : {"dense", "dense:loss_span=1.5"}) {
      REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
        gc::gradient_pipeline p(options(spec));
        std::string raised;
        std::vector<double> l = falling_history();
        l.push_back(above(l, 1.75));
        std::vector<gc::guard_action> const acts = run_losses(p, comm, l, &raised);
        RANK_REQUIRE(raised.empty() && acts.size() == l.size());
        RANK_REQUIRE(acts.back() ==
                     (spec == "dense" ? gc::guard_action::none : gc::guard_action::dense));
        RANK_REQUIRE(std::count(acts.begin(), acts.end(), gc::guard_action::none) ==
                     static_cast<std::ptrdiff_t>(l.size()) - (spec == "dense" ? 0 : 1));
      }));
    }
  }
}

TEST_CASE("guard: checkpoints keep the history and counters bit for bit",
          "[pipeline][guard][checkpoint]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline first(options("skip:window=16"));
    for (std::uint64_t s = 0; s < 20; ++s) {
      auto g = grads(comm.rank(), s, s == 15 ? 80.0 : 1.0 + 0.01 * static_cast<double>(s));
      first.step(comm, views(g), {.loss = 1.0 / (1.0 + static_cast<double>(s))});
    }
    RANK_REQUIRE(first.guard().counters().skipped == 1);
    std::vector<std::byte> const saved = first.save();
    std::uint64_t const saved_steps = first.step_count();
    gc::gradient_pipeline resumed(options("skip:window=16"));
    resumed.load(saved);
    RANK_REQUIRE(resumed.save() == saved);
    RANK_REQUIRE(resumed.step_count() == saved_steps);
    for (auto q :
         {gc::guard_quantity::gradient, gc::guard_quantity::residual, gc::guard_quantity::loss}) {
      std::vector<double> const a = first.guard().history(q), b = resumed.guard().history(q);
      RANK_REQUIRE(a.size() == 16 && a.size() == b.size());
      RANK_REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
    }
    RANK_REQUIRE(resumed.guard().counters().peak_ratio[0] ==
                 first.guard().counters().peak_ratio[0]);
    for (std::uint64_t s = 20; s < 24; ++s) {  // both go on identically, a trip included
      auto g = grads(comm.rank(), s, s == 22 ? 80.0 : 1.0);
      auto h = g;
      gc::pipeline_stats const a = first.step(comm, views(g));
      gc::pipeline_stats const b = resumed.step(comm, views(h));
      RANK_REQUIRE(a.guard == b.guard && g == h);
    }
    RANK_REQUIRE(first.save() == resumed.save());
    // another guard spec does not load; neither does a version 1 checkpoint (no guard state,
    // no checksum: from before both), which is refused as such
    gc::gradient_pipeline other(options("skip:window=17"));
    bool threw = false;
    try {
      other.load(saved);
    } catch (gc::format_error const&) {
      threw = true;
    }
    RANK_REQUIRE(threw);
    std::vector<std::byte> v1 = saved;
    std::vector<std::byte> const gstate = first.guard().save();
    std::uint64_t glen = 0;
    std::memcpy(&glen, v1.data() + v1.size() - 4 - gstate.size() - 8, 8);
    v1.resize(v1.size() - 4 - gstate.size() - 8);
    RANK_REQUIRE(glen == gstate.size());
    v1[4] = std::byte{1};
    v1[5] = std::byte{0};
    std::uint64_t const body = v1.size() - 16;
    std::memcpy(v1.data() + 8, &body, 8);
    gc::gradient_pipeline old(options("skip:window=16"));
    std::vector<std::byte> const fresh = old.save();
    std::string msg;
    try {
      old.load(v1);
    } catch (gc::format_error const& e) {
      msg = e.what();
    }
    RANK_REQUIRE(msg.find("carries no checksum") != std::string::npos);
    RANK_REQUIRE(old.save() == fresh);
  }));
}

TEST_CASE("guard: PowerSGD and two-way steps are watched too", "[pipeline][guard]") {
  for (std::string codec : {"powersgd:rank=2", "onebit"}) {
    INFO(codec);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::pipeline_options o = options("dense", codec);
      o.two_way = codec == "onebit";
      gc::gradient_pipeline p(o);
      warm(p, comm, 12);
      auto g = grads(comm.rank(), 12, 60.0);
      gc::pipeline_stats const st = p.step(comm, views(g));
      RANK_REQUIRE(st.guard == gc::guard_action::dense && std::isnan(st.residual_norm));
      auto h = grads(comm.rank(), 13, 1.0);
      h[0][0] = std::numeric_limits<float>::quiet_NaN();
      RANK_REQUIRE(p.step(comm, views(h)).guard == gc::guard_action::skipped);
      RANK_REQUIRE(p.step_count() == 13);
    }));
  }
}
