// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// SGD with optional (Nesterov) momentum and L2 weight decay on flat parameter spans, with
/// PyTorch's `torch.optim.SGD` semantics:
/// ```
///   d <- g + wd*x
///   buf <- d (first step), else mu*buf + (1 - dampening)*d
///   d <- d + mu*buf (nesterov) or buf (momentum) or d (mu = 0)
///   x <- x - lr*d
/// ```
/// The local step of D-PSGD, CHOCO-SGD and DeepSqueeze.
///
/// Element types: parameters and gradients may each be float, half or bfloat16 (mixed
/// precision); the momentum buffer and the arithmetic are float32, a 16-bit parameter is
/// rounded once per step. Float32 master parameters with 16-bit gradients are bit-identical to
/// the float32 step on the widened gradient.

#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/optim/adam.hpp>

#include <gradcomp/core/dtype.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Hyperparameters of `sgd`.
struct sgd_options {
  double lr = 1e-2;           ///< learning rate, >= 0
  double momentum = 0.0;      ///< in [0, 1)
  double dampening = 0.0;     ///< in [0, 1]
  bool nesterov = false;      ///< needs momentum > 0 and dampening = 0
  double weight_decay = 0.0;  ///< L2, >= 0

  void validate() const {
    auto fail = [](std::string const& what) { throw config_error("gradcomp: sgd " + what); };
    if (!(std::isfinite(lr) && lr >= 0.0))
      fail("lr must be finite and >= 0, got " + std::to_string(lr));
    if (!(momentum >= 0.0 && momentum < 1.0))
      fail("momentum must be in [0, 1), got " + std::to_string(momentum));
    if (!(dampening >= 0.0 && dampening <= 1.0))
      fail("dampening must be in [0, 1], got " + std::to_string(dampening));
    if (nesterov && (momentum == 0.0 || dampening != 0.0))
      fail("nesterov needs momentum > 0 and dampening 0");
    if (!(std::isfinite(weight_decay) && weight_decay >= 0.0)) {
      fail("weight_decay must be finite and >= 0, got " + std::to_string(weight_decay));
    }
  }
};

/// SGD on one flat parameter span (file comment).
class sgd {
 public:
  using optimizer_concept = optimizer_tag;

  explicit sgd(sgd_options o = {}) : opt_(o) { opt_.validate(); }

  void step(std::span<float> x, std::span<float const> g) { step_impl(x, g); }

  /// The same update for 16-bit parameters and/or gradients (`half`, `bfloat16`; mixed
  /// precision): each element is widened to float32 (exact), updated in float32 exactly as the
  /// float32 overload does, with float32 state, and a 16-bit parameter is rounded once per step
  /// (nearest even). Keep float32 master parameters where updates may be smaller than half a
  /// 16-bit ulp; a float32 `x` with a 16-bit `g` is bit-identical to the float32 step on the
  /// widened gradient.
  template <element P, element G>
    requires(!(std::same_as<P, float> && std::same_as<G, float>))
  void step(std::span<P> x, std::span<G const> g) {
    step_impl(x, g);
  }

  [[nodiscard]] double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) {
    sgd_options o = opt_;
    o.lr = lr;
    o.validate();
    opt_ = o;
  }
  [[nodiscard]] sgd_options const& options() const noexcept { return opt_; }
  /// The momentum buffer (empty before the first step or without momentum).
  [[nodiscard]] std::span<float const> momentum_buffer() const noexcept { return buf_; }
  void reset() noexcept { buf_.clear(); }

 private:
  template <element P, element G>
  void step_impl(std::span<P> x, std::span<G const> g) {
    detail::check_step_spans(x.size(), g.size(), buf_.size(), "sgd");
    float const lr = static_cast<float>(opt_.lr);
    float const mu = static_cast<float>(opt_.momentum);
    float const keep = static_cast<float>(1.0 - opt_.dampening);
    float const wd = static_cast<float>(opt_.weight_decay);
    bool const use_momentum = opt_.momentum != 0.0;
    bool const first = use_momentum && buf_.empty();
    if (first) buf_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      float const xi = to_float(x[i]);
      float d = to_float(g[i]);
      if (opt_.weight_decay != 0.0) d = d + wd * xi;
      if (use_momentum) {
        float const b = first ? d : mu * buf_[i] + keep * d;
        buf_[i] = b;
        d = opt_.nesterov ? d + mu * b : b;
      }
      x[i] = from_float<P>(xi - lr * d);
    }
  }

  sgd_options opt_;
  std::vector<float> buf_;
};

GRADCOMP_NAMESPACE_END
