// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Steps of a controller with plausible statistics, so that a controller (and its saved
/// state) has a history: the controller target and the corpus generator use them.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/concepts/step_protocol.hpp>

#include <cstdint>

namespace gradcomp_fuzz {

namespace gc = gradcomp;

/// Plausible statistics for `c`'s current plan (two layers), as a pipeline would report them.
inline gc::step_stats stats_for(gc::any_controller const& c, std::uint64_t salt) {
  gc::step_plan const& p = c.plan();
  gc::step_stats s;
  s.step = p.step;
  s.ef_norm_sq = 100.0 + static_cast<double>(salt % 7);
  for (double f : p.measure) s.compressed_norm_sq.push_back(s.ef_norm_sq * (0.3 + 0.5 / f));
  if (p.report_layers) s.layer_norms_sq = {40.0 + static_cast<double>(salt % 5), 60.0};
  s.last_step = {0.010, 0.001 * static_cast<double>(1 + salt % 3), 0.002};
  s.batch_size = 32;
  s.workers = 2;
  s.learning_rate = 0.1;
  s.next_learning_rate = salt % 4 == 3 ? 0.01 : 0.1;
  return s;
}

/// Runs `steps` decisions of `c`.
inline void drive_controller(gc::any_controller& c, unsigned steps) {
  for (unsigned i = 0; i < steps; ++i) (void)c.decide(stats_for(c, i));
}

}  // namespace gradcomp_fuzz
