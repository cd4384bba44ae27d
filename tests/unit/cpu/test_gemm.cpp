// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// cpu::gemm: agrees with a double-precision triple loop within a rounding bound for odd shapes,
// every transpose combination, padded leading dimensions and every ISA level; bit-identical
// across ISA levels and thread counts; beta = 0 never reads C; bad arguments raise; the BLAS
// backend (when compiled in) agrees with the built-in kernel to rounding.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"
#include "../support/skip.hpp"

#include <gradcomp/cpu/kernels/gemm.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;
using gc::cpu::transpose;

struct problem {
  transpose ta, tb;
  std::size_t m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c;
};

problem make_problem(std::size_t m, std::size_t n, std::size_t k, transpose ta, transpose tb,
                     std::uint64_t seed, std::size_t pad = 3) {
  problem p{ta, tb, m, n, k, 0, 0, 0, {}, {}, {}};
  bool const at = ta == transpose::yes, bt = tb == transpose::yes;
  p.lda = (at ? m : k) + pad;
  p.ldb = (bt ? k : n) + pad + 1;
  p.ldc = n + pad + 2;
  p.a = gaussian((at ? k : m) * p.lda, seed);
  p.b = gaussian((bt ? n : k) * p.ldb, seed + 1);
  p.c = gaussian(m * p.ldc, seed + 2);
  return p;
}

float op_a(problem const& p, std::size_t i, std::size_t l) {
  return p.ta == transpose::yes ? p.a[l * p.lda + i] : p.a[i * p.lda + l];
}
float op_b(problem const& p, std::size_t l, std::size_t j) {
  return p.tb == transpose::yes ? p.b[j * p.ldb + l] : p.b[l * p.ldb + j];
}

/// The exact products of a problem in double: sum and sum of magnitudes per element of C.
struct reference {
  std::vector<double> sum, mag;
};

reference reference_of(problem const& p) {
  reference r{std::vector<double>(p.m * p.n), std::vector<double>(p.m * p.n)};
  for (std::size_t i = 0; i < p.m; ++i) {
    for (std::size_t j = 0; j < p.n; ++j) {
      double s = 0.0, mag = 0.0;
      for (std::size_t l = 0; l < p.k; ++l) {
        double const t = static_cast<double>(op_a(p, i, l)) * op_b(p, l, j);
        s += t;
        mag += std::fabs(t);
      }
      r.sum[i * p.n + j] = s;
      r.mag[i * p.n + j] = mag;
    }
  }
  return r;
}

/// Runs gemm on a copy of p.c and checks every element of C against the double reference
/// within (k + 2) ulps of the sum of magnitudes; the padding of C must be untouched.
void check_against_reference(problem const& p, reference const& ref, float alpha, float beta,
                             gc::codec_context const& ctx,
                             gc::cpu::gemm_backend backend = gc::cpu::gemm_backend::builtin) {
  std::vector<float> c = p.c;
  gc::cpu::gemm(p.ta, p.tb, p.m, p.n, p.k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, beta,
                c.data(), p.ldc, ctx, backend);
  std::size_t bad = 0, first_i = 0, first_j = 0;
  for (std::size_t i = 0; i < p.m; ++i) {
    for (std::size_t j = 0; j < p.ldc; ++j) {
      float const got = c[i * p.ldc + j];
      double const c0 = p.c[i * p.ldc + j];
      bool ok;
      if (j >= p.n) {
        ok = bits_of(got) == bits_of(p.c[i * p.ldc + j]);
      } else {
        double const want = alpha * ref.sum[i * p.n + j] + (beta == 0.0f ? 0.0 : beta * c0);
        double const bound = (static_cast<double>(p.k) + 2.0) * 0x1p-23 *
                                 (std::fabs(alpha) * ref.mag[i * p.n + j] + std::fabs(beta * c0)) +
                             1e-30;
        ok = std::fabs(got - want) <= bound;
      }
      if (!ok && bad++ == 0) {
        first_i = i;
        first_j = j;
      }
    }
  }
  INFO(p.m << " x " << p.n << " x " << p.k << ": first bad element C(" << first_i << ", " << first_j
           << ")");
  REQUIRE(bad == 0);
}

constexpr std::array<std::array<std::size_t, 3>, 7> shapes = {{
    {1, 1, 1},
    {7, 13, 5},
    {130, 257, 3},
    {4, 300, 200},
    {67, 3, 129},
    {5, 70, 33},
    {3, 65, 17},
}};

}  // namespace

TEST_CASE("gemm equals the triple-loop reference for odd shapes and every transpose",
          "[cpu][gemm]") {
  std::uint64_t seed = 1;
  for (auto const& s : shapes) {
    for (transpose ta : {transpose::no, transpose::yes}) {
      for (transpose tb : {transpose::no, transpose::yes}) {
        problem const p = make_problem(s[0], s[1], s[2], ta, tb, seed += 7);
        reference const ref = reference_of(p);
        for (gc::cpu::isa level : isa_levels) {
          INFO("isa " << gc::cpu::isa_name(level) << " ta " << (ta == transpose::yes) << " tb "
                      << (tb == transpose::yes));
          check_against_reference(p, ref, 1.0f, 0.0f, serial_ctx(level));
          check_against_reference(p, ref, -0.75f, 1.0f, serial_ctx(level));
          check_against_reference(p, ref, 2.0f, 0.5f, parallel_ctx(2, level));
        }
      }
    }
  }
}

