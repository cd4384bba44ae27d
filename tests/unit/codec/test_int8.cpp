// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// int8 codec: bucket ranges stored exactly, worst-case error of nearest rounding (half a step
// plus float slack derived below), round half to even, constant and extreme buckets, and
// rejection of malformed payloads. Unbiasedness of stochastic rounding: test_stochastic.cpp.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// Checks the ranges and the error bound of an int8 packet of `x` with bucket length `blen`.
///
/// Error bound, with S = (hi - lo) / 255 and M = max(|lo|, |hi|): the encoder computes
/// v = fma(x, f32(255/(hi-lo)), f32(-lo * inv)); the rounding of inv (relative 2^-24), of the
/// bias (2^-24 |lo| inv) and of the fma (2^-24 * 255) move v by at most 2^-24 (510 + |lo| inv)
/// level units; the decoder's f32 step and fma add 255 * 2^-24 S + ulp(M) / 2. So
/// |x - x̂| <= S/2 + 2^-24 (765 S + |lo|) + ulp(M) / 2 <= S/2 + 1e-4 S + 2 ulp(M).
void check_nearest(std::vector<float> const& x, std::uint32_t bucket,
                   gc::codec_context const& ctx) {
  gc::int8_codec const c(bucket, gc::int8_rounding::nearest);
  auto const p = compress(c, x, ctx);
  auto const y = decompress<float>(c, p, x.size(), ctx);
  std::size_t const n = x.size();
  std::size_t const blen = bucket == 0 ? n : bucket;
  std::size_t const nb = (n + blen - 1) / blen;
  REQUIRE(p.size() == hdr + 8 * nb + n);
  for (std::size_t k = 0; k < nb; ++k) {
    std::size_t const b = k * blen, e = std::min(n, b + blen);
    float const lo = get_f32(p, hdr + 8 * k), hi = get_f32(p, hdr + 8 * k + 4);
    REQUIRE(lo == *std::min_element(x.begin() + static_cast<std::ptrdiff_t>(b),
                                    x.begin() + static_cast<std::ptrdiff_t>(e)));
    REQUIRE(hi == *std::max_element(x.begin() + static_cast<std::ptrdiff_t>(b),
                                    x.begin() + static_cast<std::ptrdiff_t>(e)));
    double const S = (static_cast<double>(hi) - lo) / 255.0;
    double const bound = S / 2 + 1e-4 * S + 2 * ulp_of(std::max(std::fabs(lo), std::fabs(hi)));
    double worst = 0;
    std::size_t worst_i = b;
    for (std::size_t i = b; i < e; ++i) {
      REQUIRE(std::isfinite(y[i]));
      double const err = std::fabs(static_cast<double>(y[i]) - x[i]);
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
      // In a bucket around zero (|bias| <= 255 levels, so its rounding is far below a level)
      // the minimum has code 0 and decodes exactly.
      if (x[i] == lo && lo <= 0.0f && hi >= 0.0f) REQUIRE(y[i] == lo);
    }
    CAPTURE(k, lo, hi, S, worst, worst_i, x[worst_i], y[worst_i]);
    REQUIRE(worst <= bound);
  }
}

}  // namespace

TEST_CASE("int8 nearest rounding errs by at most half a step per bucket", "[codec][int8]") {
  std::vector<std::vector<float>> inputs = {gaussian(4099, 1), heavy_tailed(4099, 2)};
  auto offset = gaussian(1000, 3, 1e-3);
  for (auto& v : offset) v += 1000.0f;  // a narrow range far from zero
  inputs.push_back(offset);
  auto extreme = gaussian(300, 4);
  extreme[10] = FLT_MAX;
  extreme[20] = -FLT_MAX;
  extreme[200] = 3e38f;
  inputs.push_back(extreme);
  std::vector<float> constant(100, -2.75f);
  inputs.push_back(constant);
  for (auto const& x : inputs) {
    for (std::uint32_t bucket : {0u, 16u, 33u, 512u}) {
      for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
        CAPTURE(x.size(), bucket, gc::cpu::isa_name(level));
        check_nearest(x, bucket, serial_ctx(level));
      }
    }
  }
}

