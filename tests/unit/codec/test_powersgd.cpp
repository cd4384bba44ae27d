// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// PowerSGD: exact for matrices of rank <= r; error falls with the rank and with warm-started
// power iteration (towards the optimal rank-r error); error feedback conserves mass; a simulated
// two-rank step of the phase protocol equals the direct formula and leaves both ranks with the
// same state; dense fallback for small matrices; packets identical for any thread count and
// ISA, decoded statelessly (also by decompress_any); rank-deficient P handled; bad shapes,
// malformed packets and state, non-finite input and phase misuse rejected; save/load resumes.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"
#include "../support/skip.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/cpu/kernels/finite.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// Options with a low dense threshold, so small test matrices take the low-rank path.
gc::powersgd_options opts(std::uint32_t rank, bool feedback = true) {
  gc::powersgd_options o;
  o.rank = rank;
  o.min_elements = 16;
  o.backend = gc::cpu::gemm_backend::builtin;
  o.error_feedback = feedback;
  return o;
}

/// Columns of a rows × k Gaussian matrix made orthonormal (Gram-Schmidt in double), stored
/// column by column.
std::vector<double> orthonormal_columns(std::size_t rows, std::size_t k, std::uint64_t seed) {
  auto const g = gaussian(rows * k, seed);
  std::vector<double> u(g.begin(), g.end());
  for (std::size_t c = 0; c < k; ++c) {
    double* v = u.data() + c * rows;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t d = 0; d < c; ++d) {
        double h = 0.0;
        for (std::size_t i = 0; i < rows; ++i) h += v[i] * u[d * rows + i];
        for (std::size_t i = 0; i < rows; ++i) v[i] -= h * u[d * rows + i];
      }
    }
    double n = 0.0;
    for (std::size_t i = 0; i < rows; ++i) n += v[i] * v[i];
    for (std::size_t i = 0; i < rows; ++i) v[i] /= std::sqrt(n);
  }
  return u;
}

/// M = U diag(sigma) Vᵀ (row-major rows × cols) with random orthonormal U, V.
std::vector<float> with_spectrum(std::size_t rows, std::size_t cols,
                                 std::vector<double> const& sigma, std::uint64_t seed) {
  std::size_t const k = sigma.size();
  auto const u = orthonormal_columns(rows, k, seed);
  auto const v = orthonormal_columns(cols, k, seed + 1);
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      double s = 0.0;
      for (std::size_t c = 0; c < k; ++c) s += sigma[c] * u[c * rows + i] * v[c * cols + j];
      m[i * cols + j] = static_cast<float>(s);
    }
  }
  return m;
}

