// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The model of the training example: a multi-layer perceptron with ReLU hidden layers, a
/// softmax cross-entropy loss and SGD with momentum, written out by hand (forward, backward,
/// three small matrix products) so that every gradient is a plain float buffer a newcomer can
/// follow into the compression pipeline.
///
/// Layout: layer l maps `sizes[l]` inputs to `sizes[l+1]` outputs with a weight matrix W
/// (`sizes[l]` rows x `sizes[l+1]` columns, row-major) and a bias b. The parameters are kept as
/// one list of tensors, W0, b0, W1, b1, ...; tensor t has gradcomp tensor id t, so every rank
/// keys the same error-feedback state and random stream to the same tensor.

#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace train {

// ---------------------------------------------------------------------------------------------
// Random numbers: xoshiro256** seeded by splitmix64, with the polar method for normals. The
// standard distributions are not specified bit for bit; these are, on every platform.
// ---------------------------------------------------------------------------------------------
class rng {
 public:
  explicit rng(std::uint64_t seed) {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  std::uint64_t next() noexcept {
    std::uint64_t const r = std::rotl(s_[1] * 5, 7) * 9;
    std::uint64_t const t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return r;
  }
  /// Uniform in (0, 1).
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }
  /// Uniform integer in [0, n).
  std::size_t below(std::size_t n) noexcept {
    return static_cast<std::size_t>(uniform() * static_cast<double>(n)) % n;
  }
  /// Standard normal.
  double normal() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    for (;;) {
      double const u = 2.0 * uniform() - 1.0, v = 2.0 * uniform() - 1.0;
      double const q = u * u + v * v;
      if (q >= 1.0 || q == 0.0) continue;
      double const f = std::sqrt(-2.0 * std::log(q) / q);
      spare_ = v * f;
      has_spare_ = true;
      return u * f;
    }
  }

 private:
  std::uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// ---------------------------------------------------------------------------------------------
// Matrix products (row-major). Tiled so that a tile of the weight matrix stays in cache while
// every row of the batch uses it, with the innermost loop running along contiguous memory, which
// the compiler vectorizes at -O2/-O3.
// ---------------------------------------------------------------------------------------------
namespace kernels {

inline constexpr std::size_t tile_k = 128;  // rows of W per tile
inline constexpr std::size_t tile_n = 256;  // columns of W per tile

/// y[m x n] = x[m x k] * w[k x n] + bias[n] (bias may be null: then zero).
inline void matmul_nn(float const* x, float const* w, float const* bias, float* y, std::size_t m,
                      std::size_t k, std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    float* yi = y + i * n;
    if (bias != nullptr)
      std::copy(bias, bias + n, yi);
    else
      std::fill(yi, yi + n, 0.0f);
  }
  for (std::size_t j0 = 0; j0 < n; j0 += tile_n) {
    std::size_t const j1 = std::min(n, j0 + tile_n);
    for (std::size_t k0 = 0; k0 < k; k0 += tile_k) {
      std::size_t const k1 = std::min(k, k0 + tile_k);
      std::size_t i = 0;
      for (; i + 4 <= m; i += 4) {  // four rows share each load of a row of W
        float* y0 = y + i * n;
        float* y1 = y0 + n;
        float* y2 = y1 + n;
        float* y3 = y2 + n;
        for (std::size_t p = k0; p < k1; ++p) {
          float const a0 = x[i * k + p], a1 = x[(i + 1) * k + p], a2 = x[(i + 2) * k + p],
                      a3 = x[(i + 3) * k + p];
          float const* wp = w + p * n;
          for (std::size_t j = j0; j < j1; ++j) {
            float const v = wp[j];
            y0[j] += a0 * v;
            y1[j] += a1 * v;
            y2[j] += a2 * v;
            y3[j] += a3 * v;
          }
        }
      }
      for (; i < m; ++i) {
        float* yi = y + i * n;
        for (std::size_t p = k0; p < k1; ++p) {
          float const a = x[i * k + p];
          float const* wp = w + p * n;
          for (std::size_t j = j0; j < j1; ++j) yi[j] += a * wp[j];
        }
      }
    }
  }
}