TEST_CASE("gemm is bit-identical across ISA levels and thread counts", "[cpu][gemm]") {
  // Shapes spanning several parallel tasks (64 rows x 1024 columns of C each) and k blocks.
  for (auto const& s : {std::array<std::size_t, 3>{70, 1030, 40}, {4, 2100, 300}, {130, 9, 77}}) {
    for (transpose ta : {transpose::no, transpose::yes}) {
      for (transpose tb : {transpose::no, transpose::yes}) {
        problem const p = make_problem(s[0], s[1], s[2], ta, tb, s[0] * 31 + s[2], 0);
        std::vector<float> first;
        for (gc::cpu::isa level : isa_levels) {
          for (unsigned threads : {1u, 2u, 3u}) {
            std::vector<float> c = p.c;
            gc::cpu::gemm(ta, tb, p.m, p.n, p.k, 0.5f, p.a.data(), p.lda, p.b.data(), p.ldb, 1.0f,
                          c.data(), p.ldc, parallel_ctx(threads, level),
                          gc::cpu::gemm_backend::builtin);
            if (first.empty()) {
              first = c;
            } else {
              INFO("isa " << gc::cpu::isa_name(level) << ", " << threads << " threads");
              REQUIRE(std::memcmp(first.data(), c.data(), c.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("gemm with beta = 0 ignores C, with k = 0 scales it, with m or n = 0 does nothing",
          "[cpu][gemm]") {
  for (transpose tb : {transpose::no, transpose::yes}) {
    problem q = make_problem(9, 37, 21, transpose::no, tb, 5, 0);
    for (float& v : q.c) v = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> c = q.c;
    gc::cpu::gemm(q.ta, q.tb, q.m, q.n, q.k, 1.0f, q.a.data(), q.lda, q.b.data(), q.ldb, 0.0f,
                  c.data(), q.ldc, serial_ctx(), gc::cpu::gemm_backend::builtin);
    for (std::size_t i = 0; i < q.m; ++i) {
      for (std::size_t j = 0; j < q.n; ++j) REQUIRE(std::isfinite(c[i * q.ldc + j]));
    }
  }
  std::vector<float> c = {1.0f, -2.0f, 4.0f, 8.0f};
  float const dummy = 0.0f;
  gc::cpu::gemm(transpose::no, transpose::no, 2, 2, 0, 1.0f, &dummy, 1, &dummy, 2, 0.5f, c.data(),
                2, serial_ctx(), gc::cpu::gemm_backend::builtin);
  CHECK(c == std::vector<float>{0.5f, -1.0f, 2.0f, 4.0f});
  gc::cpu::gemm(transpose::no, transpose::no, 0, 2, 3, 1.0f, &dummy, 3, &dummy, 2, 0.5f, c.data(),
                2, serial_ctx(), gc::cpu::gemm_backend::builtin);
  CHECK(c == std::vector<float>{0.5f, -1.0f, 2.0f, 4.0f});
}

TEST_CASE("gemm rejects leading dimensions that are too small", "[cpu][gemm]") {
  std::vector<float> a(64), b(64), c(64);
  auto call = [&](transpose ta, transpose tb, std::size_t lda, std::size_t ldb, std::size_t ldc) {
    gc::cpu::gemm(ta, tb, 4, 5, 6, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc);
  };
  CHECK_NOTHROW(call(transpose::no, transpose::no, 6, 5, 5));
  CHECK_THROWS_AS(call(transpose::no, transpose::no, 5, 5, 5), gc::config_error);
  CHECK_THROWS_AS(call(transpose::yes, transpose::no, 3, 5, 5), gc::config_error);
  CHECK_THROWS_AS(call(transpose::no, transpose::yes, 6, 5, 5), gc::config_error);
  CHECK_THROWS_AS(call(transpose::no, transpose::no, 6, 5, 4), gc::config_error);
  if (!gc::cpu::gemm_has_blas) {
    CHECK_THROWS_AS(gc::cpu::gemm(transpose::no, transpose::no, 4, 5, 6, 1.0f, a.data(), 6,
                                  b.data(), 5, 0.0f, c.data(), 5, {}, gc::cpu::gemm_backend::blas),
                    gc::config_error);
  }
}

TEST_CASE("gemm: the BLAS backend agrees with the built-in kernel", "[cpu][gemm][blas]") {
  if (!gc::cpu::gemm_has_blas) {
    GRADCOMP_TEST_SKIP("built without GRADCOMP_USE_CBLAS; gradcomp_blas_tests runs this case");
  }
  std::uint64_t seed = 100;
  for (auto const& s : shapes) {
    for (transpose ta : {transpose::no, transpose::yes}) {
      for (transpose tb : {transpose::no, transpose::yes}) {
        problem const p = make_problem(s[0], s[1], s[2], ta, tb, seed += 3);
        reference const ref = reference_of(p);
        check_against_reference(p, ref, 1.0f, 0.0f, serial_ctx(), gc::cpu::gemm_backend::blas);
        check_against_reference(p, ref, -0.5f, 1.0f, serial_ctx(),
                                gc::cpu::gemm_backend::automatic);
      }
    }
  }
}
