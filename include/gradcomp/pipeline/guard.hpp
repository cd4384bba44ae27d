// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `divergence_guard`: the training step's watch against silent divergence (docs/pipeline.md,
/// "Divergence guard"). Each step it looks at three numbers, each the same on every rank:
///
/// - the **gradient** norm √(Σ_ranks Σ_tensors ‖g‖²) of what the ranks were given;
/// - the **residual** norm √(Σ_ranks Σ_tensors ‖e‖²) of the committed error-feedback state (the
///   residual e for "residual", h for "ef21", [u | v] for "dgc"), where there is one;
/// - the **loss**, the mean over the ranks that reported one (`pipeline_step_info::loss`).
///
/// The step *trips* the guard when one of them is not finite, or, once the history holds
/// `warmup` steps, when it exceeds `factor` (the residual: `residual_factor`) times the median
/// of its last `window` accepted values (a median of zero compares with nothing); the loss
/// must also lie above the history's minimum by more than `loss_span` times the history's
/// range (max − min): a ratio to the median means nothing for a loss near zero, where one bad
/// batch is many times the median although the curve has seen such losses and keeps falling,
/// while a diverging loss leaves its recent range far behind. The history takes
/// a step's values only when the step went through untripped, so one outlier never raises the bar
/// for the next. What a trip does is the policy:
///
/// - `raise`: `numeric_error` on every rank, with a message naming the quantity, its value,
///   the tensor that holds most of it, the median and range of the history and the limit;
///   nothing is sent and the pipeline's state is as before the step. The default.
/// - `skip`: nothing is sent, no state changes (residuals, controller, step counter, history),
///   the gradient tensors are set to zero and `pipeline_stats::guard` says `skipped`; after
///   `max_skips` skipped steps in a row the next trip raises instead (a stall is not silent).
/// - `dense`: every tensor's own gradient g is sent dense (float32, averaged; no compression
///   error that step). The error-feedback state is kept as it was, except when the residual
///   is what tripped: then every tensor's state is reset to zero on every rank (its mass is
///   dropped). A non-finite gradient or loss cannot be sent: that step is skipped.
/// - `off`: no watch, no extra round, the pipeline of before the guard.
///
/// The values are summed over the ranks in one small all-reduce of 2T + 2 doubles (T tensors),
/// so every rank sees the same numbers, keeps the same history and takes the same action. A
/// non-finite element anywhere makes the sum non-finite on every rank.
///
/// Spec (`pipeline_options::guard`, Python `GradcompState(guard=...)`): `off`, or a policy with
/// optional settings,
/// `raise|skip|dense[:factor=F,residual_factor=R,loss_span=L,window=W,warmup=N,max_skips=S]`;
/// defaults in
/// `guard_options` (the residual has its own, higher limit). State (history and counters) is saved
/// as "GCGD" v1 (`save` / `load`).

#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// What the guard does when a step trips it (file comment).
enum class guard_policy : std::uint8_t { off, raise, skip, dense };

/// What the guard did with a step (`pipeline_stats::guard`).
enum class guard_action : std::uint8_t {
  none,     ///< the step went through as configured (or the guard is off)
  skipped,  ///< nothing was sent, no state changed, the gradient tensors hold zeros
  dense,    ///< every tensor's gradient was sent dense (and the residuals reset if they tripped)
};

/// The quantities the guard watches.
enum class guard_quantity : std::uint8_t { gradient, residual, loss };

/// Name of a watched quantity ("gradient", "residual", "loss").
[[nodiscard]] constexpr char const* guard_quantity_name(guard_quantity q) noexcept {
  switch (q) {
    case guard_quantity::gradient: return "gradient";
    case guard_quantity::residual: return "residual";
    case guard_quantity::loss: return "loss";
  }
  return "?";
}

