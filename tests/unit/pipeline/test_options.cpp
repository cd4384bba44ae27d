// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The table of which exchange modes combine (pipeline/options.hpp) and the spec parsers it
// reads (codec/codec_spec.hpp): every mode, every pair of modes, the feedback each takes, and
// the same verdicts through gradient_pipeline's constructor; the refusals of a device source.
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <tuple>
#include <variant>

namespace gc = gradcomp;

namespace {

// The options selecting `m` (flat: none), over a sparsifier (or PowerSGD for low_rank).
void select(gc::pipeline_options& o, gc::pipeline_mode m) {
  switch (m) {
    case gc::pipeline_mode::flat: break;
    case gc::pipeline_mode::controlled: o.controller = "static:factor=100"; break;
    case gc::pipeline_mode::two_way: o.two_way = true; break;
    case gc::pipeline_mode::hierarchical: o.hierarchical.nodes = gc::node_grouping::uniform(2); break;
    case gc::pipeline_mode::low_rank: o.codec = "powersgd:rank=2"; break;
  }
}

gc::pipeline_mode mode_of(gc::pipeline_options const& o) {
  return gc::check_pipeline_options(o, gc::make_codec_spec(o.codec));
}

constexpr gc::pipeline_mode all_modes[] = {gc::pipeline_mode::flat, gc::pipeline_mode::controlled,
                                           gc::pipeline_mode::two_way, gc::pipeline_mode::hierarchical,
                                           gc::pipeline_mode::low_rank};

}  // namespace

TEST_CASE("make_codec_spec tells a stateless codec from PowerSGD", "[pipeline][options]") {
  gc::codec_spec const topk = gc::make_codec_spec("topk:ratio=0.05");
  REQUIRE(std::holds_alternative<gc::any_codec>(topk));
  CHECK_FALSE(gc::names_low_rank(topk));
  CHECK(std::get<gc::any_codec>(topk).name() == gc::make_codec("topk:ratio=0.05").name());
  gc::codec_spec const psgd = gc::make_codec_spec("powersgd:rank=3");
  REQUIRE(gc::names_low_rank(psgd));
  CHECK(std::get<gc::powersgd_options>(psgd).rank == gc::make_powersgd("powersgd:rank=3").options().rank);
  CHECK(gc::names_low_rank(gc::make_codec_spec("powersgd")));
  // The parsers' own errors come through.
  CHECK_THROWS_WITH(gc::make_codec_spec("nope"), Catch::Contains("unknown codec 'nope'"));
  CHECK_THROWS_AS(gc::make_codec_spec("powersgd:rank=0"), gc::config_error);
  CHECK_THROWS_AS(gc::make_codec_spec("powersgd:bogus=1"), gc::config_error);
}

TEST_CASE("each option selects its exchange mode", "[pipeline][options]") {
  for (gc::pipeline_mode const m : all_modes) {
    CAPTURE(gc::pipeline_mode_name(m));
    gc::pipeline_options o;
    select(o, m);
    CHECK(mode_of(o) == m);
    CHECK(gc::gradient_pipeline(o).mode() == m);
  }
}

TEST_CASE("two exchange modes are refused, naming both options", "[pipeline][options]") {
  for (gc::pipeline_mode const a : all_modes) {
    for (gc::pipeline_mode const b : all_modes) {
      if (a == b || a == gc::pipeline_mode::flat || b == gc::pipeline_mode::flat) continue;
      CAPTURE(gc::pipeline_mode_name(a), gc::pipeline_mode_name(b));
      gc::pipeline_options o;
      select(o, a);
      select(o, b);
      // The verdict names the options of both modes, whichever order they come in.
      std::string const oa(gc::pipeline_mode_name(a) == "low_rank" ? "codec"
                           : gc::pipeline_mode_name(a) == "controlled" ? "controller"
                                                                       : gc::pipeline_mode_name(a));
      std::string const ob(gc::pipeline_mode_name(b) == "low_rank" ? "codec"
                           : gc::pipeline_mode_name(b) == "controlled" ? "controller"
                                                                       : gc::pipeline_mode_name(b));
      CHECK_THROWS_WITH(mode_of(o), Catch::Contains("pipeline_options::" + oa) &&
                                        Catch::Contains("pipeline_options::" + ob) &&
                                        Catch::Contains("exclude each other"));
      CHECK_THROWS_AS(gc::gradient_pipeline(o), gc::config_error);
    }
  }
  // All four at once: one error that names the three the first excludes.
  gc::pipeline_options o;
  for (gc::pipeline_mode const m : all_modes) select(o, m);
  CHECK_THROWS_WITH(mode_of(o), Catch::StartsWith("gradcomp: gradient_pipeline: PowerSGD") &&
                                    Catch::Contains("no hierarchical all-reduce") &&
                                    Catch::Contains("no two-way compression") &&
                                    Catch::Contains("no controller"));
}

