// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The two-way compression mode (pipeline/two_way_mode.hpp) on its own, over in-process ranks:
// its exchange is `all_reduce_two_way` with the same worker and server feedback, bit for bit;
// its checkpoint section is the compressor's saved bytes; a rolled-back step leaves the saved
// bytes as they were; a section loads back to the same bytes and malformed input is refused.
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/exchange.hpp>
#include <gradcomp/pipeline/two_way_mode.hpp>

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

std::vector<float> two_way_gradient(int rank, std::uint64_t step, std::size_t n, unsigned salt) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(std::cos(0.23 * static_cast<double>(i) * (1 + salt) + 0.5 * rank + 1.1 * step) *
                              (i % 11 == 0 ? 4.0 : 1.0));
  }
  return g;
}

std::vector<std::byte> two_way_saved(gc::two_way_mode const& m) {
  gc::detail::byte_writer w;
  w.begin("TTWM", 1);
  m.save(w);
  return w.finish();
}

gc::two_way_mode two_way_reloaded(gc::two_way_mode const& m, std::vector<std::byte> const& bytes) {
  gc::detail::byte_reader r(std::span<std::byte const>(bytes), "TTWM", 1, "two-way mode test");
  gc::two_way_mode out = m.loaded(r);
  r.expect_end();
  return out;
}

constexpr std::size_t two_way_n = 701;  // not a multiple of the ranks: shards of two sizes

}  // namespace

static_assert(gc::per_tensor_exchange_mode<gc::two_way_mode, gc::in_process_communicator>);

TEST_CASE("two_way_mode exchanges as all_reduce_two_way and keeps its shard states", "[pipeline][two_way]") {
  for (std::string const spec : {"topk:ratio=0.05", "int8"}) {
    CAPTURE(spec);
    REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      int const r = comm.rank();
      gc::any_codec const codec = gc::make_codec(spec);
      gc::two_way_mode mode("residual", codec);
      gc::two_way_compressor<gc::any_codec, gc::residual_feedback, gc::residual_feedback> ref(codec);
      gc::collective_options const copt{gc::reduction::average, false};
      for (std::uint64_t step = 0; step < 3; ++step) {
        gc::codec_context ctx;
        ctx.seed = 7 + static_cast<std::uint64_t>(r);
        ctx.step = static_cast<std::uint32_t>(step);
        gc::detail::step_check check(false);
        for (unsigned t = 0; t < 2; ++t) {
          gc::tensor_id const id = t == 0 ? gc::tensor_id{2} : gc::tensor_id{5};
          std::vector<float> const g = two_way_gradient(r, step, two_way_n, t);
          std::vector<float> out(g.size()), want(g.size());
          mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                                  std::span<float>(out), 0, 0},
                        ctx, copt, check);
          gc::all_reduce_two_way(comm, ref, gc::tensor_view<float const>(std::span<float const>(g), id),
                                 std::span<float>(want), ctx, copt);
          RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
        }
        mode.commit();
      }
      // The section is the reference compressor's bytes, and loads back to the same bytes.
      std::vector<std::byte> const bytes = two_way_saved(mode);
      {
        gc::detail::byte_writer w;
        w.begin("TTWM", 1);
        w.put_bytes(ref.save());
        RANK_REQUIRE(w.finish() == bytes);
      }
      RANK_REQUIRE(two_way_saved(two_way_reloaded(mode, bytes)) == bytes);

      // A step that is rolled back (one tensor seen before, one new) leaves every state as before.
      {
        gc::codec_context ctx;
        ctx.seed = 7 + static_cast<std::uint64_t>(r);
        ctx.step = 3;
        gc::detail::step_check check(false);
        for (gc::tensor_id id : {gc::tensor_id{2}, gc::tensor_id{9}}) {
          std::vector<float> const g = two_way_gradient(r, 3, two_way_n, 4);
          std::vector<float> out(g.size());
          mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                                  std::span<float>(out), 0, 0},
                        ctx, copt, check);
        }
        RANK_REQUIRE(two_way_saved(mode) != bytes);
        mode.rollback();
        RANK_REQUIRE(two_way_saved(mode) == bytes);
      }
      // After the rollback the mode steps on as the reference does.
      {
        gc::codec_context ctx;
        ctx.seed = 7 + static_cast<std::uint64_t>(r);
        ctx.step = 3;
        gc::detail::step_check check(false);
        std::vector<float> const g = two_way_gradient(r, 3, two_way_n, 0);
        std::vector<float> out(g.size()), want(g.size());
        auto const id = gc::tensor_id{2};
        mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                                std::span<float>(out), 0, 0},
                      ctx, copt, check);
        gc::all_reduce_two_way(comm, ref, gc::tensor_view<float const>(std::span<float const>(g), id),
                               std::span<float>(want), ctx, copt);
        mode.commit();
        RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
        gc::detail::byte_writer w;
        w.begin("TTWM", 1);
        w.put_bytes(ref.save());
        RANK_REQUIRE(w.finish() == two_way_saved(mode));
      }
    }));
  }
}