/// dw[k x n] = x^T * dy, with x [m x k] and dy [m x n] (overwrites dw).
inline void matmul_tn(float const* x, float const* dy, float* dw, std::size_t m, std::size_t k,
                      std::size_t n) {
  std::fill(dw, dw + k * n, 0.0f);
  for (std::size_t j0 = 0; j0 < n; j0 += tile_n) {
    std::size_t const j1 = std::min(n, j0 + tile_n);
    std::size_t p = 0;
    for (; p + 4 <= k; p += 4) {  // four rows of dw share each load of a row of dy
      float* d0 = dw + p * n;
      float* d1 = d0 + n;
      float* d2 = d1 + n;
      float* d3 = d2 + n;
      for (std::size_t i = 0; i < m; ++i) {
        float const* xi = x + i * k + p;
        float const a0 = xi[0], a1 = xi[1], a2 = xi[2], a3 = xi[3];
        float const* g = dy + i * n;
        for (std::size_t j = j0; j < j1; ++j) {
          float const v = g[j];
          d0[j] += a0 * v;
          d1[j] += a1 * v;
          d2[j] += a2 * v;
          d3[j] += a3 * v;
        }
      }
    }
    for (; p < k; ++p) {
      float* d = dw + p * n;
      for (std::size_t i = 0; i < m; ++i) {
        float const a = x[i * k + p];
        float const* g = dy + i * n;
        for (std::size_t j = j0; j < j1; ++j) d[j] += a * g[j];
      }
    }
  }
}

/// dx[m x k] = dy[m x n] * w^T, with w [k x n] (overwrites dx).
inline void matmul_nt(float const* dy, float const* w, float* dx, std::size_t m, std::size_t k,
                      std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    float const* g = dy + i * n;
    for (std::size_t p = 0; p < k; ++p) {
      float const* wp = w + p * n;
      float acc[8] = {};  // eight independent partial sums: vectorizable without reassociation
      std::size_t j = 0;
      for (; j + 8 <= n; j += 8) {
        for (std::size_t l = 0; l < 8; ++l) acc[l] += g[j + l] * wp[j + l];
      }
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; j < n; ++j) s += g[j] * wp[j];
      dx[i * k + p] = s;
    }
  }
}

}  // namespace kernels

// ---------------------------------------------------------------------------------------------
// The network.
// ---------------------------------------------------------------------------------------------

/// Activations and gradients of one batch, reused from step to step.
struct workspace {
  std::vector<std::vector<float>> h;   ///< h[0] = input, h[l+1] = output of layer l
  std::vector<std::vector<float>> dh;  ///< gradient of the loss w.r.t. h[l+1]
  std::size_t batch = 0;
};

/// Loss and accuracy of a batch.
struct batch_result {
  double loss = 0.0;        ///< mean cross-entropy over the batch
  std::size_t correct = 0;  ///< argmax(logits) == label
};

/// A multi-layer perceptron (see file comment).
class mlp {
 public:
  /// Layer widths, input first, number of classes last (at least two entries, all > 0).
  /// Weights are drawn from N(0, 2 / fan_in) (He), biases start at zero, all from `seed`.
  mlp(std::vector<std::size_t> sizes, std::uint64_t seed) : sizes_(std::move(sizes)) {
    if (sizes_.size() < 2) {
      throw gradcomp::config_error("train: an MLP needs at least an input and an output size");
    }
    for (std::size_t s : sizes_) {
      if (s == 0) throw gradcomp::config_error("train: MLP layer sizes must be positive");
    }
    rng r(seed);
    for (std::size_t l = 0; l + 1 < sizes_.size(); ++l) {
      std::vector<float> w(sizes_[l] * sizes_[l + 1]);
      double const sd = std::sqrt(2.0 / static_cast<double>(sizes_[l]));
      for (float& v : w) v = static_cast<float>(sd * r.normal());
      params_.push_back(std::move(w));
      params_.emplace_back(sizes_[l + 1], 0.0f);
    }
    for (auto const& p : params_) grads_.emplace_back(p.size(), 0.0f);
  }