/// Settings of the guard; the defaults are the spec's (docs/pipeline.md gives the runs they
/// were checked on).
struct guard_options {
  guard_policy policy = guard_policy::raise;
  /// A finite gradient norm or loss trips when it exceeds `factor` times the median of its
  /// history.
  double factor = 10.0;
  /// The same for the residual norm. Higher: a controller that raises the compression factor
  /// raises the residual's level legitimately (Accordion going from x10 to x1000 took it to
  /// 5.6x its median in the example).
  double residual_factor = 100.0;
  /// A loss above `factor` times its median trips only when it also exceeds the history's
  /// minimum by more than `loss_span` times the history's range (max − min), i.e. lies well
  /// outside what the recent curve has seen. 2: ResNet-18 near a loss of zero had one batch at
  /// 16x the median, 0.87 of the range (no divergence; it went on to 99 %); an MLP whose loss
  /// went from 0.55 to 5.7 (worse than chance) was 2.7 ranges above its minimum.
  double loss_span = 2.0;
  /// Accepted steps the history holds (the median's window).
  std::uint64_t window = 50;
  /// Accepted steps before the explosion test starts (non-finite values trip from step 0).
  std::uint64_t warmup = 10;
  /// `skip`: skipped steps in a row after which the next trip raises.
  std::uint64_t max_skips = 10;
};

/// Parses a guard spec (file comment); `config_error` for anything else.
[[nodiscard]] inline guard_options parse_guard(std::string_view spec) {
  spec_options o(spec, "guard");
  guard_options g;
  std::string const& name = o.name();
  if (name == "off") {
    o.finish();
    g.policy = guard_policy::off;
    return g;
  }
  if (name == "raise") {
    g.policy = guard_policy::raise;
  } else if (name == "skip") {
    g.policy = guard_policy::skip;
  } else if (name == "dense") {
    g.policy = guard_policy::dense;
  } else {
    throw config_error("gradcomp: unknown guard '" + std::string(spec) +
                       "' (expected off, or raise, skip or dense "
                       "[:factor=F,residual_factor=R,window=W,warmup=N,max_skips=S])");
  }
  g.factor = o.number("factor", g.factor);
  g.residual_factor = o.number("residual_factor", g.residual_factor);
  g.loss_span = o.number("loss_span", g.loss_span);
  g.window = o.count("window", g.window, 1u << 20);
  g.warmup = o.count("warmup", g.warmup, 1u << 20);
  g.max_skips = o.count("max_skips", g.max_skips, 1u << 20);
  o.finish({"factor", "residual_factor", "loss_span", "window", "warmup", "max_skips"});
  for (double const f : {g.factor, g.residual_factor}) {
    if (!(std::isfinite(f) && f > 1.0)) {
      throw config_error("gradcomp: guard factor and residual_factor must be finite and > 1, got " +
                         std::to_string(f));
    }
  }
  if (!(std::isfinite(g.loss_span) && g.loss_span >= 1.0)) {
    throw config_error("gradcomp: guard loss_span must be finite and >= 1, got " +
                       std::to_string(g.loss_span));
  }
  if (g.window == 0) throw config_error("gradcomp: guard window must be >= 1, got 0");
  if (g.warmup > g.window) {
    throw config_error("gradcomp: guard warmup (" + std::to_string(g.warmup) +
                       ") must not exceed its window (" + std::to_string(g.window) + ")");
  }
  return g;
}

/// One tensor's local squared norms, as the pipeline hands them to the guard.
struct guard_tensor {
  tensor_id id{};
  double gradient_sq = 0.0;  ///< ‖g‖² on this rank
  double residual_sq = 0.0;  ///< ‖e‖² of the committed error-feedback state (0: none)
};

/// The guard's finding on one step (identical on every rank).
struct guard_verdict {
  /// What to do: `none` (go on), `skipped`, `dense`; `raise` is `trip` with `raise_it` set.
  guard_action action = guard_action::none;
  bool tripped = false;         ///< some quantity tripped
  bool raise_it = false;        ///< the step must fail with `numeric_error(message)`
  bool reset_residual = false;  ///< `dense`: the error-feedback state is reset
  guard_quantity what = guard_quantity::gradient;
  bool nonfinite = false;
  double value = 0.0;   ///< the quantity's value this step
  double median = 0.0;  ///< the median of its history (0: none yet)
  /// The step's global values: gradient and residual norms (residual NaN when not watched),
  /// the mean loss (NaN when no rank reported one).
  double gradient = 0.0, residual = std::numeric_limits<double>::quiet_NaN(),
         loss = std::numeric_limits<double>::quiet_NaN();
  std::string message;  ///< the log line (or the exception's message), empty when not tripped
};

/// Counters of the guard (part of its state).
struct guard_counters {
  std::uint64_t checked = 0;   ///< steps that went through the guard untripped
  std::uint64_t skipped = 0;   ///< steps skipped
  std::uint64_t dense = 0;     ///< steps sent dense by the guard
  std::uint64_t resets = 0;    ///< of which with the error-feedback state reset
  std::uint64_t in_a_row = 0;  ///< skipped steps since the last step that went through
  /// Largest value / median seen on an untripped step, per quantity (how close normal
  /// training came to the limit; 0 before the warm-up ends).
  double peak_ratio[3] = {0.0, 0.0, 0.0};
};

