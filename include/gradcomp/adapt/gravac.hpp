// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gravac_controller`: GraVAC (Tyagi & Swany, IEEE CLOUD 2023, Algorithm 1), adaptive
/// compression from the compression gain E‖C(g_ef)‖² / E‖g_ef‖² and the compression
/// throughput T_sys × gain of each factor used. docs/adaptive.md lists every choice made
/// where the paper leaves a gap, and why.
///
/// Each step the pipeline compresses g_ef at θmin and, from that packet, at the candidate
/// factor (multi-level compression: `plan().measure` = {θmin, candidate}, the candidate packet
/// recompressed from the θmin packet by candidate/θmin). `decide` updates the smoothed gains
/// with this step's norms and sends the candidate if its gain is >= ε, else θmin if its gain
/// is >= ε, else g_ef dense (residual zeroed). Every `window` steps it promotes θmin to the
/// candidate when their gains are within ω, stops the search when the two best throughputs
/// are within ω (keeping the lower factor of the two), and otherwise moves the candidate up
/// by the scaling policy, capped at θmax.
///
/// Statistics used: `step`, `ef_norm_sq`, `compressed_norm_sq` (one per measured factor),
/// `last_step` (backprop, compress, sync), `batch_size`, `workers`.

#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How the candidate's step factor θs grows at a window boundary.
enum class gravac_policy : std::uint8_t {
  exponential,  ///< θs ← θs² (2, 4, 16, 256, ...: factors 2^1, 2^2, 2^4, 2^8 of the base)
  geometric,    ///< θs ← ratio · θs (2, 4, 8, 16, ... for ratio 2)
};

/// What the EWMA smooths.
enum class gravac_gain_average : std::uint8_t {
  ratio,     ///< one EWMA of ‖C‖²/‖g_ef‖² per factor (Algorithm 1, lines 7 and 9)
  separate,  ///< EWMAs of ‖C‖² and ‖g_ef‖², gain = their ratio (the paper's prose)
};

/// How a factor's compression throughput is kept.
enum class gravac_throughput : std::uint8_t {
  window_mean,  ///< mean of the samples of the last window in which the factor was sent
  last,         ///< the last sample (Algorithm 1, UpdateStep)
};

/// What the step factor multiplies to give the candidate: candidate = min(base · θs, θmax).
enum class gravac_base : std::uint8_t {
  initial,  ///< the initial θmin (the paper's text and its published candidate sequences)
  current,  ///< the current θmin (Algorithm 1, line 8 after a promotion)
};

/// What the dense fallback sends.
enum class gravac_dense : std::uint8_t {
  flush,  ///< g_ef, residual included; the residual becomes 0 (Algorithm 1, lines 22-23)
  keep,   ///< the raw gradient g; the residual is kept for later steps
};

/// Parameters of `gravac_controller`; defaults are the paper's (§IV-B, Exponential runs).
struct gravac_config {
  double theta_min = 10.0;     ///< initial minimum factor θmin, finite and > 1
  double theta_max = 1000.0;   ///< cap on the candidate, finite and >= theta_min
  double epsilon = 0.7;        ///< gain a factor needs to be sent, in [0, 1]
  double omega = 0.01;         ///< saturation tolerance for gains and throughputs, in [0, 1)
  std::uint64_t window = 500;  ///< steps per candidate evaluation, >= 1
  double step_factor = 2.0;    ///< initial θs (first candidate = θs · θmin), finite and > 1
  gravac_policy policy = gravac_policy::exponential;  ///< how θs grows
  double ratio = 2.0;  ///< common ratio of the geometric policy, finite and > 1
  /// EWMA weight of the newest sample, in (0, 1]; 0 (the default) means min(1, N/100) with N
  /// = `step_stats::workers`, the paper's N/100 clamped.
  double smoothing = 0.0;
  gravac_gain_average gain_average = gravac_gain_average::ratio;
  gravac_throughput throughput = gravac_throughput::window_mean;
  gravac_base candidate_base = gravac_base::initial;
  gravac_dense dense_fallback = gravac_dense::flush;
};

