// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the fault tests on in-process ranks (fault_matrix_support.hpp) and on MPI ranks
// (tests/mpi/faults_support.hpp) share: deterministic gradients, byte helpers, and one step of
// the gradient pipeline on a three-tensor model.

#include <gradcomp/pipeline/pipeline.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace fault_steps {

namespace gc = gradcomp;
using bytes = std::vector<std::byte>;

template <class T>
void append(bytes& b, std::span<T const> v) {
  auto const s = std::as_bytes(v);
  b.insert(b.end(), s.begin(), s.end());
}
template <class T>
bytes to_bytes(std::vector<T> const& v) {
  bytes b;
  append(b, std::span<T const>(v));
  return b;
}

/// Deterministic heavy-tailed gradient of (rank, step, tensor).
inline std::vector<float> gradient(int rank, int step, std::size_t n, std::uint32_t tensor = 0) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    double const x =
        std::sin(0.017 * static_cast<double>(i) + 0.9 * tensor + 0.31 * rank + 0.23 * step);
    double const spike = (i * 2654435761u + tensor * 97u + static_cast<std::size_t>(rank) * 13u +
                          static_cast<std::size_t>(step) * 7u) %
                                     37u ==
                                 0
                             ? 6.0
                             : 1.0;
    g[i] = static_cast<float>(spike * x * x * x + 0.01 * std::cos(0.3 * static_cast<double>(i)));
  }
  return g;
}

/// One step of `pipe` over a model of three tensors (two compressed, a small one between them)
/// on rank `c.rank()`; returns the averaged gradients it wrote, as bytes.
template <class Comm>
bytes pipeline_step(gc::gradient_pipeline& pipe, Comm& c, int step) {
  std::vector<std::size_t> const sizes = {1500, 100, 2500};
  std::vector<std::vector<float>> g;
  std::vector<gc::tensor_view<float>> views;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    g.push_back(gradient(c.rank(), step, sizes[t], static_cast<std::uint32_t>(t)));
  for (std::size_t t = 0; t < sizes.size(); ++t)
    views.emplace_back(std::span<float>(g[t]), static_cast<gc::tensor_id>(t));
  pipe.step(c, views, {.backprop_s = 0.01, .batch_size = 32, .learning_rate = 0.1});
  bytes out;
  for (auto const& v : g) append(out, std::span<float const>(v));
  return out;
}

}  // namespace fault_steps
