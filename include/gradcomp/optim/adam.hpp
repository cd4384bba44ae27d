// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Adam, AdamW and AccumAdam on flat parameter spans (one optimizer per parameter bucket).
///
/// Element types: parameters and gradients may each be float, half or bfloat16 (mixed
/// precision); moments and arithmetic are float32, each 16-bit input is widened exactly and a
/// 16-bit parameter is rounded once per step. The usual setup is float32 master parameters with
/// 16-bit gradients, which is bit-identical to the float32 step on the widened gradient.
///
/// Arithmetic, per element in float32, with the scalars computed in double and rounded once
/// to float (as PyTorch's single-tensor `torch.optim.Adam` does):
/// ```
///   AdamW:  x <- x * (1 - lr*wd)            Adam (L2):  g <- g + wd*x
///   m <- b1*m + (1-b1)*g
///   v <- b2*v + (1-b2)*(g*g)
///   x <- x - (lr / (1 - b1^t)) * (m / (sqrt(v) / sqrt(1 - b2^t) + eps))
/// ```
/// eps is added *outside* the square root and after the bias correction of v, as in PyTorch.
/// PyTorch writes the first moment as `m.lerp_(g, 1-b1)`, which can differ from b1*m + (1-b1)*g
/// in the last bit; gradcomp uses the product form, the one the AccumAdam reference code uses.
///
/// AccumAdam (Wang et al., ICLR 2025; the authors' Decent-DP code, see docs/decentralized.md)
/// keeps the persistent moments m, v and a running mean a of the last T gradients. Every step
/// updates x with provisional moments built from the current gradient; every T-th step commits
/// the window mean into m and v. Bias corrections use the window count K = ceil(t/T). With
/// T = 1 it is bit-identical to `adam`.

#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <gradcomp/core/dtype.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How weight decay enters Adam.
enum class weight_decay_mode : std::uint8_t {
  l2,         ///< Adam: wd * x is added to the gradient (torch.optim.Adam)
  decoupled,  ///< AdamW: x is multiplied by 1 - lr * wd before the step (torch.optim.AdamW)
};

/// Hyperparameters of Adam / AdamW / AccumAdam.
struct adam_options {
  double lr = 1e-3;           ///< learning rate, >= 0
  double beta1 = 0.9;         ///< first-moment decay, in [0, 1)
  double beta2 = 0.999;       ///< second-moment decay, in [0, 1)
  double eps = 1e-8;          ///< added to the bias-corrected sqrt(v), >= 0
  double weight_decay = 0.0;  ///< >= 0
  weight_decay_mode decay = weight_decay_mode::l2;

  /// Throws `config_error` naming the first invalid field.
  void validate() const {
    auto fail = [](std::string const& what) { throw config_error("gradcomp: adam " + what); };
    if (!(std::isfinite(lr) && lr >= 0.0))
      fail("lr must be finite and >= 0, got " + std::to_string(lr));
    if (!(beta1 >= 0.0 && beta1 < 1.0))
      fail("beta1 must be in [0, 1), got " + std::to_string(beta1));
    if (!(beta2 >= 0.0 && beta2 < 1.0))
      fail("beta2 must be in [0, 1), got " + std::to_string(beta2));
    if (!(std::isfinite(eps) && eps >= 0.0))
      fail("eps must be finite and >= 0, got " + std::to_string(eps));
    if (!(std::isfinite(weight_decay) && weight_decay >= 0.0)) {
      fail("weight_decay must be finite and >= 0, got " + std::to_string(weight_decay));
    }
  }
};

/// AdamW options: decoupled weight decay `wd` (PyTorch's AdamW default is 0.01).
[[nodiscard]] inline adam_options adamw_options(double lr = 1e-3, double wd = 0.01) {
  adam_options o;
  o.lr = lr;
  o.weight_decay = wd;
  o.decay = weight_decay_mode::decoupled;
  return o;
}

namespace detail {

// The per-step float coefficients of an Adam update at bias-correction count `k`.
struct adam_coefficients {
  float b1, c1, b2, c2;  // beta1, 1-beta1, beta2, 1-beta2
  float step_size;       // lr / (1 - beta1^k)
  float bc2_sqrt;        // sqrt(1 - beta2^k)
  float eps;
  float decay_mul;  // 1 - lr*wd (decoupled)
  float l2;         // wd (l2)
  bool decoupled;
  bool has_decay;
};

inline adam_coefficients adam_coefficients_for(adam_options const& o, std::uint64_t k) {
  double const kd = static_cast<double>(k);
  adam_coefficients c{};
  c.b1 = static_cast<float>(o.beta1);
  c.c1 = static_cast<float>(1.0 - o.beta1);
  c.b2 = static_cast<float>(o.beta2);
  c.c2 = static_cast<float>(1.0 - o.beta2);
  c.step_size = static_cast<float>(o.lr / (1.0 - std::pow(o.beta1, kd)));
  c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, kd)));
  c.eps = static_cast<float>(o.eps);
  c.decay_mul = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.l2 = static_cast<float>(o.weight_decay);
  c.decoupled = o.decay == weight_decay_mode::decoupled;
  c.has_decay = o.weight_decay != 0.0;
  return c;
}