double frob(std::vector<float> const& a) {
  double s = 0.0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double frob_diff(std::vector<float> const& a, std::vector<float> const& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

/// One full local step of `s` on `g`; returns M̂.
std::vector<float> step(gc::powersgd_state& s, std::vector<float> const& g,
                        gc::codec_context const& ctx = {}) {
  s.begin(std::span<float const>(g), ctx);
  s.after_p_reduced(ctx);
  s.finish(1.0f, ctx);
  std::vector<float> out(g.size());
  s.reconstruct(std::span<float>(out), ctx);
  return out;
}

std::vector<std::byte> compress(gc::powersgd& c, std::vector<float> const& g, std::size_t rows,
                                std::size_t cols, gc::codec_context const& ctx = {},
                                gc::tensor_id id = gc::tensor_id{0}) {
  std::vector<std::byte> out(c.max_compressed_bytes(rows, cols) + guard_bytes, guard_byte);
  std::size_t const n = c.compress(gc::tensor_view<float const>(std::span<float const>(g), id),
                                   rows, cols, std::span<std::byte>(out), ctx);
  REQUIRE(n == c.max_compressed_bytes(rows, cols));
  for (std::size_t i = n; i < out.size(); ++i) REQUIRE(out[i] == guard_byte);
  out.resize(n);
  return out;
}

std::vector<float> decode(std::vector<std::byte> const& p, std::size_t n) {
  std::vector<float> out(n);
  gc::powersgd::decompress(std::span<std::byte const>(p), std::span<float>(out));
  return out;
}

double max_abs_diff(std::vector<float> const& a, std::vector<float> const& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("powersgd is exact for a matrix of rank <= r", "[codec][powersgd]") {
  for (std::size_t true_rank : {1u, 2u, 4u}) {
    auto const m = with_spectrum(40, 56, std::vector<double>(true_rank, 3.0), true_rank);
    gc::powersgd_state s(40, 56, opts(4), gc::tensor_id{7});
    REQUIRE(s.mode() == gc::powersgd_mode::low_rank);
    auto const mhat = step(s, m);
    INFO("true rank " << true_rank);
    CHECK(frob_diff(mhat, m) <= 1e-5 * frob(m));
    // The residual is what was not sent: M - M̂, tiny here.
    CHECK(frob(s.residual()) <= 1e-5 * frob(m));
    // P is orthonormal even though only true_rank of its columns carry M.
    auto const p = s.p();
    for (std::size_t a = 0; a < 4; ++a) {
      for (std::size_t b = 0; b < 4; ++b) {
        double d = 0.0;
        for (std::size_t i = 0; i < 40; ++i)
          d += static_cast<double>(p[a * 40 + i]) * p[b * 40 + i];
        CHECK(std::fabs(d - (a == b ? 1.0 : 0.0)) < 1e-5);
      }
    }
  }
}

TEST_CASE("powersgd error decreases with the rank and with warm-start iterations",
          "[codec][powersgd]") {
  std::size_t const rows = 48, cols = 40;
  std::vector<double> sigma;
  for (int i = 0; i < 24; ++i) sigma.push_back(std::pow(0.6, i));
  auto const m = with_spectrum(rows, cols, sigma, 11);
  auto optimal = [&](std::size_t r) {
    double s = 0.0;
    for (std::size_t i = r; i < sigma.size(); ++i) s += sigma[i] * sigma[i];
    return std::sqrt(s);
  };
  // One step from the random start, for growing rank.
  double last = std::numeric_limits<double>::infinity();
  for (std::uint32_t r : {1u, 2u, 4u, 8u}) {
    gc::powersgd_state s(rows, cols, opts(r, false));
    double const err = frob_diff(step(s, m), m);
    INFO("rank " << r << " error " << err << " optimal " << optimal(r));
    CHECK(err < last);
    CHECK(err >= optimal(r) * (1.0 - 1e-4));
    last = err;
  }
  // Warm-started power iteration on the same matrix (no error feedback): the error falls
  // step after step towards the optimal rank-r error (the gap sigma_r+1 / sigma_r = 0.6 makes
  // the convergence geometric).
  for (std::uint32_t r : {1u, 2u, 4u}) {
    gc::powersgd_state s(rows, cols, opts(r, false));
    std::vector<double> errs;
    for (int it = 0; it < 12; ++it) errs.push_back(frob_diff(step(s, m), m));
    INFO("rank " << r << " first " << errs.front() << " last " << errs.back() << " optimal "
                 << optimal(r));
    for (std::size_t i = 1; i < errs.size(); ++i) CHECK(errs[i] <= errs[i - 1] * (1.0 + 1e-5));
    CHECK(errs.back() < errs.front());
    CHECK(errs.back() <= optimal(r) * 1.01);
  }
}

TEST_CASE("powersgd error feedback conserves mass over steps", "[codec][powersgd]") {
  std::size_t const rows = 24, cols = 36;
  gc::powersgd c(opts(2));
  std::vector<double> sum_in(rows * cols, 0.0), sum_out(rows * cols, 0.0);
  double scale = 0.0;
  for (int t = 0; t < 30; ++t) {
    auto const g = heavy_tailed(rows * cols, 500 + static_cast<std::uint64_t>(t));
    auto const packet = compress(c, g, rows, cols,
                                 serial_ctx(gc::cpu::isa::best, 3, static_cast<std::uint32_t>(t)));
    auto const out = decode(packet, rows * cols);
    for (std::size_t i = 0; i < g.size(); ++i) {
      sum_in[i] += g[i];
      sum_out[i] += out[i];
      scale += std::fabs(g[i]);
    }
  }
  auto const e = c.find(gc::tensor_id{0})->residual();
  double worst = 0.0;
  for (std::size_t i = 0; i < e.size(); ++i)
    worst = std::max(worst, std::fabs(sum_out[i] + e[i] - sum_in[i]));
  // Float rounding of 30 steps of sums of magnitude ~scale / n per element.
  CHECK(worst <= 1e-4 * scale / static_cast<double>(e.size()) * 30);
  // And the residual is not trivially zero (rank 2 of a 24 x 36 noise matrix loses a lot).
  CHECK(frob(e) > 0.1);
}

TEST_CASE("powersgd: two simulated ranks follow the direct formula and stay in agreement",
          "[codec][powersgd]") {
  std::size_t const rows = 30, cols = 44;
  std::uint32_t const r = 3;
  gc::codec_context const ctx = serial_ctx(gc::cpu::isa::best, 42, 5);
  gc::powersgd_state a(rows, cols, opts(r), gc::tensor_id{3});
  gc::powersgd_state b(rows, cols, opts(r), gc::tensor_id{3});
  for (int t = 0; t < 3; ++t) {
    auto const g1 = gaussian(rows * cols, 10 + static_cast<std::uint64_t>(t));
    auto const g2 = heavy_tailed(rows * cols, 20 + static_cast<std::uint64_t>(t));
    auto const e1 = a.residual(), e2 = b.residual();
    std::vector<float> const q0(a.q().begin(), a.q().end());
    // Phase 1 and the all-reduce of P (sum, written back to both).
    auto pa = a.begin(std::span<float const>(g1), ctx);
    auto pb = b.begin(std::span<float const>(g2), ctx);
    std::vector<float> const q_start(a.q().begin(), a.q().end());
    REQUIRE(std::equal(q_start.begin(), q_start.end(), b.q().begin()));  // same Philox start
    if (t > 0) REQUIRE(q_start == q0);                                   // warm start
    for (std::size_t i = 0; i < pa.size(); ++i) pa[i] = pb[i] = pa[i] + pb[i];
    auto qa = a.after_p_reduced(ctx);
    auto qb = b.after_p_reduced(ctx);
    REQUIRE(std::equal(a.p().begin(), a.p().end(), b.p().begin()));
    for (std::size_t i = 0; i < qa.size(); ++i) qa[i] = qb[i] = qa[i] + qb[i];
    a.finish(0.5f, ctx);
    b.finish(0.5f, ctx);
    std::vector<float> ha(rows * cols), hb(rows * cols);
    a.reconstruct(std::span<float>(ha), ctx);
    b.reconstruct(std::span<float>(hb), ctx);
    REQUIRE(ha == hb);

    // Direct formula in double: M_w = g_w + e_w, P = orth((M1 + M2) Q0), Q = (M1 + M2)ᵀ P / 2,
    // M̂ = P Qᵀ, e_w = M_w - M̂.
    std::vector<double> m1(rows * cols), m2(rows * cols);
    for (std::size_t i = 0; i < m1.size(); ++i) {
      m1[i] = static_cast<double>(g1[i]) + e1[i];
      m2[i] = static_cast<double>(g2[i]) + e2[i];
    }
    std::vector<double> p(r * rows, 0.0), q(r * cols, 0.0);
    for (std::size_t c = 0; c < r; ++c) {
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j)
          p[c * rows + i] += (m1[i * cols + j] + m2[i * cols + j]) * q_start[c * cols + j];
      }
    }
    for (std::size_t c = 0; c < r; ++c) {
      double* v = p.data() + c * rows;
      for (std::size_t d = 0; d < c; ++d) {
        double h = 0.0;
        for (std::size_t i = 0; i < rows; ++i) h += v[i] * p[d * rows + i];
        for (std::size_t i = 0; i < rows; ++i) v[i] -= h * p[d * rows + i];
      }
      double n = 0.0;
      for (std::size_t i = 0; i < rows; ++i) n += v[i] * v[i];
      for (std::size_t i = 0; i < rows; ++i) v[i] /= std::sqrt(n);
    }
    for (std::size_t c = 0; c < r; ++c) {
      for (std::size_t j = 0; j < cols; ++j) {
        for (std::size_t i = 0; i < rows; ++i)
          q[c * cols + j] += 0.5 * (m1[i * cols + j] + m2[i * cols + j]) * p[c * rows + i];
      }
    }
    double worst = 0.0, mag = 0.0;
    std::vector<float> const ra = a.residual(), rb = b.residual();
    double worst_e = 0.0;
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < cols; ++j) {
        double h = 0.0;
        for (std::size_t c = 0; c < r; ++c) h += p[c * rows + i] * q[c * cols + j];
        worst = std::max(worst, std::fabs(h - ha[i * cols + j]));
        mag = std::max(mag, std::fabs(h));
        worst_e = std::max(worst_e, std::fabs(m1[i * cols + j] - h - ra[i * cols + j]));
        worst_e = std::max(worst_e, std::fabs(m2[i * cols + j] - h - rb[i * cols + j]));
      }
    }
    INFO("step " << t << ": max |M̂ - direct| = " << worst << ", max |M̂| = " << mag);
    CHECK(worst <= 1e-4 * mag);
    CHECK(worst_e <= 1e-4 * mag);
    std::vector<float> const q_now(a.q().begin(), a.q().end());
    REQUIRE(std::equal(q_now.begin(), q_now.end(), b.q().begin()));
  }
}

