// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test problems for the optimizers: a sum of per-rank diagonal quadratics
//   f_i(x) = 1/2 sum_d a_id (x_d - c_id)^2,  gradient a_i * (x - c_i) + sigma * noise,
// whose global minimizer is x*_d = sum_i a_id c_id / sum_i a_id; and helpers that run n ranks
// in one thread.

#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/optim/adam.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <vector>

namespace gradcomp_test {

struct quadratic_problem {
  std::size_t n = 8;
  std::size_t d = 32;
  double sigma = 0.0;
  std::vector<std::vector<float>> a, c;

  // Curvatures in [0.5, 2]; centers N(0, 1) shared by all ranks (heterogeneous = false) or
  // drawn per rank.
  quadratic_problem(std::size_t ranks, std::size_t dim, bool heterogeneous, double noise,
                    std::uint64_t seed)
      : n(ranks), d(dim), sigma(noise) {
    test_rng r(seed);
    std::vector<float> shared(d);
    for (auto& v : shared) v = static_cast<float>(r.gaussian());
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<float> ai(d), ci(d);
      for (std::size_t k = 0; k < d; ++k) {
        ai[k] = static_cast<float>(0.5 + 1.5 * r.uniform());
        ci[k] = heterogeneous ? static_cast<float>(r.gaussian()) : shared[k];
      }
      a.push_back(ai);
      c.push_back(ci);
    }
  }

  [[nodiscard]] std::vector<double> optimum() const {
    std::vector<double> x(d, 0.0);
    for (std::size_t k = 0; k < d; ++k) {
      double num = 0.0, den = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        num += static_cast<double>(a[i][k]) * c[i][k];
        den += a[i][k];
      }
      x[k] = num / den;
    }
    return x;
  }

  // Stochastic gradient of rank i at x for step s (deterministic noise).
  [[nodiscard]] std::vector<float> gradient(std::size_t i, std::vector<float> const& x,
                                            std::uint64_t s) const {
    test_rng r(0x9E37u * (s + 1) + 7919u * i + 1);
    std::vector<float> g(d);
    for (std::size_t k = 0; k < d; ++k) {
      g[k] = static_cast<float>(a[i][k] * (x[k] - c[i][k]) + sigma * r.gaussian());
    }
    return g;
  }
};

// Cosine learning rate from lr0 to 0 over `steps`.
inline double cosine_lr(double lr0, std::uint64_t s, std::uint64_t steps) {
  return 0.5 * lr0 *
         (1.0 + std::cos(3.141592653589793 * static_cast<double>(s) / static_cast<double>(steps)));
}

inline double max_abs_error(std::vector<float> const& x, std::vector<double> const& ref) {
  double e = 0.0;
  for (std::size_t k = 0; k < x.size(); ++k) e = std::max(e, std::abs(x[k] - ref[k]));
  return e;
}

// The gradient g as tensor `id` of an optimizer step.
inline gradcomp::tensor_view<float const> tensor_of(std::vector<float> const& g,
                                                    gradcomp::tensor_id id) {
  return gradcomp::tensor_view<float const>(std::span<float const>(g), id);
}

// The codec context of step s (the codecs' random streams are keyed by it).
inline gradcomp::codec_context step_context(std::uint64_t s) {
  gradcomp::codec_context c;
  c.step = static_cast<std::uint32_t>(s);
  return c;
}

// The momentum mass a two-way collective still holds for tensor `id` of d elements on this rank:
// its worker residuals of every shard plus its server residual of the shard it owns (the
// error-feedback conservation tests of the 1-bit Adam optimizers sum this over the ranks).
template <class TwoWay>
std::vector<double> two_way_residual_mass(TwoWay const& tw, gradcomp::tensor_id id, std::size_t d,
                                          std::uint32_t rank, std::uint32_t world) {
  std::vector<double> res(d, 0.0);
  for (std::uint32_t sh = 0; sh < world; ++sh) {
    auto const range = gradcomp::shard_range(d, sh, world);
    std::size_t const b = range.first, e = range.second;  // captured below
    gradcomp::shard_key const key{id, sh, world};
    auto const add = [&](auto const& r) {
      if (r.size() != e - b)
        throw std::runtime_error("two_way_residual_mass: a residual of another size");
      for (std::size_t i = b; i < e; ++i) res[i] += r[i - b];
    };
    add(tw.worker_residual(key));
    if (sh == rank) add(tw.server_residual(key));
  }
  return res;
}

// The error-feedback conservation check of the 1-bit Adam optimizers that compress each rank's
// momentum: runs `steps` steps of the optimizer `make()` returns on `world` in-process ranks
// over problem `p` (tensor `id`) and returns, per element, the sums over the steps and ranks
// of what the ranks compressed (`local(opt)` after each step) minus what was delivered
// (W * `delivered(opt)`) minus what the residuals still hold, and the largest |sum compressed|
// and |residual| (the scale and the control). Conservation: the first is rounding only.
struct conservation_result {
  double worst = 0.0, scale = 0.0, lag = 0.0;
};
template <class Make, class Local, class Delivered>
conservation_result check_two_way_conservation(quadratic_problem const& p, int world,
                                               gradcomp::tensor_id id, std::uint64_t steps,
                                               Make make, Local local, Delivered delivered) {
  std::mutex mu;
  std::vector<double> out(p.d, 0.0), given(p.d, 0.0), left(p.d, 0.0);
  gradcomp::run_in_process(world, [&](gradcomp::in_process_communicator& comm) {
    auto const r = static_cast<std::size_t>(comm.rank());
    auto opt = make();
    std::vector<float> x(p.d, 0.0f);
    std::vector<double> mine(p.d, 0.0), got(p.d, 0.0);
    for (std::uint64_t s = 0; s < steps; ++s) {
      std::vector<float> const g = p.gradient(r, x, s);
      opt.step(comm, x, tensor_of(g, id), step_context(s));
      for (std::size_t i = 0; i < p.d; ++i) {
        mine[i] += local(opt)[i];
        got[i] += static_cast<double>(delivered(opt)[i]) * world;
      }
    }
    std::vector<double> const res = two_way_residual_mass(
        opt.two_way(), id, p.d, static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(world));
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = 0; i < p.d; ++i) {
      given[i] += mine[i];
      left[i] += res[i];
      if (r == 0) out[i] = got[i];
    }
  });
  conservation_result c;
  for (std::size_t i = 0; i < p.d; ++i) {
    c.worst = std::max(c.worst, std::abs(given[i] - out[i] - left[i]));
    c.scale = std::max(c.scale, std::abs(given[i]));
    c.lag = std::max(c.lag, std::abs(left[i]));
  }
  return c;
}

}  // namespace gradcomp_test
