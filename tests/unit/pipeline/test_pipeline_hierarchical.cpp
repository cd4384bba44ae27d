// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradient_pipeline with `pipeline_options::hierarchical`: each large tensor goes through the
// hierarchical all-reduce with the pipeline's error feedback, bit for bit, step after step;
// what the option refuses; a failed step leaves the pipeline's state as it was on every rank.

#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"
#include "../support/rank_check.hpp"
#include "../support/split_worlds.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace gc = gradcomp;
using gradcomp_test::heavy_tailed;

namespace {

std::vector<float> grad_of(std::size_t n, int rank, std::uint64_t step, std::size_t tensor) {
  return heavy_tailed(n,
                      7919u * static_cast<std::uint64_t>(rank + 1) + 104729u * step + 31u * tensor);
}

gc::pipeline_options hierarchical_pipeline(std::string codec, std::string feedback) {
  gc::pipeline_options opt;
  opt.codec = std::move(codec);
  opt.feedback = std::move(feedback);
  opt.seed = 5;
  opt.measured_timing = false;
  opt.buckets.min_compress_elements = 100;
  opt.hierarchical.nodes = gc::node_grouping::uniform(2);
  return opt;
}

}  // namespace

TEST_CASE(
    "pipeline with the hierarchical option: each large tensor through all_reduce_hierarchical, bit "
    "for bit",
    "[pipeline][hierarchical]") {
  std::vector<std::size_t> const sizes = {333, 40, 1000};  // the 40-element tensor goes dense
  for (std::string const spec : {"topk:ratio=0.05", "onebit", "fp16"}) {
    CAPTURE(spec);
    REQUIRE_NOTHROW(gc::run_in_process(6, [&](gc::in_process_communicator& comm) {
      gc::pipeline_options const opt = hierarchical_pipeline(spec, "residual");
      gc::gradient_pipeline pipe(opt);
      gc::compressor<gc::any_codec, gc::residual_feedback> ref(gc::make_codec(spec));
      gc::hierarchical_options hopt;
      hopt.nodes = opt.hierarchical.nodes;
      hopt.op = gc::reduction::average;
      for (std::uint64_t step = 0; step < 4; ++step) {
        std::vector<std::vector<float>> g, want;
        std::vector<gc::tensor_view<float>> views;
        for (std::size_t t = 0; t < sizes.size(); ++t)
          g.push_back(grad_of(sizes[t], comm.rank(), step, t));
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          want.emplace_back(sizes[t]);
          gc::codec_context ctx;
          ctx.seed = opt.seed + static_cast<std::uint64_t>(comm.rank());
          ctx.step = static_cast<std::uint32_t>(step);
          auto const id = static_cast<gc::tensor_id>(t);
          if (sizes[t] >= opt.buckets.min_compress_elements) {
            gc::all_reduce_hierarchical(
                comm, ref, gc::tensor_view<float const>(std::span<float const>(g[t]), id),
                std::span<float>(want[t]), ctx, hopt);
          } else {
            gc::all_reduce_dense(comm, std::span<float const>(g[t]), std::span<float>(want[t]),
                                 gc::dense_format::f32, {gc::reduction::average});
          }
          views.emplace_back(std::span<float>(g[t]), id);
        }
        gc::pipeline_stats const st = pipe.step(comm, views);
        RANK_REQUIRE(st.compressed_tensors == 2);
        for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(g[t] == want[t]);
      }
    }));
  }
}

TEST_CASE("pipeline with the hierarchical option refuses what it cannot do",
          "[pipeline][hierarchical]") {
  gc::pipeline_options opt = hierarchical_pipeline("topk:ratio=0.01", "ef21");
  CHECK_THROWS_WITH(gc::gradient_pipeline(opt), Catch::Contains("'residual' or 'none'"));
  opt.feedback = "residual";
  opt.two_way = true;
  CHECK_THROWS_WITH(gc::gradient_pipeline(opt), Catch::Contains("no two-way"));
  opt.two_way = false;
  opt.controller = "static:factor=100";
  CHECK_THROWS_WITH(gc::gradient_pipeline(opt), Catch::Contains("no controller"));
  // A grouping that does not fit the communicator fails the step on every rank.
  opt.controller.clear();
  opt.hierarchical.nodes = gc::node_grouping::uniform(4);
  std::vector<std::exception_ptr> errors(6);
  REQUIRE_NOTHROW(gc::run_in_process(6, [&](gc::in_process_communicator& comm) {
    gc::gradient_pipeline pipe(opt);
    std::vector<float> g = grad_of(500, comm.rank(), 0, 0);
    std::vector<gc::tensor_view<float>> views{
        gc::tensor_view<float>(std::span<float>(g), gc::tensor_id{0})};
    try {
      pipe.step(comm, views);
    } catch (...) {
      errors[static_cast<std::size_t>(comm.rank())] = std::current_exception();
    }
  }));
  for (auto const& e : errors) {
    REQUIRE(e != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(e), Catch::Contains("does not divide"));
  }
}

