// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `accordion_controller`: Accordion (Agarwal et al., MLSys 2021), which switches between a
/// low and a high compression level by detecting critical learning regimes, where the norm of
/// the accumulated gradient changes fast. As in the authors' code: every `interval` steps the
/// gradient accumulated over `accumulation` steps is compared, layer by layer, with the one
/// accumulated an interval earlier; a relative change of at least η (0.5) marks a critical
/// regime, which gets low compression. Training starts at low compression, and a learning-rate
/// decay switches to low compression until the next detection.
///
/// Statistics used: `step`, `layer_norms_sq` (when `plan().report_layers`),
/// `learning_rate` and `next_learning_rate`. docs/adaptive.md has the protocol and the choices.

#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How per-layer regimes become the one factor of a step.
enum class accordion_scope : std::uint8_t {
  any_layer,    ///< low compression when any layer is critical (Accordion's per-layer rule,
                ///< collapsed to one factor by giving every layer the least compression one needs)
  whole_model,  ///< the rule applied to the norm of the whole model's accumulated gradient
};

/// Parameters of `accordion_controller`. The level defaults are the Accordion authors' Top-K
/// pair for CIFAR-10 (keep 99 % / keep 10 %).
struct accordion_config {
  double low_factor = 100.0 / 99.0;  ///< factor in critical regimes, finite and >= 1 (1 = dense)
  double high_factor = 10.0;         ///< factor otherwise, finite and >= low_factor
  double eta = 0.5;                  ///< relative-change threshold η, finite and > 0
  /// Steps between detections, >= 1 (Accordion: 10 epochs' worth of steps).
  std::uint64_t interval = 1000;
  /// Steps over which the gradient is accumulated at the start of each interval, in
  /// [1, interval] (Accordion: one epoch's worth).
  std::uint64_t accumulation = 100;
  accordion_scope scope = accordion_scope::any_layer;
};

/// Accordion's controller. Models `controller`.
///
/// Step `i` accumulates when `i % interval < accumulation` and reports the per-layer norms
/// when `i % interval == accumulation − 1`; that step's `decide` then sets the level of the
/// following steps: low if there is no earlier report (the start) or the relative change
/// |prev − cur| / prev of a layer's accumulated-gradient norm is >= η (a zero `prev` counts as
/// critical), else high. `0 < next_learning_rate < learning_rate` in any step's statistics
/// sets every layer to low from the next step until the next report (a `next_learning_rate`
/// of 0 is "not reported" and changes nothing).
class accordion_controller {
 public:
  using controller_concept = controller_tag;
  /// Names the kind of state `save_state` writes.
  static constexpr char const* state_kind = "accordion";

  /// @throws config_error naming the first invalid parameter of `cfg`.
  explicit accordion_controller(accordion_config cfg = {}) : cfg_(cfg) {
    char const* who = "Accordion";
    detail::check_param(cfg_.low_factor, who, "low_factor", 1.0, true, 1e300, true,
                        "a finite factor >= 1 (1 = dense)");
    detail::check_param(cfg_.high_factor, who, "high_factor", cfg_.low_factor, true, 1e300, true,
                        "a finite factor >= low_factor");
    detail::check_param(cfg_.eta, who, "eta", 0.0, false, 1e300, true, "a finite threshold > 0");
    if (cfg_.interval == 0 || cfg_.accumulation == 0 || cfg_.accumulation > cfg_.interval) {
      throw config_error(
          "gradcomp: Accordion needs 1 <= accumulation <= interval, got "
          "accumulation = " +
          std::to_string(cfg_.accumulation) + " and interval = " + std::to_string(cfg_.interval));
    }
    if (static_cast<unsigned>(cfg_.scope) > 1) {
      throw config_error("gradcomp: Accordion configuration holds a scope out of range");
    }
    factor_ = cfg_.low_factor;
    refresh_plan();
  }

