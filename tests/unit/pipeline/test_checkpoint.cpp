// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The "GCPL" checkpoint container (pipeline/checkpoint.hpp) on its own: the writer lays out the
// head and the sections as the format says (against the same fields put by hand); the reader
// hands each section back; a pipeline's own checkpoint (Accordion's layer accumulators,
// PowerSGD sessions, two-way state) read section by section and written again is the same
// bytes; another configuration, a duplicated accumulator id and trailing bytes are refused with
// a `format_error` naming them, and sections out of order are a `std::logic_error`.
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/pipeline/checkpoint.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include "../support/rank_check.hpp"
#include "pipeline_support.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

gc::checkpoint_config const checkpoint_cfg{"topk:ratio=0.01", "residual", "static:factor=10",
                                           false};

std::vector<std::byte> checkpoint_bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int const b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

// A checkpoint of `checkpoint_cfg` with the given accumulators (a duplicate id is written by
// hand: the writer takes a map).
std::vector<std::byte> checkpoint_with(
    std::vector<std::pair<std::uint64_t, std::vector<float>>> const& acc, bool trailing = false) {
  gc::detail::byte_writer w;
  w.begin("GCPL", 2);
  w.put_string(checkpoint_cfg.codec);
  w.put_string(checkpoint_cfg.feedback);
  w.put_string(checkpoint_cfg.controller);
  w.put_u64(0);
  w.put_u64(3);
  for (int i = 0; i < 3; ++i) w.put_f64(0.0);
  w.put_bytes(std::vector<std::byte>{});
  w.put_bytes(std::vector<std::byte>{});
  w.put_u64(acc.size());
  for (auto const& [id, values] : acc) {
    w.put_u64(id);
    w.put_floats(values);
  }
  w.put_u64(0);
  w.put_bytes(std::vector<std::byte>{});
  w.put_bytes(std::vector<std::byte>{});
  if (trailing) w.put_u64(7);
  return w.finish();
}

// Reads every section of `bytes` (a pipeline of `cfg`, `mode` its exchange mode) and writes it
// again through the writer.
std::vector<std::byte> reread(std::vector<std::byte> const& bytes, gc::checkpoint_config const& cfg,
                              gc::pipeline_mode mode, gc::powersgd_options const& low_rank) {
  gc::detail::checkpoint_reader r(bytes, cfg);
  gc::detail::checkpoint_writer w(cfg, r.step(), r.timing());
  w.feedback(r.feedback());
  w.controller(r.controller());
  w.accumulators(r.accumulators());
  gc::detail::byte_reader& in = r.mode_sections();
  gc::detail::byte_writer& out = w.mode_sections();
  if (mode == gc::pipeline_mode::low_rank) {
    gc::low_rank_mode(low_rank).loaded(in).save(out);
  } else {
    gc::low_rank_mode::expect_none(in);
    gc::low_rank_mode::save_none(out);
  }
  if (mode == gc::pipeline_mode::two_way) {
    out.put_bytes(in.get_bytes());
  } else {
    gc::two_way_mode::expect_none(in);
    gc::two_way_mode::save_none(out);
  }
  w.guard(r.guard());
  r.end();
  return w.finish();
}

}  // namespace

TEST_CASE(
    "checkpoint_writer lays out the head and sections of the format; the reader hands them back",
    "[pipeline][checkpoint]") {
  gc::step_timing const timing{0.5, 0.25, 0.125};
  std::map<gc::tensor_id, std::vector<float>> const acc = {{gc::tensor_id{9}, {4.0f}},
                                                           {gc::tensor_id{3}, {1.0f, -2.5f}}};
  std::vector<std::byte> const fb = checkpoint_bytes({1, 2, 3}), guard = checkpoint_bytes({9});
  gc::detail::checkpoint_writer w(checkpoint_cfg, 7, timing);
  w.feedback(fb);
  w.controller(std::vector<std::byte>{});
  w.accumulators(acc);
  gc::low_rank_mode::save_none(w.mode_sections());
  w.guard(guard);
  std::vector<std::byte> const bytes = w.finish();

  gc::detail::byte_writer want;
  want.begin("GCPL", 2);
  want.put_string("topk:ratio=0.01");
  want.put_string("residual");
  want.put_string("static:factor=10");
  want.put_u64(0);
  want.put_u64(7);
  want.put_f64(0.5);
  want.put_f64(0.25);
  want.put_f64(0.125);
  want.put_bytes(fb);
  want.put_bytes(std::vector<std::byte>{});
  want.put_u64(2);
  want.put_u64(3);  // ascending ids
  want.put_floats(std::vector<float>{1.0f, -2.5f});
  want.put_u64(9);
  want.put_floats(std::vector<float>{4.0f});
  want.put_u64(0);  // the mode's section, as the mode wrote it
  want.put_bytes(guard);
  CHECK(bytes == want.finish());
  CHECK(gc::gradient_pipeline::checkpoint_magic == std::string("GCPL"));
  CHECK(gc::gradient_pipeline::checkpoint_version == 2);

  gc::detail::checkpoint_reader r(bytes, checkpoint_cfg);
  CHECK(r.step() == 7);
  CHECK(r.timing().backprop == 0.5);
  CHECK(r.timing().compress == 0.25);
  CHECK(r.timing().sync == 0.125);
  CHECK(r.feedback() == fb);
  CHECK(r.controller().empty());
  CHECK(r.accumulators() == acc);
  CHECK(r.mode_sections().get_u64() == 0);
  CHECK(r.guard() == guard);
  CHECK_NOTHROW(r.end());
}

