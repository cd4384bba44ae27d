// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The flat exchange mode (pipeline/flat_mode.hpp) on its own, over in-process ranks: staged,
// prepared, exchanged and committed through a feedback compressor, its outputs and residuals
// are bit for bit those of the plain reference (pipeline_support.hpp) — at the codec as given,
// at a further level of a multi-level plan, and on a dense step that sends g + residual or g
// with the residual kept; a discarded step leaves the residuals as they were.
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/flat_mode.hpp>
#include <gradcomp/pipeline/options.hpp>

#include "../support/rank_check.hpp"
#include "pipeline_support.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

// What one step of the flat mode sends: the packets of level `k` of the plan `factors` (none:
// the codec as given), or, with `dense`, every tensor dense under `rule`.
struct flat_step {
  std::optional<std::vector<double>> factors;
  std::size_t k = 0;
  bool dense = false;
  gc::residual_rule rule = gc::residual_rule::subtract_sent;
};

// Runs `steps` on rank `comm` with a fresh mode and compressor of `opt`; returns the outputs
// of every step and the residuals at the end.
struct flat_run {
  std::vector<std::vector<std::vector<float>>> outputs;  // per step, per tensor
  std::vector<std::vector<float>> residuals;             // per tensor
};

flat_run run_flat(gc::in_process_communicator& comm, gc::pipeline_options const& opt,
                  std::vector<flat_step> const& steps, std::vector<std::size_t> const& sizes) {
  int const r = comm.rank();
  gc::any_codec const base = gc::make_codec(opt.codec);
  gc::flat_mode mode(base, opt.buckets);
  gc::feedback_compressor comp = gc::make_feedback(opt.feedback, base);
  gc::detail::bucket_slot slots[2];
  flat_run run;
  for (std::uint64_t s = 0; s < steps.size(); ++s) {
    flat_step const& fs = steps[s];
    gc::codec_context ctx = opt.context;
    ctx.step = static_cast<std::uint32_t>(s);
    bool const shared = base.aggregation() == gc::aggregation_kind::shared_support;  // random-k
    ctx.seed = opt.seed + (shared ? 0u : static_cast<std::uint64_t>(r));
    std::optional<std::span<double const>> factors;
    if (fs.factors) factors = std::span<double const>(*fs.factors);
    mode.begin_step(factors);
    std::vector<std::vector<float>> g = pipeline_test::make_grads<float>(r, s, sizes);
    std::vector<gc::bucket_item> items;
    std::vector<double> comp_norms(mode.levels(), 0.0);
    double ef_norm = 0.0;
    for (std::size_t t = 0; t < g.size(); ++t) {
      auto const id = static_cast<gc::tensor_id>(t);
      items.push_back(
          {gc::tensor_view<float const>(std::span<float const>(g[t]), id), std::span<float>(g[t])});
      if (g[t].size() < opt.buckets.min_compress_elements) continue;
      mode.stage(comp, gc::tensor_view<float const>(std::span<float const>(g[t]), id),
                 fs.factors ? std::span<double const>(*fs.factors) : std::span<double const>{}, ctx,
                 true, ef_norm, std::span<double>(comp_norms));
      RANK_REQUIRE(mode.staged(id));
    }
    RANK_REQUIRE(ef_norm > 0.0);
    std::span<gc::bucket_item const> const view(items);
    std::vector<gc::detail::bucket_plan> const plan = gc::detail::plan_buckets(view, opt.buckets);
    gc::detail::step_check check(false);
    gc::bucket_result br;
    double decode = 0.0;
    std::size_t const k = fs.dense ? gc::decision::npos : fs.k;
    if (fs.dense) {
      mode.exchange_dense(comm, comp, view, fs.rule, comm.size(), ctx, check, slots, br, decode);
    } else {
      mode.prepare(comp, view, k, ctx);
      mode.exchange_level(comm, plan, k, view, comm.size(), ctx, check, slots, br, decode);
    }
    RANK_REQUIRE(br.buckets > 0);
    mode.commit(comp, view, k, fs.rule, false);
    mode.receive(comp, view);
    run.outputs.push_back(g);
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::span<float const> const v =
        std::visit([&](auto& c) { return c.state(static_cast<gc::tensor_id>(t)).values(); }, comp);
    run.residuals.emplace_back(v.begin(), v.end());
  }
  return run;
}

// The reference's outputs of the same steps (its decision: the level's factor, or dense).
std::vector<std::vector<std::vector<float>>> reference_outputs(
    pipeline_test::reference& ref, std::vector<flat_step> const& steps,
    std::vector<std::size_t> const& sizes) {
  std::vector<std::vector<std::vector<float>>> out;
  for (std::uint64_t s = 0; s < steps.size(); ++s) {
    gc::pipeline_stats st;
    if (steps[s].dense) st.sent = gc::send_kind::dense;
    if (steps[s].factors && !steps[s].dense) st.factor = (*steps[s].factors)[steps[s].k];
    out.push_back(ref.step<float>(s, st, sizes));
  }
  return out;
}

