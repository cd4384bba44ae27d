// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <catch2/catch.hpp>

#include "../support/rank_check.hpp"

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace gc = gradcomp;

namespace {

std::vector<float> random_matrix(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> m(n);
  for (float& x : m) x = d(gen);
  return m;
}

gc::collective_options average() {
  gc::collective_options o;
  o.op = gc::reduction::average;
  return o;
}

}  // namespace

TEST_CASE("powersgd_session: the low-rank all-reduce is exact for a sum of rank <= r", "[collective][powersgd]") {
  constexpr std::size_t rows = 64, cols = 48;
  constexpr int w = 3;
  // M_i = u v_i^T: the average is rank 1, and rank-2 PowerSGD recovers it.
  auto const u = random_matrix(rows, 1);
  std::vector<std::vector<float>> g(w), out(w, std::vector<float>(rows * cols));
  std::vector<float> expect(rows * cols, 0.0f);
  for (int r = 0; r < w; ++r) {
    auto const v = random_matrix(cols, 10 + static_cast<unsigned>(r));
    g[static_cast<std::size_t>(r)].resize(rows * cols);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) {
        g[static_cast<std::size_t>(r)][i * cols + j] = u[i] * v[j];
        expect[i * cols + j] += u[i] * v[j] / static_cast<float>(w);
      }
  }
  gc::powersgd_options opt;
  opt.rank = 2;
  opt.min_elements = 0;
  REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::powersgd_session s(rows, cols, opt, gc::tensor_id{5});
    RANK_REQUIRE(s.factor_count() == 2);
    auto const res = gc::all_reduce_low_rank(comm, s, gc::tensor_view<float const>(g[r], gc::tensor_id{5}),
                                             std::span<float>(out[r]), {}, average());
    RANK_REQUIRE(res.path == gc::collective_path::low_rank);
    RANK_REQUIRE(res.packet_bytes == 4 * opt.rank * (rows + cols));
  }));
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < expect.size(); ++i) {
    err += std::pow(double{out[0][i]} - expect[i], 2);
    norm += std::pow(double{expect[i]}, 2);
  }
  REQUIRE(std::sqrt(err / norm) < 1e-5);
  REQUIRE(out[1] == out[0]);  // every rank gets the same bits
  REQUIRE(out[2] == out[0]);
}

TEST_CASE("powersgd_session over the communicator equals the phase protocol run by hand", "[collective][powersgd]") {
  constexpr std::size_t rows = 40, cols = 36;
  gc::powersgd_options opt;
  opt.rank = 3;
  opt.min_elements = 0;
  int const steps = 3;
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < steps; ++t)
    for (int r = 0; r < 2; ++r) grads.push_back(random_matrix(rows * cols, 100 + static_cast<unsigned>(2 * t + r)));
  auto grad = [&](int t, int r) -> std::vector<float> const& { return grads[static_cast<std::size_t>(2 * t + r)]; };
  gc::codec_context ctx;
  ctx.seed = 9;

  // By hand: two states, the sums done in rank order as the in-process all-reduce does.
  std::vector<std::vector<float>> expect;
  {
    gc::powersgd_state s0(rows, cols, opt, gc::tensor_id{1}), s1(rows, cols, opt, gc::tensor_id{1});
    auto sum_into = [](std::span<float> a, std::span<float> b) {
      for (std::size_t i = 0; i < a.size(); ++i) b[i] = a[i] = a[i] + b[i];
    };
    for (int t = 0; t < steps; ++t) {
      ctx.step = static_cast<std::uint32_t>(t);
      sum_into(s0.begin(std::span<float const>(grad(t, 0)), ctx), s1.begin(std::span<float const>(grad(t, 1)), ctx));
      sum_into(s0.after_p_reduced(ctx), s1.after_p_reduced(ctx));
      s0.finish(0.5f, ctx);
      s1.finish(0.5f, ctx);
      std::vector<float> m(rows * cols);
      s0.reconstruct(std::span<float>(m), ctx);
      expect.push_back(m);
    }
  }
  std::vector<std::vector<std::vector<float>>> got(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    gc::powersgd_session s(rows, cols, opt, gc::tensor_id{1});
    gc::codec_context c = ctx;
    for (int t = 0; t < steps; ++t) {
      c.step = static_cast<std::uint32_t>(t);
      std::vector<float> out(rows * cols);
      gc::all_reduce_low_rank(comm, s, gc::tensor_view<float const>(grad(t, comm.rank()), gc::tensor_id{1}),
                              std::span<float>(out), c, average());
      got[static_cast<std::size_t>(comm.rank())].push_back(out);
    }
  }));
  REQUIRE(got[0] == expect);
  REQUIRE(got[1] == expect);
}

TEST_CASE("powersgd_session: small matrices go dense, mismatched shapes fail on every rank", "[collective][powersgd]") {
  SECTION("dense fallback averages exactly") {
    std::vector<std::vector<float>> out(3, std::vector<float>(16));
    REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      gc::powersgd_session s(4, 4);  // 16 elements < min_elements: dense
      RANK_REQUIRE(s.factor_count() == 1);
      std::vector<float> g(16, static_cast<float>(comm.rank() + 1));
      if (comm.rank() == 2) g.clear();  // contributes nothing
      gc::all_reduce_low_rank(comm, s, gc::tensor_view<float const>(g), std::span<float>(out[static_cast<std::size_t>(comm.rank())]), {},
                              average());
    }));
    for (auto const& o : out) REQUIRE(o == std::vector<float>(16, 1.0f));  // (1 + 2 + 0) / 3
  }
  SECTION("a rank with another shape") {
    std::vector<int> errors(3);
    REQUIRE_THROWS(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      gc::powersgd_options opt;
      opt.min_elements = 0;
      gc::powersgd_session s(comm.rank() == 1 ? 20 : 10, comm.rank() == 1 ? 10 : 20, opt);
      std::vector<float> g(200, 1.0f), out(200);
      try {
        gc::all_reduce_low_rank(comm, s, gc::tensor_view<float const>(g), std::span<float>(out));
      } catch (gc::error const&) {
        errors[static_cast<std::size_t>(comm.rank())] = 1;
        throw;
      }
    }));
    REQUIRE(errors == std::vector<int>{1, 1, 1});
    gc::powersgd_session s(10, 20);
    REQUIRE_THROWS_AS(s.shape_fingerprint(201), gc::config_error);
  }
}
