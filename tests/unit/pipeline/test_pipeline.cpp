// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../support/codec_support.hpp"
#include "../support/rank_check.hpp"
#include "pipeline_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace pipeline_test;

namespace {

struct config {
  std::string codec, feedback, controller;
};

// Runs `steps` steps of the pipeline on `world` in-process ranks and checks every output
// against the reference, every rank's decision against rank 0's, and returns the decisions.
template <class T>
std::vector<gc::send_kind> check_against_reference(config const& c, int world, std::uint64_t steps) {
  gc::pipeline_options opt;
  opt.codec = c.codec;
  opt.feedback = c.feedback;
  opt.controller = c.controller;
  opt.seed = 11;
  opt.measured_timing = false;
  opt.buckets.min_compress_elements = 1000;
  opt.buckets.bucket_bytes = 64 << 10;  // several buckets
  opt.context.parallel_threshold = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> const sizes = model_sizes();
  std::vector<gc::send_kind> sent(steps);
  std::vector<std::vector<double>> factors(static_cast<std::size_t>(world), std::vector<double>(steps));
  gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline pipe(opt);
    reference ref(opt, world);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto grads = make_grads<T>(comm.rank(), s, sizes);
      gc::pipeline_stats const st =
          pipe.step(comm, views(grads), {.backprop_s = 0.01, .batch_size = 32, .learning_rate = 0.1});
      RANK_REQUIRE(st.step == s);
      factors[static_cast<std::size_t>(comm.rank())][s] = st.factor;
      if (comm.rank() == 0) sent[s] = st.sent;
      auto const expect = ref.template step<T>(s, st, sizes);
      for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(same_bits(grads[t], expect[t]));
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        auto const id = static_cast<gc::tensor_id>(t);
        auto const mine = pipe.feedback_state(id);
        auto const theirs = ref.state(comm.rank(), id);
        RANK_REQUIRE(mine.size() == theirs.size());
        RANK_REQUIRE(std::equal(mine.begin(), mine.end(), theirs.begin()));
      }
    }
  });
  for (int r = 1; r < world; ++r) REQUIRE(factors[static_cast<std::size_t>(r)] == factors[0]);
  return sent;
}

}  // namespace

TEST_CASE("pipeline agrees with the plain reference for every aggregation kind and feedback", "[pipeline]") {
  std::vector<config> const configs = {
      {"topk:ratio=0.02", "residual", ""},         // gather, sparse
      {"topk:ratio=0.02", "none", ""},
      {"topk:ratio=0.02", "ef21", ""},
      {"topk:ratio=0.02", "dgc:momentum=0.9", ""},
      {"qsgd:levels=7,bucket=256", "residual", ""},  // gather, stochastic
      {"onebit", "residual", ""},                    // gather, scaled sign
      {"identity", "none", ""},                      // summable, f32 values
      {"fp16", "residual", ""},                      // summable, f16 values
      {"randomk:ratio=0.05", "residual", ""},        // shared support
      {"randomk:ratio=0.05,scale=true", "ef21", ""},
  };
  // under sanitizers (quick mode) one world size
  std::vector<int> const worlds = gradcomp_test::quick_mode() ? std::vector<int>{3} : std::vector<int>{1, 3, 8};
  for (int world : worlds) {
    for (auto const& c : configs) {
      INFO(c.codec << " + " << c.feedback << " on " << world << " ranks");
      check_against_reference<float>(c, world, 3);
    }
  }
}