void check_against_reference(gc::pipeline_options const& opt, std::vector<flat_step> const& steps,
                             int world) {
  std::vector<std::size_t> const sizes = pipeline_test::model_sizes();
  pipeline_test::reference ref(opt, world);
  auto const want = reference_outputs(ref, steps, sizes);
  std::vector<std::vector<std::vector<float>>> want_residuals(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::span<float const> const v = ref.state(r, static_cast<gc::tensor_id>(t));
      want_residuals[static_cast<std::size_t>(r)].emplace_back(v.begin(), v.end());
    }
  }
  REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    flat_run const got = run_flat(comm, opt, steps, sizes);
    for (std::size_t s = 0; s < steps.size(); ++s) {
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        RANK_REQUIRE(pipeline_test::same_bits(got.outputs[s][t], want[s][t]));
      }
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      RANK_REQUIRE(pipeline_test::same_bits(
          got.residuals[t], want_residuals[static_cast<std::size_t>(comm.rank())][t]));
    }
  }));
}

gc::pipeline_options flat_options(std::string codec, std::string feedback) {
  gc::pipeline_options o;
  o.codec = std::move(codec);
  o.feedback = std::move(feedback);
  o.buckets.bucket_bytes = 16 << 10;  // several buckets per step
  return o;
}

}  // namespace

TEST_CASE("flat_mode exchanges the codec as given as the plain reference does, bit for bit",
          "[pipeline][flat]") {
  std::vector<flat_step> const steps(3);
  for (auto const& [codec, feedback] :
       {std::pair{"topk:ratio=0.02", "residual"}, std::pair{"int8", "ef21"},
        std::pair{"qsgd:levels=7", "none"}, std::pair{"randomk:ratio=0.05", "residual"}}) {
    CAPTURE(codec, feedback);
    check_against_reference(flat_options(codec, feedback), steps, 3);
  }
}

TEST_CASE(
    "flat_mode sends a further level of a multi-level plan as the reference compresses at its "
    "factor",
    "[pipeline][flat]") {
  // Level 1 is re-compressed from level 0's packet (`recompress_sparse`); the reference
  // compresses g + residual at level 1's factor directly: the same packet for top-k.
  gc::pipeline_options opt = flat_options("topk:ratio=0.01", "residual");
  opt.controller = "static:factor=100";  // (the reference reads the factor from the decision)
  std::vector<flat_step> steps;
  for (std::size_t k : {0, 1, 1, 0})
    steps.push_back({std::vector<double>{8.0, 40.0}, k, false, {}});
  check_against_reference(opt, steps, 2);
}

TEST_CASE("flat_mode's dense step sends g + residual exactly, or g with the residual kept",
          "[pipeline][flat]") {
  gc::pipeline_options opt = flat_options("topk:ratio=0.02", "residual");
  // compressed, then g + residual dense (the residual sent in full: zero after), compressed.
  check_against_reference(opt, {{}, {std::nullopt, 0, true, gc::residual_rule::zero}, {}}, 3);
  // g dense with the residual kept (the reference's "dense=keep" decision), between steps at
  // a controller's factor (the reference reads it from the decision).
  opt.controller = "gravac:dense=keep";
  flat_step const at50{std::vector<double>{50.0}, 0, false, {}};
  check_against_reference(
      opt, {at50, {std::vector<double>{}, 0, true, gc::residual_rule::keep}, at50}, 2);
}

TEST_CASE("flat_mode: a discarded step leaves every residual as it was", "[pipeline][flat]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [](gc::in_process_communicator& comm) {
    gc::pipeline_options const opt = flat_options("topk:ratio=0.05", "residual");
    std::vector<std::size_t> const sizes = pipeline_test::model_sizes();
    gc::any_codec const base = gc::make_codec(opt.codec);
    gc::flat_mode mode(base, opt.buckets);
    gc::feedback_compressor comp = gc::make_feedback(opt.feedback, base);
    gc::detail::bucket_slot slots[2];
    auto step = [&](std::uint64_t s, bool send) {
      gc::codec_context ctx;
      ctx.step = static_cast<std::uint32_t>(s);
      mode.begin_step(std::nullopt);
      std::vector<std::vector<float>> g = pipeline_test::make_grads<float>(comm.rank(), s, sizes);
      std::vector<gc::bucket_item> items;
      double ef = 0.0;
      std::vector<double> norms(1, 0.0);
      for (std::size_t t = 0; t < g.size(); ++t) {
        auto const id = static_cast<gc::tensor_id>(t);
        items.push_back({gc::tensor_view<float const>(std::span<float const>(g[t]), id),
                         std::span<float>(g[t])});
        if (g[t].size() >= opt.buckets.min_compress_elements) {
          mode.stage(comp, gc::tensor_view<float const>(std::span<float const>(g[t]), id), {}, ctx,
                     false, ef, std::span<double>(norms));
        }
      }
      std::span<gc::bucket_item const> const view(items);
      if (!send) {
        mode.prepare(comp, view, 0, ctx);  // prepared, then the step fails
        mode.discard(comp);
        RANK_REQUIRE(!mode.staged(gc::tensor_id{0}));
        return;
      }
      gc::detail::step_check check(false);
      gc::bucket_result br;
      double decode = 0.0;
      mode.prepare(comp, view, 0, ctx);
      mode.exchange_level(comm, gc::detail::plan_buckets(view, opt.buckets), 0, view, comm.size(),
                          ctx, check, slots, br, decode);
      mode.commit(comp, view, 0, gc::residual_rule::subtract_sent, false);
    };
    auto saved = [&] { return std::visit([](auto const& c) { return c.save(); }, comp); };
    step(0, true);
    std::vector<std::byte> const before = saved();
    step(1, false);
    RANK_REQUIRE(saved() == before);
    step(1, true);
    RANK_REQUIRE(saved() != before);
  }));
}
