// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// dct_sign codec (DeMo's transform): the basis is orthonormal and the forward transform agrees
// with a double-precision DCT-II; the kept coefficients are each chunk's top k, the scale their
// mean magnitude, the decode the inverse transform of the ±scale spectrum (checked against a
// double-precision DCT-III); a single basis function round-trips; Parseval's mass bound and the
// descent property hold; packets are identical for every thread count and ISA level; bad
// options and malformed payloads are rejected with the output untouched.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/cpu/kernels/dct.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

double phi(std::size_t C, std::size_t u, std::size_t i) {
  double const a = u == 0 ? std::sqrt(1.0 / C) : std::sqrt(2.0 / C);
  return a * std::cos(std::numbers::pi * double((2 * i + 1) * u) / (2.0 * C));
}

/// Reads `count` fields of `bits` bits, least significant bit first, from `p` at byte `off`.
std::vector<std::uint32_t> read_fields(std::vector<std::byte> const& p, std::size_t off,
                                       std::size_t count, unsigned bits) {
  std::vector<std::uint32_t> f(count, 0);
  for (std::size_t j = 0; j < count; ++j) {
    for (unsigned t = 0; t < bits; ++t) {
      std::size_t const bit = j * bits + t;
      f[j] |= ((static_cast<unsigned>(p[off + bit / 8]) >> (bit % 8)) & 1u) << t;
    }
  }
  return f;
}

}  // namespace

TEST_CASE("dct_sign basis is orthonormal and the forward transform is the DCT-II",
          "[codec][dct_sign]") {
  for (std::uint32_t C : {2u, 8u, 64u, 256u}) {
    auto const t = gc::dct_sign_codec::basis(C);
    for (std::size_t u = 0; u < C; ++u) {
      for (std::size_t v = 0; v < C; ++v) {
        double d = 0;
        for (std::size_t i = 0; i < C; ++i) d += double(t[u * C + i]) * t[v * C + i];
        REQUIRE(std::fabs(d - (u == v ? 1.0 : 0.0)) <= 1e-6);
      }
    }
    auto const x = gaussian(3 * C + C / 2, C);
    auto const coef = gc::dct_sign_codec::forward(x.data(), x.size(), C, t, serial_ctx());
    REQUIRE(coef.size() == 4 * C);
    for (std::size_t b = 0; b < 4 * C; b += C) {
      for (std::size_t u = 0; u < C; ++u) {
        double ref = 0, norm = 0;
        for (std::size_t i = 0; i < C && b + i < x.size(); ++i) {
          ref += phi(C, u, i) * x[b + i];
          norm += std::fabs(double(x[b + i]));
        }
        REQUIRE(std::fabs(coef[b + u] - ref) <= 1e-6 * norm + 1e-30);
      }
    }
  }
}

TEST_CASE("dct_sign keeps each chunk's top k coefficients and decodes their inverse transform",
          "[codec][dct_sign]") {
  for (auto [C, k, n] : {std::tuple{64u, 8u, std::size_t{64 * 20 + 30}}, std::tuple{8u, 1u, std::size_t{80}},
                         std::tuple{16u, 16u, std::size_t{50}}, std::tuple{1024u, 20u, std::size_t{3000}}}) {
    CAPTURE(C, k, n);
    auto const x = heavy_tailed(n, C + k);
    gc::dct_sign_codec const codec(C, k);
    auto const p = compress(codec, x);
    std::size_t const nc = (n + C - 1) / C, K = nc * k;
    unsigned const ib = static_cast<unsigned>(std::countr_zero(C));
    REQUIRE(p.size() == hdr + 4 + (K + 7) / 8 + (K * ib + 7) / 8);
    auto const coef = gc::dct_sign_codec::forward(x.data(), n, C, gc::dct_sign_codec::basis(C), serial_ctx());
    auto const sign = read_fields(p, hdr + 4, K, 1);
    auto const idx = read_fields(p, hdr + 4 + (K + 7) / 8, K, ib);
    double mass = 0;
    for (std::size_t c = 0; c < nc; ++c) {
      std::vector<std::size_t> order(C);
      std::iota(order.begin(), order.end(), 0);
      std::size_t const base = c * C;  // a lambda cannot name a structured binding in clang 14
      std::stable_sort(order.begin(), order.end(), [&coef, base](std::size_t a, std::size_t b) {
        return std::fabs(coef[base + a]) > std::fabs(coef[base + b]);
      });
      order.resize(k);
      std::sort(order.begin(), order.end());
      for (std::size_t j = 0; j < k; ++j) {
        REQUIRE(idx[c * k + j] == order[j]);
        REQUIRE(sign[c * k + j] == (std::signbit(coef[c * C + order[j]]) ? 1u : 0u));
        mass += std::fabs(double(coef[c * C + order[j]]));
      }
    }
    float const s = get_f32(p, hdr);
    REQUIRE(s == static_cast<float>(mass / double(K)));
    auto const y = decompress<float>(codec, p, n);
    double dot = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t const c = i / C;
      double ref = 0;
      for (std::size_t j = 0; j < k; ++j) ref += (sign[c * k + j] ? -1.0 : 1.0) * phi(C, idx[c * k + j], i % C);
      ref *= s;
      REQUIRE(std::fabs(y[i] - ref) <= 1e-6 * s * k + 1e-30);
      dot += double(y[i]) * x[i];
    }
    REQUIRE(dot >= 0);  // a descent direction: <x̂, x> = s Σ |c_kept| (up to the padding)
  }
}