TEST_CASE("pipeline agrees with the reference under every controller, taking the same decisions on every rank",
          "[pipeline][adapt]") {
  std::vector<config> const configs = {
      {"topk:ratio=0.01", "residual", "static:factor=50"},
      {"topk:ratio=0.01", "residual", "schedule:0=4,3=20,6=100"},
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=256,epsilon=0.3,window=2"},
      {"topk:ratio=0.01", "ef21", "gravac:theta_min=4,theta_max=256,epsilon=0.3,window=2"},
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=64,epsilon=1,window=2"},  // always dense
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=64,epsilon=1,window=2,dense=keep"},
      {"topk:ratio=0.01", "ef21", "gravac:theta_min=4,theta_max=64,epsilon=1,window=2,dense=keep"},
      {"topk:ratio=0.01", "dgc:momentum=0.5", "gravac:theta_min=4,theta_max=64,epsilon=0.5,window=2"},
      {"topk:ratio=0.01", "residual", "accordion:low=2,high=40,interval=3,accumulation=2"},
      {"topk:ratio=0.01", "residual", "ef_window:min=4,max=256,window=2,max_delay=0.5"},
      {"approx_topk:ratio=0.01", "residual", "static:factor=20"},
      {"randomk:ratio=0.01", "residual", "schedule:0=4,2=50"},
      {"topk:ratio=0.01", "residual", "dense"},
  };
  bool saw_candidate = false, saw_dense = false, saw_minimum = false;
  std::vector<int> const worlds = gradcomp_test::quick_mode() ? std::vector<int>{4} : std::vector<int>{2, 5};
  for (int world : worlds) {
    for (auto const& c : configs) {
      INFO(c.controller << " with " << c.codec << " + " << c.feedback << " on " << world << " ranks");
      for (gc::send_kind k : check_against_reference<float>(c, world, 8)) {
        saw_candidate |= k == gc::send_kind::candidate;
        saw_dense |= k == gc::send_kind::dense;
        saw_minimum |= k == gc::send_kind::minimum;
      }
    }
  }
  // the configurations exercise every kind of decision
  CHECK(saw_candidate);
  CHECK(saw_dense);
  CHECK(saw_minimum);
}

TEST_CASE("pipeline takes float16 and bfloat16 gradients: the float32 result rounded once", "[pipeline][dtype]") {
  std::vector<config> const configs = {
      {"topk:ratio=0.02", "residual", "gravac:theta_min=4,theta_max=64,epsilon=0.3,window=2"},
      {"fp16", "none", ""},
      {"qsgd:levels=7,bucket=256", "ef21", ""},
      {"randomk:ratio=0.05", "residual", ""},
  };
  for (int world : {3}) {
    for (auto const& c : configs) {
      INFO(c.codec << " + " << c.feedback << " on " << world << " ranks");
      check_against_reference<gc::half>(c, world, 3);
      check_against_reference<gc::bfloat16>(c, world, 3);
    }
  }
}

TEST_CASE("pipeline error feedback conserves mass when the controller changes the factor and falls back to dense",
          "[pipeline][feedback]") {
  // sum over steps of (world x the averaged output) + sum over ranks of the final residual
  // equals the sum of every rank's gradients over the steps (residual feedback, large tensors)
  for (std::string const ctrl : {"schedule:0=4,2=30,4=1,5=100", "gravac:theta_min=4,theta_max=64,epsilon=0.4,window=2",
                                 "gravac:theta_min=4,theta_max=64,epsilon=1,window=2,dense=keep",
                                 "ef_window:min=4,max=64,window=2,max_delay=0.5"}) {
    INFO(ctrl);
    int const world = 3;
    std::uint64_t const steps = 8;
    gc::pipeline_options opt;
    opt.codec = "topk:ratio=0.01";
    opt.controller = ctrl;
    opt.buckets.min_compress_elements = 1000;
    std::vector<std::size_t> const sizes = {20000};
    std::vector<double> sent_sum(20000, 0.0), grad_sum(20000, 0.0), residual_sum(20000, 0.0);
    std::mutex mu;
    std::vector<gc::send_kind> kinds;
    std::vector<double> factors;
    REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline pipe(opt);
      std::vector<double> sent(20000, 0.0), gs(20000, 0.0);
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto grads = make_grads<float>(comm.rank(), s, sizes);
        for (std::size_t i = 0; i < 20000; ++i) gs[i] += grads[0][i];
        gc::pipeline_stats const st = pipe.step(comm, views(grads), {.backprop_s = 0.01, .batch_size = 8});
        if (comm.rank() == 0) kinds.push_back(st.sent);
        if (comm.rank() == 0) factors.push_back(st.factor);
        if (comm.rank() == 0) {
          for (std::size_t i = 0; i < 20000; ++i) sent[i] += static_cast<double>(grads[0][i]) * world;
        }
      }
      auto const r = pipe.feedback_state(gc::tensor_id{0});
      std::lock_guard<std::mutex> lock(mu);
      for (std::size_t i = 0; i < 20000; ++i) {
        grad_sum[i] += gs[i];
        sent_sum[i] += sent[i];
        if (!r.empty()) residual_sum[i] += r[i];
      }
    }));
    double err = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < 20000; ++i) {
      err = std::max(err, std::fabs(sent_sum[i] + residual_sum[i] - grad_sum[i]));
      scale = std::max(scale, std::fabs(grad_sum[i]));
    }
    CHECK(err <= 1e-5 * scale);
    bool changed = false;
    for (std::size_t s = 1; s < kinds.size(); ++s) changed |= kinds[s] != kinds[0];
    if (ctrl.rfind("schedule", 0) == 0) CHECK(changed);
    if (ctrl.rfind("ef_window", 0) == 0) CHECK(std::adjacent_find(factors.begin(), factors.end(), std::not_equal_to<>()) != factors.end());
  }
}