TEST_CASE("powersgd packets do not depend on thread count or ISA", "[codec][powersgd]") {
  std::size_t const rows = 70, cols = 1100;  // several row blocks and GEMM tasks
  auto const g1 = gaussian(rows * cols, 1), g2 = gaussian(rows * cols, 2);
  std::vector<std::vector<std::byte>> first;
  for (gc::cpu::isa level : isa_levels) {
    for (unsigned threads : {1u, 2u, 3u}) {
      gc::powersgd c(opts(4));
      std::vector<std::vector<std::byte>> packets;
      packets.push_back(compress(c, g1, rows, cols, parallel_ctx(threads, level, 9, 0)));
      packets.push_back(compress(c, g2, rows, cols, parallel_ctx(threads, level, 9, 1)));
      if (first.empty()) {
        first = packets;
      } else {
        INFO("isa " << gc::cpu::isa_name(level) << ", " << threads << " threads");
        REQUIRE(packets == first);
      }
    }
  }
}

TEST_CASE("powersgd packet layout and stateless decoding", "[codec][powersgd]") {
  std::size_t const rows = 20, cols = 12;
  gc::powersgd c(opts(3));
  auto const g = gaussian(rows * cols, 77);
  auto const packet = compress(c, g, rows, cols, serial_ctx(gc::cpu::isa::best, 1));
  std::span<std::byte const> const p(packet);
  CHECK(packet.size() == hdr + 4 * 3 * (rows + cols));
  CHECK(static_cast<unsigned>(p[field::codec]) == 14);
  CHECK(static_cast<unsigned>(p[field::variant]) == 0);
  CHECK(get_u64(p, field::count) == rows * cols);
  CHECK(get_u64(p, field::payload) == 4 * 3 * (rows + cols));
  CHECK(get_u32(p, field::param0) == cols);
  CHECK(get_u32(p, field::param1) == 3);
  // The payload is P then Q, column by column, exactly the state's factors.
  auto const* s = c.find(gc::tensor_id{0});
  for (std::size_t i = 0; i < s->p().size(); ++i) REQUIRE(get_f32(p, hdr + 4 * i) == s->p()[i]);
  for (std::size_t i = 0; i < s->q().size(); ++i) {
    REQUIRE(get_f32(p, hdr + 4 * (s->p().size() + i)) == s->q()[i]);
  }
  // Decoding = reconstruct; decompress_add and decompress_any agree; f16 output too.
  std::vector<float> want(rows * cols);
  s->reconstruct(std::span<float>(want));
  auto const got = decode(packet, rows * cols);
  CHECK(max_abs_diff(got, want) == 0.0);
  std::vector<float> any(rows * cols, 1.0f);
  gc::decompress_any<float>(p, any, 2.0f, true);
  for (std::size_t i = 0; i < any.size(); ++i)
    REQUIRE(std::fabs(any[i] - (1.0f + 2.0f * want[i])) <= 1e-5f * (1 + std::fabs(want[i])));
  std::vector<gc::half> h(rows * cols);
  gc::decompress_any<gc::half>(p, h);
  for (std::size_t i = 0; i < h.size(); ++i)
    REQUIRE(gc::to_float(h[i]) == gc::to_float(gc::from_float<gc::half>(want[i])));
  CHECK(gc::powersgd::inspect(p).param1 == 3);
  CHECK(std::string(gc::codec_name(gc::codec_id::powersgd)) == "powersgd");
  CHECK(gc::powersgd::aggregation == gc::aggregation_kind::low_rank);
}