  [[nodiscard]] std::vector<std::size_t> const& sizes() const noexcept { return sizes_; }
  [[nodiscard]] std::size_t layers() const noexcept { return sizes_.size() - 1; }
  [[nodiscard]] std::size_t inputs() const noexcept { return sizes_.front(); }
  [[nodiscard]] std::size_t classes() const noexcept { return sizes_.back(); }

  /// Parameter tensors W0, b0, W1, b1, ...
  [[nodiscard]] std::vector<std::vector<float>>& params() noexcept { return params_; }
  [[nodiscard]] std::vector<std::vector<float>> const& params() const noexcept { return params_; }
  /// Gradients of the last `backward`, same layout as `params`.
  [[nodiscard]] std::vector<std::vector<float>>& grads() noexcept { return grads_; }
  [[nodiscard]] std::vector<std::vector<float>> const& grads() const noexcept { return grads_; }

  /// Total number of parameters.
  [[nodiscard]] std::size_t parameter_count() const noexcept {
    std::size_t n = 0;
    for (auto const& p : params_) n += p.size();
    return n;
  }

  /// Forward pass of `batch` rows of `x` (each `inputs()` floats). Fills `ws.h`; the logits are
  /// `ws.h.back()`.
  void forward(std::span<float const> x, std::size_t batch, workspace& ws) const {
    if (x.size() != batch * inputs()) {
      throw gradcomp::config_error("train: forward got " + std::to_string(x.size()) +
                                   " input values for a batch of " + std::to_string(batch) + " x " +
                                   std::to_string(inputs()));
    }
    prepare(ws, batch);
    std::copy(x.begin(), x.end(), ws.h[0].begin());
    for (std::size_t l = 0; l < layers(); ++l) {
      kernels::matmul_nn(ws.h[l].data(), params_[2 * l].data(), params_[2 * l + 1].data(),
                         ws.h[l + 1].data(), batch, sizes_[l], sizes_[l + 1]);
      if (l + 1 < layers()) {
        for (float& v : ws.h[l + 1]) v = v > 0.0f ? v : 0.0f;  // ReLU
      }
    }
  }

  /// Softmax cross-entropy of the logits in `ws` against `labels`; also writes d(loss)/d(logits)
  /// (for the mean loss over the batch) into `ws.dh.back()`.
  batch_result loss(std::span<std::uint8_t const> labels, workspace& ws) const {
    std::size_t const c = classes();
    if (labels.size() != ws.batch) {
      throw gradcomp::config_error("train: " + std::to_string(labels.size()) +
                                   " labels for a batch of " + std::to_string(ws.batch));
    }
    batch_result r;
    float const inv = 1.0f / static_cast<float>(ws.batch);
    std::vector<float>& d = ws.dh.back();
    for (std::size_t i = 0; i < ws.batch; ++i) {
      float const* z = ws.h.back().data() + i * c;
      float* g = d.data() + i * c;
      std::size_t const y = labels[i];
      if (y >= c) {
        throw gradcomp::config_error("train: label " + std::to_string(y) + " is not below the " +
                                     std::to_string(c) + " classes of the model");
      }
      std::size_t const best = static_cast<std::size_t>(std::max_element(z, z + c) - z);
      float const zmax = z[best];
      double sum = 0.0;
      for (std::size_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(z[j] - zmax));
      double const log_sum = std::log(sum);
      r.loss += log_sum - static_cast<double>(z[y] - zmax);
      if (best == y) ++r.correct;
      for (std::size_t j = 0; j < c; ++j) {
        double const p = std::exp(static_cast<double>(z[j] - zmax) - log_sum);
        g[j] = static_cast<float>(p - (j == y ? 1.0 : 0.0)) * inv;
      }
    }
    r.loss /= static_cast<double>(ws.batch);
    return r;
  }

