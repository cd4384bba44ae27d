// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Non-adaptive controllers: `static_controller` (one factor for the whole run) and
/// `schedule_controller` (a factor that is a piecewise-constant function of the step), with
/// `dgc_warmup`, the exponential sparsity warm-up of Deep Gradient Compression (Lin et al.
/// 2018: 75 %, 93.75 %, 98.4375 %, 99.6 %, then 99.9 %), gradcomp's one warm-up: a pipeline
/// runs it as a controller, and a plain `compressor<topk_codec, dgc_feedback>` follows it with
/// `dgc_topk(schedule, step)` (docs/dgc.md).
///
/// They use only `step_stats::step`; the other fields are ignored. A factor of 1 means dense:
/// the plan measures nothing and the decision sends g_ef dense and zeroes the residual.

#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/codec/detail/sparse.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Compresses every step at one factor (1 = dense).
class static_controller {
 public:
  using controller_concept = controller_tag;
  /// Names the kind of state `save_state` writes.
  static constexpr char const* state_kind = "static";

  /// @param factor compression factor, finite and >= 1 (1 = dense); `config_error` otherwise.
  explicit static_controller(double factor) : factor_(factor) {
    detail::check_param(factor, "static controller", "factor", 1.0, true, 1e300, true,
                        "a finite compression factor >= 1 (1 = dense)");
    plan_.measure = detail::single_factor_measure(factor_);
  }

  [[nodiscard]] double factor() const noexcept { return factor_; }
  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Writes the state (the plan) after the factor, which `load_state` checks.
  void save_state(detail::byte_writer& w) const {
    w.put_f64(factor_);
    detail::save_plan(w, plan_);
  }
  /// Restores a state written by `save_state`; `format_error` for another factor.
  void load_state(detail::byte_reader& r) {
    if (r.get_f64() != factor_) r.fail("saved by a static controller with another factor");
    plan_ = detail::load_plan(r);
  }

  /// Sends the planned factor; checks only that `s.step` is the planned step.
  decision decide(step_stats const& s) {
    detail::check_step(s, plan_, "static controller");
    decision d = detail::single_factor_decision(plan_.step, factor_);
    ++plan_.step;
    d.next = plan_;
    return d;
  }

 private:
  double factor_;
  step_plan plan_;
};

/// One piece of a step schedule: from step `start` on, compress at `factor`.
struct schedule_point {
  std::uint64_t start = 0;
  double factor = 1.0;

  friend bool operator==(schedule_point const&, schedule_point const&) = default;
};

/// Compresses step `i` at the factor of the last schedule point whose `start` is <= i.
class schedule_controller {
 public:
  using controller_concept = controller_tag;
  /// Names the kind of state `save_state` writes.
  static constexpr char const* state_kind = "schedule";

  /// @param points non-empty, the first `start` is 0, starts strictly increasing, each factor
  ///        finite and >= 1; `config_error` otherwise.
  explicit schedule_controller(std::vector<schedule_point> points) : points_(std::move(points)) {
    if (points_.empty()) {
      throw config_error("gradcomp: schedule controller needs at least one {start, factor} point");
    }
    if (points_.front().start != 0) {
      throw config_error("gradcomp: schedule controller's first point starts at step " +
                         std::to_string(points_.front().start) +
                         "; expected 0 (every step needs a factor)");
    }
    for (std::size_t i = 0; i < points_.size(); ++i) {
      detail::check_param(points_[i].factor, "schedule controller", "factor", 1.0, true, 1e300,
                          true, "a finite compression factor >= 1 (1 = dense)");
      if (i > 0 && points_[i].start <= points_[i - 1].start) {
        throw config_error(
            "gradcomp: schedule controller's points must have strictly increasing "
            "starts, but step " +
            std::to_string(points_[i].start) + " follows step " +
            std::to_string(points_[i - 1].start));
      }
    }
    plan_.measure = detail::single_factor_measure(factor_at(0));
  }