TEST_CASE("powersgd sends small matrices dense", "[codec][powersgd]") {
  struct shape {
    std::size_t rows, cols;
    std::uint64_t min_elements;
  };
  // r (rows + cols) >= rows cols; a 1-D tensor; below min_elements.
  for (shape const sh : {shape{8, 8, 16}, shape{1, 1000, 16}, shape{1000, 1, 16},
                         shape{64, 64, 10000}, shape{3, 2, 0}}) {
    gc::powersgd_options o = opts(4);
    o.min_elements = sh.min_elements;
    gc::powersgd c(o);
    auto const g = gaussian(sh.rows * sh.cols, sh.rows + sh.cols);
    auto const packet = compress(c, g, sh.rows, sh.cols);
    INFO(sh.rows << " x " << sh.cols);
    CHECK(c.find(gc::tensor_id{0})->mode() == gc::powersgd_mode::dense);
    CHECK(packet.size() == hdr + 4 * g.size());
    CHECK(static_cast<unsigned>(packet[field::variant]) == 1);
    CHECK(decode(packet, g.size()) == g);  // lossless
    auto const e = c.find(gc::tensor_id{0})->residual();
    CHECK(std::all_of(e.begin(), e.end(), [](float v) { return v == 0.0f; }));
  }
  // The boundary: 9 x 9 at rank 4 gains (4 * 18 < 81).
  CHECK(gc::powersgd_mode_for(9, 9, 4, 0) == gc::powersgd_mode::low_rank);
  CHECK(gc::powersgd_mode_for(8, 8, 4, 0) == gc::powersgd_mode::dense);
  // Two dense "ranks": the protocol averages the matrices.
  gc::powersgd_state a(4, 4, opts(4)), b(4, 4, opts(4));
  std::vector<float> const ga(16, 1.0f), gb(16, 3.0f);
  auto da = a.begin(std::span<float const>(ga));
  auto db = b.begin(std::span<float const>(gb));
  for (std::size_t i = 0; i < 16; ++i) da[i] = db[i] = da[i] + db[i];
  CHECK(a.after_p_reduced().empty());
  a.finish(0.5f);
  std::vector<float> out(16);
  a.reconstruct(std::span<float>(out));
  CHECK(out == std::vector<float>(16, 2.0f));
}