TEST_CASE("pipeline: a run resumed from a checkpoint is bit-identical to one that never stopped", "[pipeline][checkpoint]") {
  std::vector<config> const configs = {
      {"topk:ratio=0.01", "residual", "gravac:theta_min=4,theta_max=256,epsilon=0.3,window=2"},
      {"topk:ratio=0.01", "ef21", "accordion:low=2,high=40,interval=3,accumulation=2"},
      {"topk:ratio=0.01", "residual", "ef_window:min=4,max=256,window=3,max_delay=0.5"},
      {"topk:ratio=0.01", "dgc:momentum=0.9", "schedule:0=4,3=20"},
      {"qsgd:levels=7,bucket=256", "residual", ""},
      {"powersgd:rank=2", "residual", ""},
      {"topk:ratio=0.05", "residual", "two_way"},
  };
  int const world = 3;
  std::uint64_t const steps = 8, cut = 5;
  for (auto const& c : configs) {
    INFO(c.codec << " + " << c.feedback << " + " << c.controller);
    gc::pipeline_options opt;
    opt.codec = c.codec;
    opt.feedback = c.feedback;
    opt.two_way = c.controller == "two_way";
    opt.measured_timing = false;  // GraVAC's throughput from wall-clock times would differ between runs
    opt.controller = opt.two_way ? "" : c.controller;
    opt.buckets.min_compress_elements = 1000;
    std::vector<std::size_t> const sizes = model_sizes();
    REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline straight(opt), first(opt);
      std::vector<std::vector<std::vector<float>>> a, b;
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        straight.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8, .learning_rate = 0.1});
        a.push_back(g);
      }
      for (std::uint64_t s = 0; s < cut; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        first.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8, .learning_rate = 0.1});
        b.push_back(g);
      }
      std::vector<std::byte> const saved = first.save();
      gc::gradient_pipeline resumed(opt);
      resumed.load(saved);
      RANK_REQUIRE(resumed.step_count() == cut);
      RANK_REQUIRE(resumed.save() == saved);
      for (std::uint64_t s = cut; s < steps; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        resumed.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8, .learning_rate = 0.1});
        b.push_back(g);
      }
      for (std::uint64_t s = 0; s < steps; ++s) {
        for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(same_bits(a[s][t], b[s][t]));
      }
      RANK_REQUIRE(straight.save() == resumed.save());
    }));
  }
}

TEST_CASE("pipeline: the controller sees the mean reported loss; ef_window's loss check drops the factor and "
          "turns compression off, and a resumed run is bit-identical",
          "[pipeline][checkpoint]") {
  // Blocks of 2 losses: 2.0 (steps 0-1), 1.0 (2-3), then 2.0 from step 4 on (rank 1 reports
  // none). A rise at step 5, from 64 (or the 256 the first window may climb to) down to the
  // lowest rung 4; each later block judged rises again, at whatever rung the windows have
  // climbed back to under a lower ceiling each time, until a rise at 4 turns compression off.
  gc::pipeline_options opt;
  opt.codec = "topk:ratio=0.01";
  opt.controller = "ef_window:min=4,max=256,window=4,max_delay=1e6,start=64,loss_block=2";
  opt.measured_timing = false;
  opt.buckets.min_compress_elements = 1000;
  int const world = 3;
  std::uint64_t const steps = 40;
  std::vector<std::size_t> const sizes = model_sizes();
  auto info = [](int rank, std::uint64_t s) {
    gc::pipeline_step_info i{.backprop_s = 0.01, .batch_size = 8, .learning_rate = 0.1};
    if (rank != 1) i.loss = s < 2 ? 2.0 : s < 4 ? 1.0 : 2.0;
    return i;
  };
  std::vector<double> factors(steps);
  std::vector<gc::send_kind> kinds(steps);
  for (std::uint64_t cut : {0u, 7u, 13u, 30u}) {
    INFO("resumed at step " << cut);
    REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline straight(opt), first(opt);
      std::vector<std::vector<std::vector<float>>> a, b;
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        gc::pipeline_stats const st = straight.step(comm, views(g), info(comm.rank(), s));
        if (comm.rank() == 0 && cut == 0) {
          factors[s] = st.factor;
          kinds[s] = st.sent;
        }
        a.push_back(g);
      }
      if (cut == 0) return;
      for (std::uint64_t s = 0; s < cut; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        first.step(comm, views(g), info(comm.rank(), s));
        b.push_back(g);
      }
      gc::gradient_pipeline resumed(opt);
      resumed.load(first.save());
      for (std::uint64_t s = cut; s < steps; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        resumed.step(comm, views(g), info(comm.rank(), s));
        b.push_back(g);
      }
      for (std::uint64_t s = 0; s < steps; ++s) {
        for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(same_bits(a[s][t], b[s][t]));
      }
      RANK_REQUIRE(straight.save() == resumed.save());
    }));
    if (cut != 0) continue;
    CHECK(factors[5] >= 64.0);  // the step that completes the rising block
    CHECK(factors[6] == 4.0);
    auto const off = std::find(kinds.begin(), kinds.end(), gc::send_kind::dense);
    REQUIRE(off != kinds.end());
    CHECK(off - kinds.begin() < 30);
    for (auto k = off; k != kinds.end(); ++k) CHECK(*k == gc::send_kind::dense);
    CHECK(factors.back() == 1.0);
  }
}

