// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The rounds of the step protocol (pipeline/rounds.hpp) on their own, over a step state and the
// services a pipeline would lend them: PowerSGD's shapes; the agreement round's plan, and its
// failure on every rank for a mismatched layout or one rank's local failure; the gain round's
// ratio over the ranks; the outcome round keeping the step's accumulators; a completed step's
// statistics, counter, timing and hook; a skipped step zeroing every output and counting nothing.
#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/guard.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/rounds.hpp>
#include <gradcomp/pipeline/step_state.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gc = gradcomp;

namespace {

// What a pipeline lends its rounds, owned here.
struct protocol {
  gc::pipeline_options opt;
  gc::pipeline_mode_traits traits;
  gc::any_codec base = gc::make_codec("int8");
  gc::feedback_compressor comp = gc::make_feedback("residual", gc::make_codec("int8"));
  std::optional<gc::any_controller> ctrl;
  gc::step_state cur;
  gc::detail::bucket_slot slots[2];
  std::map<gc::tensor_id, std::pair<std::size_t, std::size_t>> shapes;
  std::map<gc::tensor_id, std::vector<float>> accumulators;
  gc::accumulator_undo undo;
  gc::divergence_guard guard;
  gc::step_history history;

  explicit protocol(gc::pipeline_mode m = gc::pipeline_mode::flat, std::string guard_spec = "skip")
      : traits(gc::pipeline_mode_traits_of(m)), guard(std::move(guard_spec)) {
    opt.guard = guard.spec();
  }
  // The step state of `comm`'s rank.
  void join(gc::in_process_communicator const& comm) {
    cur.size = comm.size();
    cur.rank = comm.rank();
  }
  gc::step_services services() {
    return {opt,
            traits,
            base,
            comp,
            ctrl,
            cur,
            slots,
            shapes,
            accumulators,
            undo,
            guard,
            history,
            gc::detail::step_clock::now()};
  }
};

std::vector<gc::bucket_item> items_over(std::vector<std::vector<float>>& data) {
  std::vector<gc::bucket_item> out;
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::span<float> const v(data[i]);
    out.push_back(
        {gc::tensor_view<float const>(v, gc::tensor_id{static_cast<std::uint32_t>(i)}), v});
  }
  return out;
}

}  // namespace

TEST_CASE("shape_of takes set_shape's shape, else the most square factorization",
          "[pipeline][rounds]") {
  protocol p(gc::pipeline_mode::low_rank);
  p.shapes[gc::tensor_id{3}] = {2, 6};
  gc::step_services const sv = p.services();
  CHECK(sv.shape_of(gc::tensor_id{3}, 12) == std::pair<std::size_t, std::size_t>{2, 6});
  CHECK(sv.shape_of(gc::tensor_id{4}, 12) == std::pair<std::size_t, std::size_t>{4, 3});
  CHECK(sv.shape_of(gc::tensor_id{4}, 16) == std::pair<std::size_t, std::size_t>{4, 4});
  CHECK(sv.shape_of(gc::tensor_id{4}, 7) == std::pair<std::size_t, std::size_t>{7, 1});
  CHECK(sv.shape_of(gc::tensor_id{4}, 1) == std::pair<std::size_t, std::size_t>{1, 1});
  CHECK(!sv.needs_gains());
}

TEST_CASE("agree_step plans the buckets when every rank agrees and fails on all when one differs",
          "[pipeline][rounds]") {
  REQUIRE_NOTHROW(gc::run_in_process(3, [](gc::in_process_communicator& comm) {
    protocol p;
    p.join(comm);
    std::vector<std::vector<float>> data = {std::vector<float>(5000, 1.0f),
                                            std::vector<float>(10, 2.0f)};
    std::vector<gc::bucket_item> const items = items_over(data);
    gc::step_services sv = p.services();
    gc::bucket_result br;
    int planned = 0;
    std::vector<gc::detail::bucket_plan> const plan =
        gc::agree_step(sv, comm, items, br, [&](gc::fingerprint&) { ++planned; });
    RANK_REQUIRE(planned == 1);
    RANK_REQUIRE(!plan.empty());
    RANK_REQUIRE(br.wire_bytes > 0);

    // Rank 1 adds to the fingerprint what the others do not (a mode's plan that differs).
    std::string what;
    try {
      (void)gc::agree_step(sv, comm, items, br, [&](gc::fingerprint& fp) {
        if (comm.rank() == 1) fp.add("another plan");
      });
    } catch (std::exception const& e) {
      what = e.what();
    }
    RANK_REQUIRE(what.find("gradient_pipeline") != std::string::npos);
  }));
}

TEST_CASE("agree_step rethrows one rank's local failure there and fails the others",
          "[pipeline][rounds]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [](gc::in_process_communicator& comm) {
    protocol p;
    p.join(comm);
    if (comm.rank() == 0) p.cur.fail(std::make_exception_ptr(gc::config_error("rank 0's own")));
    std::vector<std::vector<float>> data = {std::vector<float>(100, 1.0f)};
    std::vector<gc::bucket_item> const items = items_over(data);
    gc::step_services sv = p.services();
    gc::bucket_result br;
    std::string what;
    try {
      (void)gc::agree_step(sv, comm, items, br, [](gc::fingerprint&) {});
    } catch (std::exception const& e) {
      what = e.what();
    }
    RANK_REQUIRE(!what.empty());
    if (comm.rank() == 0) RANK_REQUIRE(what == "rank 0's own");
    if (comm.rank() == 1) RANK_REQUIRE(what != "rank 0's own");
  }));
}

