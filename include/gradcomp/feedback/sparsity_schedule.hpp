// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `sparsity_warmup`: the exponential sparsity warm-up of Deep Gradient Compression (Lin et al.,
/// ICLR 2018, section 3.3), a map from training step to the kept fraction (density) of a
/// sparsifier. Training starts dense-ish and the density falls by a constant factor per stage
/// until it reaches its final value; DGC's own setting (density 25%, × 1/4 per stage, final
/// 0.1%) gives sparsities 75%, 93.75%, 98.4375%, 99.6%, 99.9%, one stage per epoch.
///
/// The schedule is a plain value independent of any codec: with `compressor`, replace the codec
/// between steps (`comp.codec() = topk_codec::ratio(w.density(step))`); error feedback keeps
/// what the sparser steps leave unsent. Adaptive controllers can reuse it as a floor or a start.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Exponential sparsity warm-up (see file comment). Density at step t, with stage
/// s = floor(t / stage_steps): max(final_density, first_density × factor^s).
class sparsity_warmup {
 public:
  /// DGC's schedule with stages of `stage_steps` steps (e.g. the steps of one epoch):
  /// densities 0.25, 0.0625, 0.015625, 0.00390625, then 0.001 for good.
  explicit sparsity_warmup(std::uint64_t stage_steps)
      : sparsity_warmup(stage_steps, 0.25, 0.25, 0.001) {}

  /// A schedule starting at `first_density` and multiplied by `factor` each stage of
  /// `stage_steps` steps until it reaches `final_density`. Requires stage_steps >= 1,
  /// 0 < final_density <= first_density <= 1 and, unless the two are equal, 0 < factor < 1.
  sparsity_warmup(std::uint64_t stage_steps, double first_density, double factor,
                  double final_density)
      : stage_steps_(stage_steps), final_(final_density) {
    if (stage_steps == 0)
      throw config_error("gradcomp: sparsity_warmup needs stages of at least 1 step, got 0");
    if (!(final_density > 0.0 && final_density <= first_density && first_density <= 1.0)) {
      throw config_error(
          "gradcomp: sparsity_warmup needs 0 < final density <= first density <= 1, got first " +
          std::to_string(first_density) + " and final " + std::to_string(final_density));
    }
    if (first_density > final_density && !(factor > 0.0 && factor < 1.0)) {
      throw config_error("gradcomp: sparsity_warmup factor must be in (0, 1), got " +
                         std::to_string(factor));
    }
    // Stage densities above the final one; at most ~1100 (factor and densities are doubles
    // with final >= 2^-1074), usually a handful.
    for (double d = first_density; d > final_density; d *= factor) densities_.push_back(d);
  }

  /// Kept fraction at `step` (in (0, 1]).
  [[nodiscard]] double density(std::uint64_t step) const noexcept {
    std::uint64_t const s = stage(step);
    return s < densities_.size() ? densities_[static_cast<std::size_t>(s)] : final_;
  }

  /// Dropped fraction at `step`: 1 - density(step).
  [[nodiscard]] double sparsity(std::uint64_t step) const noexcept { return 1.0 - density(step); }

  /// Stage of `step`: floor(step / stage_steps).
  [[nodiscard]] std::uint64_t stage(std::uint64_t step) const noexcept {
    return step / stage_steps_;
  }

  /// Steps per stage.
  [[nodiscard]] std::uint64_t stage_steps() const noexcept { return stage_steps_; }

  /// Number of stages before the final density (4 for DGC's schedule).
  [[nodiscard]] std::uint64_t warmup_stages() const noexcept { return densities_.size(); }

  /// First step at the final density.
  [[nodiscard]] std::uint64_t warmup_steps() const noexcept {
    return warmup_stages() * stage_steps_;
  }

  /// The final density.
  [[nodiscard]] double final_density() const noexcept { return final_; }

 private:
  std::uint64_t stage_steps_;
  double final_;
  std::vector<double> densities_;  // stages 0 .. warmup_stages() - 1
};

GRADCOMP_NAMESPACE_END
