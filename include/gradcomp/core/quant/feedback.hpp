// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of error feedback, on host and device: the combine of a state with a
/// gradient (residual feedback's p = e + g, EF21's increment g − h computed as −(h − g)), DGC's
/// momentum correction and its clipping factor. The CPU policies (feedback/policies.hpp,
/// feedback/dgc.hpp, cpu/kernels/feedback.hpp's scalar kernel) and the device ones
/// (cuda/feedback.cuh) call the same functions, so both round alike.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/rounding.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// `e + sign * g` with one rounding (`sign` is ±1, so the product is exact; it is still kept
/// apart from the add, which a device compiler would otherwise contract).
GRADCOMP_HOST_DEVICE inline float feedback_combine(float e, float g, float sign) noexcept {
  return e + mul_rn(sign, g);
}

/// EF21's staged increment g − h, computed as −(h − g) (`ef21_feedback::stage`'s order: the
/// sign of a zero result is that of the CPU's).
GRADCOMP_HOST_DEVICE inline float ef21_increment(float h, float g) noexcept {
  return -feedback_combine(h, g, -1.0f);
}

/// DGC's momentum and accumulation of one element after momentum correction.
struct dgc_element {
  float u;  ///< m·u + scale·g
  float v;  ///< v + u
};

/// DGC's momentum correction of one element (`dgc_feedback::stage`): g ← g·scale (unless the
/// scale is 1), u ← m·u + g (just g when `fresh` or m = 0), v ← v + u (`v0` 0 when fresh).
GRADCOMP_HOST_DEVICE inline dgc_element dgc_momentum(float g, float scale, float m, bool fresh, float u0,
                                                     float v0) noexcept {
  if (scale != 1.0f) g = mul_rn(g, scale);
  float const u = (fresh || m == 0.0f) ? g : mul_rn(m, u0) + g;
  return {u, v0 + u};
}

/// Whether a DGC element stays within float32.
GRADCOMP_HOST_DEVICE inline bool dgc_finite(dgc_element const& x) noexcept {
  return fabsf(x.u) <= FLT_MAX && fabsf(x.v) <= FLT_MAX;
}

/// DGC's clipping factor min(1, bound / ‖g‖) as a float, from Σ g² (in the canonical order,
/// core/quant/dither.hpp) and the worker's bound clip_norm / √workers.
inline float dgc_clip_scale(double sum_of_squares, double bound) noexcept {
  double const norm = std::sqrt(sum_of_squares);
  if (norm <= bound) return 1.0f;
  return static_cast<float>(bound / norm);
}

/// Checks DGC's parameters (`dgc_feedback` and its device rule): momentum in [0, 1), clip_norm
/// 0 (none) or positive and finite, at least one worker; `config_error` otherwise.
inline void check_dgc_parameters(float momentum, double clip_norm, std::uint32_t workers) {
  if (!(momentum >= 0.0f && momentum < 1.0f)) {
    throw config_error("gradcomp: dgc_feedback momentum must be in [0, 1), got " + std::to_string(momentum));
  }
  if (!(clip_norm >= 0.0 && clip_norm <= DBL_MAX)) {
    throw config_error("gradcomp: dgc_feedback clip_norm must be 0 (no clipping) or positive and finite, got " +
                       std::to_string(clip_norm));
  }
  if (workers == 0) throw config_error("gradcomp: dgc_feedback needs at least 1 worker, got 0");
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