TEST_CASE("pipeline: a malformed or mismatched checkpoint is a format_error and changes nothing", "[pipeline][checkpoint]") {
  gc::pipeline_options opt;
  opt.codec = "topk:ratio=0.01";
  opt.controller = "gravac:theta_min=4,theta_max=64,window=2";
  opt.buckets.min_compress_elements = 1000;
  std::vector<std::byte> saved;
  std::vector<std::byte> other;
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(opt);
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto g = make_grads<float>(comm.rank(), s, model_sizes());
      p.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8});
    }
    if (comm.rank() == 0) saved = p.save();
    gc::pipeline_options o2 = opt;
    o2.controller = "gravac:theta_min=8,theta_max=64,window=2";
    gc::gradient_pipeline q(o2);
    auto g = make_grads<float>(comm.rank(), 0, model_sizes());
    q.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8});
    if (comm.rank() == 0) other = q.save();
  }));
  gc::gradient_pipeline p(opt);
  p.load(saved);
  std::vector<std::byte> const before = p.save();
  // every truncation, and a flipped byte in every position of the frame and the strings
  for (std::size_t cut = 0; cut < saved.size(); cut += std::max<std::size_t>(1, saved.size() / 97)) {
    CHECK_THROWS_AS(p.load(std::span<std::byte const>(saved).first(cut)), gc::format_error);
  }
  for (std::size_t at : {std::size_t{0}, std::size_t{4}, std::size_t{5}, std::size_t{8}, std::size_t{20}, std::size_t{30}}) {
    std::vector<std::byte> bad = saved;
    bad[at] ^= std::byte{0x5a};
    CHECK_THROWS_AS(p.load(bad), gc::format_error);
  }
  std::vector<std::byte> longer = saved;
  longer.push_back(std::byte{0});
  CHECK_THROWS_AS(p.load(longer), gc::format_error);
  // a checkpoint of another controller configuration
  gc::pipeline_options o2 = opt;
  o2.controller = "gravac:theta_min=8,theta_max=64,window=2";
  CHECK_THROWS_AS(p.load(other), gc::format_error);
  gc::pipeline_options o3 = opt;
  o3.feedback = "ef21";
  gc::gradient_pipeline q(o3);
  CHECK_THROWS_AS(q.load(saved), gc::format_error);
  CHECK(p.save() == before);
}

TEST_CASE("pipeline: bucket by bucket (submit / finish) equals the whole step", "[pipeline][overlap]") {
  gc::pipeline_options opt;
  opt.codec = "topk:ratio=0.02";
  opt.controller = "gravac:theta_min=4,theta_max=64,epsilon=0.3,window=2";
  opt.buckets.min_compress_elements = 1000;
  opt.measured_timing = false;
  std::vector<std::size_t> const sizes = model_sizes();
  REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline whole(opt), parts(opt);
    for (std::uint64_t s = 0; s < 6; ++s) {
      auto a = make_grads<float>(comm.rank(), s, sizes);
      auto b = a;
      whole.step(comm, views(a), {.backprop_s = 0.01, .batch_size = 8});
      auto vb = views(b);
      parts.begin(comm, {.backprop_s = 0.01, .batch_size = 8});
      // the backward pass produces the last layer first
      for (std::size_t t = vb.size(); t-- > 0;) parts.submit(std::span<gc::tensor_view<float> const>(&vb[t], 1));
      parts.finish(comm);
      for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(same_bits(a[t], b[t]));
      RANK_REQUIRE(whole.save() == parts.save());
    }
  }));
}