  /// The factor the schedule gives step `step`.
  [[nodiscard]] double factor_at(std::uint64_t step) const noexcept {
    auto it =
        std::upper_bound(points_.begin(), points_.end(), step,
                         [](std::uint64_t s, schedule_point const& p) { return s < p.start; });
    return std::prev(it)->factor;
  }
  [[nodiscard]] std::vector<schedule_point> const& points() const noexcept { return points_; }
  /// Writes the state (the plan) after the schedule, which `load_state` checks.
  void save_state(detail::byte_writer& w) const {
    w.put_u64(points_.size());
    for (auto const& p : points_) {
      w.put_u64(p.start);
      w.put_f64(p.factor);
    }
    detail::save_plan(w, plan_);
  }
  /// Restores a state written by `save_state`; `format_error` for another schedule.
  void load_state(detail::byte_reader& r) {
    if (r.get_u64() != points_.size()) r.fail("saved by a schedule controller with another schedule");
    for (auto const& p : points_) {
      if (r.get_u64() != p.start || r.get_f64() != p.factor) r.fail("saved by a schedule controller with another schedule");
    }
    plan_ = detail::load_plan(r);
  }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Sends the planned factor; checks only that `s.step` is the planned step.
  decision decide(step_stats const& s) {
    detail::check_step(s, plan_, "schedule controller");
    decision d = detail::single_factor_decision(plan_.step, factor_at(plan_.step));
    ++plan_.step;
    plan_.measure = detail::single_factor_measure(factor_at(plan_.step));
    d.next = plan_;
    return d;
  }

 private:
  std::vector<schedule_point> points_;
  step_plan plan_;
};

/// DGC's exponential warm-up: stage k = 0, 1, ..., `stages` − 1 lasts `stage_steps` steps at
/// factor min(base^(k+1), final_factor); then `final_factor` for the rest of the run. The
/// defaults give DGC's sparsities 75 %, 93.75 %, 98.4375 %, 99.6 % (factors 4, 16, 64, 256)
/// over four epochs, then 99.9 % (1000), with `stage_steps` = steps per epoch.
///
/// @param stage_steps steps per stage, >= 1.
/// @param final_factor factor after the warm-up, finite and >= 1.
/// @param stages number of warm-up stages (0 = no warm-up).
/// @param base growth per stage, finite and > 1.
inline schedule_controller dgc_warmup(std::uint64_t stage_steps, double final_factor = 1000.0,
                                      std::uint32_t stages = 4, double base = 4.0) {
  if (stage_steps == 0) {
    throw config_error("gradcomp: dgc_warmup needs stage_steps >= 1, got 0");
  }
  detail::check_param(final_factor, "dgc_warmup", "final_factor", 1.0, true, 1e300, true,
                      "a finite compression factor >= 1");
  detail::check_param(base, "dgc_warmup", "base", 1.0, false, 1e300, true,
                      "a finite growth factor > 1");
  std::vector<schedule_point> points;
  double f = 1.0;
  for (std::uint32_t k = 0; k < stages; ++k) {
    f = std::min(f * base, final_factor);
    if (!points.empty() && points.back().factor == f) continue;  // capped: merge equal stages
    points.push_back({k * stage_steps, f});
  }
  std::uint64_t const end = std::uint64_t{stages} * stage_steps;
  if (points.empty()) {
    points.push_back({0, final_factor});
  } else if (points.back().factor != final_factor) {
    points.push_back({end, final_factor});
  }
  return schedule_controller(std::move(points));
}

/// The top-k codec that schedule `s` (e.g. `dgc_warmup`) gives step `step`:
/// `topk_codec::ratio(1 / s.factor_at(step), values)`. With `compressor<topk_codec,
/// dgc_feedback>`, assign it to `codec()` before each step; the state carries over.
inline topk_codec dgc_topk(schedule_controller const& s, std::uint64_t step,
                           sparse_values values = sparse_values::f32) {
  return topk_codec::ratio(1.0 / s.factor_at(step), values);
}

GRADCOMP_NAMESPACE_END
