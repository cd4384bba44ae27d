// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Two-phase error feedback (stage, then commit exactly what was sent), the EF21 receiver side
// through the collectives, the saved-state format with receivers, and the sparse budget handle.

#include "../support/codec_support.hpp"
#include "../support/rank_check.hpp"

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace gradcomp_test;

namespace {

template <class F>
void check_two_phase_equals_one_phase(char const* spec, F feedback) {
  gc::any_codec const codec = gc::make_codec(spec);
  gc::compressor<gc::any_codec, F> one(codec, feedback), two(codec, feedback);
  gc::codec_context ctx{.seed = 5};
  for (std::uint32_t step = 0; step < 4; ++step) {
    ctx.step = step;
    std::vector<float> const g = heavy_tailed(3000, 100 + step);
    gc::tensor_view<float const> const v(std::span<float const>(g), gc::tensor_id{2});
    std::vector<std::byte> a(codec.max_compressed_bytes(g.size())), b(a.size());
    std::vector<std::byte> const prior = one.save();  // the state before this step
    std::size_t const na = one.compress(v, std::span<std::byte>(a), ctx);
    std::size_t const nb = two.stage(v, std::span<std::byte>(b), ctx);
    REQUIRE(na == nb);
    REQUIRE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(na), b.begin()));
    // the committed state is untouched until the commit
    REQUIRE(two.save() == prior);
    REQUIRE(two.staged_input(gc::tensor_id{2}).size() == g.size());
    two.commit(gc::tensor_id{2}, std::span<std::byte const>(b).first(nb), ctx);
    auto const sa = one.state(gc::tensor_id{2}).values();
    auto const sb = two.state(gc::tensor_id{2}).values();
    REQUIRE(sa.size() == sb.size());
    REQUIRE(std::equal(sa.begin(), sa.end(), sb.begin()));
  }
}

}  // namespace

TEST_CASE("two-phase feedback: stage + commit equals the one-phase compress, byte for byte", "[feedback][two_phase]") {
  for (char const* spec : {"topk:ratio=0.05", "qsgd:levels=7,bucket=256", "onebit", "fp16"}) {
    INFO(spec);
    check_two_phase_equals_one_phase(spec, gc::residual_feedback{});
    check_two_phase_equals_one_phase(spec, gc::ef21_feedback{});
    check_two_phase_equals_one_phase(spec, gc::no_feedback{});
    check_two_phase_equals_one_phase(spec, gc::dgc_feedback(0.9f));
  }
}

TEST_CASE("two-phase feedback: the residual is g + e minus exactly what was sent", "[feedback][two_phase]") {
  gc::any_codec const codec = gc::make_codec("topk:ratio=0.1");
  gc::compressor<gc::any_codec, gc::residual_feedback> c(codec);
  std::vector<float> const g = heavy_tailed(2000, 7);
  gc::tensor_view<float const> const v(std::span<float const>(g), gc::tensor_id{1});
  std::vector<std::byte> p(codec.max_compressed_bytes(g.size()));
  std::size_t const n = c.stage(v, std::span<std::byte>(p));
  std::vector<float> const staged(c.staged_input(gc::tensor_id{1}).begin(), c.staged_input(gc::tensor_id{1}).end());
  REQUIRE(staged == g);  // first step: e = 0
  // send a multi-level re-compression to 20 elements instead of the 200 compressed
  std::vector<std::byte> q(gc::max_recompressed_bytes(std::span<std::byte const>(p).first(n), 20));
  std::size_t const m = gc::recompress_sparse(std::span<std::byte const>(p).first(n), 20, std::span<std::byte>(q));
  gc::any_codec const small = codec.with_budget(gc::sparse_budget::count(20));
  c.commit(gc::tensor_id{1}, small, std::span<std::byte const>(q).first(m));
  std::vector<float> sent(g.size(), 0.0f);
  small.decompress(std::span<std::byte const>(q).first(m), std::span<float>(sent));
  auto const e = c.state(gc::tensor_id{1}).values();
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    REQUIRE(e[i] == g[i] - sent[i]);
    nonzero += sent[i] != 0.0f ? 1 : 0;
  }
  CHECK(nonzero == 20);
  // a commit needs a stage; a discard keeps the state; commit_lossless zeroes the residual
  CHECK_THROWS_AS(c.commit(gc::tensor_id{1}, std::span<std::byte const>(q).first(m)), gc::config_error);
  std::vector<float> const kept(e.begin(), e.end());
  c.stage(v, std::span<std::byte>(p));
  c.discard(gc::tensor_id{1});
  CHECK(std::equal(kept.begin(), kept.end(), c.state(gc::tensor_id{1}).values().begin()));
  CHECK_THROWS_AS(c.commit_lossless(gc::tensor_id{1}), gc::config_error);
  c.stage(v, std::span<std::byte>(p));
  c.commit_lossless(gc::tensor_id{1});
  CHECK(c.state(gc::tensor_id{1}).values().empty());  // zero
}

