// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The step state the protocol shares with the exchange modes (pipeline/step_state.hpp) on its
// own: the per-tensor modes' split sends each compressed tensor through one call, in entry
// order, counting its bytes and one bucket, and returns the small tensors for the dense
// buckets; a step keeps its first local failure; the guard's dense step reads as dense in the
// statistics.
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/pipeline/step_state.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

// Entries over `data`: tensor i of `sizes[i]` elements, compressed from `large_from` up.
std::vector<gc::step_entry> step_entries(std::vector<std::vector<float>>& data,
                                         std::size_t large_from) {
  std::vector<gc::step_entry> out;
  for (std::size_t i = 0; i < data.size(); ++i) {
    gc::step_entry e;
    e.id = gc::tensor_id{static_cast<std::uint32_t>(20 + i)};
    e.n = data[i].size();
    e.large = e.n >= large_from;
    e.out32 = std::span<float>(data[i]);
    e.raw32 = std::span<float const>(data[i]);
    out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "for_each_compressed runs each compressed tensor once, in order, and returns the small ones",
    "[pipeline][step_state]") {
  std::vector<std::vector<float>> data = {
      std::vector<float>(300, 1.0f), std::vector<float>(5, 2.0f),  std::vector<float>(100, 3.0f),
      std::vector<float>(0),         std::vector<float>(99, 4.0f), std::vector<float>(1000, 5.0f)};
  std::vector<gc::step_entry> const entries = step_entries(data, 100);
  gc::bucket_result br;
  br.wire_bytes = 11;  // the agreement round's, kept
  std::vector<gc::tensor_id> seen;
  std::vector<gc::bucket_item> const dense =
      gc::detail::for_each_compressed(std::span<gc::step_entry const>(entries), br,
                                      [&](gc::step_entry const& e, gc::tensor_view<float const> g) {
                                        CHECK(g.id() == e.id);
                                        CHECK(g.span().data() == e.raw32.data());
                                        CHECK(g.size() == e.n);
                                        seen.push_back(e.id);
                                        gc::collective_result r;
                                        r.packet_bytes = e.n;
                                        r.wire_bytes = 2 * e.n;
                                        return r;
                                      });
  CHECK(seen ==
        std::vector<gc::tensor_id>{gc::tensor_id{20}, gc::tensor_id{22}, gc::tensor_id{25}});
  CHECK(br.packet_bytes == 300 + 100 + 1000);
  CHECK(br.wire_bytes == 11 + 2 * (300 + 100 + 1000));
  CHECK(br.buckets == 3);
  REQUIRE(dense.size() == 3);
  std::size_t const small[] = {1, 3, 4};
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(dense[i].grad.id() == entries[small[i]].id);
    CHECK(dense[i].grad.span().data() == data[small[i]].data());
    CHECK(dense[i].out.data() == data[small[i]].data());
    CHECK(dense[i].out.size() == data[small[i]].size());
  }
}

TEST_CASE("for_each_compressed with every tensor small calls nothing", "[pipeline][step_state]") {
  std::vector<std::vector<float>> data = {std::vector<float>(3), std::vector<float>(4)};
  std::vector<gc::step_entry> const entries = step_entries(data, 1000);
  gc::bucket_result br;
  int calls = 0;
  std::vector<gc::bucket_item> const dense =
      gc::detail::for_each_compressed(std::span<gc::step_entry const>(entries), br,
                                      [&](gc::step_entry const&, gc::tensor_view<float const>) {
                                        ++calls;
                                        return gc::collective_result{};
                                      });
  CHECK(calls == 0);
  CHECK(dense.size() == 2);
  CHECK(br.buckets == 0);
  CHECK(br.packet_bytes == 0);
}

TEST_CASE("step_state keeps its first local failure", "[pipeline][step_state]") {
  gc::step_state s;
  CHECK(!s.local);
  s.fail(std::make_exception_ptr(gc::config_error("first")));
  s.fail(std::make_exception_ptr(std::runtime_error("second")));
  REQUIRE(s.local);
  CHECK_THROWS_AS(std::rethrow_exception(s.local), gc::config_error);
  CHECK_THROWS_WITH(std::rethrow_exception(s.local), "first");
}

TEST_CASE("the guard's dense step reads as dense in the statistics", "[pipeline][step_state]") {
  gc::opened_step o;
  CHECK(!o.guard_dense());
  o.gv.action = gc::guard_action::dense;
  CHECK(o.guard_dense());
  o.gv.action = gc::guard_action::skipped;
  CHECK(!o.guard_dense());

  gc::pipeline_stats st;
  st.sent = gc::send_kind::candidate;
  st.factor = 32.0;
  st.gain = 0.25;
  gc::detail::dense_step_stats(st);
  CHECK(st.sent == gc::send_kind::dense);
  CHECK(st.factor == 1.0);
  CHECK(st.gain == 1.0);
}
