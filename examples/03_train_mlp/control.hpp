// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Compression controllers for the training example: who picks the compression factor of each
/// step.
///
/// The pipeline (exchange.hpp) speaks gradcomp's controller protocol: before a step it asks
/// `ctrl.plan()` which factors to compress at (`step_plan::measure`, multi-level), after
/// compressing it reports `step_stats` (‖g_ef‖², ‖C(g_ef)‖² per measured factor, per-layer
/// norms, the last step's compute / compress / sync times), made identical on every rank, and
/// `ctrl.decide(stats)` answers what to send and how to update the residual (`decision`).
///
/// When the library has its adaptive controllers (`gradcomp/adapt/any_controller.hpp`), this
/// header uses them: every `make_controller` spec works (static, schedule, dgc_warmup, gravac,
/// accordion). Without them it provides the same protocol types and the two non-adaptive
/// controllers itself (`dense`, `static:factor=F`, `schedule:0=F0,STEP=F1,...`), and an
/// adaptive spec raises `controller_unavailable`: the demo then prints "not available in this
/// build" for that run instead of numbers.

#include <gradcomp/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if __has_include(<gradcomp/adapt/any_controller.hpp>)
#  include <gradcomp/adapt/any_controller.hpp>
#  define TRAIN_HAVE_ADAPTIVE_CONTROLLERS 1
#else
#  define TRAIN_HAVE_ADAPTIVE_CONTROLLERS 0
#endif

namespace train {

/// A controller spec that this build cannot run (an adaptive controller without the library's
/// `adapt/` headers).
class controller_unavailable : public gradcomp::config_error {
 public:
  using gradcomp::config_error::config_error;
};

/// True when the adaptive controllers (GraVAC, Accordion) are available.
inline constexpr bool have_adaptive_controllers = TRAIN_HAVE_ADAPTIVE_CONTROLLERS != 0;

#if TRAIN_HAVE_ADAPTIVE_CONTROLLERS

using gradcomp::agree;
using gradcomp::decision;
using gradcomp::residual_rule;
using gradcomp::send_kind;
using gradcomp::step_plan;
using gradcomp::step_stats;
using gradcomp::step_timing;
/// A controller chosen at run time.
using controller = gradcomp::any_controller;

/// Builds a controller from a spec (see `gradcomp::make_controller`).
inline controller make_controller(std::string_view spec) { return gradcomp::make_controller(spec); }

#else

// The protocol, field for field as in gradcomp/adapt/protocol.hpp, reduced to what the
// non-adaptive controllers below need.

/// What the pipeline must compute during the coming step.
struct step_plan {
  std::uint64_t step = 0;
  /// Factors to compress g_ef at, increasing; each after the first from the previous packet.
  /// Empty: the step is dense.
  std::vector<double> measure;
  bool accumulate_layers = false;  ///< accumulate the raw per-layer gradients
  bool report_layers = false;      ///< report (and reset) the accumulators' squared norms
};

/// Wall-clock seconds of one step.
struct step_timing {
  double backprop = 0.0;
  double compress = 0.0;
  double sync = 0.0;
};

/// What the pipeline reports once per step (identical on every rank after `agree`).
struct step_stats {
  std::uint64_t step = 0;
  double ef_norm_sq = 0.0;                 ///< ‖g_ef‖², summed over ranks
  std::vector<double> compressed_norm_sq;  ///< ‖C(g_ef)‖² per measured factor, summed
  std::vector<double> layer_norms_sq;      ///< per-layer accumulator norms, summed
  step_timing last_step;                   ///< previous step's times, max over ranks
  std::uint64_t batch_size = 0;
  std::uint32_t workers = 0;
  double learning_rate = 0.0;
  double next_learning_rate = 0.0;
};

/// What a step sends.
enum class send_kind : std::uint8_t { minimum, candidate, dense };

/// How the residual is updated after the send.
enum class residual_rule : std::uint8_t { subtract_sent, zero, keep };

/// A controller's answer for one step.
struct decision {
  std::uint64_t step = 0;
  send_kind send = send_kind::dense;
  double factor = 1.0;
  residual_rule residual = residual_rule::zero;
  double gain = 1.0;
  step_plan next;