  [[nodiscard]] accordion_config const& config() const noexcept { return cfg_; }
  /// Writes the whole state — the current factor, the per-layer accumulated norms of this and
  /// the last report, the changes, the model-level values and the plan — after the
  /// configuration, which `load_state` checks.
  void save_state(detail::byte_writer& w) const {
    double const c[] = {cfg_.low_factor, cfg_.high_factor, cfg_.eta, static_cast<double>(cfg_.interval),
                        static_cast<double>(cfg_.accumulation), static_cast<double>(cfg_.scope)};
    w.put_doubles(c);
    w.put_f64(factor_);
    w.put_doubles(layers_);
    w.put_doubles(prev_);
    w.put_doubles(changes_);
    w.put_f64(prev_total_);
    w.put_f64(model_change_);
    detail::save_plan(w, plan_);
  }
  /// Restores a state written by `save_state`; `format_error` if it was saved with another
  /// configuration.
  void load_state(detail::byte_reader& r) {
    double const c[] = {cfg_.low_factor, cfg_.high_factor, cfg_.eta, static_cast<double>(cfg_.interval),
                        static_cast<double>(cfg_.accumulation), static_cast<double>(cfg_.scope)};
    std::vector<double> const saved = r.get_doubles();
    if (!std::equal(saved.begin(), saved.end(), std::begin(c), std::end(c))) {
      r.fail("saved by an Accordion controller with another configuration");
    }
    factor_ = r.get_f64();
    layers_ = r.get_doubles();
    prev_ = r.get_doubles();
    changes_ = r.get_doubles();
    prev_total_ = r.get_f64();
    model_change_ = r.get_f64();
    plan_ = detail::load_plan(r);
  }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Factor of the coming step.
  [[nodiscard]] double factor() const noexcept { return factor_; }
  /// True when the coming step is in a critical regime (low compression).
  [[nodiscard]] bool critical() const noexcept { return factor_ == cfg_.low_factor; }
  /// Per-layer levels chosen at the last report (or by the last learning-rate decay): what a
  /// pipeline that compresses layers at different factors may use. Empty before the first
  /// report.
  [[nodiscard]] std::vector<double> const& layer_factors() const noexcept { return layers_; }
  /// Per-layer relative changes computed at the last report (+inf where the earlier norm was
  /// 0); empty before the second report.
  [[nodiscard]] std::vector<double> const& relative_changes() const noexcept { return changes_; }
  /// Relative change of the whole model's norm at the last report (+inf if the earlier norm
  /// was 0, NaN before the second report).
  [[nodiscard]] double model_relative_change() const noexcept { return model_change_; }

  /// Decides step `s.step` (== `plan().step`): sends the factor planned for it, and at a
  /// report step or on a learning-rate decay chooses the factor of the next steps.
  ///
  /// @throws config_error if the step is not the planned one, or a report step brings no
  ///         per-layer norms or a different number of layers than before.
  /// @throws numeric_error if a norm is negative or not finite. Nothing changes when it throws.
  decision decide(step_stats const& s) {
    char const* who = "Accordion";
    detail::check_step(s, plan_, who);
    if (plan_.report_layers) {
      if (s.layer_norms_sq.empty()) {
        throw config_error("gradcomp: Accordion step " + std::to_string(s.step) +
                           " is a report step but layer_norms_sq is empty; expected the squared "
                           "norm of each layer's accumulated gradient");
      }
      if (!prev_.empty() && s.layer_norms_sq.size() != prev_.size()) {
        throw config_error("gradcomp: Accordion step " + std::to_string(s.step) + " reports " +
                           std::to_string(s.layer_norms_sq.size()) + " layers; expected " +
                           std::to_string(prev_.size()) + " as before");
      }
      for (double v : s.layer_norms_sq) detail::check_stat(v, who, "layer_norms_sq");
    }

    decision d = detail::single_factor_decision(plan_.step, factor_);
    if (plan_.report_layers) detect(s.layer_norms_sq);
    // next_learning_rate == 0 means "not reported" (adapt/protocol.hpp), not a decay to 0.
    if (s.next_learning_rate > 0.0 && s.next_learning_rate < s.learning_rate) {
      layers_.assign(layers_.size(), cfg_.low_factor);
      factor_ = cfg_.low_factor;
    }
    ++plan_.step;
    refresh_plan();
    d.next = plan_;
    return d;
  }

 private:
  [[nodiscard]] double change(double prev, double cur) const noexcept {
    return prev > 0.0 ? std::fabs(prev - cur) / prev : std::numeric_limits<double>::infinity();
  }

  void detect(std::vector<double> const& norms_sq) {
    std::vector<double> cur(norms_sq.size());
    double total_sq = 0.0;
    for (std::size_t l = 0; l < cur.size(); ++l) {
      cur[l] = std::sqrt(norms_sq[l]);
      total_sq += norms_sq[l];
    }
    double const total = std::sqrt(total_sq);
    layers_.assign(cur.size(), cfg_.low_factor);
    bool any_critical = true, model_critical = true;
    if (!prev_.empty()) {
      changes_.resize(cur.size());
      any_critical = false;
      for (std::size_t l = 0; l < cur.size(); ++l) {
        changes_[l] = change(prev_[l], cur[l]);
        bool const crit = changes_[l] >= cfg_.eta;
        layers_[l] = crit ? cfg_.low_factor : cfg_.high_factor;
        any_critical = any_critical || crit;
      }
      model_change_ = change(prev_total_, total);
      model_critical = model_change_ >= cfg_.eta;
    }
    prev_ = std::move(cur);
    prev_total_ = total;
    bool const crit = cfg_.scope == accordion_scope::any_layer ? any_critical : model_critical;
    factor_ = crit ? cfg_.low_factor : cfg_.high_factor;
  }

  void refresh_plan() {
    std::uint64_t const phase = plan_.step % cfg_.interval;
    plan_.measure = detail::single_factor_measure(factor_);
    plan_.accumulate_layers = phase < cfg_.accumulation;
    plan_.report_layers = phase == cfg_.accumulation - 1;
  }

  accordion_config cfg_;
  double factor_ = 1.0;
  std::vector<double> layers_, prev_, changes_;
  double prev_total_ = 0.0;
  double model_change_ = std::numeric_limits<double>::quiet_NaN();
  step_plan plan_;
};

static_assert(controller<accordion_controller>);

GRADCOMP_NAMESPACE_END