TEST_CASE("two-phase feedback: a failed stage leaves the state as it was", "[feedback][two_phase][errors]") {
  gc::compressor<gc::any_codec, gc::residual_feedback> c(gc::make_codec("topk:ratio=0.1"));
  std::vector<float> g = heavy_tailed(500, 3);
  std::vector<std::byte> p(c.max_compressed_bytes(g.size()));
  c.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{0}), std::span<std::byte>(p));
  std::vector<std::byte> const saved = c.save();
  g[10] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(c.stage(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{0}), std::span<std::byte>(p)),
                  gc::numeric_error);
  CHECK_THROWS_AS(c.stage(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{9}), std::span<std::byte>(p)),
                  gc::numeric_error);
  CHECK(c.save() == saved);  // tensor 9 was not added either
  CHECK_THROWS_AS(c.commit(gc::tensor_id{0}, std::span<std::byte const>(p)), gc::config_error);
}

TEST_CASE("EF21 through all_reduce_compressed returns the gradient estimate, not the increment",
          "[feedback][ef21][collective]") {
  // Regression (issue 11, defect 3): with the lossless identity codec the estimate is exactly
  // the average gradient every step; the increments it used to return differ from step 2 on.
  int const world = 3;
  std::size_t const n = 1000;
  REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    gc::compressor<gc::any_codec, gc::ef21_feedback> c(gc::make_codec("identity"));
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g(n), expect(n, 0.0f);
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          float const v = static_cast<float>(std::sin(0.01 * static_cast<double>(i) * (step + 1) + r));
          if (r == comm.rank()) g[i] = v;
        }
      }
      std::vector<float> out(n);
      gc::all_reduce_compressed(comm, c, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{4}),
                                std::span<float>(out), {}, {.op = gc::reduction::average});
      // the average of the three ranks' gradients, summed in rank order as the identity
      // all-reduce does, then scaled
      for (std::size_t i = 0; i < n; ++i) {
        float s = 0.0f;
        for (int r = 0; r < world; ++r) s += static_cast<float>(std::sin(0.01 * static_cast<double>(i) * (step + 1) + r));
        RANK_REQUIRE(std::fabs(out[i] - s / world) <= 4e-7f * (1.0f + std::fabs(s)));
      }
    }
  }));
}