TEST_CASE("powersgd handles rank-deficient P deterministically", "[codec][powersgd]") {
  std::size_t const rows = 32, cols = 24;
  for (int kind = 0; kind < 2; ++kind) {
    // kind 0: zero gradient (every column of P replaced); kind 1: rank 1 with r = 4.
    std::vector<float> const g =
        kind == 0 ? std::vector<float>(rows * cols, 0.0f) : with_spectrum(rows, cols, {2.0}, 5);
    std::vector<float> first_p;
    for (unsigned threads : {1u, 2u}) {
      gc::powersgd_state s(rows, cols, opts(4), gc::tensor_id{1});
      auto const mhat = step(s, g, parallel_ctx(threads, gc::cpu::isa::best, 8, 2));
      auto const p = s.p();
      for (std::size_t a = 0; a < 4; ++a) {
        for (std::size_t b = 0; b < 4; ++b) {
          double d = 0.0;
          for (std::size_t i = 0; i < rows; ++i)
            d += static_cast<double>(p[a * rows + i]) * p[b * rows + i];
          INFO("kind " << kind << " columns " << a << ", " << b);
          CHECK(std::fabs(d - (a == b ? 1.0 : 0.0)) < 1e-5);
        }
      }
      CHECK(frob_diff(mhat, g) <= 1e-5 * (1.0 + frob(g)));
      for (float v : p) REQUIRE(std::isfinite(v));
      if (first_p.empty()) {
        first_p.assign(p.begin(), p.end());
      } else {
        CHECK(std::equal(first_p.begin(), first_p.end(), p.begin()));
      }
    }
  }
}

TEST_CASE("powersgd rejects bad shapes, ranks, specs and phase misuse", "[codec][powersgd]") {
  gc::powersgd c(opts(2));
  std::vector<float> const g(60, 1.0f);
  std::vector<std::byte> out(4096);
  CHECK_THROWS_AS(c.compress(std::span<float const>(g), 7, 9, std::span<std::byte>(out)),
                  gc::config_error);
  CHECK_THROWS_AS(c.compress(std::span<float const>(g), 6, 10, std::span<std::byte>(out).first(40)),
                  gc::config_error);
  CHECK_NOTHROW(c.compress(std::span<float const>(g), 6, 10, std::span<std::byte>(out)));
  CHECK_THROWS_AS(c.compress(std::span<float const>(g), 10, 6, std::span<std::byte>(out)),
                  gc::config_error);  // same tensor id, another shape
  CHECK_THROWS_AS(gc::powersgd(opts(0)), gc::config_error);
  CHECK_THROWS_AS(gc::powersgd_state(4, 4, opts(0)), gc::config_error);
  if (!gc::cpu::gemm_has_blas) {
    gc::powersgd_options o = opts(2);
    o.backend = gc::cpu::gemm_backend::blas;
    CHECK_THROWS_AS(gc::powersgd(o), gc::config_error);
  }
  CHECK_THROWS_AS(gc::make_powersgd("powersgd:rank=0"), gc::config_error);
  CHECK_THROWS_AS(gc::make_powersgd("powersgd:rank=x"), gc::config_error);
  CHECK_THROWS_AS(gc::make_powersgd("powersgd:bogus=1"), gc::config_error);
  CHECK_THROWS_AS(gc::make_powersgd("powersgd:rank=2,rank=3"), gc::config_error);
  CHECK_THROWS_AS(gc::make_powersgd("powersgd:"), gc::config_error);
  CHECK_THROWS_AS(gc::make_powersgd("topk:rank=2"), gc::config_error);
  CHECK(gc::make_powersgd("powersgd").options().rank == 4);
  auto const made = gc::make_powersgd("powersgd:rank=8,min_elements=100,backend=builtin");
  CHECK(made.options().rank == 8);
  CHECK(made.options().min_elements == 100);
  CHECK(made.options().backend == gc::cpu::gemm_backend::builtin);
  std::string msg;
  try {
    (void)gc::make_codec("powersgd:rank=4");
  } catch (gc::config_error const& e) {
    msg = e.what();
  }
  CHECK(msg.find("make_powersgd") != std::string::npos);

  gc::powersgd_state s(6, 10, opts(2));
  std::vector<float> const wrong(59, 1.0f);
  CHECK_THROWS_AS(s.begin(std::span<float const>(wrong)), gc::config_error);
  CHECK_THROWS_AS(s.after_p_reduced(), gc::config_error);
  CHECK_THROWS_AS(s.finish(), gc::config_error);
  std::vector<float> res(60);
  CHECK_THROWS_AS(s.reconstruct(std::span<float>(res)), gc::config_error);
  s.begin(std::span<float const>(g));
  CHECK_THROWS_AS(s.begin(std::span<float const>(g)), gc::config_error);
  CHECK_THROWS_AS(s.finish(), gc::config_error);
  s.after_p_reduced();
  s.finish();
  std::vector<float> short_out(59);
  CHECK_THROWS_AS(s.reconstruct(std::span<float>(short_out)), gc::config_error);
}

