// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// A plain reference for `local_update` with the identity codec: W replicas simulated on one
// thread with the header's formulas (the pseudo-gradients summed in rank order, times 1/W, the
// outer step, the fragment schedule and the delayed mixing), and the deterministic inner steps
// and weights the tests feed it. Shared by the in-process and the MPI tests.

#include <gradcomp/optim/local_update.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace local_update_test {

using weights_t = std::vector<std::vector<float>>;

inline std::vector<std::size_t> lu_sizes() { return {300, 7, 129, 64, 1000}; }

// The inner step of rank r at step t: w -= 0.05 * g(r, t, tensor, i), deterministic, rank-dependent.
inline void lu_inner_step(weights_t& w, int rank, std::uint64_t t) {
  for (std::size_t k = 0; k < w.size(); ++k)
    for (std::size_t i = 0; i < w[k].size(); ++i) {
      double const g = std::sin(0.031 * static_cast<double>(i) + 0.9 * static_cast<double>(k) +
                                0.37 * rank + 0.21 * static_cast<double>(t)) +
                       0.3 * std::cos(0.7 * static_cast<double>(i * (k + 1)) + rank);
      w[k][i] -= 0.05f * static_cast<float>(g);
    }
}

inline weights_t lu_initial(int rank) {
  weights_t w;
  for (std::size_t n : lu_sizes()) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i) + static_cast<double>(n))) +
             0.5f * static_cast<float>(rank);  // ranks differ: start must make them identical
    w.push_back(std::move(v));
  }
  return w;
}

inline std::vector<std::span<float>> lu_spans(weights_t& w) {
  std::vector<std::span<float>> s;
  for (auto& v : w) s.emplace_back(v);
  return s;
}

inline bool lu_same(weights_t const& a, weights_t const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].size() != b[k].size() || std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// The plain reference with the identity codec on W simulated replicas (the header's formulas).
struct lu_reference {
  gradcomp::local_update_options opt;
  int world;
  weights_t sync;
  std::vector<weights_t> w;         // per rank
  weights_t u;                      // nesterov
  std::vector<weights_t> e;         // sparseloco, per rank
  std::vector<std::uint64_t> due;   // per fragment: mixing step

  lu_reference(gradcomp::local_update_options o, int world_size) : opt(std::move(o)), world(world_size) {
    gradcomp::local_update const probe(opt);  // resolves the defaults
    opt = probe.options();
    weights_t const w0 = lu_initial(0);
    sync = w0;
    w.assign(static_cast<std::size_t>(world), w0);
    u = w0;
    for (auto& v : u) std::fill(v.begin(), v.end(), 0.0f);
    e.assign(static_cast<std::size_t>(world), u);
    due.assign(opt.fragments, 0);
  }

  void run(std::uint64_t steps) {
    auto const H = opt.sync_every, F = opt.fragments;
    float const lr = static_cast<float>(*opt.outer_lr), mu = static_cast<float>(*opt.outer_momentum);
    float const alpha = static_cast<float>(opt.mix);
    float const inv = 1.0f / static_cast<float>(world);
    bool const sparse = opt.outer == "sparseloco", nesterov = opt.outer == "nesterov";
    for (std::uint64_t t = 1; t <= steps; ++t) {
      for (int r = 0; r < world; ++r) lu_inner_step(w[static_cast<std::size_t>(r)], r, t);
      for (std::uint64_t f = 0; f < F; ++f) {
        if (due[f] == t) {
          for (std::size_t k = f; k < sync.size(); k += F)
            for (auto& wr : w)
              for (std::size_t i = 0; i < sync[k].size(); ++i) wr[k][i] = alpha * wr[k][i] + (1.0f - alpha) * sync[k][i];
          due[f] = 0;
        }
      }
      for (std::uint64_t f = 0; f < F; ++f) {
        std::uint64_t const o = f * H / F;
        if (!(t >= o && (t - o) % H == 0)) continue;
        for (std::size_t k = f; k < sync.size(); k += F) {
          for (std::size_t i = 0; i < sync[k].size(); ++i) {
            float sum = 0.0f;
            for (int r = 0; r < world; ++r) {
              auto const rr = static_cast<std::size_t>(r);
              float d = sync[k][i] - w[rr][k][i];
              if (sparse) d = mu * e[rr][k][i] + d;  // identity codec: C(e) = e, e - D(C(e)) = 0
              if (sparse) e[rr][k][i] = d - d;
              sum = r == 0 ? d : sum + d;
            }
            float const m = inv * sum;
            if (nesterov) {
              u[k][i] = mu * u[k][i] + m;
              sync[k][i] = sync[k][i] - lr * (m + mu * u[k][i]);
            } else {
              sync[k][i] = sync[k][i] - lr * m;
            }
          }
          if (opt.overlap == 0)
            for (auto& wr : w) wr[k] = sync[k];
        }
        if (opt.overlap != 0) due[f] = t + opt.overlap;
      }
    }
  }
};

}  // namespace local_update_test