TEST_CASE("compressor state v3 saves the EF21 receiver side; versions 1 and 2 load only inside a container",
          "[feedback][ef21][state]") {
  gc::compressor<gc::any_codec, gc::ef21_feedback> c(gc::make_codec("topk:ratio=0.1"));
  std::vector<float> const g = heavy_tailed(400, 9);
  std::vector<std::byte> p(c.max_compressed_bytes(g.size()));
  c.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{3}), std::span<std::byte>(p));
  std::vector<float> io(400, 0.5f);
  c.receive(gc::tensor_id{3}, std::span<float>(io));
  std::vector<std::byte> const saved = c.save();
  CHECK(static_cast<unsigned>(saved[4]) == 3);
  gc::compressor<gc::any_codec, gc::ef21_feedback> d(gc::make_codec("topk:ratio=0.1"));
  d.load(saved);
  CHECK(d.save() == saved);
  std::vector<float> a(400, 1.0f), b(400, 1.0f);
  c.receive(gc::tensor_id{3}, std::span<float>(a));
  d.receive(gc::tensor_id{3}, std::span<float>(b));
  CHECK(a == b);
  CHECK(a[0] == 1.5f);
  // version 1 (no receiver records, no checksum) loads inside a checked container (a pipeline
  // checkpoint), not on its own; a v1 with a non-zero reserved field does not load at all
  std::vector<std::byte> v1 = gc::compressor<gc::any_codec, gc::residual_feedback>(gc::make_codec("fp16")).save();
  v1.resize(v1.size() - 4);  // without the checksum
  v1[4] = std::byte{1};
  gc::compressor<gc::any_codec, gc::residual_feedback> r(gc::make_codec("fp16"));
  CHECK_THROWS_AS(r.load(v1), gc::format_error);
  CHECK_NOTHROW(r.load(v1, gc::state_check::container));
  v1[12] = std::byte{1};
  CHECK_THROWS_AS(r.load(v1, gc::state_check::container), gc::format_error);
  // receiver records for a policy without a receiver side are refused
  std::vector<std::byte> wrong = saved;
  wrong[5] = static_cast<std::byte>(gc::feedback_id::residual);
  gc::detail::seal_state(wrong);  // the checksum recomputed: the parser refuses it
  CHECK_THROWS_AS(r.load(wrong), gc::format_error);
  // a size change of the receiver's output is a clear error
  std::vector<float> shorter(10, 0.0f);
  CHECK_THROWS_AS(c.receive(gc::tensor_id{3}, std::span<float>(shorter)), gc::config_error);
}

TEST_CASE("sparse_budget sets a sparsifier's selection size without a spec string", "[codec][budget]") {
  gc::topk_codec const t = gc::topk_codec::ratio(0.01, gc::sparse_values::f16);
  gc::topk_codec const u = t.with_budget(gc::sparse_budget::factor(50));
  CHECK(u.value_type() == gc::sparse_values::f16);
  CHECK(u.k_for(10000) == 200);
  CHECK(t.with_budget(gc::sparse_budget::count(7)).k_for(10000) == 7);
  CHECK(gc::sparse_budget::factor(50).kept(10000) == 200);
  CHECK(gc::sparse_budget::factor(1e9).kept(10000) == 1);
  CHECK(gc::sparse_budget::count(7).kept(3) == 3);
  gc::approx_topk_codec const a = gc::approx_topk_codec::ratio(0.01, 0.002, 0.2);
  gc::approx_topk_codec const b = a.with_budget(gc::sparse_budget::factor(10));
  CHECK(b.sample_fraction() == 0.002);
  CHECK(b.tolerance() == 0.2);
  CHECK(b.k_for(1000) == 100);
  gc::scaled_random_k_codec const r = gc::scaled_random_k_codec::ratio(0.5).with_budget(gc::sparse_budget::factor(4));
  CHECK(r.k_for(1000) == 250);
  // through any_codec, equal packets to the codec made from a spec
  gc::any_codec const any = gc::make_codec("topk:ratio=0.01,values=bf16");
  CHECK(any.has_budget());
  gc::any_codec const at = any.with_budget(gc::sparse_budget::factor(20));
  gc::any_codec const spec = gc::make_codec("topk:ratio=0.05,values=bf16");
  std::vector<float> const g = heavy_tailed(5000, 1);
  std::vector<std::byte> p1(at.max_compressed_bytes(g.size())), p2(spec.max_compressed_bytes(g.size()));
  std::size_t const n1 = at.compress(gc::tensor_view<float const>(std::span<float const>(g)), std::span<std::byte>(p1));
  std::size_t const n2 = spec.compress(gc::tensor_view<float const>(std::span<float const>(g)), std::span<std::byte>(p2));
  CHECK(n1 == n2);
  CHECK(std::equal(p1.begin(), p1.begin() + static_cast<std::ptrdiff_t>(n1), p2.begin()));
  // bad budgets and codecs without one
  CHECK_THROWS_AS(gc::sparse_budget::factor(0.5), gc::config_error);
  CHECK_THROWS_AS(gc::sparse_budget::factor(std::numeric_limits<double>::infinity()), gc::config_error);
  CHECK_FALSE(gc::make_codec("qsgd").has_budget());
  CHECK_THROWS_AS(gc::make_codec("qsgd").with_budget(gc::sparse_budget::factor(2)), gc::config_error);
  CHECK_THROWS_AS(gc::make_codec("threshold:value=0.5").with_budget(gc::sparse_budget::factor(2)), gc::config_error);
}