TEST_CASE("gain_round gives every rank the ratio of the summed norms", "[pipeline][rounds]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [](gc::in_process_communicator& comm) {
    protocol p;
    p.cur.size = comm.size();
    p.cur.levels = 1;
    p.cur.ef_norm = comm.rank() == 0 ? 3.0 : 5.0;  // 8 over the ranks
    p.cur.comp_norms = {1.0};                      // 2 over the ranks
    gc::step_services sv = p.services();
    gc::pipeline_stats st;
    double communicate = 0.0;
    gc::gain_round(sv, comm, st, communicate);
    RANK_REQUIRE(st.gain == 0.25);
    RANK_REQUIRE(communicate >= 0.0);

    p.cur.ef_norm = 0.0;  // nothing staged anywhere: no gain to measure
    p.cur.comp_norms = {0.0};
    gc::gain_round(sv, comm, st, communicate);
    RANK_REQUIRE(st.gain == 1.0);
  }));
}

TEST_CASE("outcome_round keeps the step's accumulators and counts its bytes",
          "[pipeline][rounds]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [](gc::in_process_communicator& comm) {
    protocol p;
    p.cur.size = comm.size();
    p.undo.emplace_back(gc::tensor_id{1}, std::nullopt);
    gc::step_services sv = p.services();
    gc::bucket_result br;
    gc::outcome_round(sv, comm, br);
    RANK_REQUIRE(p.undo.empty());
    RANK_REQUIRE(br.wire_bytes == gc::detail::outcome_wire_bytes(false, 2));
  }));
}

TEST_CASE("close_step counts the step, records its timing and statistics, calls the hook",
          "[pipeline][rounds]") {
  protocol p(gc::pipeline_mode::low_rank);
  p.history.step = 4;
  p.cur.info.backprop_s = 0.5;
  p.cur.compress_s = 0.25;
  p.cur.entries.resize(2);
  p.cur.entries[0].n = 100;
  p.cur.entries[1].n = 300;
  std::vector<std::size_t> hooked;  // the bytes of each step the hook saw
  p.history.on_step = [&](gc::pipeline_stats const& st) { hooked.push_back(st.bytes_sent); };
  gc::opened_step s;
  s.br.packet_bytes = 40;
  s.br.wire_bytes = 90;
  s.br.buckets = 3;
  s.communicate = 2.0;
  s.st.sent = gc::send_kind::candidate;
  gc::step_services sv = p.services();
  gc::pipeline_stats const st = gc::complete(sv, s, 0.75, 1.5);
  CHECK(hooked == std::vector<std::size_t>{40});
  CHECK(p.history.step == 5);
  CHECK(st.bytes_sent == 40);
  CHECK(st.wire_bytes == 90);
  CHECK(st.buckets == 3);
  CHECK(st.compress_s == 1.0);
  CHECK(st.communicate_s == 2.0);
  CHECK(st.decode_s == 1.5);
  CHECK(st.factor == 1600.0 / 40.0);  // PowerSGD's: float32 bytes over the bytes sent
  CHECK(st.total_s >= 0.0);
  CHECK(p.history.last.bytes_sent == 40);
  CHECK(p.history.last_timing.backprop == 0.5);
  CHECK(p.history.last_timing.compress == 1.0);
  CHECK(p.history.last_timing.sync == 2.0);
  CHECK(p.guard.counters().checked == 1);

  p.opt.measured_timing = false;  // the controller sees the caller's backprop time only
  gc::opened_step s2;
  s2.communicate = 2.0;
  gc::step_services sv2 = p.services();
  (void)gc::complete(sv2, s2, 0.75, 1.5);
  CHECK(p.history.step == 6);
  CHECK(hooked == std::vector<std::size_t>{40, 0});
  CHECK(p.history.last_timing.compress == 0.0);
  CHECK(p.history.last_timing.sync == 0.0);
}

TEST_CASE("skip_step zeroes every output, keeps the step counter and reports the trip",
          "[pipeline][rounds]") {
  protocol p;
  p.history.step = 7;
  p.cur.compress_s = 0.5;
  std::vector<float> a(4, 1.0f), b(3, 2.0f);
  int written = 0;
  p.cur.entries.resize(2);
  p.cur.entries[0].out32 = std::span<float>(a);
  p.cur.entries[0].staged = true;
  p.cur.entries[1].out32 = std::span<float>(b);
  p.cur.entries[1].write_back = [&] { ++written; };
  std::vector<std::string> reported;
  p.history.on_guard = [&](gc::guard_verdict const& v) { reported.push_back(v.message); };
  int hooked = 0;
  p.history.on_step = [&](gc::pipeline_stats const&) { ++hooked; };
  gc::guard_verdict gv;
  gv.action = gc::guard_action::skipped;
  gv.tripped = true;
  gv.message = "skipped for the test";
  gc::pipeline_stats st;
  st.sent = gc::send_kind::candidate;
  st.factor = 32.0;
  gc::step_services sv = p.services();
  int zeroed = 0;
  gc::pipeline_stats const out = gc::skip_step(sv, st, gv, 1.25, [&](std::span<float> x) {
    ++zeroed;
    for (float& v : x) v = 0.0f;
  });
  CHECK(zeroed == 2);
  CHECK(a == std::vector<float>(4, 0.0f));
  CHECK(b == std::vector<float>(3, 0.0f));
  CHECK(written == 1);
  CHECK(!p.cur.entries[0].staged);
  CHECK(out.guard == gc::guard_action::skipped);
  CHECK(out.sent == gc::send_kind::dense);
  CHECK(out.factor == 1.0);
  CHECK(out.communicate_s == 1.25);
  CHECK(out.compress_s == 0.5);
  CHECK(p.history.step == 7);
  CHECK(p.guard.counters().skipped == 1);
  CHECK(reported == std::vector<std::string>{"skipped for the test"});
  CHECK(hooked == 1);
  CHECK(p.history.last.guard == gc::guard_action::skipped);
}