TEST_CASE("dct_sign round-trips one basis function per chunk; kept mass >= k / C",
          "[codec][dct_sign]") {
  std::uint32_t const C = 64;
  std::vector<float> x(C * 3);
  double const a = 2.5;
  for (std::size_t c = 0; c < 3; ++c)
    for (std::size_t i = 0; i < C; ++i) x[c * C + i] = static_cast<float>((c == 1 ? -a : a) * phi(C, 5 + c, i));
  auto const y = decompress<float>(gc::dct_sign_codec(C, 1), compress(gc::dct_sign_codec(C, 1), x), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(std::fabs(y[i] - x[i]) <= 1e-5);

  auto const g = gaussian(C * 50, 9);
  for (std::uint32_t k : {1u, 4u, 16u}) {
    auto const coef = gc::dct_sign_codec::forward(g.data(), g.size(), C, gc::dct_sign_codec::basis(C), serial_ctx());
    for (std::size_t c = 0; c < 50; ++c) {
      std::vector<double> e(C);
      double all = 0;
      for (std::size_t u = 0; u < C; ++u) all += (e[u] = double(coef[c * C + u]) * coef[c * C + u]);
      std::sort(e.begin(), e.end(), std::greater<>());
      double const kept = std::accumulate(e.begin(), e.begin() + k, 0.0);
      double xx = 0;
      for (std::size_t i = 0; i < C; ++i) xx += double(g[c * C + i]) * g[c * C + i];
      REQUIRE(std::fabs(all - xx) <= 1e-5 * xx);  // Parseval
      REQUIRE(kept >= double(k) / C * all * (1 - 1e-9));
    }
  }
}

TEST_CASE("dct_sign packets are identical for every thread count and ISA level",
          "[codec][dct_sign][determinism]") {
  auto const x = heavy_tailed(200003, 4);
  gc::dct_sign_codec const codec(64, 8);
  auto const ref = compress(codec, x, serial_ctx(gc::cpu::isa::scalar));
  auto const ref_out = decompress<float>(codec, ref, x.size(), serial_ctx(gc::cpu::isa::scalar));
  for (auto level : isa_levels) {
    for (unsigned threads : {0u, 2u, 3u}) {
      auto const ctx = threads == 0 ? serial_ctx(level) : parallel_ctx(threads, level);
      CAPTURE(gc::cpu::isa_name(level), threads);
      REQUIRE(compress(codec, x, ctx) == ref);
      auto const out = decompress<float>(codec, ref, x.size(), ctx);
      REQUIRE(std::memcmp(out.data(), ref_out.data(), 4 * x.size()) == 0);
    }
  }
}

TEST_CASE("dct_sign rejects bad options, non-finite input and malformed payloads",
          "[codec][dct_sign][malformed]") {
  REQUIRE_THROWS_AS(gc::dct_sign_codec(48, 2), gc::config_error);
  REQUIRE_THROWS_AS(gc::dct_sign_codec(2048, 2), gc::config_error);
  REQUIRE_THROWS_AS(gc::dct_sign_codec(64, 0), gc::config_error);
  REQUIRE_THROWS_AS(gc::dct_sign_codec(64, 65), gc::config_error);
  REQUIRE_THROWS_WITH(gc::make_codec("dct_sign:chunk=100"), Catch::Contains("chunk"));
  REQUIRE(gc::make_codec("dct_sign").id() == gc::codec_id::dct_sign);
  REQUIRE(gc::dct_sign_codec(64, 8).bits_per_element() == 8.0 * 7 / 64);
  REQUIRE(std::string(gc::codec_name(gc::codec_id::dct_sign)) == "dct_sign");
  {
    auto x = gaussian(100, 1);
    x[77] = INFINITY;
    std::vector<std::byte> out(gc::dct_sign_codec().max_compressed_bytes(100));
    REQUIRE_THROWS_AS(gc::dct_sign_codec().compress(
                          gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{0}),
                          std::span<std::byte>(out)),
                      gc::numeric_error);
  }
  gc::dct_sign_codec const codec(16, 3);
  auto const good = compress(codec, gaussian(40, 2));  // 3 chunks, K = 9, 4-bit indices
  std::size_t const ioff = hdr + 4 + 2;
  auto rejects = [&](std::vector<std::byte> const& p) {
    std::vector<float> out(40, 5.0f);
    REQUIRE_THROWS_AS(codec.decompress(std::span<std::byte const>(p), std::span<float>(out)),
                      gc::format_error);
    REQUIRE_THROWS_AS(codec.decompress_add(std::span<std::byte const>(p), std::span<float>(out), 1.0f),
                      gc::format_error);
    REQUIRE(std::all_of(out.begin(), out.end(), [](float f) { return f == 5.0f; }));
  };
  for (float bad : {NAN, INFINITY, -1.0f}) {
    auto p = good;
    put_f32(p, hdr, bad);
    rejects(p);
  }
  auto const idx = read_fields(good, ioff, 9, 4);
  {  // chunk 1's first two indices swapped: not ascending
    auto p = good;
    auto set = [&](std::size_t j, unsigned v) {
      for (unsigned t = 0; t < 4; ++t) {
        std::size_t const bit = j * 4 + t;
        auto b = static_cast<unsigned>(p[ioff + bit / 8]);
        b = (b & ~(1u << (bit % 8))) | (((v >> t) & 1u) << (bit % 8));
        p[ioff + bit / 8] = std::byte(b);
      }
    };
    set(3, idx[4]);
    set(4, idx[3]);
    rejects(p);
  }
  for (unsigned variant : {1u, 255u}) {
    auto p = good;
    put_u8(p, field::variant, variant);
    rejects(p);
  }
  for (std::uint32_t chunk : {0u, 12u, 32u, 2048u}) {
    auto p = good;
    put_u32(p, field::param0, chunk);
    rejects(p);
  }
  for (std::uint32_t k : {0u, 2u, 17u}) {
    auto p = good;
    put_u32(p, field::param1, k);
    rejects(p);
  }
}