TEST_CASE("powersgd rejects malformed packets with format_error", "[codec][powersgd]") {
  std::size_t const rows = 16, cols = 10;
  gc::powersgd c(opts(2));
  auto const good = compress(c, gaussian(rows * cols, 3), rows, cols);
  std::vector<float> out(rows * cols);
  auto rejects = [&](std::vector<std::byte> const& p) {
    return throws_gradcomp_error(
        [&] { gc::powersgd::decompress(std::span<std::byte const>(p), std::span<float>(out)); });
  };
  REQUIRE_FALSE(rejects(good));
  auto expect_format = [&](std::vector<std::byte> const& p, char const* what) {
    INFO(what);
    CHECK_THROWS_AS(gc::powersgd::decompress(std::span<std::byte const>(p), std::span<float>(out)),
                    gc::format_error);
  };
  {
    auto p = good;
    put_u8(p, field::codec, 10);
    expect_format(p, "codec id");
  }
  {
    auto p = good;
    put_u8(p, field::variant, 2);
    expect_format(p, "variant");
  }
  {
    auto p = good;
    put_u32(p, field::param0, 0);
    expect_format(p, "cols 0");
  }
  {
    auto p = good;
    put_u32(p, field::param0, 7);
    expect_format(p, "count not rows x cols");
  }
  {
    auto p = good;
    put_u32(p, field::param0, 5);
    expect_format(p, "cols changed: payload");
  }
  {
    auto p = good;
    put_u32(p, field::param1, 0);
    expect_format(p, "rank 0");
  }
  {
    // Regression (issue 15): a bare 32-byte low-rank header with 0 elements, 0 columns and rank
    // 3 divided by zero in inspect (rows = count / cols ran before the empty-matrix check).
    std::vector<std::byte> p(gc::header_bytes);
    gc::write_header(p, {gc::codec_id::powersgd, gc::dtype::f32, 0, 0, 0, 0, 3});
    expect_format(p, "empty low-rank header with 0 columns");
    std::vector<float> none;
    CHECK_THROWS_AS(gc::decompress_any(std::span<std::byte const>(p), std::span<float>(none)), gc::format_error);
  }
  {
    // Regression (issue 15, fuzz campaign): an empty dense-variant packet (0 elements, no
    // payload) passed a null pointer to memcpy in decode, undefined even for 0 bytes (UBSan's
    // nonnull-attribute check). It decodes to nothing, in both modes.
    std::vector<std::byte> p(gc::header_bytes);
    gc::write_header(p, {gc::codec_id::powersgd, gc::dtype::f32, 1, 0, 0, 0, 0});
    std::vector<float> none;
    CHECK_NOTHROW(gc::decompress_any(std::span<std::byte const>(p), std::span<float>(none)));
    CHECK_NOTHROW(gc::decompress_any(std::span<std::byte const>(p), std::span<float>(none), 0.5f,
                                     true));
  }
  {
    auto p = good;
    put_u32(p, field::param1, 3);
    expect_format(p, "rank vs payload");
  }
  {
    auto p = good;
    put_u32(p, field::param1, 0xffffffffu);
    expect_format(p, "rank overflow");
  }
  {
    auto p = good;
    p.pop_back();
    expect_format(p, "truncated");
  }
  {
    auto p = good;
    p.push_back(std::byte{0});
    expect_format(p, "trailing byte");
  }
  {
    auto p = good;
    put_f32(p, hdr + 8, std::numeric_limits<float>::quiet_NaN());
    expect_format(p, "NaN factor");
  }
  {
    auto p = good;
    put_f32(p, p.size() - 4, std::numeric_limits<float>::infinity());
    expect_format(p, "inf factor");
  }
  {
    auto p = good;
    put_u8(p, field::variant, 1);  // dense header with the low-rank payload size
    expect_format(p, "dense size");
  }
  {
    std::vector<std::byte> p(hdr + 4 * rows * cols);
    std::memcpy(p.data(), good.data(), hdr);
    put_u8(p, field::variant, 1);
    put_u64(p, field::payload, 4 * rows * cols);
    put_u32(p, field::param1, 2);
    expect_format(p, "dense with a rank");
    put_u32(p, field::param1, 0);
    CHECK_FALSE(rejects(p));  // a well-formed dense packet of zeros
  }
  std::vector<float> wrong(rows * cols + 1);
  CHECK_THROWS_AS(
      gc::powersgd::decompress(std::span<std::byte const>(good), std::span<float>(wrong)),
      gc::config_error);
}

