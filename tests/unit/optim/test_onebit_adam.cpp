// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// 1-bit Adam's warm-up-then-compress scheme (optim/onebit_adam.hpp): exact Adam during the
// warm-up, a frozen second moment after it, error feedback that conserves the momentum's mass,
// bit-identical resumption from a checkpoint, convergence with onebit and top-k.

#include <catch2/catch.hpp>

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/onebit_adam.hpp>

#include "../support/rank_check.hpp"
#include "optim_support.hpp"

#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace {

namespace gc = gradcomp;
using gradcomp_test::quadratic_problem;
using gradcomp_test::two_way_residual_mass;

gc::tensor_view<float const> view(std::vector<float> const& g) {
  return gradcomp_test::tensor_of(g, gc::tensor_id{3});
}

gc::codec_context context(std::uint64_t step) { return gradcomp_test::step_context(step); }

}  // namespace

TEST_CASE("onebit_adam: the warm-up is Adam on the mean gradient, bit for bit; then v freezes",
          "[optim][onebit_adam]") {
  quadratic_problem const p(3, 3000, true, 0.3, 41);
  for (auto const& ao : {gc::adam_options{.lr = 0.01}, gc::adamw_options(1e-2, 0.1)}) {
    REQUIRE_NOTHROW(gc::run_in_process(3, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      gc::onebit_adam<gc::any_codec> opt(gc::make_codec("onebit"), {.adam = ao, .warmup = 6});
      gc::adam ref(ao);
      std::vector<float> x(p.d, 0.5f), y(p.d, 0.5f);
      for (std::uint64_t s = 0; s < 6; ++s) {
        std::vector<float> const g = p.gradient(r, x, s);
        // the reference: every rank's gradient summed in rank order, times 1/3, then adam
        std::vector<float> mean(p.d, 0.0f);
        for (std::size_t k = 0; k < 3; ++k) {
          std::vector<float> const gk = p.gradient(k, y, s);
          for (std::size_t i = 0; i < p.d; ++i) mean[i] += gk[i];
        }
        for (float& v : mean) v = v * (1.0f / 3.0f);
        ref.step(y, mean);
        RANK_REQUIRE(!opt.compressing());
        gc::collective_result const res = opt.step(comm, x, view(g), context(s));
        RANK_REQUIRE(x == y);
        RANK_REQUIRE(res.packet_bytes == p.d * 4);
      }
      RANK_REQUIRE(opt.compressing() && opt.steps() == 6);
      std::vector<float> const v0(opt.second_moment().begin(), opt.second_moment().end());
      RANK_REQUIRE(
          std::equal(v0.begin(), v0.end(), ref.second_moment().begin(), ref.second_moment().end()));
      for (std::uint64_t s = 6; s < 12; ++s) {
        std::vector<float> const g = p.gradient(r, x, s);
        std::vector<float> const before = x;
        gc::collective_result const res = opt.step(comm, x, view(g), context(s));
        RANK_REQUIRE(x != before);
        // compressed: far below the dense ring all-reduce of the warm-up
        RANK_REQUIRE(res.wire_bytes < gc::detail::ring_all_reduce_bytes(p.d * 4, 3) / 4);
        RANK_REQUIRE(std::equal(v0.begin(), v0.end(), opt.second_moment().begin(),
                                opt.second_moment().end()));
      }
      RANK_REQUIRE(opt.steps() == 12);
    }));
  }
}

TEST_CASE(
    "onebit_adam: the variance refresh replaces v at steps 2T, 4T, 8T only, with the ranks' mean",
    "[optim][onebit_adam]") {
  quadratic_problem const p(2, 400, true, 0.3, 23);
  std::mutex mu;
  std::vector<std::vector<float>> vs(2);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::onebit_adam<gc::any_codec> opt(
        gc::make_codec("onebit"), {.adam = {.lr = 0.01}, .warmup = 3, .refresh_variance = true});
    std::vector<float> x(p.d, 0.2f);
    std::vector<float> v(p.d, 0.0f);
    for (std::uint64_t s = 0; s < 26; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      gc::collective_result const res = opt.step(comm, x, view(g), context(s));
      std::vector<float> const now(opt.second_moment().begin(), opt.second_moment().end());
      std::uint64_t const t = s + 1;
      bool const refresh = t == 6 || t == 12 || t == 24;
      if (t > 3) {
        RANK_REQUIRE((now != v) == refresh);
        RANK_REQUIRE((res.packet_bytes >= p.d * 4) == refresh);  // the refresh's all-reduce
      }
      v = now;
    }
    std::lock_guard<std::mutex> lock(mu);
    vs[r] = v;
  }));
  CHECK(vs[0] == vs[1]);
}

