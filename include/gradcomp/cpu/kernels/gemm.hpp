// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Single-precision GEMM for the low-rank codecs: C = alpha op(A) op(B) + beta C on row-major
/// matrices, with the BLAS argument conventions (`cblas_sgemm` with `CblasRowMajor`).
///
/// The built-in kernel is cache-blocked and register-blocked, vectorized with AVX-512 or AVX2
/// (chosen at run time, like every gradcomp kernel) or portable C++, and split over the
/// context's thread pool above a size threshold. It has two forms, picked by the layout of B:
///
/// - **axpy form** (B not transposed: rows of op(B) are contiguous). A tile of C, MR rows by NR
///   columns, lives in registers; for each p, the MR values alpha * op(A)(i, p) are broadcast
///   and multiplied into row p of B. Every element is `acc = (beta == 0 ? 0 : beta * c)`, then
///   `acc = fma(alpha * a_ip, b_pj, acc)` for p = 0, 1, ..., k - 1 in that order. The k loop is
///   blocked (`gemm_kc` rows of B at a time, the partial sum parked in C in between, which is
///   exact), so a block of B stays in cache while the tiles sweep across it.
/// - **dot form** (B transposed, A not: both operands contiguous along k). Element (i, j) is
///   the dot product of row i of A and row j of B, accumulated in 16 lane sums (lane l takes
///   the products p ≡ l mod 16, in increasing p, by fma), reduced as l + 8, then + 4, + 2, + 1,
///   then `c = alpha * dot` (+ `beta * c` when beta ≠ 0). Both transposed: A is first copied
///   transposed, then the dot form runs.
///
/// Those orders are fixed by the shapes alone: the result is bit-identical for every thread
/// count (each task owns a block of C and runs the same per-element order) and for every ISA
/// level (the scalar code performs the same fmas in the same order). A CBLAS (OpenBLAS, for
/// instance) can replace the built-in kernel when the program is compiled with
/// `GRADCOMP_USE_CBLAS` (CMake: link `gradcomp::blas`); its results agree to rounding only.

#include <gradcomp/config.hpp>
#include <gradcomp/core/gemm_order.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cpu/execution.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif
#if defined(GRADCOMP_USE_CBLAS)
#  include <cblas.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// Whether a GEMM operand is used as stored or transposed.
enum class transpose : bool { no = false, yes = true };

/// Which implementation a `gemm` call runs.
enum class gemm_backend : unsigned char {
  builtin = 0,      ///< gradcomp's own kernel (deterministic for any thread count and ISA)
  blas = 1,         ///< `cblas_sgemm`; only in programs compiled with `GRADCOMP_USE_CBLAS`
  automatic = 255,  ///< `blas` where compiled in, else `builtin`
};

/// True when this program was compiled with `GRADCOMP_USE_CBLAS`.
inline constexpr bool gemm_has_blas =
#if defined(GRADCOMP_USE_CBLAS)
    true;
#else
    false;
#endif

/// Name of a backend ("builtin", "blas", "automatic").
constexpr char const* gemm_backend_name(gemm_backend b) noexcept {
  switch (b) {
    case gemm_backend::builtin: return "builtin";
    case gemm_backend::blas: return "blas";
    case gemm_backend::automatic: return "automatic";
  }
  return "unknown";
}

