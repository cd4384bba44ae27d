// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `agree`, which makes a step's statistics identical on every rank before the controller sees
/// them, and the checks every controller shares. The protocol's types (`step_plan`,
/// `step_stats`, `decision`, ...) and the order of one step are in
/// `gradcomp/concepts/step_protocol.hpp`.

#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Makes `s` identical on every rank, given the communicator's in-place all-reduce over
/// doubles: `sum(std::span<double>)` (element-wise sum) and `max(std::span<double>)`
/// (element-wise maximum). Both must leave bit-identical results on every rank (an all-reduce
/// that computes each element once and distributes it; if yours cannot promise that, reduce
/// on one rank and broadcast the result instead).
///
/// Sums: `ef_norm_sq`, `compressed_norm_sq`, `layer_norms_sq` (so gains are ratios of global
/// sums), and the reported losses with their count, so that `loss` becomes the mean over the
/// ranks that reported one (NaN when none did; a rank reports none by leaving it NaN). Maximum: the
/// three times of `last_step` (the slowest rank paces the step). The step, batch size, worker count
/// and learning rates must already agree: they are checked with one max-reduction of each value and
/// of its negation, and if any rank differs, every rank throws `comm_error` (all of them, so none
/// is left waiting in a collective).
///
/// Calls `sum` once and `max` once, with spans whose lengths follow from the plan (identical
/// on every rank that follows the protocol).
template <class Sum, class Max>
void agree(step_stats& s, Sum&& sum, Max&& max) {
  std::vector<double> sums;
  sums.reserve(3 + s.compressed_norm_sq.size() + s.layer_norms_sq.size());
  bool const reported = !std::isnan(s.loss);
  sums.push_back(reported ? s.loss : 0.0);
  sums.push_back(reported ? 1.0 : 0.0);
  sums.push_back(s.ef_norm_sq);
  sums.insert(sums.end(), s.compressed_norm_sq.begin(), s.compressed_norm_sq.end());
  sums.insert(sums.end(), s.layer_norms_sq.begin(), s.layer_norms_sq.end());
  double const same[5] = {static_cast<double>(s.step), static_cast<double>(s.batch_size),
                          static_cast<double>(s.workers), s.learning_rate, s.next_learning_rate};
  std::vector<double> maxes{s.last_step.backprop, s.last_step.compress, s.last_step.sync};
  for (double v : same) {
    maxes.push_back(v);
    maxes.push_back(-v);
  }
  sum(std::span<double>(sums));
  max(std::span<double>(maxes));
  static char const* const names[5] = {"step", "batch size", "worker count", "learning rate",
                                       "next learning rate"};
  for (std::size_t i = 0; i < 5; ++i) {
    double const hi = maxes[3 + 2 * i], lo = -maxes[4 + 2 * i];
    if (!(hi == lo)) {
      throw comm_error(std::string("gradcomp: ranks disagree on the ") + names[i] +
                       " of the step statistics (from " + std::to_string(lo) + " to " +
                       std::to_string(hi) + "); every rank must report the same value");
    }
  }
  s.loss = sums[1] > 0.0 ? sums[0] / sums[1] : std::numeric_limits<double>::quiet_NaN();
  s.ef_norm_sq = sums[2];
  std::size_t k = 3;
  for (auto& v : s.compressed_norm_sq) v = sums[k++];
  for (auto& v : s.layer_norms_sq) v = sums[k++];
  s.last_step = {maxes[0], maxes[1], maxes[2]};
}

namespace detail {

// Throws numeric_error unless v is finite and >= 0.
inline void check_stat(double v, char const* who, char const* what) {
  if (!std::isfinite(v) || v < 0.0) {
    throw numeric_error(std::string("gradcomp: ") + who + " got " + what + " = " +
                        std::to_string(v) + "; expected a finite value >= 0");
  }
}

// The checks every controller makes: the step is the planned one, times are finite and >= 0.
inline void check_step(step_stats const& s, step_plan const& p, char const* who) {
  if (s.step != p.step) {
    throw config_error(std::string("gradcomp: ") + who + " was given the statistics of step " +
                       std::to_string(s.step) + " but expected step " + std::to_string(p.step) +
                       " (call decide once per step, in order)");
  }
  check_stat(s.last_step.backprop, who, "last_step.backprop");
  check_stat(s.last_step.compress, who, "last_step.compress");
  check_stat(s.last_step.sync, who, "last_step.sync");
  check_stat(s.learning_rate, who, "learning_rate");
  check_stat(s.next_learning_rate, who, "next_learning_rate");
}

// A plan in a saved controller state.
inline void save_plan(byte_writer& w, step_plan const& p) {
  w.put_u64(p.step);
  w.put_doubles(p.measure);
  w.put_bool(p.accumulate_layers);
  w.put_bool(p.report_layers);
}
inline step_plan load_plan(byte_reader& r) {
  step_plan p;
  p.step = r.get_u64();
  p.measure = r.get_doubles();
  p.accumulate_layers = r.get_bool();
  p.report_layers = r.get_bool();
  return p;
}

// Throws config_error unless v is finite and within [lo, hi] (inclusive flags as given).
inline void check_param(double v, char const* who, char const* name, double lo, bool lo_incl,
                        double hi, bool hi_incl, char const* expected) {
  bool const ok = std::isfinite(v) && (lo_incl ? v >= lo : v > lo) && (hi_incl ? v <= hi : v < hi);
  if (!ok) {
    throw config_error(std::string("gradcomp: ") + who + " parameter " + name + " = " +
                       std::to_string(v) + " is invalid; expected " + expected);
  }
}

// The decision that sends the single factor `f` planned for step `step` (dense when f == 1).
inline decision single_factor_decision(std::uint64_t step, double f) {
  decision d;
  d.step = step;
  if (f > 1.0) {
    d.send = send_kind::minimum;
    d.factor = f;
    d.residual = residual_rule::subtract_sent;
  }
  return d;
}

// The plan that compresses at the single factor f (nothing when f == 1).
inline std::vector<double> single_factor_measure(double f) {
  return f > 1.0 ? std::vector<double>{f} : std::vector<double>{};
}

}  // namespace detail

GRADCOMP_NAMESPACE_END
