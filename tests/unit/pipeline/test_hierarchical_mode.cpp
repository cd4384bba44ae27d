// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The hierarchical all-reduce mode (pipeline/hierarchical_mode.hpp) on its own, over in-process
// ranks: its exchange is `all_reduce_hierarchical` with the same owners' error feedback, bit for
// bit; its checkpoint section is that compressor's saved bytes; a rolled-back step leaves the
// saved bytes as they were; a section loads back to the same bytes and malformed input is
// refused; what the mode refuses.
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/exchange.hpp>
#include <gradcomp/pipeline/hierarchical_mode.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

std::vector<float> hier_gradient(int rank, std::uint64_t step, std::size_t n, unsigned salt) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(std::sin(0.19 * static_cast<double>(i) * (1 + salt) + 0.8 * rank + 1.9 * step) *
                              (i % 17 == 0 ? 6.0 : 1.0));
  }
  return g;
}

std::vector<std::byte> hier_saved(gc::hierarchical_mode const& m) {
  gc::detail::byte_writer w;
  w.begin("THRM", 1);
  m.save(w);
  return w.finish();
}

gc::hierarchical_mode hier_reloaded(gc::hierarchical_mode const& m, std::vector<std::byte> const& bytes) {
  gc::detail::byte_reader r(std::span<std::byte const>(bytes), "THRM", 1, "hierarchical mode test");
  gc::hierarchical_mode out = m.loaded(r);
  r.expect_end();
  return out;
}

gc::hierarchical_options hier_options() {
  gc::hierarchical_options o;
  o.nodes = gc::node_grouping::uniform(2);
  o.op = gc::reduction::average;
  return o;
}

// One step of the mode: the plan settled, then the exchange of `g` as tensor `id`.
template <class Comm>
std::vector<float> hier_step(gc::hierarchical_mode& mode, Comm& comm, std::vector<float> const& g, gc::tensor_id id,
                             gc::codec_context const& ctx) {
  gc::fingerprint fp;
  mode.plan_step(comm.size(), comm.rank(), false, fp);
  gc::detail::step_check check(false);
  std::vector<float> out(g.size());
  mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                          std::span<float>(out), 0, 0},
                ctx, {}, check);
  return out;
}

constexpr std::size_t hier_n = 613;

}  // namespace

static_assert(gc::per_tensor_exchange_mode<gc::hierarchical_mode, gc::in_process_communicator>);

TEST_CASE("hierarchical_mode exchanges as all_reduce_hierarchical and keeps the owners' feedback",
          "[pipeline][hierarchical]") {
  for (std::string const spec : {"topk:ratio=0.05", "onebit"}) {
    CAPTURE(spec);
    REQUIRE_NOTHROW(gc::run_in_process(6, [&](gc::in_process_communicator& comm) {
      int const r = comm.rank();
      gc::any_codec const codec = gc::make_codec(spec);
      gc::hierarchical_mode mode(hier_options(), "residual", codec);
      gc::compressor<gc::any_codec, gc::residual_feedback> ref(codec);
      auto ctx_of = [&](std::uint64_t step) {
        gc::codec_context ctx;
        ctx.seed = 5 + static_cast<std::uint64_t>(r);
        ctx.step = static_cast<std::uint32_t>(step);
        return ctx;
      };
      auto reference = [&](std::vector<float> const& g, gc::tensor_id id, gc::codec_context const& ctx) {
        std::vector<float> want(g.size());
        gc::all_reduce_hierarchical(comm, ref, gc::tensor_view<float const>(std::span<float const>(g), id),
                                    std::span<float>(want), ctx, hier_options());
        return want;
      };
      for (std::uint64_t step = 0; step < 3; ++step) {
        for (unsigned t = 0; t < 2; ++t) {
          gc::tensor_id const id = t == 0 ? gc::tensor_id{1} : gc::tensor_id{6};
          std::vector<float> const g = hier_gradient(r, step, hier_n, t);
          std::vector<float> const out = hier_step(mode, comm, g, id, ctx_of(step));
          std::vector<float> const want = reference(g, id, ctx_of(step));
          RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
        }
        mode.commit();
      }
      RANK_REQUIRE(mode.plan().lanes == 2);  // 3 nodes of 2 ranks: a lane per rank of a node
      // The section is the reference compressor's bytes, and loads back to the same bytes.
      std::vector<std::byte> const bytes = hier_saved(mode);
      auto ref_section = [&] {
        gc::detail::byte_writer w;
        w.begin("THRM", 1);
        w.put_bytes(ref.save());
        return w.finish();
      };
      RANK_REQUIRE(ref_section() == bytes);
      RANK_REQUIRE(hier_saved(hier_reloaded(mode, bytes)) == bytes);

      // A step that is rolled back (a tensor seen before, one new) leaves the feedback as before,
      // and the mode then steps on as the reference does.
      for (gc::tensor_id id : {gc::tensor_id{1}, gc::tensor_id{8}}) {
        (void)hier_step(mode, comm, hier_gradient(r, 3, hier_n, 4), id, ctx_of(3));
      }
      mode.rollback();
      RANK_REQUIRE(hier_saved(mode) == bytes);
      std::vector<float> const g = hier_gradient(r, 3, hier_n, 0);
      std::vector<float> const out = hier_step(mode, comm, g, gc::tensor_id{1}, ctx_of(3));
      mode.commit();
      std::vector<float> const want = reference(g, gc::tensor_id{1}, ctx_of(3));
      RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
      RANK_REQUIRE(ref_section() == hier_saved(mode));
      RANK_REQUIRE(hier_saved(mode) != bytes);
    }));
  }
}

TEST_CASE("hierarchical_mode refuses what it cannot run, and malformed sections", "[pipeline][hierarchical]") {
  gc::any_codec const codec = gc::make_codec("topk:ratio=0.1");
  CHECK_THROWS_WITH(gc::hierarchical_mode(hier_options(), "ef21", codec), Catch::Contains("'residual' or 'none'"));
  CHECK_THROWS_AS(gc::hierarchical_mode(hier_options(), "dgc", codec), gc::config_error);
  gc::hierarchical_mode mode(hier_options(), "residual", codec);
  {
    gc::fingerprint fp;
    CHECK_THROWS_WITH(mode.plan_step(4, 0, true, fp), Catch::Contains("set_hierarchical_groups"));
    CHECK_THROWS_AS(mode.plan_step(3, 0, false, fp), gc::config_error);  // 3 ranks are no nodes of 2
  }
  std::vector<std::byte> const none = hier_saved(mode);
  CHECK(hier_saved(hier_reloaded(mode, none)) == none);
  std::vector<std::byte> const junk = {std::byte{1}, std::byte{2}, std::byte{3}};
  CHECK_THROWS_AS(mode.loaded_from(std::span<std::byte const>(junk)), gc::format_error);
  {
    // another feedback policy's state
    gc::compressor<gc::any_codec, gc::no_feedback> other(codec);
    std::vector<std::byte> const bytes = other.save();
    CHECK_THROWS_AS(mode.loaded_from(std::span<std::byte const>(bytes)), gc::format_error);
  }
  CHECK(hier_saved(mode) == none);
}