TEST_CASE("onebit_adam: compressing the update m/d is compressing m, scaled by the fixed 1/d",
          "[optim][onebit_adam]") {
  // With the identity codec both forms apply the same update, up to rounding.
  quadratic_problem const p(2, 64, true, 0.3, 29);
  REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::onebit_adam<gc::any_codec> a(gc::make_codec("identity"),
                                     {.adam = {.lr = 0.01}, .warmup = 3});
    gc::onebit_adam<gc::any_codec> b(gc::make_codec("identity"),
                                     {.adam = {.lr = 0.01}, .warmup = 3, .precondition = true});
    std::vector<float> x(p.d, 0.3f), y(p.d, 0.3f);
    for (std::uint64_t s = 0; s < 20; ++s) {
      a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      b.step(comm, y, view(p.gradient(r, y, s)), context(s));
    }
    for (std::size_t i = 0; i < p.d; ++i) RANK_REQUIRE(std::abs(x[i] - y[i]) < 1e-5f);
  }));
  CHECK_THROWS_AS(
      gc::onebit_adam<gc::any_codec>(gc::make_codec("onebit"),
                                     {.warmup = 1, .refresh_variance = true, .precondition = true}),
      gc::config_error);
  CHECK_THROWS_AS(gc::onebit_adam<gc::any_codec>(
                      gc::make_codec("onebit"),
                      {.warmup = 1, .compress_momentum = false, .precondition = true}),
                  gc::config_error);
}

TEST_CASE("onebit_adam: every rank holds the same parameters and momentum",
          "[optim][onebit_adam]") {
  quadratic_problem const p(4, 37, true, 0.3, 5);
  std::mutex mu;
  std::vector<std::vector<float>> xs(4), ms(4);
  REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::onebit_adam<gc::any_codec> opt(gc::make_codec("topk:ratio=0.1"),
                                       {.adam = {.lr = 0.02}, .warmup = 3});
    std::vector<float> x(p.d, 0.0f);
    for (std::uint64_t s = 0; s < 20; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      opt.step(comm, x, view(g), context(s));
    }
    std::lock_guard<std::mutex> lock(mu);
    xs[r] = x;
    ms[r].assign(opt.first_moment().begin(), opt.first_moment().end());
  }));
  for (std::size_t r = 1; r < 4; ++r) {
    CHECK(xs[r] == xs[0]);
    CHECK(ms[r] == ms[0]);
  }
}

TEST_CASE("onebit_adam: error feedback conserves the momentum's mass", "[optim][onebit_adam]") {
  // Summed over the compressed steps: what was delivered (W * m) plus every worker and server
  // residual equals the sum of the ranks' local momenta.
  constexpr int world = 2;  // a power of two: W * m is the decoded sum exactly
  quadratic_problem const p(world, 45, true, 0.5, 9);
  std::mutex mu;
  std::vector<double> delivered(p.d, 0.0), given(p.d, 0.0), left(p.d, 0.0);
  REQUIRE_NOTHROW(gc::run_in_process(world, [&](gc::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    gc::onebit_adam<gc::any_codec> opt(gc::make_codec("onebit"),
                                       {.adam = {.lr = 0.01}, .warmup = 2});
    std::vector<float> x(p.d, 0.0f);
    std::vector<double> mine(p.d, 0.0), got(p.d, 0.0);
    for (std::uint64_t s = 0; s < 25; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      bool const compressed = opt.compressing();
      opt.step(comm, x, view(g), context(s));
      if (!compressed) continue;
      for (std::size_t i = 0; i < p.d; ++i) {
        mine[i] += opt.local_momentum()[i];
        got[i] += static_cast<double>(opt.first_moment()[i]) * world;
      }
    }
    std::vector<double> const res = two_way_residual_mass(opt.two_way(), gc::tensor_id{3}, p.d,
                                                          static_cast<std::uint32_t>(r), world);
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = 0; i < p.d; ++i) {
      given[i] += mine[i];
      left[i] += res[i];
      if (r == 0) delivered[i] = got[i];
    }
  }));
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < p.d; ++i) {
    worst = std::max(worst, std::abs(given[i] - delivered[i] - left[i]));
    scale = std::max(scale, std::abs(given[i]));
  }
  INFO(worst << " of " << scale);
  CHECK(scale > 1.0);
  CHECK(worst < 1e-5 * scale);
}