namespace kernels {

/// The fixed reduction of the 16 lane sums of the dot form (core/gemm_order.hpp).
inline float gemm_reduce16(float const* s) noexcept { return gemm_order::reduce16(s); }

/// c = alpha * dot (+ beta * c when beta ≠ 0; C is not read when beta = 0).
inline void gemm_store_dot(float* c, float dot, float alpha, float beta) noexcept {
  *c = gemm_order::store_dot(dot, alpha, beta, beta == 0.0f ? 0.0f : *c);
}

namespace scalar {

/// Axpy form, one row of C, w ≤ 64 columns, kc products (see file comment).
inline void gemm_axpy_row(std::size_t kc, float alpha, float const* a, std::size_t a_k,
                          float const* b, std::size_t ldb, float* c, std::size_t w, float beta,
                          bool first) noexcept {
  float acc[64];
  for (std::size_t j = 0; j < w; ++j) {
    acc[j] = !first ? c[j] : beta == 0.0f ? 0.0f : beta * c[j];
  }
  for (std::size_t p = 0; p < kc; ++p) {
    float const ap = alpha * a[p * a_k];
    float const* bp = b + p * ldb;
    for (std::size_t j = 0; j < w; ++j) acc[j] = std::fma(ap, bp[j], acc[j]);
  }
  for (std::size_t j = 0; j < w; ++j) c[j] = acc[j];
}

/// Dot form, one element: 16 lane sums in canonical order.
inline float gemm_dot(float const* a, float const* b, std::size_t k) noexcept {
  return gemm_order::dot(a, 1, b, 1, k);
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

/// Axpy form: MR rows by up to 64 columns (w) of C in 4 × MR registers.
template <std::size_t MR>
GRADCOMP_TARGET_AVX512 inline void gemm_axpy_tile(std::size_t kc, float alpha, float const* a,
                                                  std::size_t a_row, std::size_t a_k,
                                                  float const* b, std::size_t ldb, float* c,
                                                  std::size_t ldc, std::size_t w, float beta,
                                                  bool first) noexcept {
  __mmask16 m[4];
  for (std::size_t u = 0; u < 4; ++u) {
    std::size_t const rem = w > 16 * u ? w - 16 * u : 0;
    m[u] = rem >= 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1u);
  }
  __m512 acc[MR][4];
  __m512 const vb = _mm512_set1_ps(beta);
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t u = 0; u < 4; ++u) {
      if (first && beta == 0.0f) {
        acc[i][u] = _mm512_setzero_ps();
      } else {
        __m512 const cv = _mm512_maskz_loadu_ps(m[u], c + i * ldc + 16 * u);
        acc[i][u] = first ? _mm512_mul_ps(vb, cv) : cv;
      }
    }
  }
  for (std::size_t p = 0; p < kc; ++p) {
    float const* bp = b + p * ldb;
    if (w == 64) {  // the tile after next: one line per row, ahead of the hardware prefetcher
      for (std::size_t l = 0; l < 4; ++l) {
        _mm_prefetch(reinterpret_cast<char const*>(bp + gemm_prefetch + 16 * l), _MM_HINT_T0);
      }
    }
    __m512 const b0 = _mm512_maskz_loadu_ps(m[0], bp);
    __m512 const b1 = _mm512_maskz_loadu_ps(m[1], bp + 16);
    __m512 const b2 = _mm512_maskz_loadu_ps(m[2], bp + 32);
    __m512 const b3 = _mm512_maskz_loadu_ps(m[3], bp + 48);
    for (std::size_t i = 0; i < MR; ++i) {
      __m512 const av = _mm512_set1_ps(alpha * a[i * a_row + p * a_k]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(av, b2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(av, b3, acc[i][3]);
    }
  }
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t u = 0; u < 4; ++u)
      _mm512_mask_storeu_ps(c + i * ldc + 16 * u, m[u], acc[i][u]);
  }
}

/// Dot form: an MR × NR block of C, each element 16 lane sums over the whole k.
template <std::size_t MR, std::size_t NR>
GRADCOMP_TARGET_AVX512 inline void gemm_dot_tile(std::size_t k, float alpha, float const* a,
                                                 std::size_t lda, float const* b, std::size_t ldb,
                                                 float beta, float* c, std::size_t ldc) noexcept {
  __m512 acc[MR][NR];
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  std::size_t p = 0;
  for (; p + 16 <= k; p += 16) {
    __m512 av[MR], bv[NR];
    for (std::size_t i = 0; i < MR; ++i) av[i] = _mm512_loadu_ps(a + i * lda + p);
    for (std::size_t j = 0; j < NR; ++j) bv[j] = _mm512_loadu_ps(b + j * ldb + p);
    for (std::size_t i = 0; i < MR; ++i) {
      for (std::size_t j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av[i], bv[j], acc[i][j]);
    }
  }
  if (p < k) {
    __mmask16 const m = __mmask16((1u << (k - p)) - 1u);
    __m512 av[MR], bv[NR];
    for (std::size_t i = 0; i < MR; ++i) av[i] = _mm512_maskz_loadu_ps(m, a + i * lda + p);
    for (std::size_t j = 0; j < NR; ++j) bv[j] = _mm512_maskz_loadu_ps(m, b + j * ldb + p);
    for (std::size_t i = 0; i < MR; ++i) {
      for (std::size_t j = 0; j < NR; ++j)
        acc[i][j] = _mm512_mask3_fmadd_ps(av[i], bv[j], acc[i][j], m);
    }
  }
  alignas(64) float lanes[16];
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t j = 0; j < NR; ++j) {
      _mm512_store_ps(lanes, acc[i][j]);
      gemm_store_dot(c + i * ldc + j, gemm_reduce16(lanes), alpha, beta);
    }
  }
}

}  // namespace avx512