/// The divergence guard (file comment). One per pipeline; every rank holds an identical one.
class divergence_guard {
 public:
  explicit divergence_guard(std::string spec) : spec_(std::move(spec)), opt_(parse_guard(spec_)) {}

  [[nodiscard]] std::string const& spec() const noexcept { return spec_; }
  [[nodiscard]] guard_options const& options() const noexcept { return opt_; }
  [[nodiscard]] bool enabled() const noexcept { return opt_.policy != guard_policy::off; }
  [[nodiscard]] guard_counters const& counters() const noexcept { return counters_; }
  /// The history of a quantity, oldest first.
  [[nodiscard]] std::vector<double> history(guard_quantity q) const {
    return hist_[index(q)].ordered();
  }

  /// Collective: sums the ranks' `tensors` (the same ids in the same order on every rank) and
  /// losses in one all-reduce and judges step `step`. `watch_residual`: the pipeline has
  /// error-feedback state to watch. Adds the round's modeled ring bytes to `wire_bytes`.
  /// Changes nothing: `commit` records the outcome once the step went through.
  template <communicator Comm>
  guard_verdict check(Comm& comm, std::uint64_t step, std::span<guard_tensor const> tensors,
                      bool watch_residual, std::optional<double> loss, std::size_t& wire_bytes) {
    auto sum = [&](std::span<double> v) {
      comm.all_reduce(std::as_writable_bytes(v), comm_type::f64, reduce_op::sum);
    };
    return check_with(sum, comm.size(), step, tensors, watch_residual, loss, wire_bytes);
  }
  /// `check` with the all-reduce done by `sum(std::span<double>)` over `world` ranks (the
  /// pipeline passes its checked statistics reduction, so that with the checksum option a
  /// corrupted sum fails the step instead of steering one rank's verdict).
  template <class Sum>
  guard_verdict check_with(Sum&& sum, int world, std::uint64_t step, std::span<guard_tensor const> tensors,
                           bool watch_residual, std::optional<double> loss, std::size_t& wire_bytes) {
    std::size_t const t = tensors.size();
    buf_.assign(2 * t + 2, 0.0);
    for (std::size_t i = 0; i < t; ++i) {
      buf_[i] = tensors[i].gradient_sq;
      buf_[t + i] = tensors[i].residual_sq;
    }
    if (loss) {
      buf_[2 * t] = *loss;
      buf_[2 * t + 1] = 1.0;
    }
    sum(std::span<double>(buf_));
    std::size_t const bytes = buf_.size() * sizeof(double);
    auto const w = static_cast<std::size_t>(world);
    wire_bytes += w <= 1 ? 0 : 2 * bytes * (w - 1) / w;
    return judge(step, tensors, watch_residual);
  }

  /// Records a step that went through (`action` none or dense) or was skipped.
  void commit(guard_verdict const& v) {
    if (v.action == guard_action::skipped) {
      ++counters_.skipped;
      ++counters_.in_a_row;
      return;
    }
    counters_.in_a_row = 0;
    if (v.action == guard_action::dense) {
      ++counters_.dense;
      counters_.resets += v.reset_residual ? 1 : 0;
      return;
    }
    ++counters_.checked;
    push(guard_quantity::gradient, v.gradient);
    if (!std::isnan(v.residual)) push(guard_quantity::residual, v.residual);
    if (!std::isnan(v.loss)) push(guard_quantity::loss, v.loss);
  }