// Applies weight decay to one element: returns the (possibly L2-augmented) gradient and
// updates x for decoupled decay.
GRADCOMP_FORCEINLINE float adam_decay(float& x, float g, adam_coefficients const& c) noexcept {
  if (c.has_decay) {
    if (c.decoupled) {
      x = x * c.decay_mul;
    } else {
      g = g + c.l2 * x;
    }
  }
  return g;
}

// x - step_size * m / (sqrt(v)/bc2_sqrt + eps)
GRADCOMP_FORCEINLINE float adam_apply(float x, float m, float v,
                                      adam_coefficients const& c) noexcept {
  float const denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  return x - c.step_size * (m / denom);
}

// The largest |m / sqrt(v)| Adam's own moments allow (Cauchy-Schwarz on the two exponential
// averages): (1-b1) / sqrt((1-b2)(1-b1^2/b2)), 7.27 with the default betas; infinite when
// b1^2 >= b2. The optimizers whose v is not Adam's own (frozen, factored) clip the normalized
// step m / (sqrt(v)/sqrt(1-b2^t) + eps) to it.
inline float adam_update_bound(adam_options const& o) noexcept {
  double const b1 = o.beta1, b2 = o.beta2;
  if (b1 * b1 >= b2 || b2 <= 0.0) return std::numeric_limits<float>::infinity();
  return static_cast<float>((1.0 - b1) / std::sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2)));
}

inline void check_step_spans(std::size_t nx, std::size_t ng, std::size_t state, char const* who) {
  if (nx != ng) {
    throw config_error(std::string("gradcomp: ") + who + " got " + std::to_string(nx) +
                       " parameters but " + std::to_string(ng) +
                       " gradient values (expected equal)");
  }
  if (state != 0 && state != nx) {
    throw config_error(std::string("gradcomp: ") + who + " state holds " + std::to_string(state) +
                       " elements but the step has " + std::to_string(nx) +
                       " (use one optimizer per parameter span)");
  }
}

}  // namespace detail

/// Adam / AdamW on one flat parameter span (see file comment for the arithmetic).
class adam {
 public:
  using optimizer_concept = optimizer_tag;

  explicit adam(adam_options o = {}) : opt_(o) { opt_.validate(); }

  /// One update of `x` with gradient `g` (same length as every earlier step).
  void step(std::span<float> x, std::span<float const> g) { step_impl(x, g); }

  /// The same update for 16-bit parameters and/or gradients (`half`, `bfloat16`; mixed
  /// precision): each element is widened to float32 (exact), updated in float32 exactly as the
  /// float32 overload does, with float32 moments, and a 16-bit parameter is rounded once per
  /// step (nearest even). Keep float32 master parameters where updates may be smaller than half
  /// a 16-bit ulp; a float32 `x` with a 16-bit `g` is bit-identical to the float32 step on the
  /// widened gradient.
  template <element P, element G>
    requires(!(std::same_as<P, float> && std::same_as<G, float>))
  void step(std::span<P> x, std::span<G const> g) {
    step_impl(x, g);
  }

 private:
  template <element P, element G>
  void step_impl(std::span<P> x, std::span<G const> g) {
    detail::check_step_spans(x.size(), g.size(), m_.size(), "adam");
    if (m_.empty()) {
      m_.assign(x.size(), 0.0f);
      v_.assign(x.size(), 0.0f);
    }
    ++t_;
    detail::adam_coefficients const c = detail::adam_coefficients_for(opt_, t_);
    float* m = m_.data();
    float* v = v_.data();
    for (std::size_t i = 0; i < x.size(); ++i) {
      float xi = to_float(x[i]);
      float const gi = detail::adam_decay(xi, to_float(g[i]), c);
      float const mi = c.b1 * m[i] + c.c1 * gi;
      float const vi = c.b2 * v[i] + c.c2 * (gi * gi);
      m[i] = mi;
      v[i] = vi;
      x[i] = from_float<P>(detail::adam_apply(xi, mi, vi, c));
    }
  }

