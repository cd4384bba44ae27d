// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Built against gradcomp::blas: GRADCOMP_USE_CBLAS must be defined, and cpu::gemm through
// cblas_sgemm must give what gradcomp's built-in kernel gives on a 37 × 29 × 41 product (its
// inputs make every partial sum exact, so the two agree to the bit).

#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <vector>

#if !defined(GRADCOMP_USE_CBLAS)
#  error "gradcomp::blas did not define GRADCOMP_USE_CBLAS"
#endif
static_assert(gradcomp::cpu::gemm_has_blas, "gemm_has_blas is false under gradcomp::blas");

int main() {
  using gradcomp::cpu::gemm;
  using gradcomp::cpu::gemm_backend;
  using gradcomp::cpu::transpose;
  std::size_t const m = 37, n = 29, k = 41;
  std::vector<float> a(m * k), b(k * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 5) % 11) * 0.25f;
  std::vector<float> blas(m * n), builtin(m * n);
  gemm(transpose::no, transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, blas.data(), n,
       {}, gemm_backend::blas);
  gemm(transpose::no, transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, builtin.data(),
       n, {}, gemm_backend::builtin);
  for (std::size_t i = 0; i < blas.size(); ++i) {
    // Small integers and quarters: every partial sum is exact, so both must agree exactly.
    if (blas[i] != builtin[i]) {
      std::fprintf(stderr, "C[%zu]: cblas_sgemm %g, built-in %g\n", i, static_cast<double>(blas[i]),
                   static_cast<double>(builtin[i]));
      return 1;
    }
  }
  std::printf("gradcomp::blas: %zu x %zu x %zu GEMM through cblas_sgemm matches the built-in\n", m,
              n, k);
  return 0;
}
