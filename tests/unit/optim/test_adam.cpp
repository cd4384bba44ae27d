// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Adam, AdamW, AccumAdam and SGD: agreement with the reference pseudo-code, AccumAdam with
// T = 1 bit-identical to Adam, weight decay placement, and parameter validation.

#include <catch2/catch.hpp>

#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/sgd.hpp>

#include "../support/codec_support.hpp"

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace {

namespace gc = gradcomp;
using gradcomp_test::bits_of;

static_assert(gc::local_optimizer<gc::adam>);
static_assert(gc::local_optimizer<gc::accum_adam>);
static_assert(gc::local_optimizer<gc::sgd>);
struct not_an_optimizer {
  void step(std::span<float>, std::span<float const>) {}
  void set_lr(double) {}
  double lr() const { return 0; }
};
static_assert(!gc::local_optimizer<not_an_optimizer>);

// AccumAdam as written in the research spec (decentralized.md §3), in double.
struct reference_accum {
  gc::adam_options o;
  std::uint64_t T;
  std::vector<double> m, v, a;
  std::uint64_t t = 0;
  void step(std::vector<double>& x, std::vector<double> g) {
    if (m.empty()) m.assign(x.size(), 0.0), v.assign(x.size(), 0.0), a.assign(x.size(), 0.0);
    ++t;
    double const K = std::ceil(static_cast<double>(t) / static_cast<double>(T));
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (o.weight_decay != 0.0) {
        if (o.decay == gc::weight_decay_mode::decoupled) {
          x[i] *= 1.0 - o.lr * o.weight_decay;
        } else {
          g[i] += o.weight_decay * x[i];
        }
      }
      a[i] += g[i] / static_cast<double>(T);
      double const mh = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      double const vh = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      x[i] -= (o.lr / (1 - std::pow(o.beta1, K))) * mh /
              (std::sqrt(vh) / std::sqrt(1 - std::pow(o.beta2, K)) + o.eps);
      if (t % T == 0) {
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * a[i];
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * a[i] * a[i];
        a[i] = 0.0;
      }
    }
  }
};

std::vector<gc::adam_options> option_variants() {
  gc::adam_options plain;
  gc::adam_options l2;
  l2.weight_decay = 0.05;
  l2.lr = 3e-3;
  gc::adam_options w = gc::adamw_options(2e-3, 0.1);
  w.beta1 = 0.8;
  w.beta2 = 0.95;
  w.eps = 1e-6;
  return {plain, l2, w};
}

}  // namespace

TEST_CASE("adam and accum_adam agree with the reference pseudo-code", "[optim]") {
  for (auto const& o : option_variants()) {
    for (std::uint32_t T : {1u, 3u, 4u}) {
      INFO("T=" << T << " wd=" << o.weight_decay);
      gc::accum_adam opt(o, T);
      gc::adam plain(o);
      reference_accum ref{o, T, {}, {}, {}};
      std::vector<float> x = gradcomp_test::gaussian(64, 1);
      std::vector<float> xa = x;
      std::vector<double> xr(x.begin(), x.end());
      for (std::uint64_t s = 0; s < 24; ++s) {
        std::vector<float> const g = gradcomp_test::gaussian(64, 1000 + s, 0.5);
        opt.step(x, g);
        if (T == 1) plain.step(xa, g);
        ref.step(xr, std::vector<double>(g.begin(), g.end()));
        for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(x[i] == Approx(xr[i]).margin(2e-5));
      }
      if (T == 1) {
        for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(xa[i] == Approx(xr[i]).margin(2e-5));
      }
      // Moments are committed only at the end of a window.
      REQUIRE(opt.steps() == 24);
      for (std::size_t i = 0; i < 4; ++i) {
        REQUIRE(opt.first_moment()[i] == Approx(ref.m[i]).margin(1e-6));
        REQUIRE(opt.second_moment()[i] == Approx(ref.v[i]).margin(1e-6));
      }
    }
  }
}

TEST_CASE("accum_adam with T = 1 is bit-identical to adam", "[optim]") {
  for (auto o : option_variants()) {
    gc::adam a(o);
    gc::accum_adam b(o, 1);
    std::vector<float> xa = gradcomp_test::heavy_tailed(257, 7);
    xa[3] = -0.0f;
    std::vector<float> xb = xa;
    for (std::uint64_t s = 0; s < 60; ++s) {
      std::vector<float> g = gradcomp_test::heavy_tailed(257, 50 + s);
      g[5] = -0.0f;
      g[6] = 0.0f;
      if (s == 20) {  // a learning-rate schedule changes both alike
        a.set_lr(o.lr * 0.5);
        b.set_lr(o.lr * 0.5);
      }
      a.step(xa, g);
      b.step(xb, g);
      for (std::size_t i = 0; i < xa.size(); ++i) {
        REQUIRE(bits_of(xa[i]) == bits_of(xb[i]));
        REQUIRE(bits_of(a.first_moment()[i]) == bits_of(b.first_moment()[i]));
        REQUIRE(bits_of(a.second_moment()[i]) == bits_of(b.second_moment()[i]));
      }
    }
  }
}