  /// Serializes the history and counters ("GCGD" v1: the spec, the counters, then per quantity
  /// its values oldest first).
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GCGD", 1);
    w.put_string(spec_);
    w.put_u64(counters_.checked);
    w.put_u64(counters_.skipped);
    w.put_u64(counters_.dense);
    w.put_u64(counters_.resets);
    w.put_u64(counters_.in_a_row);
    w.put_doubles(counters_.peak_ratio);
    for (auto const& h : hist_) w.put_doubles(h.ordered());
    return w.finish();
  }

  /// Restores `save`'s bytes of a guard with the same spec; `format_error` otherwise, and the
  /// state is unchanged then.
  void load(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, "GCGD", 1, "divergence guard state");
    std::string const spec = r.get_string();
    if (spec != spec_) r.fail("saved with guard '" + spec + "', this guard is '" + spec_ + "'");
    guard_counters c;
    c.checked = r.get_u64();
    c.skipped = r.get_u64();
    c.dense = r.get_u64();
    c.resets = r.get_u64();
    c.in_a_row = r.get_u64();
    std::vector<double> const peak = r.get_doubles();
    if (peak.size() != 3)
      r.fail("holds " + std::to_string(peak.size()) + " peak ratios, expected 3");
    std::copy(peak.begin(), peak.end(), c.peak_ratio);
    ring h[3];
    for (std::size_t q = 0; q < 3; ++q) {
      std::vector<double> const v = r.get_doubles();
      if (v.size() > opt_.window) r.fail("a history holds more values than the window");
      for (double d : v) {
        // norms are >= 0; a loss may be any finite value
        if (!std::isfinite(d) || (d < 0.0 && q != index(guard_quantity::loss)))
          r.fail("a history holds a bad value");
        h[q].push(d, opt_.window);
      }
    }
    r.expect_end();
    counters_ = c;
    for (std::size_t i = 0; i < 3; ++i) hist_[i] = std::move(h[i]);
  }

 private:
  // The last `window` values; `at` is where the next one goes once full.
  struct ring {
    std::vector<double> v;
    std::size_t at = 0;
    void push(double x, std::uint64_t window) {
      if (v.size() < window) {
        v.push_back(x);
        return;
      }
      v[at] = x;
      at = (at + 1) % v.size();
    }
    [[nodiscard]] std::vector<double> ordered() const {
      std::vector<double> out(v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
      out.insert(out.end(), v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at));
      return out;
    }
    [[nodiscard]] double median() const {
      if (v.empty()) return 0.0;
      std::vector<double> s = v;
      std::sort(s.begin(), s.end());
      std::size_t const n = s.size();
      return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    }
  };

  static constexpr std::size_t index(guard_quantity q) noexcept {
    return static_cast<std::size_t>(q);
  }
  [[nodiscard]] double limit(guard_quantity q) const noexcept {
    return q == guard_quantity::residual ? opt_.residual_factor : opt_.factor;
  }

  // How far `x` lies above the history's minimum, in history ranges (max − min); +inf above a
  // history of one value.
  static double spans_above(ring const& h, double x) {
    auto const [lo, hi] = std::minmax_element(h.v.begin(), h.v.end());
    double const range = *hi - *lo;
    if (range > 0.0) return (x - *lo) / range;
    return x > *lo ? std::numeric_limits<double>::infinity() : 0.0;
  }

  void push(guard_quantity q, double x) {
    ring& h = hist_[index(q)];
    if (h.v.size() >= opt_.warmup) {
      double const m = h.median();
      if (m > 0.0) counters_.peak_ratio[index(q)] = std::max(counters_.peak_ratio[index(q)], x / m);
    }
    h.push(x, opt_.window);
  }

  guard_verdict judge(std::uint64_t step, std::span<guard_tensor const> tensors,
                      bool watch_residual) const {
    std::size_t const t = tensors.size();
    std::span<double const> const g(buf_.data(), t), e(buf_.data() + t, t);
    guard_verdict v;
    auto total = [](std::span<double const> x) {
      double s = 0.0;
      for (double d : x) s += d;
      return std::sqrt(s);
    };
    v.gradient = total(g);
    if (watch_residual) v.residual = total(e);
    if (buf_[2 * t + 1] > 0.0) v.loss = buf_[2 * t] / buf_[2 * t + 1];

    struct candidate {
      guard_quantity q;
      double value;
      std::span<double const> parts;
    };
    std::vector<candidate> cands{{guard_quantity::gradient, v.gradient, g}};
    if (watch_residual) cands.push_back({guard_quantity::residual, v.residual, e});
    if (buf_[2 * t + 1] > 0.0) cands.push_back({guard_quantity::loss, v.loss, {}});
    candidate const* hit = nullptr;
    for (auto const& c : cands) {  // a non-finite value first, in this order
      if (!std::isfinite(c.value)) {
        hit = &c;
        v.nonfinite = true;
        break;
      }
    }
    if (hit == nullptr) {
      for (auto const& c : cands) {
        ring const& h = hist_[index(c.q)];
        if (h.v.size() < opt_.warmup || h.v.empty()) continue;
        double const m = h.median();
        if (m > 0.0 && c.value > limit(c.q) * m &&
            (c.q != guard_quantity::loss || spans_above(h, c.value) > opt_.loss_span)) {
          hit = &c;
          break;
        }
      }
    }
    if (hit == nullptr) return v;

    v.tripped = true;
    v.what = hit->q;
    v.value = hit->value;
    v.median = hist_[index(hit->q)].median();
    bool const stall = counters_.in_a_row >= opt_.max_skips;
    switch (opt_.policy) {
      case guard_policy::off:
      case guard_policy::raise: v.raise_it = true; break;
      case guard_policy::skip: v.action = guard_action::skipped; break;
      case guard_policy::dense:
        if (v.nonfinite && hit->q != guard_quantity::residual) {
          v.action = guard_action::skipped;  // a non-finite gradient or loss cannot be sent
        } else {
          v.action = guard_action::dense;
          v.reset_residual = hit->q == guard_quantity::residual;
        }
        break;
    }
    if (v.action == guard_action::skipped && stall) {
      v.action = guard_action::none;
      v.raise_it = true;
    }
    v.message =
        describe(step, v, *hit, tensors, stall && v.raise_it && opt_.policy != guard_policy::raise);
    return v;
  }

  static std::string num(double x) {
    if (std::isnan(x)) return "nan";  // never "-nan"
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", x);
    return b;
  }

  template <class Candidate>
  std::string describe(std::uint64_t step, guard_verdict const& v, Candidate const& c,
                       std::span<guard_tensor const> tensors, bool stalled) const {
    std::string s = "gradcomp: divergence guard: step " + std::to_string(step) + ": ";
    std::string const what = c.q == guard_quantity::loss ? std::string("the loss")
                             : c.q == guard_quantity::gradient
                                 ? std::string("the gradient norm")
                                 : std::string("the residual (error-feedback state) norm");
    s += what + " is " + num(v.value);
    if (!c.parts.empty()) {  // the tensor holding the first non-finite value or most of the norm
      std::size_t at = 0;
      for (std::size_t i = 0; i < c.parts.size(); ++i) {
        if (v.nonfinite ? !std::isfinite(c.parts[i]) : c.parts[i] > c.parts[at]) {
          at = i;
          if (v.nonfinite) break;
        }
      }
      if (at < tensors.size()) {
        s += " (tensor " + std::to_string(static_cast<std::uint32_t>(tensors[at].id)) + ": " +
             num(std::sqrt(c.parts[at])) + ")";
      }
    }
    ring const& h = hist_[index(c.q)];
    if (v.nonfinite) {
      s += ", not finite";
    } else {
      s += ", " + num(v.value / v.median) + "x the median " + num(v.median) + " of its last " +
           std::to_string(h.v.size()) + " steps (limit " + num(limit(c.q)) + "x)";
      if (c.q == guard_quantity::loss) {
        s += " and " + num(spans_above(h, v.value)) +
             " history ranges above its minimum (limit " + num(opt_.loss_span) + ")";
      }
    }
    if (!h.v.empty()) {
      auto const [lo, hi] = std::minmax_element(h.v.begin(), h.v.end());
      s += "; history range " + num(*lo) + " .. " + num(*hi);
    }
    s += "; gradient norm " + num(v.gradient);
    if (!std::isnan(v.residual)) s += ", residual norm " + num(v.residual);
    if (!std::isnan(v.loss)) s += ", loss " + num(v.loss);
    if (stalled) {
      s += ". The guard skipped the last " + std::to_string(counters_.in_a_row) +
           " steps in a row (max_skips), so it raises: training has stalled";
    } else if (v.raise_it) {
      s += ". Nothing was sent; the pipeline's state is as before the step";
    } else if (v.action == guard_action::skipped) {
      s += ". Step skipped: nothing sent, no state changed, gradients zeroed";
    } else {
      s += v.reset_residual ? ". Sent dense; every error-feedback state reset to zero"
                            : ". Sent dense; error-feedback state kept";
    }
    s += " (guard '" + spec_ +
         "'; docs/pipeline.md, \"Divergence guard\"; for scaled-sign codecs with "
         "error feedback see the learning-rate rule in docs/training.md)";
    return s;
  }

  std::string spec_;
  guard_options opt_;
  ring hist_[3];
  guard_counters counters_;
  std::vector<double> buf_;
};

GRADCOMP_NAMESPACE_END
