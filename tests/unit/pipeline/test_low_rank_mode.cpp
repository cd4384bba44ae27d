// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The PowerSGD exchange mode (pipeline/low_rank_mode.hpp) on its own, over in-process ranks:
// its exchange is `all_reduce_low_rank` with a session per tensor, bit for bit; a rolled-back
// step leaves the saved bytes as they were; its checkpoint section loads back to the same
// bytes and refuses malformed input.
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/pipeline/exchange.hpp>
#include <gradcomp/pipeline/low_rank_mode.hpp>

#include "../support/rank_check.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace gc = gradcomp;

namespace {

constexpr std::size_t rows = 48, cols = 20;

std::vector<float> gradient(int rank, std::uint64_t step, std::size_t n, unsigned salt) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(std::sin(0.11 * static_cast<double>(i) * (1 + salt) + 0.7 * rank + 1.3 * step) +
                              0.01 * static_cast<double>(i % 7));
  }
  return g;
}

std::vector<std::byte> saved(gc::low_rank_mode const& m) {
  gc::detail::byte_writer w;
  w.begin("TLRM", 1);
  m.save(w);
  return w.finish();
}

gc::low_rank_mode reloaded(gc::low_rank_mode const& m, std::vector<std::byte> const& bytes) {
  gc::detail::byte_reader r(std::span<std::byte const>(bytes), "TLRM", 1, "low-rank mode test");
  gc::low_rank_mode out = m.loaded(r);
  r.expect_end();
  return out;
}

gc::powersgd_options options() {
  gc::powersgd_options o;
  o.rank = 2;
  o.min_elements = 16;
  return o;
}

}  // namespace

static_assert(gc::per_tensor_exchange_mode<gc::low_rank_mode, gc::in_process_communicator>);

TEST_CASE("low_rank_mode exchanges as all_reduce_low_rank and keeps its sessions", "[pipeline][low_rank]") {
  REQUIRE_NOTHROW(gc::run_in_process(3, [](gc::in_process_communicator& comm) {
    int const r = comm.rank();
    gc::low_rank_mode mode(options());
    std::vector<gc::powersgd_session> ref;
    for (gc::tensor_id id : {gc::tensor_id{3}, gc::tensor_id{7}}) ref.emplace_back(rows, cols, options(), id);
    gc::collective_options const copt{};
    for (std::uint64_t step = 0; step < 3; ++step) {
      gc::codec_context ctx;
      ctx.seed = 11;
      ctx.step = static_cast<std::uint32_t>(step);
      gc::detail::step_check check(false);
      for (unsigned t = 0; t < 2; ++t) {
        gc::tensor_id const id = t == 0 ? gc::tensor_id{3} : gc::tensor_id{7};
        std::vector<float> const g = gradient(r, step, rows * cols, t);
        std::vector<float> out(g.size()), want(g.size());
        mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                                std::span<float>(out), rows, cols},
                      ctx, copt, check);
        gc::all_reduce_low_rank(comm, ref[t], gc::tensor_view<float const>(std::span<float const>(g), id),
                                std::span<float>(want), ctx, copt);
        RANK_REQUIRE(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
      }
      mode.commit();
      RANK_REQUIRE(mode.sessions().size() == 2);
    }
    // The saved sessions are the reference sessions' states, and load back to the same bytes.
    std::vector<std::byte> const bytes = saved(mode);
    RANK_REQUIRE(saved(reloaded(mode, bytes)) == bytes);
    gc::detail::byte_writer w;
    w.begin("TLRM", 1);
    w.put_u64(2);
    for (std::size_t t = 0; t < 2; ++t) {
      w.put_u64(t == 0 ? 3u : 7u);
      w.put_u64(rows);
      w.put_u64(cols);
      ref[t].state().save_exact(w);
    }
    RANK_REQUIRE(w.finish() == bytes);

    // A step that is rolled back leaves every session (and a session it made) as before.
    {
      gc::codec_context ctx;
      ctx.seed = 11;
      ctx.step = 3;
      gc::detail::step_check check(false);
      for (gc::tensor_id id : {gc::tensor_id{3}, gc::tensor_id{9}}) {
        std::vector<float> const g = gradient(r, 3, rows * cols, 5);
        std::vector<float> out(g.size());
        mode.exchange(comm, gc::exchange_tensor{gc::tensor_view<float const>(std::span<float const>(g), id),
                                                std::span<float>(out), rows, cols},
                      ctx, copt, check);
      }
      RANK_REQUIRE(mode.sessions().size() == 3);
      RANK_REQUIRE(saved(mode) != bytes);
      mode.rollback();
      RANK_REQUIRE(mode.sessions().size() == 2);
      RANK_REQUIRE(saved(mode) == bytes);
    }
  }));
}

TEST_CASE("low_rank_mode's checkpoint section refuses malformed input and changes nothing", "[pipeline][low_rank]") {
  gc::low_rank_mode const empty(options());
  std::vector<std::byte> const none = saved(empty);
  CHECK(reloaded(empty, none).sessions().empty());
  {
    gc::detail::byte_reader r(std::span<std::byte const>(none), "TLRM", 1, "t");
    CHECK_NOTHROW(gc::low_rank_mode::expect_none(r));
  }
  // One session of a 0-row matrix, then one id twice.
  auto section = [](std::uint64_t r0, bool twice) {
    gc::detail::byte_writer w;
    w.begin("TLRM", 1);
    w.put_u64(twice ? 2 : 1);
    gc::powersgd_session s(rows, cols, options(), gc::tensor_id{4});
    for (int i = 0; i < (twice ? 2 : 1); ++i) {
      w.put_u64(4);
      w.put_u64(r0);
      w.put_u64(cols);
      s.state().save_exact(w);
    }
    return w.finish();
  };
  CHECK_THROWS_WITH(reloaded(empty, section(0, false)), Catch::Contains("invalid shape"));
  CHECK_THROWS_WITH(reloaded(empty, section(rows, true)), Catch::Contains("appears twice"));
  CHECK(reloaded(empty, section(rows, false)).sessions().size() == 1);
  {
    std::vector<std::byte> const one = section(rows, false);
    gc::detail::byte_reader r(std::span<std::byte const>(one), "TLRM", 1, "t");
    CHECK_THROWS_WITH(gc::low_rank_mode::expect_none(r), Catch::Contains("this pipeline is not PowerSGD"));
  }
  CHECK(saved(empty) == none);
}