TEST_CASE("powersgd rejects non-finite input and keeps its state", "[codec][powersgd]") {
  std::size_t const rows = 12, cols = 20;
  gc::powersgd c(opts(2));
  compress(c, gaussian(rows * cols, 1), rows, cols);
  compress(c, gaussian(rows * cols, 2), rows, cols);
  auto const* s = c.find(gc::tensor_id{0});
  auto const e_before = s->residual();
  std::vector<float> const q_before(s->q().begin(), s->q().end());
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto g = gaussian(rows * cols, 3);
    g[77] = bad;
    std::string msg;
    try {
      compress(c, g, rows, cols);
    } catch (gc::numeric_error const& err) {
      msg = err.what();
    }
    CHECK(msg.find("element 77") != std::string::npos);
    CHECK(s->phase() == gc::powersgd_phase::idle);
    CHECK(s->residual() == e_before);
    CHECK(std::equal(q_before.begin(), q_before.end(), s->q().begin()));
  }
  // The state still works, and bf16 input too.
  auto const g16 = convert_to<gc::bfloat16>(gaussian(rows * cols, 4));
  std::vector<std::byte> out(c.max_compressed_bytes(rows, cols));
  CHECK(c.compress(std::span<gc::bfloat16 const>(g16), rows, cols, std::span<std::byte>(out)) ==
        out.size());
  CHECK(static_cast<unsigned>(out[field::dtype]) == static_cast<unsigned>(gc::dtype::bf16));
}

TEST_CASE("powersgd without the input scan still rejects non-finite input", "[codec][powersgd]") {
  std::size_t const rows = 12, cols = 20;
  gc::powersgd_options o = opts(2);
  o.check_finite = false;
  // Two ranks; rank b's gradient holds a NaN. Both see a non-finite reduced P and abandon the
  // step: a keeps its gradient in the residual, b clears its poisoned residual; Q stays equal.
  gc::powersgd_state a(rows, cols, o), b(rows, cols, o);
  auto const ea = a.residual();  // zero: fresh states, the same Philox Q
  auto const ga = gaussian(rows * cols, 3);
  auto gb = gaussian(rows * cols, 4);
  gb[5] = std::numeric_limits<float>::quiet_NaN();
  auto pa = a.begin(std::span<float const>(ga));
  auto pb = b.begin(std::span<float const>(gb));
  for (std::size_t i = 0; i < pa.size(); ++i) pa[i] = pb[i] = pa[i] + pb[i];
  CHECK_THROWS_AS(a.after_p_reduced(), gc::numeric_error);
  CHECK_THROWS_AS(b.after_p_reduced(), gc::numeric_error);
  CHECK(a.phase() == gc::powersgd_phase::idle);
  CHECK(b.phase() == gc::powersgd_phase::idle);
  auto const ea2 = a.residual();
  for (std::size_t i = 0; i < ea2.size(); ++i)
    REQUIRE(std::fabs(ea2[i] - (ea[i] + ga[i])) <= 1e-5f * (1 + std::fabs(ea2[i])));
  auto const eb = b.residual();
  CHECK(std::all_of(eb.begin(), eb.end(), [](float v) { return v == 0.0f; }));
  CHECK(std::equal(a.q().begin(), a.q().end(), b.q().begin()));
  CHECK(std::isfinite(frob(step(b, gaussian(rows * cols, 5)))));
}

TEST_CASE("powersgd abort keeps the gradient in the residual and restores Q", "[codec][powersgd]") {
  std::size_t const rows = 12, cols = 20;
  gc::powersgd_state s(rows, cols, opts(2));
  step(s, gaussian(rows * cols, 1));
  auto const e0 = s.residual();
  std::vector<float> const q0(s.q().begin(), s.q().end());
  auto const g = gaussian(rows * cols, 2);
  s.begin(std::span<float const>(g));
  s.after_p_reduced();
  s.abort();
  CHECK(s.phase() == gc::powersgd_phase::idle);
  CHECK(std::equal(q0.begin(), q0.end(), s.q().begin()));
  auto const e1 = s.residual();
  for (std::size_t i = 0; i < e1.size(); ++i)
    REQUIRE(std::fabs(e1[i] - (e0[i] + g[i])) <= 1e-5f * (1 + std::fabs(e1[i])));
}

