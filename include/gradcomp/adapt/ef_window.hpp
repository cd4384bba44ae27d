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
/// - else, if D >= `settled` (and the loss check, below, does not hold the loss up): move up
///   to the highest rung whose predicted delay fits, at most `climb` times the current factor;
/// - else stay: the residual has not settled at this factor yet.
///
/// **The loss check.** The delay says how long mass waits, not what the wait costs: a model
/// trained with momentum SGD adds the momentum's own lag (about β/(1 − β) steps) to the delay,
/// and some models break at a delay others take in their stride (docs/training.md: ResNet-18
/// with momentum 0.9 does not train at any factor from 10 up). So when the pipeline reports
/// the training loss (`step_stats::loss`, the mean over the ranks), the controller also
/// watches it, in blocks of `loss_block` reported losses: it keeps the first block's mean L0
/// and the lowest block mean so far L*, and a block whose mean m is above L* by more than
/// `loss_rise` · max(L0 − L*, L*) — a quarter of the progress made, with the default, or,
/// while the loss has not yet fallen to half its start, a quarter of the loss itself — and by
/// more than two standard errors of the block mean is a **rise**: training is going backwards.
/// (The second term keeps the first blocks, before any progress, from being judged against a
/// progress of nearly zero: ResNet-18's loss rises by 11 % in its first 20 steps and then falls,
/// with top-k as without it.)
/// The factor is blamed: the controller drops to the lowest rung at once (a new window starts
/// there) and caps the ladder for the rest of the run at the rung below the one that rose; the
/// delay rules then climb back up to that cap, but never while the last block is still above
/// the threshold (training has not recovered yet). The next block judged is one that ends a
/// window after the drop, so that the damage done before it can heal; if the loss is still up
/// then, at the lowest rung, that is a rise there. A rise at the lowest rung turns compression
/// off for the rest of the run: every later step sends its gradient dense and keeps the
/// residual (`residual_rule::keep`: the delayed mass the rise blames is not sent). With no
/// loss reported the check is inert, and the controller decides on the norms alone.
///
/// The rungs are `factor_min` · `ratio`^k, capped at `factor_max` (the last rung). The first
/// window runs at the rung nearest below the geometric middle of the ladder (80 for the
/// defaults 10 … 1000), unless `start` names one. Each step measures two rungs (the current
/// one and its upper neighbour, or its lower neighbour at the top) so that the pipeline
/// computes the norms (it does whenever a plan measures more than one factor); it sends the
/// current rung; it sends dense only after a rise at the lowest rung. Decisions depend only on
/// agreed statistics and the controller's state, so every rank decides alike.
///
/// Statistics used: `step`, `ef_norm_sq`, `compressed_norm_sq` (one per measured factor), and
/// `loss` when reported. Meant for sparsifiers (top-k) with residual error feedback; with a codec
/// whose dropped and kept parts are not orthogonal, R_t is an approximation. docs/training.md ("An
/// adaptive controller for error feedback") has the measurements behind the defaults.

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
  /// Reported losses per block of the loss check; 0 turns the check off. At least 2 otherwise
  /// (a block's standard error needs two values).
  std::uint64_t loss_block = 10;
  /// Fraction of the progress so far (first block's mean loss − lowest block mean), or of the
  /// lowest block mean where that is larger, by which a block's mean must exceed the lowest to
  /// be a rise, finite and > 0.
  double loss_rise = 0.25;
};

/// A drop of the loss check: the block that rose, and what the controller did.
struct ef_window_backoff {
  std::uint64_t step = 0;  ///< the step that completed the block
  double loss = 0.0;       ///< the block's mean loss
  double lowest = 0.0;     ///< the lowest block mean before it (L*)
  double first = 0.0;      ///< the first block's mean (L0)
  double from = 0.0;       ///< factor sent when the rise was seen
  double to = 0.0;         ///< factor of the next step (1: compression turned off)

