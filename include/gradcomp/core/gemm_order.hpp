// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The per-element arithmetic of gradcomp's built-in GEMM (cpu/kernels/gemm.hpp), for every
/// backend: `GRADCOMP_HOST_DEVICE` functions that the CPU's scalar kernels call and the CUDA
/// PowerSGD evaluates, so both compute every element with the same operations in the same
/// order.
///
/// - axpy form: `acc = (beta == 0 ? 0 : beta * c)`, then `acc = fma(alpha * a_p, b_p, acc)`
///   for p = 0, 1, ..., k − 1;
/// - dot form: 16 lane sums (lane l takes the products p ≡ l mod 16, in increasing p, by fma),
///   reduced as l + 8, then + 4, + 2, + 1, then `c = alpha * dot` (+ `beta * c`).
///
/// Products that meet an addition are rounded on their own (`quant::mul_rn`), so no compiler
/// contracts them into a fused multiply-add.

#include <gradcomp/config.hpp>
#include <gradcomp/core/quant/rounding.hpp>

#include <cstddef>

#include <math.h>

GRADCOMP_NAMESPACE_BEGIN
namespace gemm_order {

/// a · b rounded to float, never fused with a following addition.
GRADCOMP_HOST_DEVICE inline float product(float a, float b) noexcept { return quant::mul_rn(a, b); }

/// The fixed reduction of the 16 lane sums of the dot form.
GRADCOMP_HOST_DEVICE inline float reduce16(float const* s) noexcept {
  float h[8];
  for (int l = 0; l < 8; ++l) h[l] = s[l] + s[l + 8];
  float g[4];
  for (int l = 0; l < 4; ++l) g[l] = h[l] + h[l + 4];
  float const f0 = g[0] + g[2];
  float const f1 = g[1] + g[3];
  return f0 + f1;
}

/// The dot form's store: alpha · dot (+ beta · c when beta ≠ 0; c is not used when beta = 0).
GRADCOMP_HOST_DEVICE inline float store_dot(float dot, float alpha, float beta, float c) noexcept {
  float const r = product(alpha, dot);
  return beta == 0.0f ? r : r + product(beta, c);
}

/// The dot form of one element: Σ a[p·sa] b[p·sb], p < k, in 16 lane sums.
GRADCOMP_HOST_DEVICE inline float dot(float const* a, std::size_t sa, float const* b,
                                      std::size_t sb, std::size_t k) noexcept {
  float s[16] = {};
  std::size_t p = 0;
  for (; p + 16 <= k; p += 16) {
    for (std::size_t l = 0; l < 16; ++l) s[l] = fmaf(a[(p + l) * sa], b[(p + l) * sb], s[l]);
  }
  for (std::size_t l = 0; p + l < k; ++l) s[l] = fmaf(a[(p + l) * sa], b[(p + l) * sb], s[l]);
  return reduce16(s);
}

/// The axpy form of one element: beta · c, then fma(alpha · a[p·sa], b[p·sb], ·) for p < k.
GRADCOMP_HOST_DEVICE inline float axpy(float alpha, float const* a, std::size_t sa, float const* b,
                                       std::size_t sb, std::size_t k, float beta, float c) noexcept {
  float acc = beta == 0.0f ? 0.0f : product(beta, c);
  for (std::size_t p = 0; p < k; ++p) acc = fmaf(product(alpha, a[p * sa]), b[p * sb], acc);
  return acc;
}

}  // namespace gemm_order
GRADCOMP_NAMESPACE_END