TEST_CASE("short-row selection and the signed row sum agree with plain references at every ISA level",
          "[codec][dct_sign][chunk_topk][isa]") {
  // kth_largest_key (chunk_topk's and dct_sign's rows of at most 256) against a sort, with
  // ties, zeros and the largest finite key; add_signed_row against the scalar double loop.
  std::mt19937 rng(5);
  for (std::size_t L : {std::size_t{1}, std::size_t{2}, std::size_t{15}, std::size_t{16},
                        std::size_t{17}, std::size_t{64}, std::size_t{100}, std::size_t{256}}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::uint32_t> keys(L);
      for (auto& k : keys) {
        switch (rng() % 4) {
          case 0: k = static_cast<std::uint32_t>(rng() % 4); break;  // many ties, zeros
          case 1: k = 0x7f7fffffu - static_cast<std::uint32_t>(rng() % 2); break;
          default: k = static_cast<std::uint32_t>(rng()) & 0x7f7fffffu;
        }
      }
      std::vector<std::uint32_t> sorted = keys;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      for (std::size_t kc = 1; kc <= L; kc += (L > 20 ? 7 : 1)) {
        std::size_t want_greater = 0;
        for (auto k : keys) want_greater += k > sorted[kc - 1] ? 1 : 0;
        for (auto const requested : isa_levels) {
          auto const level = gc::cpu::effective_isa(requested);  // a kernel runs what it is given
          CAPTURE(L, trial, kc, gc::cpu::isa_name(level));
          std::size_t greater = 99999;
          REQUIRE(gc::cpu::kernels::kth_largest_key(keys.data(), L, kc, greater, level) ==
                  sorted[kc - 1]);
          REQUIRE(greater == want_greater);
        }
      }
    }
  }
  for (std::size_t C : {std::size_t{2}, std::size_t{7}, std::size_t{64}, std::size_t{1024}}) {
    auto const row = gaussian(C, C);
    std::vector<double> start(C);
    for (std::size_t i = 0; i < C; ++i) start[i] = 1e-3 * static_cast<double>(i) - 0.1;
    for (bool neg : {false, true}) {
      std::vector<double> ref = start;
      for (std::size_t i = 0; i < C; ++i) {
        ref[i] = neg ? ref[i] - static_cast<double>(row[i]) : ref[i] + static_cast<double>(row[i]);
      }
      for (auto const requested : isa_levels) {
        auto const level = gc::cpu::effective_isa(requested);
        CAPTURE(C, neg, gc::cpu::isa_name(level));
        std::vector<double> acc = start;
        gc::cpu::kernels::add_signed_row(acc.data(), row.data(), C, neg, level);
        REQUIRE(std::memcmp(acc.data(), ref.data(), C * sizeof(double)) == 0);
      }
    }
  }
}
