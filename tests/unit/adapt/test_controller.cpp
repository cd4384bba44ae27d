// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// concepts/controller.hpp and adapt/protocol.hpp, adapt/any_controller.hpp: what is and is not
// a controller (nominal tag + operations); `agree` makes statistics identical across ranks
// (sums, maxima, disagreement raised on every rank), so controllers on different ranks decide
// alike; `any_controller` copies its state; `make_controller` parses specs and rejects bad ones.

#include <catch2/catch.hpp>

#include "adapt_support.hpp"

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/concepts/controller.hpp>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gc = gradcomp;
using namespace adapt_test;

namespace {

struct complete {
  using controller_concept = gc::controller_tag;
  gc::step_plan const& plan() const;
  gc::decision decide(gc::step_stats const&);
};
struct derived_tag : gc::controller_tag {};
struct with_derived_tag {
  using controller_concept = derived_tag;
  gc::step_plan plan() const;  // by value is fine
  gc::decision decide(gc::step_stats const&);
};
struct untagged {
  gc::step_plan const& plan() const;
  gc::decision decide(gc::step_stats const&);
};
struct wrong_tag {
  using controller_concept = int;
  gc::step_plan const& plan() const;
  gc::decision decide(gc::step_stats const&);
};
struct no_plan {
  using controller_concept = gc::controller_tag;
  gc::decision decide(gc::step_stats const&);
};
struct mutable_plan {
  using controller_concept = gc::controller_tag;
  gc::step_plan const& plan();  // not const
  gc::decision decide(gc::step_stats const&);
};
struct wrong_result {
  using controller_concept = gc::controller_tag;
  gc::step_plan const& plan() const;
  double decide(gc::step_stats const&);
};
struct takes_copy_only_mutable_stats {
  using controller_concept = gc::controller_tag;
  gc::step_plan const& plan() const;
  gc::decision decide(gc::step_stats&);  // cannot take const statistics
};

}  // namespace

TEST_CASE("controller concept: tag and operations both required", "[controller]") {
  STATIC_REQUIRE(gc::controller<complete>);
  STATIC_REQUIRE(gc::controller<with_derived_tag>);
  STATIC_REQUIRE_FALSE(gc::controller<untagged>);
  STATIC_REQUIRE_FALSE(gc::controller<wrong_tag>);
  STATIC_REQUIRE_FALSE(gc::controller<no_plan>);
  STATIC_REQUIRE_FALSE(gc::controller<mutable_plan>);
  STATIC_REQUIRE_FALSE(gc::controller<wrong_result>);
  STATIC_REQUIRE_FALSE(gc::controller<takes_copy_only_mutable_stats>);
  STATIC_REQUIRE_FALSE(gc::controller<int>);
  STATIC_REQUIRE(gc::controller<gc::static_controller>);
  STATIC_REQUIRE(gc::controller<gc::schedule_controller>);
  STATIC_REQUIRE(gc::controller<gc::gravac_controller>);
  STATIC_REQUIRE(gc::controller<gc::accordion_controller>);
  STATIC_REQUIRE(gc::controller<gc::any_controller>);
}

TEST_CASE("decision::packet maps the send kind to the measured packet", "[controller]") {
  gc::decision d;
  d.send = gc::send_kind::candidate;
  CHECK(d.packet(2) == 1);
  CHECK(d.packet(1) == 0);
  CHECK(d.packet(0) == gc::decision::npos);
  d.send = gc::send_kind::minimum;
  CHECK(d.packet(2) == 0);
  d.send = gc::send_kind::dense;
  CHECK(d.packet(2) == gc::decision::npos);
  CHECK(std::string(gc::send_kind_name(gc::send_kind::candidate)) == "candidate");
  CHECK(std::string(gc::residual_rule_name(gc::residual_rule::keep)) == "keep");
}

namespace {

// An in-process all-reduce for the agreement tests: every rank's buffer is combined in rank
// order, so all ranks get bit-identical results.
class fake_comm {
 public:
  explicit fake_comm(int n) : n_(n), bar_(n), bufs_(static_cast<std::size_t>(n)) {}
  void all_reduce(int rank, std::span<double> x, bool is_max) {
    bufs_[static_cast<std::size_t>(rank)].assign(x.begin(), x.end());
    bar_.arrive_and_wait();
    for (std::size_t i = 0; i < x.size(); ++i) {
      double acc = bufs_[0][i];
      for (std::size_t r = 1; r < bufs_.size(); ++r)
        acc = is_max ? std::max(acc, bufs_[r][i]) : acc + bufs_[r][i];
      x[i] = acc;
    }
    bar_.arrive_and_wait();
  }
  [[nodiscard]] int size() const noexcept { return n_; }