namespace avx2 {

/// Lane mask of the first `rem` (0..8+) of 8 lanes.
GRADCOMP_TARGET_AVX2 inline __m256i gemm_mask8(std::size_t rem) noexcept {
  int const r = rem > 8 ? 8 : static_cast<int>(rem);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Eight floats, or the lanes of `m` (the others 0) when not `full`.
GRADCOMP_TARGET_AVX2 inline __m256 gemm_load8(float const* p, __m256i m, bool full) noexcept {
  return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}

/// Axpy form: MR rows by up to 32 columns (w) of C in 4 × MR registers.
template <std::size_t MR>
GRADCOMP_TARGET_AVX2 inline void gemm_axpy_tile(std::size_t kc, float alpha, float const* a,
                                                std::size_t a_row, std::size_t a_k, float const* b,
                                                std::size_t ldb, float* c, std::size_t ldc,
                                                std::size_t w, float beta, bool first) noexcept {
  bool const full = w == 32;
  __m256i m[4];
  for (std::size_t u = 0; u < 4; ++u) m[u] = gemm_mask8(w > 8 * u ? w - 8 * u : 0);
  __m256 acc[MR][4];
  __m256 const vb = _mm256_set1_ps(beta);
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t u = 0; u < 4; ++u) {
      if (first && beta == 0.0f) {
        acc[i][u] = _mm256_setzero_ps();
      } else {
        __m256 const cv = gemm_load8(c + i * ldc + 8 * u, m[u], full);
        acc[i][u] = first ? _mm256_mul_ps(vb, cv) : cv;
      }
    }
  }
  for (std::size_t p = 0; p < kc; ++p) {
    float const* bp = b + p * ldb;
    if (full) {
      for (std::size_t l = 0; l < 2; ++l) {
        _mm_prefetch(reinterpret_cast<char const*>(bp + gemm_prefetch + 16 * l), _MM_HINT_T0);
      }
    }
    __m256 const b0 = gemm_load8(bp, m[0], full);
    __m256 const b1 = gemm_load8(bp + 8, m[1], full);
    __m256 const b2 = gemm_load8(bp + 16, m[2], full);
    __m256 const b3 = gemm_load8(bp + 24, m[3], full);
    for (std::size_t i = 0; i < MR; ++i) {
      __m256 const av = _mm256_set1_ps(alpha * a[i * a_row + p * a_k]);
      acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(av, b2, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(av, b3, acc[i][3]);
    }
  }
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t u = 0; u < 4; ++u) {
      if (full) {
        _mm256_storeu_ps(c + i * ldc + 8 * u, acc[i][u]);
      } else {
        _mm256_maskstore_ps(c + i * ldc + 8 * u, m[u], acc[i][u]);
      }
    }
  }
}