TEST_CASE("onebit_adam: a checkpoint resumes bit-identically, before and after the freeze",
          "[optim][onebit_adam]") {
  quadratic_problem const p(2, 33, true, 0.3, 17);
  for (std::uint64_t at : {2u, 4u, 9u}) {  // in the warm-up, at the freeze, compressing
    INFO(at);
    REQUIRE_NOTHROW(gc::run_in_process(2, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      gc::onebit_adam_options const o{
          .adam = {.lr = 0.02}, .warmup = 4, .refresh_variance = at == 9};
      gc::onebit_adam<gc::any_codec> a(gc::make_codec("topk:ratio=0.2"), o);
      std::vector<float> x(p.d, 0.1f);
      for (std::uint64_t s = 0; s < at; ++s) a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      std::vector<std::byte> const saved = a.save();
      gc::onebit_adam<gc::any_codec> b(gc::make_codec("topk:ratio=0.2"), o);
      b.load(saved);
      RANK_REQUIRE(b.save() == saved);
      std::vector<float> y = x;
      for (std::uint64_t s = at; s < 14; ++s) {
        a.step(comm, x, view(p.gradient(r, x, s)), context(s));
        b.step(comm, y, view(p.gradient(r, y, s)), context(s));
        RANK_REQUIRE(x == y);
      }
      RANK_REQUIRE(a.save() == b.save());
      // another warm-up, a truncated buffer: format_error, nothing changed
      gc::onebit_adam<gc::any_codec> c(gc::make_codec("topk:ratio=0.2"),
                                       {.adam = {.lr = 0.02}, .warmup = 5});
      bool threw = false;
      try {
        c.load(saved);
      } catch (gc::format_error const&) {
        threw = true;
      }
      RANK_REQUIRE(threw);
      threw = false;
      try {
        b.load(std::span<std::byte const>(saved).first(saved.size() - 3));
      } catch (gc::format_error const&) {
        threw = true;
      }
      RANK_REQUIRE(threw && b.save() == a.save());
    }));
  }
}

TEST_CASE("onebit_adam reaches the optimum with onebit and top-k; bad arguments are errors",
          "[optim][onebit_adam]") {
  quadratic_problem const p(4, 64, true, 0.05, 32);
  std::vector<double> const opt = p.optimum();
  for (auto const& run : {std::pair{"onebit", true}, std::pair{"topk:ratio=0.1", true},
                          std::pair{"identity", true}, std::pair{"onebit", false}}) {
    char const* const codec = run.first;
    bool const momentum = run.second;
    std::mutex mu;
    double err = 0.0;
    REQUIRE_NOTHROW(gc::run_in_process(4, [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      gc::onebit_adam<gc::any_codec> a(
          gc::make_codec(codec),
          {.adam = {.lr = 0.05}, .warmup = 50, .compress_momentum = momentum});
      std::vector<float> x(p.d, 0.0f);
      for (std::uint64_t s = 0; s < 1500; ++s) {
        a.set_lr(gradcomp_test::cosine_lr(0.05, s, 1500) + 1e-5);
        a.step(comm, x, view(p.gradient(r, x, s)), context(s));
      }
      std::lock_guard<std::mutex> lock(mu);
      err = std::max(err, gradcomp_test::max_abs_error(x, opt));
    }));
    INFO(codec << (momentum ? " (momentum): " : " (gradient): ") << err);
    CHECK(err < 3e-2);
  }
  CHECK_THROWS_AS(gc::onebit_adam<gc::any_codec>(gc::make_codec("onebit"), {.warmup = 0}),
                  gc::config_error);
  CHECK_THROWS_AS(
      gc::onebit_adam<gc::any_codec>(gc::make_codec("onebit"), {.adam = {.lr = -1.0}, .warmup = 1}),
      gc::config_error);
  REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
    gc::onebit_adam<gc::any_codec> a(gc::make_codec("onebit"), {.warmup = 1});
    std::vector<float> x(4, 0.0f), g(5, 1.0f);
    bool threw = false;
    try {
      a.step(comm, x, view(g));
    } catch (gc::config_error const&) {
      threw = true;
    }
    RANK_REQUIRE(threw);
  }));
}