TEST_CASE("pipeline: a NaN on one rank fails the step on every rank and leaves the state unchanged",
          "[pipeline][errors]") {
  gc::pipeline_options opt;
  opt.codec = "topk:ratio=0.01";
  opt.controller = "gravac:theta_min=4,theta_max=64,window=2";
  opt.buckets.min_compress_elements = 1000;
  std::vector<std::size_t> const sizes = model_sizes();
  std::mutex mu;
  std::vector<std::string> errors(3);
  REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(opt);
    for (std::uint64_t s = 0; s < 2; ++s) {
      auto g = make_grads<float>(comm.rank(), s, sizes);
      p.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8});
    }
    std::vector<std::byte> const before = p.save();
    auto g = make_grads<float>(comm.rank(), 2, sizes);
    if (comm.rank() == 1) g[2][17] = std::numeric_limits<float>::quiet_NaN();
    try {
      p.step(comm, views(g), {.backprop_s = 0.01, .batch_size = 8});
      RANK_REQUIRE(false);
    } catch (gc::numeric_error const& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] = "numeric";
    } catch (gc::comm_error const& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] = "comm";
    }
    RANK_REQUIRE(p.save() == before);
    RANK_REQUIRE(p.step_count() == 2);
    // the next step works
    auto h = make_grads<float>(comm.rank(), 2, sizes);
    p.step(comm, views(h), {.backprop_s = 0.01, .batch_size = 8});
    RANK_REQUIRE(p.step_count() == 3);
  }));
  // the divergence guard (on by default) sees the NaN in its round: the same error everywhere
  CHECK(errors == std::vector<std::string>{"numeric", "numeric", "numeric"});
}

TEST_CASE("pipeline: mismatched layouts and bad options are clear errors", "[pipeline][errors]") {
  auto options = [](std::string codec, std::string feedback, std::string controller) {
    gc::pipeline_options o;
    o.codec = std::move(codec);
    o.feedback = std::move(feedback);
    o.controller = std::move(controller);
    return o;
  };
  CHECK_THROWS_AS(gc::gradient_pipeline(options("qsgd", "residual", "static:factor=10")), gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(options("topk:ratio=0.01", "bogus", "")), gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(options("powersgd:rank=2", "ef21", "")), gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(options("topk:ratio=0.01", "residual", "nope")), gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(options("topk:ratio=0.01", "dgc:momentum=2", "")), gc::config_error);
  std::mutex mu;
  int config_errors = 0;
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("topk:ratio=0.01", "residual", ""));
    std::vector<std::size_t> sizes = model_sizes();
    if (comm.rank() == 1) sizes[0] += 1;
    auto g = make_grads<float>(comm.rank(), 0, sizes);
    try {
      p.step(comm, views(g));
    } catch (gc::config_error const&) {
      std::lock_guard<std::mutex> lock(mu);
      ++config_errors;
    }
    RANK_REQUIRE(p.step_count() == 0);
  }));
  CHECK(config_errors == 2);
  // a tensor id given twice on one rank: that rank's config_error, comm_error on the others
  std::vector<std::string> kinds(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(options("topk:ratio=0.01", "residual", ""));
    auto g = make_grads<float>(comm.rank(), 0, model_sizes());
    auto v = views(g);
    if (comm.rank() == 0) v[1] = gc::tensor_view<float>(std::span<float>(g[1]), gc::tensor_id{0});
    try {
      p.step(comm, v);
    } catch (gc::config_error const&) {
      std::lock_guard<std::mutex> lock(mu);
      kinds[static_cast<std::size_t>(comm.rank())] = "config";
    } catch (gc::comm_error const&) {
      std::lock_guard<std::mutex> lock(mu);
      kinds[static_cast<std::size_t>(comm.rank())] = "comm";
    }
  }));
  CHECK(kinds == std::vector<std::string>{"config", "comm"});
}