 private:
  int n_;
  std::barrier<> bar_;
  std::vector<std::vector<double>> bufs_;
};

// Runs f(rank) on n threads; returns what each returned.
template <class F>
auto on_ranks(int n, F f) {
  std::vector<decltype(f(0))> out(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { out[static_cast<std::size_t>(r)] = f(r); });
  for (auto& t : ts) t.join();
  return out;
}

}  // namespace

TEST_CASE("agree sums the norms, takes the slowest times, and leaves every rank identical",
          "[controller]") {
  fake_comm comm(3);
  auto const agreed = on_ranks(3, [&](int r) {
    gc::step_stats s;
    s.step = 7;
    s.ef_norm_sq = 1.0 + r;
    s.compressed_norm_sq = {0.5 * (1 + r), 0.25 * (1 + r)};
    s.layer_norms_sq = {double(r), 10.0 * r};
    s.last_step = {1.0 + r, 0.5 - 0.1 * r, 2.0 * (r == 1)};
    s.batch_size = 32;
    s.workers = 3;
    s.learning_rate = 0.1;
    s.next_learning_rate = 0.01;
    gc::agree(
        s, [&](std::span<double> x) { comm.all_reduce(r, x, false); },
        [&](std::span<double> x) { comm.all_reduce(r, x, true); });
    return s;
  });
  for (auto const& s : agreed) {
    CHECK(s.step == 7);
    CHECK(s.ef_norm_sq == 6.0);
    CHECK(s.compressed_norm_sq == std::vector<double>{3.0, 1.5});
    CHECK(s.layer_norms_sq == std::vector<double>{3.0, 30.0});
    CHECK(s.last_step == gc::step_timing{3.0, 0.5, 2.0});
    CHECK(s.batch_size == 32);
    CHECK(s.workers == 3);
    CHECK(s.learning_rate == 0.1);
    CHECK(s.next_learning_rate == 0.01);
    CHECK(std::isnan(s.loss));  // no rank reported a loss
  }
}

TEST_CASE("agree: the loss is the mean over the ranks that reported one", "[controller]") {
  auto play = [](auto loss_of) {
    fake_comm comm(3);
    return on_ranks(3, [&](int r) {
      gc::step_stats s;
      s.step = 2;
      s.ef_norm_sq = 1.0;
      s.loss = loss_of(r);
      gc::agree(
          s, [&](std::span<double> x) { comm.all_reduce(r, x, false); },
          [&](std::span<double> x) { comm.all_reduce(r, x, true); });
      return s;
    });
  };
  double const nan = std::numeric_limits<double>::quiet_NaN();
  // Rank 1 reports none: (1.5 + 3.5) / 2, not / 3; the norms are summed as before.
  for (auto const& s : play([&](int r) { return r == 1 ? nan : 1.5 + r; })) {
    CHECK(s.loss == 2.5);
    CHECK(s.ef_norm_sq == 3.0);
  }
  for (auto const& s : play([](int r) { return -1.0 * r; })) CHECK(s.loss == -1.0);
  for (auto const& s : play([&](int) { return nan; })) CHECK(std::isnan(s.loss));
}

TEST_CASE("agree raises comm_error on every rank when ranks disagree", "[controller]") {
  auto run = [](auto tweak) {
    fake_comm comm(3);
    return on_ranks(3, [&](int r) -> std::string {
      gc::step_stats s;
      s.step = 3;
      s.batch_size = 8;
      s.workers = 3;
      s.learning_rate = 0.1;
      tweak(r, s);
      return thrown<gc::comm_error>([&] {
        gc::agree(
            s, [&](std::span<double> x) { comm.all_reduce(r, x, false); },
            [&](std::span<double> x) { comm.all_reduce(r, x, true); });
      });
    });
  };
  using Catch::Matchers::Contains;
  for (auto const& m : run([](int r, gc::step_stats& s) { if (r == 2) s.step = 4; }))
    CHECK_THAT(m, Contains("disagree on the step"));
  for (auto const& m : run([](int r, gc::step_stats& s) { if (r == 0) s.learning_rate = 0.2; }))
    CHECK_THAT(m, Contains("learning rate"));
  for (auto const& m : run([](int r, gc::step_stats& s) { if (r == 1) s.batch_size = 7; }))
    CHECK_THAT(m, Contains("batch size"));
  for (auto const& m : run([](int, gc::step_stats&) {})) CHECK(m == "(nothing thrown)");
}