 public:
  [[nodiscard]] double lr() const noexcept { return opt_.lr; }
  /// Sets the learning rate for the following steps (finite, >= 0).
  void set_lr(double lr) {
    adam_options o = opt_;
    o.lr = lr;
    o.validate();
    opt_ = o;
  }
  [[nodiscard]] adam_options const& options() const noexcept { return opt_; }
  /// Steps taken so far (the bias-correction count).
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  [[nodiscard]] std::span<float const> first_moment() const noexcept { return m_; }
  [[nodiscard]] std::span<float const> second_moment() const noexcept { return v_; }
  /// Forgets moments and the step count.
  void reset() noexcept {
    m_.clear();
    v_.clear();
    t_ = 0;
  }
  /// Restores moments and the step count (a checkpoint); `config_error` unless m and v have
  /// the same size, and are empty exactly when `t` is 0.
  void restore(std::span<float const> m, std::span<float const> v, std::uint64_t t) {
    if (m.size() != v.size() || (t == 0) != m.empty()) {
      throw config_error("gradcomp: adam::restore got moments of " + std::to_string(m.size()) +
                         " and " + std::to_string(v.size()) + " elements at step " +
                         std::to_string(t));
    }
    m_.assign(m.begin(), m.end());
    v_.assign(v.begin(), v.end());
    t_ = t;
  }

 private:
  adam_options opt_;
  std::vector<float> m_, v_;
  std::uint64_t t_ = 0;
};

/// AccumAdam / AccumAdamW: Adam whose persistent moments see the mean of every `accumulation`
/// consecutive gradients, while the parameters are updated every step (file comment).
class accum_adam {
 public:
  using optimizer_concept = optimizer_tag;

  /// `accumulation` = T >= 1 (the reference code's `accum_iter`).
  explicit accum_adam(adam_options o = {}, std::uint32_t accumulation = 1)
      : opt_(o), window_(accumulation) {
    opt_.validate();
    if (accumulation < 1) {
      throw config_error("gradcomp: accum_adam accumulation must be >= 1, got 0");
    }
    inv_window_ = static_cast<float>(1.0 / static_cast<double>(window_));
  }

  /// One update of `x` with gradient `g`.
  void step(std::span<float> x, std::span<float const> g) { step_impl(x, g); }

  /// The same update for 16-bit parameters and/or gradients, with float32 moments (as
  /// `adam::step`'s 16-bit overload: widened exactly, a 16-bit parameter rounded once per step).
  template <element P, element G>
    requires(!(std::same_as<P, float> && std::same_as<G, float>))
  void step(std::span<P> x, std::span<G const> g) {
    step_impl(x, g);
  }

 private:
  template <element P, element G>
  void step_impl(std::span<P> x, std::span<G const> g) {
    detail::check_step_spans(x.size(), g.size(), m_.size(), "accum_adam");
    if (m_.empty()) {
      m_.assign(x.size(), 0.0f);
      v_.assign(x.size(), 0.0f);
      a_.assign(x.size(), 0.0f);
    }
    ++t_;
    std::uint64_t const k = (t_ + window_ - 1) / window_;  // ceil(t / T)
    bool const first = (t_ - 1) % window_ == 0;            // first step of a window
    bool const commit = t_ % window_ == 0;                 // last step of a window
    detail::adam_coefficients const c = detail::adam_coefficients_for(opt_, k);
    float const inv_t = inv_window_;
    float* m = m_.data();
    float* v = v_.data();
    float* a = a_.data();
    for (std::size_t i = 0; i < x.size(); ++i) {
      float xi = to_float(x[i]);
      float const gi = detail::adam_decay(xi, to_float(g[i]), c);
      // a <- a + g/T, with a = 0 at a window start written as an assignment (keeps -0 exact).
      float const ai = first ? gi * inv_t : a[i] + gi * inv_t;
      float const mh = c.b1 * m[i] + c.c1 * gi;
      float const vh = c.b2 * v[i] + c.c2 * (gi * gi);
      x[i] = from_float<P>(detail::adam_apply(xi, mh, vh, c));
      if (commit) {
        m[i] = c.b1 * m[i] + c.c1 * ai;
        v[i] = c.b2 * v[i] + c.c2 * (ai * ai);  // square of the window mean
      }
      a[i] = ai;
    }
  }

 public:
  [[nodiscard]] double lr() const noexcept { return opt_.lr; }
  void set_lr(double lr) {
    adam_options o = opt_;
    o.lr = lr;
    o.validate();
    opt_ = o;
  }
  [[nodiscard]] adam_options const& options() const noexcept { return opt_; }
  [[nodiscard]] std::uint32_t accumulation() const noexcept { return window_; }
  [[nodiscard]] std::uint64_t steps() const noexcept { return t_; }
  /// Persistent moments (last committed window) and the accumulator.
  [[nodiscard]] std::span<float const> first_moment() const noexcept { return m_; }
  [[nodiscard]] std::span<float const> second_moment() const noexcept { return v_; }
  [[nodiscard]] std::span<float const> accumulator() const noexcept { return a_; }
  void reset() noexcept {
    m_.clear();
    v_.clear();
    a_.clear();
    t_ = 0;
  }

 private:
  adam_options opt_;
  std::uint32_t window_;
  float inv_window_ = 1.0f;
  std::vector<float> m_, v_, a_;
  std::uint64_t t_ = 0;
};

GRADCOMP_NAMESPACE_END
