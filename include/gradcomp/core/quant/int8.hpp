// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element math of int8 min-max quantization, on host and device: the per-bucket encoding
/// constants, the code of one element (nearest or stochastic rounding) and its decoded value.
/// The CPU kernels (cpu/kernels/bytecode.hpp) and the CUDA codec (cuda/int8.cuh) both call
/// these functions, so the two backends cannot round differently.
///
/// Per bucket [lo, hi]: inv = f32(255 / (hi - lo)) (0 if hi == lo), bias = f32(-lo * inv) (both
/// computed in double), v = fma(x, inv, bias); nearest: q = round-half-even(v), stochastic:
/// q = floor(v + r) with the dither offset r = (draw16 + 0.5) / 2^16; q clamped to [0, 255].
/// Decoding: x̂ = fma(q, step, lo), step = f32((hi - lo) / 255).

#include <gradcomp/config.hpp>

#include <cstdint>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// Per-bucket constants of int8 encoding.
struct int8_bucket {
  float inv = 0.0f;
  float bias = 0.0f;
};

/// Encoding constants for a bucket with range [lo, hi] (finite, lo <= hi).
GRADCOMP_HOST_DEVICE inline int8_bucket make_int8_bucket(float lo, float hi) noexcept {
  int8_bucket b;
  if (hi > lo) {
    double const inv = 255.0 / (static_cast<double>(hi) - static_cast<double>(lo));
    b.inv = static_cast<float>(inv);
    b.bias = static_cast<float>(-static_cast<double>(lo) * static_cast<double>(b.inv));
  }
  return b;
}

/// Decoding step of a bucket with range [lo, hi].
GRADCOMP_HOST_DEVICE inline float int8_step(float lo, float hi) noexcept {
  return static_cast<float>((static_cast<double>(hi) - static_cast<double>(lo)) / 255.0);
}

/// The code of element value `x` in bucket `b`; `draw` (a 16-bit uniform draw) is used only
/// when `stochastic`.
GRADCOMP_HOST_DEVICE inline std::uint8_t int8_code(float x, int8_bucket const& b, bool stochastic,
                                                   std::uint32_t draw) noexcept {
  float const v = fmaf(x, b.inv, b.bias);
  float const fl = floorf(v);
  float const d = v - fl;
  float q;
  if (stochastic) {
    q = floorf(v + fmaf(static_cast<float>(draw), 0x1p-16f, 0x1p-17f));
  } else {
    bool const odd = floorf(fl * 0.5f) * 2.0f != fl;  // fl is an integer here
    q = fl + ((d > 0.5f || (d == 0.5f && odd)) ? 1.0f : 0.0f);
  }
  q = q >= 0.0f ? (q > 255.0f ? 255.0f : q) : 0.0f;  // NaN (from an infinite inv) -> 0
  return static_cast<std::uint8_t>(q);
}

/// The decoded value of code `q` in a bucket with lower end `lo` and step `step`.
GRADCOMP_HOST_DEVICE inline float int8_value(std::uint8_t q, float lo, float step) noexcept {
  return fmaf(static_cast<float>(q), step, lo);
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