/// Dot form: an MR × NR block of C; the 16 lane sums of an element are two registers
/// (lanes 0-7 and 8-15).
template <std::size_t MR, std::size_t NR>
GRADCOMP_TARGET_AVX2 inline void gemm_dot_tile(std::size_t k, float alpha, float const* a,
                                               std::size_t lda, float const* b, std::size_t ldb,
                                               float beta, float* c, std::size_t ldc) noexcept {
  __m256 lo[MR][NR], hi[MR][NR];
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  }
  std::size_t p = 0;
  for (; p + 16 <= k; p += 16) {
    for (std::size_t i = 0; i < MR; ++i) {
      __m256 const al = _mm256_loadu_ps(a + i * lda + p);
      __m256 const ah = _mm256_loadu_ps(a + i * lda + p + 8);
      for (std::size_t j = 0; j < NR; ++j) {
        lo[i][j] = _mm256_fmadd_ps(al, _mm256_loadu_ps(b + j * ldb + p), lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(ah, _mm256_loadu_ps(b + j * ldb + p + 8), hi[i][j]);
      }
    }
  }
  if (p < k) {
    __m256i const ml = gemm_mask8(k - p);
    __m256i const mh = gemm_mask8(k - p > 8 ? k - p - 8 : 0);
    for (std::size_t i = 0; i < MR; ++i) {
      __m256 const al = _mm256_maskload_ps(a + i * lda + p, ml);
      __m256 const ah = _mm256_maskload_ps(a + i * lda + p + 8, mh);
      for (std::size_t j = 0; j < NR; ++j) {
        __m256 const fl = _mm256_fmadd_ps(al, _mm256_maskload_ps(b + j * ldb + p, ml), lo[i][j]);
        __m256 const fh =
            _mm256_fmadd_ps(ah, _mm256_maskload_ps(b + j * ldb + p + 8, mh), hi[i][j]);
        lo[i][j] = _mm256_blendv_ps(lo[i][j], fl, _mm256_castsi256_ps(ml));
        hi[i][j] = _mm256_blendv_ps(hi[i][j], fh, _mm256_castsi256_ps(mh));
      }
    }
  }
  alignas(32) float lanes[16];
  for (std::size_t i = 0; i < MR; ++i) {
    for (std::size_t j = 0; j < NR; ++j) {
      _mm256_store_ps(lanes, lo[i][j]);
      _mm256_store_ps(lanes + 8, hi[i][j]);
      gemm_store_dot(c + i * ldc + j, gemm_reduce16(lanes), alpha, beta);
    }
  }
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

// The per-level pieces of the serial block loops below: rows of the axpy register tile, one
// panel of the axpy form (mr rows, all n columns, one k block) and the dot form of a block.
namespace scalar {
constexpr std::size_t gemm_axpy_rows(isa_tag) noexcept { return 1; }

inline void gemm_axpy_panel(isa_tag, std::size_t /*mr*/, std::size_t kc, float const* ap,
                            float const* bk, std::size_t ldb, float* ci, std::size_t /*ldc*/,
                            std::size_t n, float beta, bool first) noexcept {
  for (std::size_t j = 0; j < n; j += 64) {
    std::size_t const w = std::min<std::size_t>(64, n - j);
    gemm_axpy_row(kc, 1.0f, ap, 1, bk + j, ldb, ci + j, w, beta, first);
  }
}

inline void gemm_dot_block(isa_tag, std::size_t m, std::size_t n, std::size_t k, float alpha,
                           float const* a, std::size_t lda, float const* b, std::size_t ldb,
                           float beta, float* c, std::size_t ldc) noexcept {
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < m; ++i) {
      gemm_store_dot(c + i * ldc + j, gemm_dot(a + i * lda, b + j * ldb, k), alpha, beta);
    }
  }
}
}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {
constexpr std::size_t gemm_axpy_rows(isa_tag) noexcept { return 4; }

GRADCOMP_TARGET_AVX512 inline void gemm_axpy_panel(isa_tag, std::size_t mr, std::size_t kc,
                                                   float const* ap, float const* bk,
                                                   std::size_t ldb, float* ci, std::size_t ldc,
                                                   std::size_t n, float beta, bool first) noexcept {
  for (std::size_t j = 0; j < n; j += 64) {
    std::size_t const w = std::min<std::size_t>(64, n - j);
    switch (mr) {
      case 4:
        gemm_axpy_tile<4>(kc, 1.0f, ap, 1, 4, bk + j, ldb, ci + j, ldc, w, beta, first);
        break;
      case 3:
        gemm_axpy_tile<3>(kc, 1.0f, ap, 1, 3, bk + j, ldb, ci + j, ldc, w, beta, first);
        break;
      case 2:
        gemm_axpy_tile<2>(kc, 1.0f, ap, 1, 2, bk + j, ldb, ci + j, ldc, w, beta, first);
        break;
      default:
        gemm_axpy_tile<1>(kc, 1.0f, ap, 1, 1, bk + j, ldb, ci + j, ldc, w, beta, first);
        break;
    }
  }
}

template <std::size_t MR>
GRADCOMP_TARGET_AVX512 inline void gemm_dot_row(std::size_t nr, std::size_t k, float alpha,
                                                float const* a, std::size_t lda, float const* b,
                                                std::size_t ldb, float beta, float* c,
                                                std::size_t ldc) noexcept {
  switch (nr) {
    case 4: gemm_dot_tile<MR, 4>(k, alpha, a, lda, b, ldb, beta, c, ldc); break;
    case 3: gemm_dot_tile<MR, 3>(k, alpha, a, lda, b, ldb, beta, c, ldc); break;
    case 2: gemm_dot_tile<MR, 2>(k, alpha, a, lda, b, ldb, beta, c, ldc); break;
    default: gemm_dot_tile<MR, 1>(k, alpha, a, lda, b, ldb, beta, c, ldc); break;
  }
}

GRADCOMP_TARGET_AVX512 inline void gemm_dot_block(isa_tag, std::size_t m, std::size_t n,
                                                  std::size_t k, float alpha, float const* a,
                                                  std::size_t lda, float const* b, std::size_t ldb,
                                                  float beta, float* c, std::size_t ldc) noexcept {
  for (std::size_t j = 0; j < n; j += 4) {
    std::size_t const nr = std::min<std::size_t>(4, n - j);
    for (std::size_t i = 0; i < m; i += 4) {
      std::size_t const mr = std::min<std::size_t>(4, m - i);
      float const* ai = a + i * lda;
      float const* bj = b + j * ldb;
      float* cij = c + i * ldc + j;
      switch (mr) {
        case 4: gemm_dot_row<4>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc); break;
        case 3: gemm_dot_row<3>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc); break;
        case 2: gemm_dot_row<2>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc); break;
        default: gemm_dot_row<1>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc); break;
      }
    }
  }
}
}  // namespace avx512

