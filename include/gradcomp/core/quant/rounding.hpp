// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// A product rounded on its own, for element math shared by the host and the device (the
/// dithering codecs, the GEMM orders of core/gemm_order.hpp).

#include <gradcomp/config.hpp>

GRADCOMP_NAMESPACE_BEGIN
namespace quant {

/// `a * b` rounded on its own: device code must not contract it with a following add into an
/// fma (nvcc does by default), which the host does not do.
GRADCOMP_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace quant
GRADCOMP_NAMESPACE_END