TEST_CASE("pipeline: statistics per step and the logging hook", "[pipeline][stats]") {
  gc::pipeline_options opt;
  opt.codec = "topk:ratio=0.01";
  opt.buckets.min_compress_elements = 1000;
  opt.measure_gain = true;
  std::vector<std::size_t> const sizes = model_sizes();
  std::mutex mu;
  std::vector<gc::pipeline_stats> logged;
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline p(opt);
    std::vector<gc::pipeline_stats> mine;
    p.on_step([&](gc::pipeline_stats const& s) { mine.push_back(s); });
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto g = make_grads<float>(comm.rank(), s, sizes);
      gc::pipeline_stats const st = p.step(comm, views(g));
      RANK_REQUIRE(mine.size() == s + 1 && mine.back().step == st.step && mine.back().bytes_sent == st.bytes_sent);
      RANK_REQUIRE(p.last_stats().step == s);
      RANK_REQUIRE(st.tensors == 3 && st.compressed_tensors == 2);
      // gain = ||C(g_ef)||^2 / ||g_ef||^2 of top-k 1 %: within (0, 1)
      RANK_REQUIRE(st.gain > 0.0 && st.gain < 1.0);
      // payload: the two top-k packets plus the small tensor as float32
      RANK_REQUIRE(st.bytes_sent > 700 * 4 && st.bytes_sent < 700 * 4 + 2 * (gc::header_bytes + 8 * 300));
      RANK_REQUIRE(st.wire_bytes > 0 && st.compress_s >= 0.0 && st.communicate_s >= 0.0 && st.decode_s >= 0.0);
      RANK_REQUIRE(st.total_s >= st.compress_s);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) logged = mine;
  }));
  CHECK(logged.size() == 3);
}

TEST_CASE("pipeline: PowerSGD and two-way agree with their collectives run by hand", "[pipeline][low_rank][two_way]") {
  // The reference: the library's per-tensor collectives with state of their own (one
  // powersgd_session per tensor with the same shape and seed; one two_way_compressor), small
  // tensors through all_reduce_dense, averaged. Bit for bit, every step.
  std::vector<std::size_t> const sizes = model_sizes();
  auto square = [](std::size_t n) {
    std::size_t c = 1;
    for (std::size_t d = 1; d * d <= n; ++d) {
      if (n % d == 0) c = d;
    }
    return std::pair<std::size_t, std::size_t>{n / c, c};
  };
  for (bool two_way : {false, true}) {
    INFO((two_way ? "two-way top-k" : "PowerSGD rank 2"));
    gc::pipeline_options opt;
    opt.codec = two_way ? "topk:ratio=0.05" : "powersgd:rank=2";
    opt.two_way = two_way;
    opt.seed = 9;
    opt.buckets.min_compress_elements = 1000;
    REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline pipe(opt);
      std::map<gc::tensor_id, gc::powersgd_session> sessions;
      gc::two_way_compressor<gc::any_codec> tw(gc::make_codec("topk:ratio=0.05"));
      gc::collective_options const avg{gc::reduction::average};
      for (std::uint64_t s = 0; s < 4; ++s) {
        auto g = make_grads<float>(comm.rank(), s, sizes);
        auto const in = g;
        pipe.step(comm, views(g));
        gc::codec_context ctx;
        ctx.step = static_cast<std::uint32_t>(s);
        ctx.seed = two_way ? 9 + static_cast<std::uint64_t>(comm.rank()) : 9;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          auto const id = static_cast<gc::tensor_id>(t);
          std::vector<float> out(sizes[t]);
          gc::tensor_view<float const> const gv{std::span<float const>(in[t]), id};
          if (sizes[t] < 1000) {
            gc::all_reduce_dense(comm, std::span<float const>(in[t]), std::span<float>(out), gc::dense_format::f32, avg);
          } else if (two_way) {
            gc::all_reduce_two_way(comm, tw, gv, std::span<float>(out), ctx, avg);
          } else {
            auto it = sessions.find(id);
            if (it == sessions.end()) {
              auto const [rows, cols] = square(sizes[t]);
              it = sessions.emplace(id, gc::powersgd_session(rows, cols, gc::make_powersgd("powersgd:rank=2").options(), id)).first;
            }
            gc::all_reduce_low_rank(comm, it->second, gv, std::span<float>(out), ctx, avg);
          }
          RANK_REQUIRE(same_bits(g[t], out));
        }
      }
    }));
  }
}
