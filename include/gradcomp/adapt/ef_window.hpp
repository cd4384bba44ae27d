// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `ef_window_controller`: adaptive sparsification for error feedback, judged over a window of
/// steps instead of one. Under error feedback nothing is lost, only delayed: what a step does
/// not send stays in the residual and goes out later. So the controller asks two questions of
/// the factor it sends, once per window, and of nothing else:
///
/// - **How long does mass wait in the residual?** By Little's law, the mean time a quantity
///   spends in a store is the store divided by the flow through it. Energy stands in for mass:
///   the residual after step t holds R_t = ‖g_ef‖² − ‖C(g_ef)‖² (exact for a sparsifier, whose
///   kept and dropped values are disjoint) and the step sent ‖C(g_ef)‖², so the window's
///   *delay* is d = Σ R_t / Σ ‖C_t‖², in steps. The one-step gain G = ‖C‖²/‖g_ef‖² that
///   GraVAC thresholds is the same measurement seen differently, G = 1/(1 + R/C): a gain of
///   0.07 means about 13 steps of delay, not 93 % of the gradient lost.
/// - **Is the residual settled?** Energy balance over the window: what flowed in is what was
///   sent plus what the residual gained, so the *delivered fraction* is
///   D = Σ ‖C_t‖² / (Σ ‖C_t‖² + R_end − R_start). D near 1: the residual is bounded and
///   everything that arrives leaves; D small: the residual is still filling (the factor was
///   just raised, or it is too high to keep up).
///
/// The delay of a sparsifier grows about in proportion to its factor (for gradient noise,
/// d ≈ factor / 2; for a steady gradient, in proportion too), which predicts the delay of
/// another factor f' from the one measured at f: d·f'/f. At the end of each window:
/// - d > `max_delay`: move down to the highest rung whose predicted delay fits (at least one
///   rung down);
/// - else, if D >= `settled`: move up to the highest rung whose predicted delay fits, at most
///   `climb` times the current factor;
/// - else stay: the residual has not settled at this factor yet.
///
/// The rungs are `factor_min` · `ratio`^k, capped at `factor_max` (the last rung). The first
/// window runs at the rung nearest below the geometric middle of the ladder (80 for the
/// defaults 10 … 1000), unless `start` names one. Each step measures two rungs (the current
/// one and its upper neighbour, or its lower neighbour at the top) so that the pipeline
/// computes the norms (it does whenever a plan measures more than one factor); it sends the
/// current rung and never sends dense. Decisions depend only on agreed statistics and the
/// controller's state, so every rank decides alike.
///
/// Statistics used: `step`, `ef_norm_sq`, `compressed_norm_sq` (one per measured factor).
/// Meant for sparsifiers (top-k) with residual error feedback; with a codec whose dropped and
/// kept parts are not orthogonal, R_t is an approximation. docs/training.md ("An adaptive
/// controller for error feedback") has the measurements behind the defaults.

#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Parameters of `ef_window_controller`; docs/training.md gives the reasons for the defaults.
struct ef_window_config {
  double factor_min = 10.0;    ///< lowest rung, finite and > 1
  double factor_max = 1000.0;  ///< highest rung, finite and > factor_min
  double ratio = 2.0;          ///< ratio of neighbouring rungs, finite and > 1
  std::uint64_t window = 40;   ///< steps per decision, >= 2
  double max_delay = 20.0;     ///< longest acceptable delay d, in steps, finite and > 0
  double settled = 0.75;       ///< delivered fraction D needed to move up, in (0, 1]
  double climb = 4.0;          ///< largest factor multiple of one move up, finite and >= ratio
  /// Factor of the first window, rounded down to a rung (at least `factor_min`); 0: the rung
  /// nearest below the ladder's geometric middle √(factor_min · factor_max).
  double start = 0.0;
};

/// What the last window boundary measured and decided (for logs and tests).
struct ef_window_event {
  std::uint64_t step = 0;  ///< the boundary step (its decide call)
  double delay = 0.0;  ///< d = Σ R / Σ ‖C‖² over the window, in steps (+inf: nothing sent)
  double delivered = 0.0;  ///< D, the delivered fraction of the window's inflow, in [0, 1]
  double from = 0.0;       ///< factor of the window
  double to = 0.0;         ///< factor of the next window

  friend bool operator==(ef_window_event const&, ef_window_event const&) = default;
};

/// The window controller for error feedback. Models `controller`.
class ef_window_controller {
 public:
  using controller_concept = controller_tag;
  /// Names the kind of state `save_state` writes.
  static constexpr char const* state_kind = "ef_window";