  /// Index into `plan().measure` of the packet to send, or `npos` for dense.
  [[nodiscard]] std::size_t packet(std::size_t measured) const noexcept {
    if (send == send_kind::dense || measured == 0) return npos;
    return send == send_kind::minimum ? 0 : measured - 1;
  }
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
};

/// Makes `s` identical on every rank: sums of the norms, maximum of the times.
template <class Sum, class Max>
void agree(step_stats& s, Sum&& sum, Max&& max) {
  std::vector<double> sums{s.ef_norm_sq};
  sums.insert(sums.end(), s.compressed_norm_sq.begin(), s.compressed_norm_sq.end());
  sums.insert(sums.end(), s.layer_norms_sq.begin(), s.layer_norms_sq.end());
  std::vector<double> maxes{s.last_step.backprop, s.last_step.compress, s.last_step.sync};
  sum(std::span<double>(sums));
  max(std::span<double>(maxes));
  s.ef_norm_sq = sums[0];
  std::size_t k = 1;
  for (auto& v : s.compressed_norm_sq) v = sums[k++];
  for (auto& v : s.layer_norms_sq) v = sums[k++];
  s.last_step = {maxes[0], maxes[1], maxes[2]};
}

/// A piecewise-constant factor per step: from `starts[i]` on, `factors[i]` (1 = dense). A static
/// factor is the one-piece schedule. Uses only the step number of the statistics.
class controller {
 public:
  controller(std::vector<std::uint64_t> starts, std::vector<double> factors, std::string name)
      : starts_(std::move(starts)), factors_(std::move(factors)), name_(std::move(name)) {
    if (starts_.empty() || starts_.size() != factors_.size() || starts_[0] != 0) {
      throw gradcomp::config_error(
          "train: a schedule needs at least one point, the first at step 0");
    }
    for (std::size_t i = 0; i < factors_.size(); ++i) {
      if (!std::isfinite(factors_[i]) || factors_[i] < 1.0) {
        throw gradcomp::config_error("train: compression factor " + std::to_string(factors_[i]) +
                                     " is invalid; expected a finite factor >= 1 (1 = dense)");
      }
      if (i > 0 && starts_[i] <= starts_[i - 1]) {
        throw gradcomp::config_error("train: schedule steps must increase strictly");
      }
    }
    plan_ = plan_for(0);
  }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }
  [[nodiscard]] std::string const& name() const noexcept { return name_; }

  decision decide(step_stats const& s) {
    if (s.step != plan_.step) {
      throw gradcomp::config_error("train: controller got the statistics of step " +
                                   std::to_string(s.step) + ", expected step " +
                                   std::to_string(plan_.step));
    }
    decision d;
    d.step = s.step;
    double const f = factor_at(s.step);
    if (f > 1.0) {
      d.send = send_kind::minimum;
      d.factor = f;
      d.residual = residual_rule::subtract_sent;
    }
    plan_ = plan_for(s.step + 1);
    d.next = plan_;
    return d;
  }

 private:
  [[nodiscard]] double factor_at(std::uint64_t step) const {
    std::size_t i = 0;
    while (i + 1 < starts_.size() && starts_[i + 1] <= step) ++i;
    return factors_[i];
  }
  [[nodiscard]] step_plan plan_for(std::uint64_t step) const {
    step_plan p;
    p.step = step;
    double const f = factor_at(step);
    if (f > 1.0) p.measure = {f};
    return p;
  }

  std::vector<std::uint64_t> starts_;
  std::vector<double> factors_;
  std::string name_;
  step_plan plan_;
};

/// Builds a controller: `dense`, `static:factor=F` or `schedule:STEP=F,...` (first STEP 0).
/// `gravac...`, `accordion...` and `dgc_warmup...` raise `controller_unavailable`.
inline controller make_controller(std::string_view spec) {
  std::string_view const name = spec.substr(0, spec.find(':'));
  std::string_view const rest =
      name.size() < spec.size() ? spec.substr(name.size() + 1) : std::string_view{};
  auto number = [&](std::string_view v, char const* what) {
    std::string const s(v);
    char* end = nullptr;
    double const x = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) {
      throw gradcomp::config_error("train: controller '" + std::string(spec) + "': " + what + " '" +
                                   s + "' is not a number");
    }
    return x;
  };
  if (name == "dense" && rest.empty()) return controller({0}, {1.0}, std::string(spec));
  if (name == "static") {
    if (rest.substr(0, 7) != "factor=") {
      throw gradcomp::config_error("train: controller 'static' needs factor=F, got '" +
                                   std::string(spec) + "'");
    }
    return controller({0}, {number(rest.substr(7), "factor")}, std::string(spec));
  }
  if (name == "schedule" && !rest.empty()) {
    std::vector<std::uint64_t> starts;
    std::vector<double> factors;
    std::string_view r = rest;
    while (!r.empty()) {
      std::string_view const item = r.substr(0, r.find(','));
      r = item.size() < r.size() ? r.substr(item.size() + 1) : std::string_view{};
      auto const eq = item.find('=');
      if (eq == std::string_view::npos) {
        throw gradcomp::config_error("train: schedule point '" + std::string(item) +
                                     "' is not STEP=FACTOR");
      }
      double const step = number(item.substr(0, eq), "step");
      if (step < 0 || step != std::floor(step)) {
        throw gradcomp::config_error("train: schedule step '" + std::string(item.substr(0, eq)) +
                                     "' is not a non-negative integer");
      }
      starts.push_back(static_cast<std::uint64_t>(step));
      factors.push_back(number(item.substr(eq + 1), "factor"));
    }
    return controller(std::move(starts), std::move(factors), std::string(spec));
  }
  if (name == "gravac" || name == "accordion" || name == "dgc_warmup") {
    throw controller_unavailable("train: controller '" + std::string(name) +
                                 "' is not available in this build (it needs gradcomp's adaptive "
                                 "controllers, gradcomp/adapt/any_controller.hpp)");
  }
  throw gradcomp::config_error("train: unknown controller '" + std::string(spec) +
                               "' (expected dense, static:factor=F, schedule:STEP=F,...)");
}

#endif

}  // namespace train
