// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// SGD with optional (Nesterov) momentum and L2 weight decay on flat float spans, with
/// PyTorch's `torch.optim.SGD` semantics:
/// ```
///   d <- g + wd*x
///   buf <- d (first step), else mu*buf + (1 - dampening)*d
///   d <- d + mu*buf (nesterov) or buf (momentum) or d (mu = 0)
///   x <- x - lr*d
/// ```
/// The local step of D-PSGD, CHOCO-SGD and DeepSqueeze.

#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/optim/adam.hpp>

#include <cmath>
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

  void step(std::span<float> x, std::span<float const> g) {
    detail::check_step_spans(x.size(), g.size(), buf_.size(), "sgd");
    float const lr = static_cast<float>(opt_.lr);
    float const mu = static_cast<float>(opt_.momentum);
    float const keep = static_cast<float>(1.0 - opt_.dampening);
    float const wd = static_cast<float>(opt_.weight_decay);
    bool const use_momentum = opt_.momentum != 0.0;
    bool const first = use_momentum && buf_.empty();
    if (first) buf_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      float d = g[i];
      if (opt_.weight_decay != 0.0) d = d + wd * x[i];
      if (use_momentum) {
        float const b = first ? d : mu * buf_[i] + keep * d;
        buf_[i] = b;
        d = opt_.nesterov ? d + mu * b : b;
      }
      x[i] = x[i] - lr * d;
    }
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
  sgd_options opt_;
  std::vector<float> buf_;
};

GRADCOMP_NAMESPACE_END