  friend bool operator==(ef_window_backoff const&, ef_window_backoff const&) = default;
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
    if (cfg_.loss_block == 1) {
      throw config_error(
          "gradcomp: ef_window parameter loss_block = 1 is invalid; expected 0 (no loss "
          "check) or >= 2 losses per block");
    }
    detail::check_param(cfg_.loss_rise, who, "loss_rise", 0.0, false, 1e300, true,
                        "a finite fraction of the progress > 0");
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
    ceiling_ = rungs_.size() - 1;
    refresh_plan();
  }

  [[nodiscard]] ef_window_config const& config() const noexcept { return cfg_; }
  /// The ladder of factors, lowest first.
  [[nodiscard]] std::vector<double> const& rungs() const noexcept { return rungs_; }
  /// Factor sent in the coming step (1: compression is off after a rise at the lowest rung).
  [[nodiscard]] double factor() const noexcept { return dense_ ? 1.0 : rungs_[index_]; }
  /// The highest factor the ladder may still reach (lowered by each rise of the loss; 1 once
  /// compression is off).
  [[nodiscard]] double ceiling() const noexcept { return dense_ ? 1.0 : rungs_[ceiling_]; }
  /// The last window boundary's measurement and move (all zero before the first boundary).
  [[nodiscard]] ef_window_event const& last_window() const noexcept { return event_; }
  /// Number of rises of the loss so far, and the last one (all zero before the first).
  [[nodiscard]] std::uint64_t backoffs() const noexcept { return backoffs_; }
  [[nodiscard]] ef_window_backoff const& last_backoff() const noexcept { return backoff_; }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Decides step `s.step` (== `plan().step`): sends the current rung, adds the step to the
  /// window and its loss to the loss block; when the block completes with a rise, drops to the
  /// lowest rung (or turns compression off), else at the window's last step chooses the rung
  /// of the next window.
  ///
  /// @throws config_error if the step is not the planned one or `compressed_norm_sq` does not
  ///         hold one norm per measured factor.
  /// @throws numeric_error if a norm or time is negative or not finite, or the loss is
  ///         infinite.
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
    if (std::isinf(s.loss)) {
      throw numeric_error("gradcomp: ef_window step " + std::to_string(s.step) +
                          " got loss = " + std::to_string(s.loss) +
                          "; expected a finite loss or NaN (not reported)");
    }

    if (dense_) {  // compression is off: g dense, the residual kept
      decision d;
      d.step = s.step;
      d.send = send_kind::dense;
      d.residual = residual_rule::keep;
      ++plan_.step;
      d.next = plan_;
      return d;
    }

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
    bool const rose = cfg_.loss_block > 0 && !std::isnan(s.loss) && add_loss(s.step, s.loss);
    if (rose) {
      back_off(s.step);
    } else if (count_ == cfg_.window) {
      end_window(s.step);
    }
    ++plan_.step;
    refresh_plan();
    d.next = plan_;
    return d;
  }

  /// Writes the whole state — the loss check's state (compression off, loss up, ceiling, window
  /// start, the first step judged, rises, the block's sums, first and lowest block means, the last
  /// rise), the rung, the window's sums, the residual at the window's start, the last window
  /// event and the plan — after a fingerprint of the configuration.
  void save_state(detail::byte_writer& w) const {
    w.put_u64(config_fingerprint());
    w.put_bool(dense_);
    w.put_bool(elevated_);
    w.put_u64(ceiling_);
    w.put_u64(window_start_);
    w.put_u64(judge_from_);
    w.put_u64(backoffs_);
    w.put_u64(block_n_);
    w.put_f64(block_sum_);
    w.put_f64(block_sum_sq_);
    w.put_f64(first_loss_);
    w.put_f64(lowest_loss_);
    w.put_u64(backoff_.step);
    w.put_f64(backoff_.loss);
    w.put_f64(backoff_.lowest);
    w.put_f64(backoff_.first);
    w.put_f64(backoff_.from);
    w.put_f64(backoff_.to);
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
  /// configuration or does not hold together (a rung or ceiling off the ladder, a rung above
  /// the ceiling, a window count that does not match the step, a negative or non-finite sum, a
  /// loss block that is not one, a plan other than the rung's).
  void load_state(detail::byte_reader& r) {
    if (r.get_u64() != config_fingerprint()) {
      r.fail("saved by an ef_window controller with another configuration");
    }
    bool const dense = r.get_bool();
    bool const elevated = r.get_bool();
    std::uint64_t const ceiling = r.get_u64();
    std::uint64_t const window_start = r.get_u64();
    std::uint64_t const judge_from = r.get_u64();
    std::uint64_t const backoffs = r.get_u64();
    std::uint64_t const block_n = r.get_u64();
    double const block_sum = r.get_f64(), block_sum_sq = r.get_f64();
    double const first_loss = r.get_f64(), lowest_loss = r.get_f64();
    ef_window_backoff bo;
    bo.step = r.get_u64();
    bo.loss = r.get_f64();
    bo.lowest = r.get_f64();
    bo.first = r.get_f64();
    bo.from = r.get_f64();
    bo.to = r.get_f64();
    if (ceiling >= rungs_.size()) {
      r.fail("ceiling " + std::to_string(ceiling) + " is off the ladder of " +
             std::to_string(rungs_.size()) + " rungs");
    }
    if (block_n >= std::max<std::uint64_t>(cfg_.loss_block, 1) || !std::isfinite(block_sum) ||
        !std::isfinite(block_sum_sq) || block_sum_sq < 0.0 || (block_n == 0 && block_sum != 0.0) ||
        std::isnan(first_loss) != std::isnan(lowest_loss) || std::isinf(first_loss) ||
        std::isinf(lowest_loss) || lowest_loss > first_loss) {
      r.fail("the loss check's block or its first and lowest means do not hold together");
    }
    double const bv[] = {bo.loss, bo.lowest, bo.first, bo.from, bo.to};
    for (double v : bv) {
      if (!std::isfinite(v)) r.fail("the last rise of the loss holds a non-finite value");
    }
    if ((backoffs == 0) != (bo == ef_window_backoff{})) {
      r.fail("the count of rises does not match the last rise");
    }
    std::uint64_t const index = r.get_u64();
    if (index >= rungs_.size()) {
      r.fail("rung " + std::to_string(index) + " is off the ladder of " +
             std::to_string(rungs_.size()) + " rungs");
    }
    if (index > ceiling) {
      r.fail("rung " + std::to_string(index) + " is above the ceiling " + std::to_string(ceiling));
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
    if (!dense &&
        (window_start > p.step || count != p.step - window_start || count >= cfg_.window)) {
      r.fail("the window holds " + std::to_string(count) + " steps at step " +
             std::to_string(p.step) + "; expected the steps since its start, fewer than " +
             std::to_string(cfg_.window));
    }
    step_plan expected = p;
    expected.measure = dense ? std::vector<double>{} : measure_of(static_cast<std::size_t>(index));
    expected.accumulate_layers = expected.report_layers = false;
    if (!(p == expected)) r.fail("the plan is not the one of the saved rung");
    dense_ = dense;
    elevated_ = elevated;
    ceiling_ = static_cast<std::size_t>(ceiling);
    window_start_ = window_start;
    judge_from_ = judge_from;
    backoffs_ = backoffs;
    block_n_ = block_n;
    block_sum_ = block_sum;
    block_sum_sq_ = block_sum_sq;
    first_loss_ = first_loss;
    lowest_loss_ = lowest_loss;
    backoff_ = bo;
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
    double const v[] = {cfg_.factor_min,
                        cfg_.factor_max,
                        cfg_.ratio,
                        static_cast<double>(cfg_.window),
                        cfg_.max_delay,
                        cfg_.settled,
                        cfg_.climb,
                        cfg_.start,
                        static_cast<double>(cfg_.loss_block),
                        cfg_.loss_rise};
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
    } else if (ev.delivered >= cfg_.settled && !elevated_) {
      double const fits = ev.delay > 0.0 ? f * cfg_.max_delay / ev.delay : f * cfg_.climb;
      next = std::max(index_, std::min(ceiling_, rung_at_most(std::min(fits, f * cfg_.climb))));
    }
    index_ = next;
    ev.to = rungs_[index_];
    event_ = ev;
    restart_window(step);
  }

  // A new window from the step after `step`.
  void restart_window(std::uint64_t step) noexcept {
    count_ = 0;
    sum_sent_ = sum_kept_ = 0.0;
    start_kept_ = last_kept_;
    window_start_ = step + 1;
  }

  // Adds a reported loss to the block; at the block's end, judges it. True: a rise.
  bool add_loss(std::uint64_t step, double loss) {
    block_sum_ += loss;
    block_sum_sq_ += loss * loss;
    if (++block_n_ < cfg_.loss_block) return false;
    auto const n = static_cast<double>(block_n_);
    double const mean = block_sum_ / n;
    double const var = std::max(0.0, (block_sum_sq_ - n * mean * mean) / (n - 1.0));
    double const se = std::sqrt(var / n);
    block_n_ = 0;
    block_sum_ = block_sum_sq_ = 0.0;
    if (std::isnan(first_loss_)) {
      first_loss_ = lowest_loss_ = mean;
      return false;
    }
    double const rise = mean - lowest_loss_;
    elevated_ = rise > cfg_.loss_rise * std::max(first_loss_ - lowest_loss_, lowest_loss_) &&
                rise > 2.0 * se;
    if (elevated_ && step >= judge_from_) {
      backoff_ = {step, mean, lowest_loss_, first_loss_, rungs_[index_], 0.0};
      return true;
    }
    lowest_loss_ = std::min(lowest_loss_, mean);
    return false;
  }

  // A rise of the loss at the current rung: the lowest rung under a ceiling just below the
  // current one, or compression off at the lowest rung.
  void back_off(std::uint64_t step) noexcept {
    ++backoffs_;
    if (index_ == 0) {
      dense_ = true;
    } else {
      ceiling_ = index_ - 1;
      index_ = 0;
    }
    backoff_.to = factor();
    restart_window(step);
    judge_from_ = step + 1 + cfg_.window;
  }

  void refresh_plan() {
    plan_.measure = dense_ ? std::vector<double>{} : measure_of(index_);
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
  // The loss check.
  bool elevated_ = false;           // the last block was above the threshold: no climbing
  bool dense_ = false;              // compression off (a rise at the lowest rung)
  std::size_t ceiling_ = 0;         // highest rung allowed
  std::uint64_t window_start_ = 0;  // first step of the current window
  std::uint64_t judge_from_ = 0;    // blocks completed before this step are not judged
  std::uint64_t backoffs_ = 0;      // rises so far
  std::uint64_t block_n_ = 0;       // losses in the current block
  double block_sum_ = 0.0, block_sum_sq_ = 0.0;
  double first_loss_ = std::numeric_limits<double>::quiet_NaN();   // L0
  double lowest_loss_ = std::numeric_limits<double>::quiet_NaN();  // L*
  ef_window_backoff backoff_;
};

static_assert(controller<ef_window_controller>);

GRADCOMP_NAMESPACE_END