TEST_CASE("a pipeline's checkpoint read and written again section by section is the same bytes",
          "[pipeline][checkpoint]") {
  struct config {
    char const* codec;
    char const* controller;
    bool two_way;
  };
  for (config const c :
       {config{"topk:ratio=0.01", "accordion:low=2,high=40,interval=3,accumulation=2", false},
        config{"powersgd:rank=2", "", false}, config{"topk:ratio=0.05", "", true}}) {
    CAPTURE(c.codec, c.controller, c.two_way);
    gc::pipeline_options opt;
    opt.codec = c.codec;
    opt.controller = c.controller;
    opt.two_way = c.two_way;
    opt.measured_timing = false;
    opt.buckets.min_compress_elements = 1000;
    gc::checkpoint_config const cfg{opt.codec, opt.feedback, opt.controller, opt.two_way};
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      gc::gradient_pipeline p(opt);
      std::vector<std::size_t> const sizes = pipeline_test::model_sizes();
      for (std::uint64_t s = 0; s < 3; ++s) {
        auto g = pipeline_test::make_grads<float>(comm.rank(), s, sizes);
        p.step(comm, pipeline_test::views(g), {.backprop_s = 0.01, .batch_size = 8});
      }
      std::vector<std::byte> const saved = p.save();
      gc::detail::checkpoint_reader r(saved, cfg);
      RANK_REQUIRE(r.step() == 3);
      gc::powersgd_options low_rank;
      if (p.mode() == gc::pipeline_mode::low_rank) {
        low_rank = std::get<gc::powersgd_options>(gc::make_codec_spec(opt.codec));
        low_rank.error_feedback = true;
      }
      RANK_REQUIRE(reread(saved, cfg, p.mode(), low_rank) == saved);
      if (p.mode() == gc::pipeline_mode::controlled) {
        (void)r.feedback();
        (void)r.controller();
        RANK_REQUIRE(!r.accumulators().empty());  // Accordion's layers are in the checkpoint
      }
    }));
  }
}

TEST_CASE(
    "checkpoint_reader refuses another configuration, a duplicated accumulator id and trailing "
    "bytes",
    "[pipeline][checkpoint]") {
  std::vector<std::byte> const good = checkpoint_with({{3, {1.0f}}, {5, {2.0f}}});
  {
    gc::detail::checkpoint_reader r(good, checkpoint_cfg);
    (void)r.feedback();
    (void)r.controller();
    CHECK(r.accumulators().size() == 2);
  }
  auto refused = [](std::vector<std::byte> const& bytes,
                    gc::checkpoint_config const& cfg) -> std::string {
    try {
      gc::detail::checkpoint_reader r(bytes, cfg);
      (void)r.feedback();
      (void)r.controller();
      (void)r.accumulators();
      return "read";
    } catch (gc::format_error const& e) {
      return e.what();
    }
  };
  gc::checkpoint_config other = checkpoint_cfg;
  other.codec = "int8";
  CHECK_THAT(refused(good, other),
             Catch::Contains("gradient_pipeline checkpoint") &&
                 Catch::Contains("saved with codec 'topk:ratio=0.01', this pipeline has 'int8'"));
  other = checkpoint_cfg;
  other.feedback = "ef21";
  CHECK_THAT(refused(good, other),
             Catch::Contains("saved with feedback 'residual', this pipeline has 'ef21'"));
  other = checkpoint_cfg;
  other.controller = "";
  CHECK_THAT(refused(good, other), Catch::Contains("saved with controller 'static:factor=10'"));
  other = checkpoint_cfg;
  other.two_way = true;
  CHECK_THAT(refused(good, other), Catch::Contains("saved with another two_way setting"));
  CHECK_THAT(refused(checkpoint_with({{3, {1.0f}}, {3, {2.0f}}}), checkpoint_cfg),
             Catch::Contains("an accumulator id appears twice"));
  CHECK_THAT(refused(checkpoint_with({{std::uint64_t{1} << 33, {1.0f}}}), checkpoint_cfg),
             Catch::Contains("accumulator id"));

  std::vector<std::byte> const long_one = checkpoint_with({}, true);
  gc::detail::checkpoint_reader trailing(long_one, checkpoint_cfg);
  (void)trailing.feedback();
  (void)trailing.controller();
  (void)trailing.accumulators();
  gc::detail::byte_reader& in = trailing.mode_sections();
  gc::low_rank_mode::expect_none(in);
  gc::two_way_mode::expect_none(in);
  (void)trailing.guard();
  CHECK_THROWS_WITH(trailing.end(), Catch::Contains("8 trailing bytes"));
}

TEST_CASE("checkpoint sections out of order are a logic_error", "[pipeline][checkpoint]") {
  gc::detail::checkpoint_writer w(checkpoint_cfg, 0, {});
  CHECK_THROWS_AS(w.controller(std::vector<std::byte>{}), std::logic_error);  // before feedback
  w.feedback(std::vector<std::byte>{});
  CHECK_THROWS_AS(w.guard(std::vector<std::byte>{}), std::logic_error);
  w.controller(std::vector<std::byte>{});
  w.accumulators({});
  (void)w.mode_sections();
  CHECK_THROWS_AS(w.finish(), std::logic_error);  // the guard is missing

  std::vector<std::byte> const bytes = checkpoint_with({});
  gc::detail::checkpoint_reader r(bytes, checkpoint_cfg);
  CHECK_THROWS_AS(r.accumulators(), std::logic_error);
  (void)r.feedback();
  CHECK_THROWS_AS(r.feedback(), std::logic_error);
  CHECK_THROWS_AS(r.end(), std::logic_error);
}