/// What happened at the last window boundary (for logs and tests).
struct gravac_window_event {
  std::uint64_t step = 0;  ///< the boundary step (its decide call)
  bool promoted = false;   ///< θmin was raised to the candidate
  bool saturated = false;  ///< the two best throughputs were within ω; the search stopped
  bool scaled = false;     ///< the candidate moved up by the scaling policy
  double theta_min = 0.0;  ///< θmin after the boundary
  double candidate = 0.0;  ///< candidate after the boundary

  friend bool operator==(gravac_window_event const&, gravac_window_event const&) = default;
};

/// GraVAC's controller. Models `controller`.
class gravac_controller {
 public:
  using controller_concept = controller_tag;
  /// Names the kind of state `save_state` writes.
  static constexpr char const* state_kind = "gravac";

  /// @throws config_error naming the first invalid parameter of `cfg`.
  explicit gravac_controller(gravac_config cfg = {}) : cfg_(cfg) {
    char const* who = "GraVAC";
    detail::check_param(cfg_.theta_min, who, "theta_min", 1.0, false, 1e300, true,
                        "a finite factor > 1");
    detail::check_param(cfg_.theta_max, who, "theta_max", cfg_.theta_min, true, 1e300, true,
                        "a finite factor >= theta_min");
    detail::check_param(cfg_.epsilon, who, "epsilon", 0.0, true, 1.0, true, "a gain in [0, 1]");
    detail::check_param(cfg_.omega, who, "omega", 0.0, true, 1.0, false,
                        "a relative tolerance in [0, 1)");
    if (cfg_.window == 0) {
      throw config_error("gradcomp: GraVAC parameter window = 0 is invalid; expected >= 1 step");
    }
    detail::check_param(cfg_.step_factor, who, "step_factor", 1.0, false, 1e300, true,
                        "a finite step factor > 1");
    detail::check_param(cfg_.ratio, who, "ratio", 1.0, false, 1e300, true,
                        "a finite common ratio > 1");
    detail::check_param(cfg_.smoothing, who, "smoothing", 0.0, true, 1.0, true,
                        "an EWMA weight in (0, 1], or 0 for min(1, workers/100)");
    if (static_cast<unsigned>(cfg_.policy) > 1 || static_cast<unsigned>(cfg_.gain_average) > 1 ||
        static_cast<unsigned>(cfg_.throughput) > 1 ||
        static_cast<unsigned>(cfg_.candidate_base) > 1 ||
        static_cast<unsigned>(cfg_.dense_fallback) > 1) {
      throw config_error("gradcomp: GraVAC configuration holds an enum value out of range");
    }
    theta_min_ = cfg_.theta_min;
    theta_s_ = cfg_.step_factor;
    candidate_ = std::min(cfg_.theta_min * theta_s_, cfg_.theta_max);
    refresh_plan();
  }