  /// @throws config_error naming the first invalid parameter of `cfg`.
  explicit ef_window_controller(ef_window_config cfg = {}) : cfg_(cfg) {
    char const* who = "ef_window";
    detail::check_param(cfg_.factor_min, who, "factor_min", 1.0, false, 1e300, true,
                        "a finite factor > 1");
    detail::check_param(cfg_.factor_max, who, "factor_max", cfg_.factor_min, false, 1e300, true,
                        "a finite factor > factor_min (a ladder of at least two rungs)");
    detail::check_param(cfg_.ratio, who, "ratio", 1.0, false, 1e300, true,
                        "a finite ratio of neighbouring rungs > 1");
    if (cfg_.window < 2) {
      throw config_error("gradcomp: ef_window parameter window = " + std::to_string(cfg_.window) +
                         " is invalid; expected >= 2 steps");
    }
    detail::check_param(cfg_.max_delay, who, "max_delay", 0.0, false, 1e300, true,
                        "a finite delay in steps > 0");
    detail::check_param(cfg_.settled, who, "settled", 0.0, false, 1.0, true,
                        "a delivered fraction in (0, 1]");
    detail::check_param(cfg_.climb, who, "climb", cfg_.ratio, true, 1e300, true,
                        "a finite factor multiple >= ratio");
    detail::check_param(cfg_.start, who, "start", 0.0, true, cfg_.factor_max, true,
                        "0 (the middle of the ladder) or a factor <= factor_max");
    for (double f = cfg_.factor_min; f < cfg_.factor_max && rungs_.size() < 4096; f *= cfg_.ratio)
      rungs_.push_back(f);
    if (rungs_.size() == 4096) {
      throw config_error(
          "gradcomp: ef_window ladder from factor_min to factor_max in steps of "
          "ratio has more than 4096 rungs; expected a larger ratio");
    }
    rungs_.push_back(cfg_.factor_max);
    double const first =
        cfg_.start > 0.0 ? cfg_.start : std::sqrt(cfg_.factor_min * cfg_.factor_max);
    index_ = rung_at_most(first);
    refresh_plan();
  }

  [[nodiscard]] ef_window_config const& config() const noexcept { return cfg_; }
  /// The ladder of factors, lowest first.
  [[nodiscard]] std::vector<double> const& rungs() const noexcept { return rungs_; }
  /// Factor sent in the coming step.
  [[nodiscard]] double factor() const noexcept { return rungs_[index_]; }
  /// The last window boundary's measurement and move (all zero before the first boundary).
  [[nodiscard]] ef_window_event const& last_window() const noexcept { return event_; }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Decides step `s.step` (== `plan().step`): sends the current rung, adds the step to the
  /// window, and at the window's last step chooses the rung of the next window.
  ///
  /// @throws config_error if the step is not the planned one or `compressed_norm_sq` does not
  ///         hold one norm per measured factor.
  /// @throws numeric_error if a norm or time is negative or not finite.
  /// Nothing changes when it throws.
  decision decide(step_stats const& s) {
    char const* who = "ef_window";
    detail::check_step(s, plan_, who);
    if (s.compressed_norm_sq.size() != plan_.measure.size()) {
      throw config_error("gradcomp: ef_window step " + std::to_string(s.step) + " reports " +
                         std::to_string(s.compressed_norm_sq.size()) +
                         " compressed norms; expected one per measured factor (" +
                         std::to_string(plan_.measure.size()) + ")");
    }
    detail::check_stat(s.ef_norm_sq, who, "ef_norm_sq");
    for (double v : s.compressed_norm_sq) detail::check_stat(v, who, "compressed_norm_sq");

    bool const top = index_ + 1 == rungs_.size();
    double const sent = top ? s.compressed_norm_sq[1] : s.compressed_norm_sq[0];
    double const kept = std::max(0.0, s.ef_norm_sq - sent);  // R_t, what the residual holds now

    decision d;
    d.step = s.step;
    d.send = top ? send_kind::candidate : send_kind::minimum;
    d.factor = rungs_[index_];
    d.residual = residual_rule::subtract_sent;
    d.gain = s.ef_norm_sq > 0.0 ? std::min(1.0, sent / s.ef_norm_sq) : 1.0;

    sum_sent_ += sent;
    sum_kept_ += kept;
    last_kept_ = kept;
    ++count_;
    if (count_ == cfg_.window) end_window(s.step);
    ++plan_.step;
    refresh_plan();
    d.next = plan_;
    return d;
  }