TEST_CASE("powersgd state saves and loads; the resumed run is identical", "[codec][powersgd]") {
  std::size_t const rows = 18, cols = 26;
  gc::powersgd a(opts(3));
  compress(a, gaussian(rows * cols, 1), rows, cols, {}, gc::tensor_id{4});
  compress(a, gaussian(rows * cols, 2), rows, cols, {}, gc::tensor_id{4});
  compress(a, gaussian(6, 3), 2, 3, {}, gc::tensor_id{9});  // a dense one
  gc::powersgd b(opts(3));
  b.load(a.save());
  REQUIRE(b.tensors() == 2);
  for (int t = 3; t < 6; ++t) {
    auto const g = gaussian(rows * cols, static_cast<std::uint64_t>(t));
    auto const pa = compress(a, g, rows, cols, {}, gc::tensor_id{4});
    auto const pb = compress(b, g, rows, cols, {}, gc::tensor_id{4});
    REQUIRE(max_abs_diff(decode(pa, g.size()), decode(pb, g.size())) <= 1e-5);
  }
  auto const saved = a.save();
  gc::powersgd other_rank(opts(4));
  CHECK_THROWS_AS(other_rank.load(saved), gc::format_error);
  auto bad = saved;
  bad[0] = std::byte{'X'};
  CHECK_THROWS_AS(b.load(bad), gc::format_error);
  auto truncated = saved;
  truncated.pop_back();
  CHECK_THROWS_AS(b.load(truncated), gc::format_error);
  auto trailing = saved;
  trailing.push_back(std::byte{0});
  CHECK_THROWS_AS(b.load(trailing), gc::format_error);
  CHECK(b.tensors() == 2);  // kept after the failures
}

TEST_CASE("powersgd state: every flipped byte is refused, the state unchanged; version 1 is refused",
          "[codec][powersgd][state]") {
  std::size_t const rows = 6, cols = 5;
  gc::powersgd a(opts(2));
  compress(a, gaussian(rows * cols, 1), rows, cols, {}, gc::tensor_id{4});
  compress(a, gaussian(rows * cols, 2), rows, cols, {}, gc::tensor_id{4});
  compress(a, gaussian(6, 3), 2, 3, {}, gc::tensor_id{9});  // a dense one
  auto const saved = a.save();
  REQUIRE(static_cast<unsigned>(saved[4]) == 2);
  CHECK(gc::detail::load_le<std::uint32_t>(saved.data() + saved.size() - 4) ==
        gc::detail::crc32c_table(std::span<std::byte const>(saved).first(saved.size() - 4)));
  gc::powersgd b(opts(2));
  compress(b, gaussian(rows * cols, 7), rows, cols, {}, gc::tensor_id{1});
  auto const before = b.save();
  for (std::size_t i = 0; i < saved.size(); ++i) {
    for (std::byte mask : {std::byte{0xff}, std::byte{0x01}}) {
      auto bad = saved;
      bad[i] ^= mask;
      INFO("byte " << i << " of " << saved.size());
      CHECK_THROWS_AS(b.load(bad), gc::format_error);
    }
  }
  CHECK(b.save() == before);
  // version 1: the same bytes without the checksum
  std::vector<std::byte> v1(saved.begin(), saved.end() - 4);
  v1[4] = std::byte{1};
  CHECK_THROWS_WITH(b.load(v1), Catch::Contains("carries no checksum"));
  CHECK(b.save() == before);
  b.load(saved);
  CHECK(b.save() == saved);
}

TEST_CASE("powersgd: the BLAS backend agrees with the built-in GEMM", "[codec][powersgd][blas]") {
  if (!gc::cpu::gemm_has_blas) {
    GRADCOMP_TEST_SKIP("built without GRADCOMP_USE_CBLAS; gradcomp_blas_tests runs this case");
  }
  std::size_t const rows = 50, cols = 70;
  gc::powersgd_options ob = opts(4);
  ob.backend = gc::cpu::gemm_backend::blas;
  gc::powersgd builtin(opts(4)), blas(ob);
  for (int t = 0; t < 4; ++t) {
    auto const g = gaussian(rows * cols, 60 + static_cast<std::uint64_t>(t));
    auto const x = decode(compress(builtin, g, rows, cols), g.size());
    auto const y = decode(compress(blas, g, rows, cols), g.size());
    INFO("step " << t);
    CHECK(frob_diff(x, y) <= 1e-4 * frob(x));
  }
}

TEST_CASE("the finiteness scan finds NaN and infinities at every position and ISA",
          "[codec][powersgd][cpu]") {
  std::vector<float> x = gaussian(203, 9);
  for (gc::cpu::isa const requested : isa_levels) {
    gc::cpu::isa const level = gc::cpu::effective_isa(requested);  // a kernel runs what it is given
    INFO("isa " << gc::cpu::isa_name(requested) << " (runs " << gc::cpu::isa_name(level) << ")");
    CHECK(gc::cpu::kernels::all_finite(x.data(), x.size(), level));
    CHECK(gc::cpu::kernels::all_finite(x.data(), 0, level));
    for (std::size_t at : {0u, 15u, 63u, 64u, 100u, 191u, 192u, 202u}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        std::vector<float> y = x;
        y[at] = bad;
        INFO("position " << at << " value " << bad);
        CHECK_FALSE(gc::cpu::kernels::all_finite(y.data(), y.size(), level));
      }
    }
    std::vector<float> big(70, std::numeric_limits<float>::max());
    CHECK(gc::cpu::kernels::all_finite(big.data(), big.size(), level));
  }
}