  /// Backward pass after `forward` and `loss`: writes every parameter's gradient into `grads()`.
  void backward(workspace& ws) {
    std::size_t const m = ws.batch;
    for (std::size_t l = layers(); l-- > 0;) {
      std::vector<float>& dz = ws.dh[l];  // d(loss)/d(output of layer l), ReLU already applied
      kernels::matmul_tn(ws.h[l].data(), dz.data(), grads_[2 * l].data(), m, sizes_[l],
                         sizes_[l + 1]);
      std::vector<float>& db = grads_[2 * l + 1];
      std::fill(db.begin(), db.end(), 0.0f);
      for (std::size_t i = 0; i < m; ++i) {
        float const* g = dz.data() + i * sizes_[l + 1];
        for (std::size_t j = 0; j < sizes_[l + 1]; ++j) db[j] += g[j];
      }
      if (l == 0) break;  // no gradient w.r.t. the input
      std::vector<float>& dprev = ws.dh[l - 1];
      kernels::matmul_nt(dz.data(), params_[2 * l].data(), dprev.data(), m, sizes_[l],
                         sizes_[l + 1]);
      std::vector<float> const& h = ws.h[l];  // ReLU output: its derivative is h > 0
      for (std::size_t i = 0; i < dprev.size(); ++i) dprev[i] = h[i] > 0.0f ? dprev[i] : 0.0f;
    }
  }

 private:
  void prepare(workspace& ws, std::size_t batch) const {
    ws.batch = batch;
    ws.h.resize(sizes_.size());
    ws.dh.resize(layers());
    for (std::size_t l = 0; l < sizes_.size(); ++l) ws.h[l].resize(batch * sizes_[l]);
    for (std::size_t l = 0; l < layers(); ++l) ws.dh[l].resize(batch * sizes_[l + 1]);
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
};

/// SGD with (heavy-ball) momentum and optional L2 weight decay:
/// v <- momentum * v + (g + weight_decay * w);  w <- w - lr * v.
class sgd {
 public:
  sgd(double momentum, double weight_decay) : momentum_(momentum), weight_decay_(weight_decay) {
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      throw gradcomp::config_error("train: momentum must be in [0, 1), got " +
                                   std::to_string(momentum));
    }
    if (!(weight_decay >= 0.0)) {
      throw gradcomp::config_error("train: weight decay must be >= 0, got " +
                                   std::to_string(weight_decay));
    }
  }

  /// Applies `grads` (same layout as `params`) with learning rate `lr`. Weight decay is applied
  /// to weight matrices only (even tensor indices), not to biases.
  void step(std::vector<std::vector<float>>& params, std::vector<std::vector<float>> const& grads,
            double lr) {
    if (velocity_.empty()) {
      for (auto const& p : params) velocity_.emplace_back(p.size(), 0.0f);
    }
    auto const mu = static_cast<float>(momentum_);
    auto const eta = static_cast<float>(lr);
    for (std::size_t t = 0; t < params.size(); ++t) {
      float const wd = t % 2 == 0 ? static_cast<float>(weight_decay_) : 0.0f;
      float* w = params[t].data();
      float* v = velocity_[t].data();
      float const* g = grads[t].data();
      for (std::size_t i = 0; i < params[t].size(); ++i) {
        v[i] = mu * v[i] + (g[i] + wd * w[i]);
        w[i] -= eta * v[i];
      }
    }
  }

 private:
  double momentum_, weight_decay_;
  std::vector<std::vector<float>> velocity_;
};

}  // namespace train