namespace avx2 {
constexpr std::size_t gemm_axpy_rows(isa_tag) noexcept { return 2; }

GRADCOMP_TARGET_AVX2 inline void gemm_axpy_panel(isa_tag, std::size_t mr, std::size_t kc,
                                                 float const* ap, float const* bk, std::size_t ldb,
                                                 float* ci, std::size_t ldc, std::size_t n,
                                                 float beta, bool first) noexcept {
  for (std::size_t j = 0; j < n; j += 32) {
    std::size_t const w = std::min<std::size_t>(32, n - j);
    if (mr == 2) {
      gemm_axpy_tile<2>(kc, 1.0f, ap, 1, 2, bk + j, ldb, ci + j, ldc, w, beta, first);
    } else {
      gemm_axpy_tile<1>(kc, 1.0f, ap, 1, 1, bk + j, ldb, ci + j, ldc, w, beta, first);
    }
  }
}

template <std::size_t MR>
GRADCOMP_TARGET_AVX2 inline void gemm_dot_row(std::size_t nr, std::size_t k, float alpha,
                                              float const* a, std::size_t lda, float const* b,
                                              std::size_t ldb, float beta, float* c,
                                              std::size_t ldc) noexcept {
  if (nr == 2) {
    gemm_dot_tile<MR, 2>(k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_dot_tile<MR, 1>(k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

GRADCOMP_TARGET_AVX2 inline void gemm_dot_block(isa_tag, std::size_t m, std::size_t n,
                                                std::size_t k, float alpha, float const* a,
                                                std::size_t lda, float const* b, std::size_t ldb,
                                                float beta, float* c, std::size_t ldc) noexcept {
  for (std::size_t j = 0; j < n; j += 2) {
    std::size_t const nr = std::min<std::size_t>(2, n - j);
    for (std::size_t i = 0; i < m; i += 2) {
      std::size_t const mr = std::min<std::size_t>(2, m - i);
      float const* ai = a + i * lda;
      float const* bj = b + j * ldb;
      float* cij = c + i * ldc + j;
      if (mr == 2) {
        gemm_dot_row<2>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc);
      } else {
        gemm_dot_row<1>(nr, k, alpha, ai, lda, bj, ldb, beta, cij, ldc);
      }
    }
  }
}
}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// Serial axpy form on an m × n block of C at the level of `Tag`: op(A)(i, p) = a[i * a_row +
/// p * a_k], B row p at b + p * ldb. k = 0 gives C = beta C.
template <class Tag>
inline void gemm_axpy_blocked(Tag t, std::size_t m, std::size_t n, std::size_t k, float alpha,
                              float const* a, std::size_t a_row, std::size_t a_k, float const* b,
                              std::size_t ldb, float beta, float* c, std::size_t ldc) noexcept {
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      }
    }
    return;
  }
  // alpha * op(A) for one k block and up to 4 rows, packed [p][row]: the tiles then broadcast
  // from one small contiguous buffer (the products are the same floats as unpacked).
  constexpr std::size_t mr_max = gemm_axpy_rows(Tag{});
  static_assert(mr_max <= 4);
  float ap[gemm_kc * 4];
  for (std::size_t kb = 0; kb < k; kb += gemm_kc) {
    std::size_t const kc = std::min(gemm_kc, k - kb);
    bool const first = kb == 0;
    float const* bk = b + kb * ldb;
    for (std::size_t i = 0; i < m; i += mr_max) {
      std::size_t const mr = std::min(mr_max, m - i);
      for (std::size_t p = 0; p < kc; ++p) {
        for (std::size_t ii = 0; ii < mr; ++ii)
          ap[p * mr + ii] = alpha * a[(i + ii) * a_row + (kb + p) * a_k];
      }
      gemm_axpy_panel(t, mr, kc, ap, bk, ldb, c + i * ldc, ldc, n, beta, first);
    }
  }
}