TEST_CASE("int8 nearest rounds ties to even and stores the documented codes", "[codec][int8]") {
  // With lo = 0 and hi = 255 the level of x is x itself (inv = 1, bias = 0), so ties are exact.
  std::vector<float> const x = {0.0f, 255.0f, 0.5f,   1.5f,   2.5f,
                                3.5f, 254.5f, 127.4f, 127.6f, 100.0f};
  std::vector<unsigned> const codes = {0, 255, 0, 2, 2, 4, 254, 127, 128, 100};
  gc::int8_codec const c(0);
  for (auto level : isa_levels) {
    auto const p = compress(c, x, serial_ctx(level));
    REQUIRE(get_f32(p, hdr) == 0.0f);
    REQUIRE(get_f32(p, hdr + 4) == 255.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      CAPTURE(gc::cpu::isa_name(level), i);
      REQUIRE(static_cast<unsigned>(p[hdr + 8 + i]) == codes[i]);
    }
    auto const y = decompress<float>(c, p, x.size());
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == static_cast<float>(codes[i]));
  }
}

TEST_CASE("int8 header records bucket and rounding", "[codec][int8]") {
  auto const x = gaussian(100, 9);
  auto const h1 =
      gc::int8_codec::inspect(compress(gc::int8_codec(33, gc::int8_rounding::stochastic), x));
  REQUIRE(h1.param0 == 33);
  REQUIRE(h1.variant == 1);
  REQUIRE(h1.param1 == 0);
  auto const h0 = gc::int8_codec::inspect(compress(gc::int8_codec(), x));
  REQUIRE(h0.param0 == 512);
  REQUIRE(h0.variant == 0);
  REQUIRE_THROWS_AS(gc::int8_codec(16, static_cast<gc::int8_rounding>(2)), gc::config_error);
}

TEST_CASE("int8 rejects malformed payloads", "[codec][int8][malformed]") {
  auto const x = formula_input(37);
  for (auto rounding : {gc::int8_rounding::nearest, gc::int8_rounding::stochastic}) {
    gc::int8_codec const c(16, rounding);
    auto const good = compress(c, x);
    for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
      auto rejects = [&](std::vector<std::byte> const& p) {
        std::vector<float> out(37);
        REQUIRE_THROWS_AS(
            c.decompress(std::span<std::byte const>(p), std::span<float>(out), serial_ctx(level)),
            gc::format_error);
      };
      for (std::size_t k = 0; k < 3; ++k) {  // every bucket's range
        CAPTURE(k);
        for (float bad : {NAN, INFINITY, -INFINITY}) {
          auto p = good;
          put_f32(p, hdr + 8 * k, bad);
          rejects(p);
          p = good;
          put_f32(p, hdr + 8 * k + 4, bad);
          rejects(p);
        }
        auto p = good;  // lo > hi
        put_f32(p, hdr + 8 * k, 1.0f);
        put_f32(p, hdr + 8 * k + 4, 0.5f);
        rejects(p);
      }
      for (unsigned variant : {2u, 255u}) {
        auto p = good;
        put_u8(p, field::variant, variant);
        rejects(p);
      }
      auto p = good;
      put_u32(p, field::param1, 1);
      rejects(p);
      for (std::uint32_t bucket : {0u, 1u, 12u, 36u, 0xffffffffu}) {  // bucket count != 3
        p = good;
        put_u32(p, field::param0, bucket);
        rejects(p);
      }
    }
  }
  // Every code byte value is valid, and lo == hi is a valid constant bucket.
  gc::int8_codec const c(16);
  auto p = compress(c, x);
  for (std::size_t i = hdr + 24; i < p.size(); ++i) p[i] = std::byte{0xff};
  put_f32(p, hdr, 3.0f);
  put_f32(p, hdr + 4, 3.0f);
  auto const y = decompress<float>(c, p, 37);
  for (std::size_t i = 0; i < 16; ++i) REQUIRE(y[i] == 3.0f);
}