TEST_CASE("each mode takes the error feedback of its row", "[pipeline][options]") {
  for (gc::pipeline_mode const m : all_modes) {
    CAPTURE(gc::pipeline_mode_name(m));
    bool const any_feedback = m == gc::pipeline_mode::flat || m == gc::pipeline_mode::controlled;
    for (char const* fb : {"none", "residual", "ef21", "dgc", "dgc:momentum=0.5,clip_norm=1"}) {
      CAPTURE(fb);
      gc::pipeline_options o;
      select(o, m);
      o.feedback = fb;
      bool const taken = any_feedback || o.feedback == "none" || o.feedback == "residual";
      if (taken) {
        CHECK(mode_of(o) == m);
        CHECK_NOTHROW(gc::gradient_pipeline(o));
      } else {
        CHECK_THROWS_WITH(mode_of(o), Catch::Contains("pipeline_options::feedback must be 'residual' or 'none'") &&
                                          Catch::Contains(std::string("got '") + fb + "'"));
        CHECK_THROWS_AS(gc::gradient_pipeline(o), gc::config_error);
      }
    }
  }
}

TEST_CASE("the options table refuses a controller without a selection size and per-bucket compression",
          "[pipeline][options]") {
  gc::pipeline_options o;
  o.codec = "qsgd:levels=7";
  o.controller = "static:factor=10";
  CHECK_THROWS_WITH(mode_of(o), Catch::Contains("pipeline_options::controller") && Catch::Contains("qsgd"));
  for (char const* sparsifier : {"topk:ratio=0.01", "approx_topk:ratio=0.01", "randomk:ratio=0.01"}) {
    o.codec = sparsifier;
    CHECK(mode_of(o) == gc::pipeline_mode::controlled);
  }
  gc::pipeline_options b;
  b.buckets.mode = gc::bucket_compression::per_bucket;
  CHECK_THROWS_WITH(mode_of(b), Catch::Contains("per_tensor"));
  // Refusals leave nothing behind: the same options object, fixed, is taken.
  b.buckets.mode = gc::bucket_compression::per_tensor;
  CHECK(mode_of(b) == gc::pipeline_mode::flat);
}

TEST_CASE(
    "the options table refuses what a device source does not take, options first, then the source",
    "[pipeline][options][device]") {
  // Whatever the source: no checksums, no 16-bit dense buckets.
  gc::pipeline_options o;
  CHECK_NOTHROW(gc::check_device_options(o));
  o.buckets.checksum = true;
  CHECK_THROWS_WITH(gc::check_device_options(o),
                    Catch::Contains("with a device source: buckets.checksum"));
  o.buckets.checksum = false;
  o.buckets.small_format = gc::dense_format::f16;
  CHECK_THROWS_WITH(gc::check_device_options(o), Catch::Contains("16-bit buckets.small_format"));

  // The source against the mode: a budget for a controller, sessions and no feedback for
  // PowerSGD, the spec's feedback (and DGC's parameters) for the others.
  auto check = [](gc::pipeline_options const& opt, gc::device_source_facts const& src) {
    gc::codec_spec const spec = gc::make_codec_spec(opt.codec);
    gc::pipeline_mode const m = gc::check_pipeline_options(opt, spec);
    gc::any_codec const codec =
        gc::names_low_rank(spec) ? gc::make_codec("identity") : std::get<gc::any_codec>(spec);
    gc::check_device_source(opt, m, gc::make_feedback(opt.feedback, codec), src);
  };
  gc::device_source_facts residual{true, false, gc::feedback_id::residual, {}};
  gc::pipeline_options flat;
  CHECK_NOTHROW(check(flat, residual));
  gc::pipeline_options ctrl;
  ctrl.controller = "static:factor=100";
  CHECK_NOTHROW(check(ctrl, residual));
  residual.has_budget = false;
  CHECK_THROWS_WITH(check(ctrl, residual),
                    Catch::Contains("has none (controller 'static:factor=100')"));
  CHECK_NOTHROW(check(flat, residual));  // the codec as given needs no budget
  gc::device_source_facts const none{true, false, gc::feedback_id::none, {}};
  CHECK_THROWS_WITH(check(flat, none),
                    Catch::Contains("error feedback (none) is not feedback 'residual'"));
  gc::pipeline_options psgd;
  psgd.codec = "powersgd:rank=2";
  CHECK_THROWS_WITH(check(psgd, residual),
                    Catch::Contains("with PowerSGD the source keeps no feedback state"));
  CHECK_THROWS_WITH(check(psgd, none), Catch::Contains("makes no PowerSGD sessions"));
  gc::device_source_facts sessions = none;
  sessions.makes_low_rank_sessions = true;
  CHECK_NOTHROW(check(psgd, sessions));
  gc::pipeline_options dgc;
  dgc.feedback = "dgc:momentum=0.9";
  gc::device_source_facts dgc_src{true, false, gc::feedback_id::dgc,
                                  std::tuple{0.9f, 0.0, std::uint32_t{1}}};
  CHECK_NOTHROW(check(dgc, dgc_src));
  dgc_src.dgc = std::tuple{0.5f, 0.0, std::uint32_t{1}};
  CHECK_THROWS_WITH(check(dgc, dgc_src), Catch::Contains("DGC parameters"));
}