  [[nodiscard]] gravac_config const& config() const noexcept { return cfg_; }
  /// Writes the whole state — θmin, θs, the candidate, the smoothed gains, every factor's
  /// throughput record, the search flags, the pending window sample, the last window event and
  /// the plan — after a fingerprint of the configuration, which `load_state` checks.
  void save_state(detail::byte_writer& w) const {
    w.put_u64(config_fingerprint());
    w.put_f64(theta_min_);
    w.put_f64(theta_s_);
    w.put_f64(candidate_);
    for (smoothed_gain const* g : {&min_, &cand_}) {
      w.put_bool(g->seeded);
      w.put_f64(g->ratio);
      w.put_f64(g->num);
      w.put_f64(g->den);
    }
    w.put_u64(tput_.size());
    for (auto const& [f, e] : tput_) {
      w.put_f64(f);
      w.put_bool(e.has_value);
      w.put_f64(e.value);
      w.put_f64(e.window_sum);
      w.put_u64(e.window_count);
    }
    w.put_bool(searching_);
    w.put_bool(pending_);
    w.put_f64(pending_factor_);
    w.put_f64(pending_gain_);
    w.put_u64(event_.step);
    w.put_bool(event_.promoted);
    w.put_bool(event_.saturated);
    w.put_bool(event_.scaled);
    w.put_f64(event_.theta_min);
    w.put_f64(event_.candidate);
    detail::save_plan(w, plan_);
  }
  /// Restores a state written by `save_state`; `format_error` if it was saved with another
  /// configuration.
  void load_state(detail::byte_reader& r) {
    if (r.get_u64() != config_fingerprint()) r.fail("saved by a GraVAC controller with another configuration");
    theta_min_ = r.get_f64();
    theta_s_ = r.get_f64();
    candidate_ = r.get_f64();
    for (smoothed_gain* g : {&min_, &cand_}) {
      g->seeded = r.get_bool();
      g->ratio = r.get_f64();
      g->num = r.get_f64();
      g->den = r.get_f64();
    }
    std::uint64_t const n = r.get_u64();
    tput_.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
      double const f = r.get_f64();
      throughput_entry e;
      e.has_value = r.get_bool();
      e.value = r.get_f64();
      e.window_sum = r.get_f64();
      e.window_count = r.get_u64();
      if (!tput_.emplace(f, e).second) r.fail("a throughput record appears twice");
    }
    searching_ = r.get_bool();
    pending_ = r.get_bool();
    pending_factor_ = r.get_f64();
    pending_gain_ = r.get_f64();
    event_.step = r.get_u64();
    event_.promoted = r.get_bool();
    event_.saturated = r.get_bool();
    event_.scaled = r.get_bool();
    event_.theta_min = r.get_f64();
    event_.candidate = r.get_f64();
    plan_ = detail::load_plan(r);
  }

  [[nodiscard]] step_plan const& plan() const noexcept { return plan_; }

  /// Current minimum factor θmin.
  [[nodiscard]] double theta_min() const noexcept { return theta_min_; }
  /// Current candidate factor (== θmin when there is nothing above θmin left to try).
  [[nodiscard]] double candidate() const noexcept { return candidate_; }
  /// Current step factor θs of the scaling policy.
  [[nodiscard]] double step_factor() const noexcept { return theta_s_; }
  /// False once the throughputs saturated: the candidate is then fixed.
  [[nodiscard]] bool searching() const noexcept { return searching_; }
  /// Smoothed gain of θmin (1 before the first step).
  [[nodiscard]] double gain_min() const noexcept { return min_.gain(); }
  /// Smoothed gain of the candidate (1 before it is first measured).
  [[nodiscard]] double gain_candidate() const noexcept { return cand_.gain(); }
  /// Compression throughput per factor (1 = dense) of every factor sent so far, in samples
  /// per second × gain, as the saturation check sees it.
  [[nodiscard]] std::map<double, double> throughput() const {
    std::map<double, double> out;
    for (auto const& [f, e] : tput_)
      if (e.has_value) out.emplace(f, e.value);
    return out;
  }
  /// The last window boundary's outcome (all false before the first boundary).
  [[nodiscard]] gravac_window_event const& last_window() const noexcept { return event_; }

  /// Decides step `s.step` (== `plan().step`).
  ///
  /// @throws config_error if the step is not the planned one, `compressed_norm_sq` does not
  ///         hold one norm per measured factor, or `workers` or `batch_size` is 0.
  /// @throws numeric_error if a norm or time is negative or not finite.
  /// Nothing changes when it throws.
  decision decide(step_stats const& s) {
    char const* who = "GraVAC";
    detail::check_step(s, plan_, who);
    if (s.compressed_norm_sq.size() != plan_.measure.size()) {
      throw config_error("gradcomp: GraVAC step " + std::to_string(s.step) + " reports " +
                         std::to_string(s.compressed_norm_sq.size()) +
                         " compressed norms; expected one per measured factor (" +
                         std::to_string(plan_.measure.size()) + ")");
    }
    if (s.workers == 0 || s.batch_size == 0) {
      throw config_error("gradcomp: GraVAC needs workers >= 1 and batch_size >= 1, got " +
                         std::to_string(s.workers) + " and " + std::to_string(s.batch_size));
    }
    detail::check_stat(s.ef_norm_sq, who, "ef_norm_sq");
    for (double v : s.compressed_norm_sq) detail::check_stat(v, who, "compressed_norm_sq");

    double const alpha = cfg_.smoothing > 0.0
                             ? cfg_.smoothing
                             : std::min(1.0, static_cast<double>(s.workers) / 100.0);

    // UpdateStep of the previous step, whose times arrive now.
    if (pending_) {
      double const t = s.last_step.backprop + s.last_step.sync +
                       (pending_factor_ > 1.0 ? s.last_step.compress : 0.0);
      if (t > 0.0) {
        double const tsys = static_cast<double>(s.workers) * static_cast<double>(s.batch_size) / t;
        record(pending_factor_, tsys * pending_gain_);
      }
    }

    // Gains, with this step's sample.
    min_.update(s.compressed_norm_sq[0], s.ef_norm_sq, alpha, cfg_.gain_average);
    bool const two = plan_.measure.size() == 2;
    if (two) cand_.update(s.compressed_norm_sq[1], s.ef_norm_sq, alpha, cfg_.gain_average);

    decision d;
    d.step = s.step;
    if (two && cand_.gain() >= cfg_.epsilon) {
      d.send = send_kind::candidate;
      d.factor = candidate_;
      d.gain = cand_.gain();
      d.residual = residual_rule::subtract_sent;
    } else if (min_.gain() >= cfg_.epsilon) {
      d.send = send_kind::minimum;
      d.factor = theta_min_;
      d.gain = min_.gain();
      d.residual = residual_rule::subtract_sent;
    } else {
      d.send = send_kind::dense;
      d.factor = 1.0;
      d.gain = 1.0;
      d.residual =
          cfg_.dense_fallback == gravac_dense::flush ? residual_rule::zero : residual_rule::keep;
    }
    pending_ = true;
    pending_factor_ = d.factor;
    pending_gain_ = d.gain;

    if ((s.step + 1) % cfg_.window == 0) check_window(s.step);
    ++plan_.step;
    refresh_plan();
    d.next = plan_;
    return d;
  }

 private:
  // A smoothed gain: EWMA of the ratio, or of numerator and denominator, seeded with the
  // first sample.
  [[nodiscard]] std::uint64_t config_fingerprint() const noexcept {
    double const v[] = {cfg_.theta_min, cfg_.theta_max, cfg_.epsilon, cfg_.omega, static_cast<double>(cfg_.window),
                        cfg_.step_factor, static_cast<double>(cfg_.policy), cfg_.ratio, cfg_.smoothing,
                        static_cast<double>(cfg_.gain_average), static_cast<double>(cfg_.throughput),
                        static_cast<double>(cfg_.candidate_base), static_cast<double>(cfg_.dense_fallback)};
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the values' bit patterns
    for (double d : v) {
      auto const b = std::bit_cast<std::uint64_t>(d);
      for (int i = 0; i < 8; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
  }

  struct smoothed_gain {
    bool seeded = false;
    double ratio = 1.0, num = 0.0, den = 0.0;

    static double clamp(double c, double e) { return e > 0.0 ? std::min(1.0, c / e) : 1.0; }
    [[nodiscard]] double gain() const noexcept { return seeded ? ratio : 1.0; }
    void update(double c, double e, double alpha, gravac_gain_average mode) {
      if (mode == gravac_gain_average::ratio) {
        double const x = clamp(c, e);
        ratio = seeded ? (1.0 - alpha) * ratio + alpha * x : x;
      } else {
        num = seeded ? (1.0 - alpha) * num + alpha * c : c;
        den = seeded ? (1.0 - alpha) * den + alpha * e : e;
        ratio = clamp(num, den);
      }
      seeded = true;
    }
  };

  struct throughput_entry {
    bool has_value = false;
    double value = 0.0;
    double window_sum = 0.0;
    std::uint64_t window_count = 0;
  };

  void record(double factor, double t) {
    throughput_entry& e = tput_[factor];
    if (cfg_.throughput == gravac_throughput::last) {
      e.has_value = true;
      e.value = t;
    } else {
      e.window_sum += t;
      ++e.window_count;
    }
  }

  void set_candidate(double c) {
    if (c != candidate_) cand_ = {};
    candidate_ = c;
  }

  // CheckGraVAC at the end of boundary step `step`.
  void check_window(std::uint64_t step) {
    for (auto& [f, e] : tput_) {
      if (e.window_count > 0) {
        e.has_value = true;
        e.value = e.window_sum / static_cast<double>(e.window_count);
        e.window_sum = 0.0;
        e.window_count = 0;
      }
    }
    gravac_window_event ev;
    ev.step = step;
    if (searching_) {
      // 1. Promote θmin to the candidate just evaluated when their gains are within ω.
      double const gmin = min_.gain(), gcand = cand_.gain();
      if (candidate_ > theta_min_ && cand_.seeded && gmin > 0.0 &&
          std::fabs(gmin - gcand) / gmin <= cfg_.omega) {
        theta_min_ = candidate_;
        min_ = cand_;  // the same factor: its average carries over
        cand_ = {};
        ev.promoted = true;
      }
      // 2. Saturation: the two best compressed throughputs within ω; keep the lower factor.
      double f1 = 0.0, t1 = -1.0, f2 = 0.0, t2 = -1.0;
      for (auto const& [f, e] : tput_) {
        if (f <= 1.0 || !e.has_value) continue;
        if (e.value > t1) {
          f2 = f1, t2 = t1;
          f1 = f, t1 = e.value;
        } else if (e.value > t2) {
          f2 = f, t2 = e.value;
        }
      }
      if (t2 > 0.0 && (t1 - t2) / t2 <= cfg_.omega) {
        double const pick = std::min(f1, f2);
        if (pick < theta_min_) {
          theta_min_ = pick;
          min_ = {};
        }
        set_candidate(std::max(pick, theta_min_));
        searching_ = false;
        ev.saturated = true;
      } else if (candidate_ < cfg_.theta_max) {
        // 3. Scale the candidate up.
        theta_s_ =
            cfg_.policy == gravac_policy::exponential ? theta_s_ * theta_s_ : theta_s_ * cfg_.ratio;
        double const base =
            cfg_.candidate_base == gravac_base::initial ? cfg_.theta_min : theta_min_;
        set_candidate(std::max(std::min(base * theta_s_, cfg_.theta_max), theta_min_));
        ev.scaled = true;
      }
    }
    ev.theta_min = theta_min_;
    ev.candidate = candidate_;
    event_ = ev;
  }

  void refresh_plan() {
    plan_.measure.clear();
    plan_.measure.push_back(theta_min_);
    if (candidate_ > theta_min_) plan_.measure.push_back(candidate_);
  }

  gravac_config cfg_;
  double theta_min_ = 0.0, theta_s_ = 0.0, candidate_ = 0.0;
  smoothed_gain min_, cand_;
  std::map<double, throughput_entry> tput_;
  bool searching_ = true;
  bool pending_ = false;
  double pending_factor_ = 1.0, pending_gain_ = 1.0;
  gravac_window_event event_;
  step_plan plan_;
};

static_assert(controller<gravac_controller>);

GRADCOMP_NAMESPACE_END