/// Serial axpy form on an m × n block of C (see `gemm_axpy_blocked`).
inline void gemm_axpy_block(isa level, std::size_t m, std::size_t n, std::size_t k, float alpha,
                            float const* a, std::size_t a_row, std::size_t a_k, float const* b,
                            std::size_t ldb, float beta, float* c, std::size_t ldc) noexcept {
  dispatch(level, [&](auto t) {
    gemm_axpy_blocked(t, m, n, k, alpha, a, a_row, a_k, b, ldb, beta, c, ldc);
  });
}

/// Serial dot form on an m × n block of C: C(i, j) = alpha <A row i, B row j> (+ beta C).
inline void gemm_dot_block(isa level, std::size_t m, std::size_t n, std::size_t k, float alpha,
                           float const* a, std::size_t lda, float const* b, std::size_t ldb,
                           float beta, float* c, std::size_t ldc) noexcept {
  dispatch(level, [&](auto t) { gemm_dot_block(t, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

}  // namespace kernels

namespace detail {

inline void check_gemm_ld(char const* what, std::size_t ld, std::size_t cols) {
  if (ld < std::max<std::size_t>(1, cols)) {
    throw config_error(std::string("gradcomp: gemm leading dimension ") + what + " = " +
                       std::to_string(ld) + " is smaller than the " + std::to_string(cols) +
                       " columns its row-major matrix stores");
  }
}

/// The built-in GEMM (k > 0) on fixed blocks of C. Every element's summation order depends
/// only on k, so the blocks (one per thread, or the whole C on one thread) do not change the
/// result.
inline void gemm_builtin(isa level, transpose ta, transpose tb, std::size_t m, std::size_t n,
                         std::size_t k, float alpha, float const* a, std::size_t lda,
                         float const* b, std::size_t ldb, float* c, std::size_t ldc,
                         execution const& ctx, float beta = 0.0f) {
  bool const at = ta == transpose::yes, bt = tb == transpose::yes;
  std::vector<float> at_copy;  // A transposed, for the dot form of Aᵀ Bᵀ
  if (at && bt) {
    at_copy.resize(m * k);
    for (std::size_t p = 0; p < k; ++p) {
      for (std::size_t i = 0; i < m; ++i) at_copy[i * k + p] = a[p * lda + i];
    }
    a = at_copy.data();
    lda = k;
  }
  bool const dot = bt;
  std::size_t const a_row = at && !bt ? 1 : lda;
  std::size_t const a_k = at && !bt ? lda : 1;
  auto block = [&](std::size_t i0, std::size_t mb, std::size_t j0, std::size_t nb) {
    float* cb = c + i0 * ldc + j0;
    if (dot) {
      kernels::gemm_dot_block(level, mb, nb, k, alpha, a + i0 * lda, lda, b + j0 * ldb, ldb, beta,
                              cb, ldc);
    } else {
      kernels::gemm_axpy_block(level, mb, nb, k, alpha, a + i0 * a_row, a_row, a_k, b + j0, ldb,
                               beta, cb, ldc);
    }
  };
  double const work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  unsigned const threads = ctx.threads().size();
  if (threads <= 1 || work < static_cast<double>(gemm_parallel_factor) *
                                 static_cast<double>(ctx.parallel_threshold)) {
    block(0, m, 0, n);  // whole rows: sequential streams through B
    return;
  }
  // Rows of C in blocks of gemm_task_rows; columns in one block per thread (aligned to the
  // widest tile), so each task streams long runs of B.
  std::size_t const col_w = std::max<std::size_t>(64, ((n + threads - 1) / threads + 63) / 64 * 64);
  std::size_t const row_blocks = (m + gemm_task_rows - 1) / gemm_task_rows;
  std::size_t const col_blocks = (n + col_w - 1) / col_w;
  ctx.threads().run(row_blocks * col_blocks, [&](std::size_t t) {
    std::size_t const i0 = (t / col_blocks) * gemm_task_rows;
    std::size_t const j0 = (t % col_blocks) * col_w;
    block(i0, std::min(gemm_task_rows, m - i0), j0, std::min(col_w, n - j0));
  });
}

}  // namespace detail

/// C = alpha op(A) op(B) + beta C, all row-major: op(A) is m × k, op(B) k × n, C m × n; A is
/// stored m × k (lda ≥ k) or, transposed, k × m (lda ≥ m); likewise B. With beta = 0, C is
/// only written (NaNs in it do not propagate). Runs on `ctx`'s pool (a `cpu::execution`, or a
/// `codec_context`, which converts to one) when m·n·k is at least 32 × `ctx.parallel_threshold`;
/// each task owns a block of C and every element's summation order depends only on the shapes,
/// so the result does not depend on the thread count. Throws `config_error` for leading
/// dimensions that are too small, or for `gemm_backend::blas` in a program built without
/// `GRADCOMP_USE_CBLAS`.
inline void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, float const* a, std::size_t lda, float const* b, std::size_t ldb,
                 float beta, float* c, std::size_t ldc, execution const& ctx = {},
                 gemm_backend backend = gemm_backend::automatic) {
  bool const at = ta == transpose::yes, bt = tb == transpose::yes;
  detail::check_gemm_ld("lda", lda, at ? m : k);
  detail::check_gemm_ld("ldb", ldb, bt ? k : n);
  detail::check_gemm_ld("ldc", ldc, n);
  if (backend == gemm_backend::blas && !gemm_has_blas) {
    throw config_error(
        "gradcomp: gemm backend 'blas' requested, but this program was built without "
        "GRADCOMP_USE_CBLAS (link gradcomp::blas, or use gemm_backend::builtin)");
  }
  if (m == 0 || n == 0) return;
#if defined(GRADCOMP_USE_CBLAS)
  bool const fits = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX &&
                    ldb <= INT_MAX && ldc <= INT_MAX;
  if (backend != gemm_backend::builtin && fits && k > 0) {
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    return;
  }
#endif
  isa const level = effective_isa(ctx.isa);
  if (k == 0) {
    kernels::gemm_axpy_block(level, m, n, 0, alpha, a, lda, 1, b, ldb, beta, c, ldc);
    return;
  }
  // A narrow C (n < 16) with many rows is computed transposed, Cᵀ = op(B)ᵀ op(A)ᵀ, where the
  // wide dimension feeds the vector lanes, then transposed back: P = M Q and Q = Mᵀ P with
  // n = r run as fast as their column-by-column twins.
  if (n < 16 && m >= 64) {
    std::vector<float> ct(n * m);
    detail::gemm_builtin(level, bt ? transpose::no : transpose::yes,
                         at ? transpose::no : transpose::yes, n, m, k, alpha, b, ldb, a, lda,
                         ct.data(), m, ctx);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        float const v = ct[j * m + i];
        c[i * ldc + j] = beta == 0.0f ? v : v + beta * c[i * ldc + j];
      }
    }
    return;
  }
  detail::gemm_builtin(level, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc, ctx, beta);
}

}  // namespace cpu
GRADCOMP_NAMESPACE_END