TEST_CASE("GraVAC on agreed statistics decides alike on every rank; on local ones it would not",
          "[controller][gravac]") {
  // Rank r's local gain of the candidate: 0.95 on rank 0, 0.55 on the others; the global gain
  // (sum of ‖C‖² over sum of ‖g_ef‖², rank 0 carrying half of the mass) lands in between.
  auto local = [](int r, std::uint64_t step, double f) {
    double const ef = r == 0 ? 3.0 : 1.0;
    double const g = f == 10.0 ? 1.0 : (r == 0 ? 0.95 : 0.55 - 0.01 * static_cast<double>(step % 3));
    return std::pair{ef, g * ef};
  };
  auto play = [&](bool agreeing) {
    fake_comm comm(4);
    return on_ranks(4, [&](int r) {
      gc::gravac_config cfg;
      cfg.window = 3;
      cfg.smoothing = 0.0;  // N/100 = 0.04
      gc::gravac_controller c(cfg);
      std::vector<std::string> trace;
      for (int i = 0; i < 9; ++i) {
        gc::step_stats s;
        s.step = c.plan().step;
        for (double f : c.plan().measure) {
          auto const [ef, cn] = local(r, s.step, f);
          s.ef_norm_sq = ef;
          s.compressed_norm_sq.push_back(cn);
        }
        s.last_step = {0.1, 0.01, 0.05 + 0.01 * r};
        s.batch_size = 16;
        s.workers = 4;
        if (agreeing) {
          gc::agree(
              s, [&](std::span<double> x) { comm.all_reduce(r, x, false); },
              [&](std::span<double> x) { comm.all_reduce(r, x, true); });
        }
        trace.push_back(code(c.decide(s)));
      }
      std::string out;
      for (auto const& t : trace) out += t + " ";
      return out + "/ " + num(c.theta_min()) + " " + num(c.candidate());
    });
  };
  auto const agreed = play(true);
  for (auto const& t : agreed) CHECK(t == agreed[0]);
  // Global candidate gain (0.95·3 + 3·0.55) / 6 = 0.75 >= 0.7: candidate sent everywhere.
  CHECK(agreed[0].substr(0, 12) == "c20 c20 c20 ");
  auto const local_only = play(false);
  CHECK(local_only[0] != local_only[1]);  // without agreement the ranks would diverge
}

TEST_CASE("any_controller wraps any controller and copies its state", "[controller]") {
  gc::gravac_config cfg;
  cfg.window = 2;
  cfg.smoothing = 1.0;
  gc::any_controller a(gc::gravac_controller(cfg), "mine");
  CHECK(a.name() == "mine");
  REQUIRE(a.target<gc::gravac_controller>() != nullptr);
  CHECK(a.target<gc::static_controller>() == nullptr);
  auto const gains = [](std::uint64_t, double f) { return f == 10.0 ? 1.0 : 0.9; };
  auto const tp = throughput_timing([](double f) { return f; });
  auto const first = drive(a, 3, gains, tp);
  gc::any_controller b = a;  // copy mid-run
  auto const ta = drive(a, 4, gains, tp);
  auto const tb = drive(b, 4, gains, tp);
  CHECK(codes(ta) == codes(tb));
  CHECK(codes(first) + " " + codes(ta) == "c20 c20 c40 c40 c160 c160 c1000");
  // Independent states: advancing one leaves the other.
  drive(a, 1, gains, tp);
  CHECK(a.plan().step == 8);
  CHECK(b.plan().step == 7);
  b = a;
  CHECK(b.plan().step == 8);
  CHECK(b.target<gc::gravac_controller>()->candidate() == 1000.0);
}

TEST_CASE("make_controller builds each controller from its spec", "[controller]") {
  auto dense = gc::make_controller("dense");
  CHECK(codes(drive(dense, 2, [](std::uint64_t, double) { return 0.0; },
                    [](std::uint64_t, gc::decision const&) { return gc::step_timing{}; })) ==
        "d d");
  auto st = gc::make_controller("static:factor=250");
  REQUIRE(st.target<gc::static_controller>() != nullptr);
  CHECK(st.target<gc::static_controller>()->factor() == 250.0);
  CHECK(st.name() == "static:factor=250");

  auto sc = gc::make_controller("schedule:0=1,100=10,1000=100");
  REQUIRE(sc.target<gc::schedule_controller>() != nullptr);
  CHECK(sc.target<gc::schedule_controller>()->points() ==
        std::vector<gc::schedule_point>{{0, 1.0}, {100, 10.0}, {1000, 100.0}});

  auto w = gc::make_controller("dgc_warmup:stage_steps=50");
  CHECK(w.target<gc::schedule_controller>()->points() == gc::dgc_warmup(50).points());
  auto w2 = gc::make_controller("dgc_warmup:stage_steps=5,final=99,stages=2,base=3");
  CHECK(w2.target<gc::schedule_controller>()->points() == gc::dgc_warmup(5, 99.0, 2, 3.0).points());

  auto g = gc::make_controller(
      "gravac:theta_min=1.5,theta_max=2000,epsilon=0.9,omega=0.02,window=2000,"
      "policy=geometric,step_factor=3,ratio=4,smoothing=0.25,gain=separate,throughput=last,"
      "base=current,dense=keep");
  REQUIRE(g.target<gc::gravac_controller>() != nullptr);
  auto const& c = g.target<gc::gravac_controller>()->config();
  CHECK(c.theta_min == 1.5);
  CHECK(c.theta_max == 2000.0);
  CHECK(c.epsilon == 0.9);
  CHECK(c.omega == 0.02);
  CHECK(c.window == 2000);
  CHECK(c.policy == gc::gravac_policy::geometric);
  CHECK(c.step_factor == 3.0);
  CHECK(c.ratio == 4.0);
  CHECK(c.smoothing == 0.25);
  CHECK(c.gain_average == gc::gravac_gain_average::separate);
  CHECK(c.throughput == gc::gravac_throughput::last);
  CHECK(c.candidate_base == gc::gravac_base::current);
  CHECK(c.dense_fallback == gc::gravac_dense::keep);
  auto const defaults = gc::make_controller("gravac");
  auto const& d = defaults.target<gc::gravac_controller>()->config();
  CHECK(d.window == 500);
  CHECK(d.policy == gc::gravac_policy::exponential);

  auto a = gc::make_controller(
      "accordion:low=2,high=1000,eta=0.25,interval=300,accumulation=30,scope=whole_model");
  REQUIRE(a.target<gc::accordion_controller>() != nullptr);
  auto const& ac = a.target<gc::accordion_controller>()->config();
  CHECK(ac.low_factor == 2.0);
  CHECK(ac.high_factor == 1000.0);
  CHECK(ac.eta == 0.25);
  CHECK(ac.interval == 300);
  CHECK(ac.accumulation == 30);
  CHECK(ac.scope == gc::accordion_scope::whole_model);
}