TEST_CASE("adam: first step is lr * sign(g); eps outside the square root", "[optim]") {
  gc::adam_options o;
  o.lr = 0.01;
  o.eps = 1e-8;
  gc::adam a(o);
  std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> const g = {0.3f, -4.0f, 1e-3f, 0.0f};
  a.step(x, g);
  // m^ = g, v^ = g^2: step = lr * g / (|g| + eps).
  REQUIRE(x[0] == Approx(1.0 - 0.01).epsilon(1e-6));
  REQUIRE(x[1] == Approx(-2.0 + 0.01).epsilon(1e-6));
  REQUIRE(x[2] == Approx(0.5 - 0.01 * 1e-3 / (1e-3 + 1e-8)).epsilon(1e-6));
  REQUIRE(x[3] == 3.0f);
  // eps inside the square root would give lr * g / sqrt(g^2 + eps) = 0.01 * 1e-3/1.000005e-3;
  // with eps = 1e-4 the two placements differ clearly.
  gc::adam_options o2 = o;
  o2.eps = 1e-4;
  gc::adam b(o2);
  std::vector<float> y = {0.0f};
  std::vector<float> const h = {1e-4f};
  b.step(y, h);
  REQUIRE(y[0] == Approx(-0.01 * 1e-4 / (1e-4 + 1e-4)).epsilon(1e-5));
}

TEST_CASE("adamw decays the parameters; adam adds L2 to the gradient", "[optim]") {
  std::vector<float> const zero(3, 0.0f);
  gc::adam w(gc::adamw_options(0.1, 0.5));
  std::vector<float> x = {2.0f, -4.0f, 0.0f};
  w.step(x, zero);  // m = 0: only the decay acts
  REQUIRE(x == std::vector<float>{2.0f * 0.95f, -4.0f * 0.95f, 0.0f});

  gc::adam_options l2;
  l2.lr = 0.1;
  l2.weight_decay = 0.5;
  gc::adam a(l2);
  std::vector<float> y = {2.0f, -4.0f, 0.0f};
  a.step(y, zero);  // g = 0.5 x: a sign step of lr against x
  REQUIRE(y[0] == Approx(1.9).epsilon(1e-6));
  REQUIRE(y[1] == Approx(-3.9).epsilon(1e-6));
  REQUIRE(y[2] == 0.0f);
  REQUIRE(a.first_moment()[0] == Approx(0.1 * 1.0).epsilon(1e-6));
}

TEST_CASE("sgd follows torch.optim.SGD", "[optim]") {
  gc::sgd_options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  gc::sgd s(o);
  std::vector<float> x = {1.0f};
  s.step(x, std::vector<float>{2.0f});  // buf = 2; d = 2 + 0.9*2 = 3.8
  REQUIRE(x[0] == Approx(1.0 - 0.38).epsilon(1e-6));
  s.step(x, std::vector<float>{1.0f});  // buf = 0.9*2 + 1 = 2.8; d = 1 + 2.52 = 3.52
  REQUIRE(x[0] == Approx(1.0 - 0.38 - 0.352).epsilon(1e-6));
  gc::sgd plain(gc::sgd_options{0.5, 0.0, 0.0, false, 0.0});
  std::vector<float> y = {1.0f, 2.0f};
  plain.step(y, std::vector<float>{1.0f, -1.0f});
  REQUIRE(y == std::vector<float>{0.5f, 2.5f});
}

TEST_CASE("optimizers reject invalid parameters and mismatched spans", "[optim]") {
  gc::adam_options bad;
  bad.beta1 = 1.0;
  REQUIRE_THROWS_AS(gc::adam(bad), gc::config_error);
  bad = {};
  bad.beta2 = -0.1;
  REQUIRE_THROWS_AS(gc::adam(bad), gc::config_error);
  bad = {};
  bad.lr = std::nan("");
  REQUIRE_THROWS_AS(gc::adam(bad), gc::config_error);
  bad = {};
  bad.eps = -1;
  REQUIRE_THROWS_AS(gc::accum_adam(bad, 2), gc::config_error);
  bad = {};
  bad.weight_decay = -1;
  REQUIRE_THROWS_AS(gc::adam(bad), gc::config_error);
  REQUIRE_THROWS_AS(gc::accum_adam({}, 0), gc::config_error);
  REQUIRE_THROWS_WITH(gc::adam(bad), Catch::Contains("weight_decay"));

  gc::adam a;
  std::vector<float> x(4), g(3), g4(4, 1.0f), x5(5), g5(5);
  REQUIRE_THROWS_AS(a.step(x, g), gc::config_error);
  a.step(x, g4);
  REQUIRE_THROWS_AS(a.step(x5, g5), gc::config_error);  // state is for 4 elements
  REQUIRE_THROWS_AS(a.set_lr(-1.0), gc::config_error);
  REQUIRE(a.lr() == 1e-3);  // unchanged after the failed set

  REQUIRE_THROWS_AS(gc::sgd(gc::sgd_options{0.1, 0.0, 0.0, true, 0.0}), gc::config_error);
  REQUIRE_THROWS_AS(gc::sgd(gc::sgd_options{0.1, 1.0, 0.0, false, 0.0}), gc::config_error);
}