TEST_CASE(
    "pipeline with the hierarchical option: a failed step leaves every rank's state as it was",
    "[pipeline][hierarchical]") {
  std::vector<std::vector<std::byte>> before(4), after(4);
  std::vector<std::exception_ptr> errors(4);
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    gc::pipeline_options opt = hierarchical_pipeline("onebit", "residual");
    opt.guard = "off";  // the codec meets the NaN, not the guard
    gc::gradient_pipeline pipe(opt);
    std::vector<float> g = grad_of(500, comm.rank(), 0, 0);
    std::vector<gc::tensor_view<float>> views{
        gc::tensor_view<float>(std::span<float>(g), gc::tensor_id{0})};
    pipe.step(comm, views);
    before[static_cast<std::size_t>(comm.rank())] = pipe.save();
    auto refill = [&](std::uint64_t step) {  // in place: the views keep pointing at g
      std::vector<float> const fresh = grad_of(500, comm.rank(), step, 0);
      std::copy(fresh.begin(), fresh.end(), g.begin());
    };
    refill(1);
    if (comm.rank() == 1) g[7] = std::numeric_limits<float>::quiet_NaN();  // shard 0 of node 0
    try {
      pipe.step(comm, views);
    } catch (...) {
      errors[static_cast<std::size_t>(comm.rank())] = std::current_exception();
    }
    after[static_cast<std::size_t>(comm.rank())] = pipe.save();
    // The retry with a finite gradient succeeds.
    refill(1);
    pipe.step(comm, views);
  }));
  for (auto const& e : errors) REQUIRE(e != nullptr);
  CHECK_THROWS_AS(std::rethrow_exception(errors[0]),
                  gc::numeric_error);  // rank 0 compresses node 0's shard 0
  for (int r = 1; r < 4; ++r) {
    CHECK_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), gc::comm_error);
  }
  for (int r = 0; r < 4; ++r)
    CHECK(after[static_cast<std::size_t>(r)] == before[static_cast<std::size_t>(r)]);
}

TEST_CASE(
    "pipeline with the hierarchical option over its own node and lane communicators: the same "
    "bits and checkpoints as over point-to-point groups",
    "[pipeline][hierarchical]") {
  std::vector<std::size_t> const sizes = {333, 40, 1000};
  int const w = 6;  // 3 nodes of 2
  for (std::string const spec : {"topk:ratio=0.05", "int8"}) {
    for (int lanes : {0, 1}) {
      CAPTURE(spec, lanes);
      gc::pipeline_options opt = hierarchical_pipeline(spec, "residual");
      opt.hierarchical.lanes = lanes;
      gradcomp_test::split_worlds const sub(opt.hierarchical.nodes, w, lanes);
      std::vector<std::vector<std::vector<float>>> out(2, std::vector<std::vector<float>>(w));
      std::vector<std::vector<std::vector<std::byte>>> saved(2, std::vector<std::vector<std::byte>>(w));
      for (int own : {0, 1}) {
        REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
          int const r = comm.rank();
          gc::gradient_pipeline pipe(opt);
          if (own) {
            std::optional<gc::any_communicator> lane;
            if (auto l = sub.lane(r)) lane.emplace(*l);
            pipe.set_hierarchical_groups(sub.node(r), std::move(lane));
          }
          std::vector<float> flat;
          for (std::uint64_t step = 0; step < 3; ++step) {
            std::vector<std::vector<float>> g;
            std::vector<gc::tensor_view<float>> views;
            for (std::size_t t = 0; t < sizes.size(); ++t) g.push_back(grad_of(sizes[t], r, step, t));
            for (std::size_t t = 0; t < sizes.size(); ++t)
              views.emplace_back(std::span<float>(g[t]), static_cast<gc::tensor_id>(t));
            pipe.step(comm, views);
            for (auto const& x : g) flat.insert(flat.end(), x.begin(), x.end());
          }
          out[static_cast<std::size_t>(own)][static_cast<std::size_t>(r)] = flat;
          saved[static_cast<std::size_t>(own)][static_cast<std::size_t>(r)] = pipe.save();
        }));
      }
      CHECK(out[1] == out[0]);
      CHECK(saved[1] == saved[0]);  // the owners' residuals, keyed by shard
    }
  }
  // Without the hierarchical option, or communicators that do not fit the grouping: refused.
  gc::pipeline_options plain = hierarchical_pipeline("int8", "residual");
  plain.hierarchical.nodes = {};
  gc::in_process_world const one(1);
  gc::gradient_pipeline no_hier(plain);
  CHECK_THROWS_AS(no_hier.set_hierarchical_groups(one.communicator(0)), gc::config_error);
  std::vector<std::exception_ptr> errors(4);
  gc::in_process_world const three(3), node0(2), node1(2), lane0(2), lane1(2);
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    int const r = comm.rank();  // 2 nodes of 2: {0, 1} {2, 3}; lane j holds the nodes' j-th ranks
    gc::gradient_pipeline pipe(hierarchical_pipeline("int8", "residual"));
    if (r == 2) {  // a node communicator of 3 ranks for a node of 2
      pipe.set_hierarchical_groups(three.communicator(0), lane0.communicator(1));
    } else {
      pipe.set_hierarchical_groups((r < 2 ? node0 : node1).communicator(r % 2),
                                   (r % 2 == 0 ? lane0 : lane1).communicator(r / 2));
    }
    std::vector<float> g = grad_of(500, r, 0, 0);
    std::vector<gc::tensor_view<float>> views{gc::tensor_view<float>(std::span<float>(g), gc::tensor_id{0})};
    try {
      pipe.step(comm, views);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
    }
  }));
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    REQUIRE(errors[r] != nullptr);
    if (r == 2)
      CHECK_THROWS_WITH(std::rethrow_exception(errors[r]), Catch::Contains("node communicator has rank 0 of 3"));
    else
      CHECK_THROWS_AS(std::rethrow_exception(errors[r]), gc::comm_error);
  }
}