TEST_CASE("make_controller rejects malformed specs with config_error", "[controller]") {
  using Catch::Matchers::Contains;
  auto msg = [](char const* spec) {
    return thrown<gc::config_error>([&] { gc::make_controller(spec); });
  };
  CHECK_THAT(msg("sgd"), Contains("unknown controller 'sgd'"));
  CHECK_THAT(msg("gravac:"), Contains("ends with ':'"));
  CHECK_THAT(msg("gravac:window"), Contains("not key=value"));
  CHECK_THAT(msg("gravac:=3"), Contains("not key=value"));
  CHECK_THAT(msg("gravac:window=3,window=4"), Contains("given twice"));
  CHECK_THAT(msg("gravac:windows=3"), Contains("no option 'windows'"));
  CHECK_THAT(msg("gravac:window=-3"), Contains("unsigned integer"));
  CHECK_THAT(msg("gravac:epsilon=high"), Contains("needs a number"));
  CHECK_THAT(msg("gravac:epsilon="), Contains("needs a number"));
  CHECK_THAT(msg("gravac:policy=linear"), Contains("exponential, geometric"));
  CHECK_THAT(msg("gravac:epsilon=2"), Contains("epsilon"));  // range checked by the controller
  CHECK_THAT(msg("gravac:theta_min=100,theta_max=10"), Contains("theta_max"));
  CHECK_THAT(msg("static"), Contains("needs factor="));
  CHECK_THAT(msg("static:factor=0.5"), Contains("factor"));
  CHECK_THAT(msg("dense:factor=3"), Contains("no option 'factor'"));
  CHECK_THAT(msg("schedule:5=10"), Contains("expected 0"));
  CHECK_THAT(msg("schedule:zero=10"), Contains("unsigned integer"));
  CHECK_THAT(msg("dgc_warmup:final=10"), Contains("needs stage_steps="));
  CHECK_THAT(msg("dgc_warmup:stage_steps=1,stages=1000"), Contains("at most 64"));
  CHECK_THAT(msg("accordion:scope=layer"), Contains("any_layer, whole_model"));
  CHECK_THAT(msg("accordion:interval=10,accumulation=20"), Contains("accumulation"));
}

TEST_CASE("the explicit-instantiation list names every controller make_controller builds",
          "[controller][instantiate]") {
  // GRADCOMP_EXTERN_TEMPLATES (config.hpp) instantiates the erasures of the types in
  // GRADCOMP_DETAIL_MAKE_CONTROLLER_TYPES once per program: each spec family must build exactly
  // one type of that list.
  for (char const* spec : {"dense", "static:factor=4", "schedule:0=4,100=16", "dgc_warmup:stage_steps=10",
                           "gravac", "accordion", "ef_window"}) {
    INFO(spec);
    gc::any_controller const c = gc::make_controller(spec);
    int listed = 0;
#define GRADCOMP_TEST_LISTED(C) listed += c.target<gc::C>() != nullptr ? 1 : 0;
    GRADCOMP_DETAIL_MAKE_CONTROLLER_TYPES(GRADCOMP_TEST_LISTED)
#undef GRADCOMP_TEST_LISTED
    CHECK(listed == 1);
  }
}