  /// Writes the whole state — the rung, the window's sums, the residual at the window's start,
  /// the last window event and the plan — after a fingerprint of the configuration.
  void save_state(detail::byte_writer& w) const {
    w.put_u64(config_fingerprint());
    w.put_u64(index_);
    w.put_u64(count_);
    w.put_f64(sum_sent_);
    w.put_f64(sum_kept_);
    w.put_f64(start_kept_);
    w.put_f64(last_kept_);
    w.put_u64(event_.step);
    w.put_f64(event_.delay);
    w.put_f64(event_.delivered);
    w.put_f64(event_.from);
    w.put_f64(event_.to);
    detail::save_plan(w, plan_);
  }
  /// Restores a state written by `save_state`. `format_error` if it was saved with another
  /// configuration or does not hold together (a rung off the ladder, a window count that does
  /// not match the step, a negative or non-finite sum, a plan other than the rung's).
  void load_state(detail::byte_reader& r) {
    if (r.get_u64() != config_fingerprint()) {
      r.fail("saved by an ef_window controller with another configuration");
    }
    std::uint64_t const index = r.get_u64();
    if (index >= rungs_.size()) {
      r.fail("rung " + std::to_string(index) + " is off the ladder of " +
             std::to_string(rungs_.size()) + " rungs");
    }
    std::uint64_t const count = r.get_u64();
    double const sums[4] = {r.get_f64(), r.get_f64(), r.get_f64(), r.get_f64()};
    for (double v : sums) {
      if (!std::isfinite(v) || v < 0.0)
        r.fail("a window sum or residual norm is " + std::to_string(v));
    }
    ef_window_event ev;
    ev.step = r.get_u64();
    ev.delay = r.get_f64();
    ev.delivered = r.get_f64();
    ev.from = r.get_f64();
    ev.to = r.get_f64();
    if (std::isnan(ev.delay) || ev.delay < 0.0 || !(ev.delivered >= 0.0 && ev.delivered <= 1.0) ||
        !std::isfinite(ev.from) || !std::isfinite(ev.to) || ev.from < 0.0 || ev.to < 0.0) {
      r.fail("the last window event holds an impossible delay, fraction or factor");
    }
    step_plan const p = detail::load_plan(r);
    if (count != p.step % cfg_.window) {
      r.fail("the window holds " + std::to_string(count) + " steps at step " +
             std::to_string(p.step) + "; expected " + std::to_string(p.step % cfg_.window));
    }
    step_plan expected = p;
    expected.measure = measure_of(static_cast<std::size_t>(index));
    expected.accumulate_layers = expected.report_layers = false;
    if (!(p == expected)) r.fail("the plan is not the one of the saved rung");
    index_ = static_cast<std::size_t>(index);
    count_ = count;
    sum_sent_ = sums[0];
    sum_kept_ = sums[1];
    start_kept_ = sums[2];
    last_kept_ = sums[3];
    event_ = ev;
    plan_ = p;
  }

 private:
  [[nodiscard]] std::uint64_t config_fingerprint() const noexcept {
    double const v[] = {
        cfg_.factor_min, cfg_.factor_max, cfg_.ratio, static_cast<double>(cfg_.window),
        cfg_.max_delay,  cfg_.settled,    cfg_.climb, cfg_.start};
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the values' bit patterns
    for (double x : v) {
      auto const b = std::bit_cast<std::uint64_t>(x);
      for (int i = 0; i < 8; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
  }

  // The highest rung <= f, or the lowest rung when f is below it.
  [[nodiscard]] std::size_t rung_at_most(double f) const noexcept {
    std::size_t i = 0;
    while (i + 1 < rungs_.size() && rungs_[i + 1] <= f) ++i;
    return i;
  }

  [[nodiscard]] std::vector<double> measure_of(std::size_t i) const {
    if (i + 1 < rungs_.size()) return {rungs_[i], rungs_[i + 1]};
    return {rungs_[i - 1], rungs_[i]};
  }

  void end_window(std::uint64_t step) {
    double const f = rungs_[index_];
    ef_window_event ev;
    ev.step = step;
    ev.from = f;
    // Little's law: residual held per unit sent, in steps.
    if (sum_sent_ > 0.0) {
      ev.delay = sum_kept_ / sum_sent_;
    } else {
      ev.delay = sum_kept_ > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
    }
    // Energy balance: inflow = sent + growth of the residual.
    double const inflow = sum_sent_ + last_kept_ - start_kept_;
    ev.delivered = inflow > 0.0 ? std::min(1.0, sum_sent_ / inflow) : 1.0;

    std::size_t next = index_;
    if (ev.delay > cfg_.max_delay) {
      double const fits = std::isfinite(ev.delay) ? f * cfg_.max_delay / ev.delay : 0.0;
      next = std::min(rung_at_most(fits), index_ > 0 ? index_ - 1 : 0);
    } else if (ev.delivered >= cfg_.settled) {
      double const fits = ev.delay > 0.0 ? f * cfg_.max_delay / ev.delay : f * cfg_.climb;
      next = std::max(index_, rung_at_most(std::min(fits, f * cfg_.climb)));
    }
    index_ = next;
    ev.to = rungs_[index_];
    event_ = ev;
    count_ = 0;
    sum_sent_ = sum_kept_ = 0.0;
    start_kept_ = last_kept_;
  }

  void refresh_plan() {
    plan_.measure = measure_of(index_);
    plan_.accumulate_layers = plan_.report_layers = false;
  }

  ef_window_config cfg_;
  std::vector<double> rungs_;
  std::size_t index_ = 0;
  std::uint64_t count_ = 0;                    // steps of the current window decided so far
  double sum_sent_ = 0.0, sum_kept_ = 0.0;     // Σ ‖C_t‖², Σ R_t over the window
  double start_kept_ = 0.0, last_kept_ = 0.0;  // R before the window, R after the last step
  ef_window_event event_;
  step_plan plan_;
};

static_assert(controller<ef_window_controller>);

GRADCOMP_NAMESPACE_END