TEST_CASE("two_way_mode without feedback keeps no state; other feedback is refused", "[pipeline][two_way]") {
  REQUIRE_NOTHROW(gc::run_in_process(2, [](gc::in_process_communicator& comm) {
    gc::any_codec const codec = gc::make_codec("int8");
    gc::two_way_mode mode("none", codec);
    gc::two_way_compressor<gc::any_codec, gc::no_feedback, gc::no_feedback> ref(codec);
    gc::codec_context ctx;
    gc::detail::step_check check(false);
    std::vector<float> const g = two_way_gradient(comm.rank(), 0, two_way_n, 1);
    std::vector<float> out(g.size()), want(g.size());
    auto const id = gc::tensor_id{1};
    mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                            std::span<float>(out), 0, 0},
                  ctx, {}, check);
    gc::all_reduce_two_way(comm, ref, gc::tensor_view<float const>(std::span<float const>(g), id),
                           std::span<float>(want), ctx, {});
    mode.commit();
    RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
    gc::detail::byte_writer w;
    w.begin("TTWM", 1);
    w.put_bytes(ref.save());
    RANK_REQUIRE(w.finish() == two_way_saved(mode));
  }));
  CHECK_THROWS_AS(gc::two_way_mode("ef21", gc::make_codec("int8")), gc::config_error);
  CHECK_THROWS_WITH(gc::two_way_mode("dgc", gc::make_codec("int8")), Catch::Contains("feedback none or residual"));
}

TEST_CASE("two_way_mode's checkpoint section refuses malformed input and changes nothing", "[pipeline][two_way]") {
  gc::two_way_mode const empty("residual", gc::make_codec("topk:ratio=0.1"));
  std::vector<std::byte> const none = two_way_saved(empty);
  CHECK(two_way_saved(two_way_reloaded(empty, none)) == none);
  // The section of a pipeline in another mode: an empty byte string.
  std::vector<std::byte> other;
  {
    gc::detail::byte_writer w;
    w.begin("TTWM", 1);
    gc::two_way_mode::save_none(w);
    other = w.finish();
    gc::detail::byte_reader r(std::span<std::byte const>(other), "TTWM", 1, "t");
    CHECK_NOTHROW(gc::two_way_mode::expect_none(r));
  }
  {
    gc::detail::byte_reader r(std::span<std::byte const>(none), "TTWM", 1, "t");
    CHECK_THROWS_WITH(gc::two_way_mode::expect_none(r), Catch::Contains("this pipeline is not two-way"));
  }
  // A shard key out of range, a shard twice, and bytes that are no "GCTW" state.
  auto section = [](std::uint64_t shard, bool twice) {
    gc::detail::byte_writer inner;
    inner.begin("GCTW", 1);
    inner.put_u64(twice ? 2 : 1);
    for (int i = 0; i < (twice ? 2 : 1); ++i) {
      inner.put_u64(3);
      inner.put_u64(shard);
      inner.put_u64(2);
      std::vector<float> const v(4, 0.5f);
      inner.put_floats(std::span<float const>(v));
    }
    inner.put_u64(0);
    gc::detail::byte_writer w;
    w.begin("TTWM", 1);
    w.put_bytes(inner.finish());
    return w.finish();
  };
  CHECK(two_way_saved(two_way_reloaded(empty, section(1, false))) == section(1, false));
  CHECK_THROWS_AS(two_way_reloaded(empty, section(2, false)), gc::format_error);
  CHECK_THROWS_WITH(two_way_reloaded(empty, section(0, true)), Catch::Contains("appears twice"));
  {
    std::vector<std::byte> const junk = {std::byte{1}, std::byte{2}, std::byte{3}};
    CHECK_THROWS_AS(empty.loaded_from(std::span<std::byte const>(junk)), gc::format_error);
  }
  CHECK(two_way_saved(empty) == none);
}
