// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// natural compression: the byte layout (bucket exponent, k | sign << 7), exact coding of
// powers of two, the exponent window below which elements round to 0 or 2^(lo-127), the
// 2^127 limit, and rejection of malformed payloads. Unbiasedness and the 1/8 relative variance
// bound: test_stochastic.cpp.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

unsigned biased_exponent(float f) { return (bits_of(f) >> 23) & 0xffu; }

}  // namespace

TEST_CASE("natural compression codes powers of two exactly, with the documented bytes",
          "[codec][natural]") {
  std::vector<float> x;
  for (int k : {-126, -100, -20, -1, 0, 1, 5, 20}) {
    x.push_back(std::ldexp(1.0f, k));
    x.push_back(-std::ldexp(1.0f, k));
  }
  x.push_back(0.0f);
  x.push_back(-0.0f);
  gc::natural_codec const c(0);
  unsigned emax = 0;
  for (float v : x) emax = std::max(emax, biased_exponent(v));
  REQUIRE(emax == 147);  // 2^20
  for (std::uint32_t step : {0u, 1u, 99u}) {
    for (auto level : isa_levels) {
      gc::codec_context const ctx = serial_ctx(level, 5, step);
      auto const p = compress(c, x, ctx);
      REQUIRE(p.size() == hdr + 1 + x.size());
      REQUIRE(static_cast<unsigned>(p[hdr]) == emax);
      unsigned const lo = emax > 126 ? emax - 125 : 1;  // 22: 2^-105 is the smallest power kept
      for (std::size_t i = 0; i < x.size(); ++i) {
        CAPTURE(step, gc::cpu::isa_name(level), i, x[i]);
        unsigned const code = static_cast<unsigned>(p[hdr + 1 + i]);
        if (x[i] == 0.0f) {
          REQUIRE(code == 0u);  // zero has no sign
          continue;
        }
        unsigned const e = biased_exponent(x[i]);
        if (e >= lo) {
          REQUIRE(code == ((emax + 2 - e) | (x[i] < 0 ? 0x80u : 0u)));
        } else {  // below the window: 0 or 2^(lo-127)
          REQUIRE((code == 0u || code == ((emax + 2 - lo) | (x[i] < 0 ? 0x80u : 0u))));
        }
      }
      auto const y = decompress<float>(c, p, x.size(), ctx);
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (biased_exponent(x[i]) >= lo || x[i] == 0.0f) {
          REQUIRE(bits_of(y[i]) == (x[i] == 0.0f ? 0u : bits_of(x[i])));
        } else {
          REQUIRE(
              (y[i] == 0.0f || std::fabs(y[i]) == std::ldexp(1.0f, static_cast<int>(lo) - 127)));
        }
      }
    }
  }
}

TEST_CASE("natural compression keeps one exponent byte per bucket", "[codec][natural]") {
  auto const x = heavy_tailed(1000, 12);
  for (std::uint32_t bucket : {0u, 1u, 16u, 33u, 512u}) {
    gc::natural_codec const c(bucket);
    auto const p = compress(c, x);
    std::size_t const blen = bucket == 0 ? x.size() : bucket;
    std::size_t const nb = (x.size() + blen - 1) / blen;
    REQUIRE(p.size() == hdr + nb + x.size());
    REQUIRE(gc::natural_codec::inspect(p).param0 == bucket);
    for (std::size_t k = 0; k < nb; ++k) {
      unsigned e = 0;
      for (std::size_t i = k * blen; i < std::min(x.size(), (k + 1) * blen); ++i) {
        e = std::max(e, biased_exponent(x[i]));
      }
      REQUIRE(static_cast<unsigned>(p[hdr + k]) == e);
    }
    // Each decoded magnitude is one of the two powers of two around |x| (or, below the
    // bucket's exponent window, 0 or the window's smallest power), with the sign of x.
    auto const y = decompress<float>(c, p, x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      unsigned const emax = static_cast<unsigned>(p[hdr + i / blen]);
      unsigned const lo = emax > 126 ? emax - 125 : 1;
      unsigned const e = biased_exponent(x[i]);
      double const r = std::fabs(static_cast<double>(y[i]));
      CAPTURE(bucket, i, x[i], y[i], emax);
      REQUIRE(std::signbit(y[i]) == (x[i] < 0 && y[i] != 0));
      if (x[i] == 0.0f) {
        REQUIRE(r == 0.0);
      } else if (e >= lo) {
        double const down = std::ldexp(1.0, static_cast<int>(e) - 127);
        REQUIRE((r == down || (r == 2 * down && std::fabs(static_cast<double>(x[i])) != down)));
      } else {
        REQUIRE((r == 0.0 || r == std::ldexp(1.0, static_cast<int>(lo) - 127)));
      }
    }
  }
}

TEST_CASE("natural compression of subnormal-only buckets rounds to 0 or 2^-126",
          "[codec][natural]") {
  std::vector<float> x = {1e-40f, -1e-39f, FLT_TRUE_MIN, -5e-39f, 0.0f, 1.1e-38f};
  gc::natural_codec const c(0);
  std::size_t ups = 0;
  for (std::uint32_t step = 0; step < 200; ++step) {
    auto const p = compress(c, x, gc::codec_context{.seed = 1, .step = step});
    REQUIRE(static_cast<unsigned>(p[hdr]) == 0u);  // every exponent field is 0
    auto const y = decompress<float>(c, p, x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      REQUIRE((y[i] == 0.0f || std::fabs(y[i]) == FLT_MIN));
      if (y[i] != 0.0f) {
        REQUIRE(std::signbit(y[i]) == std::signbit(x[i]));
        ++ups;
      }
    }
  }
  REQUIRE(ups > 0);  // 1.1e-38 rounds up with probability ~0.94
}

TEST_CASE("natural compression rejects |x| >= 2^127 and accepts everything below",
          "[codec][natural][nonfinite]") {
  gc::natural_codec const c(16);
  for (float big : {0x1p127f, -0x1p127f, FLT_MAX, -FLT_MAX, 0x1.000002p127f}) {
    auto x = gaussian(40, 3);
    x[21] = big;
    std::vector<std::byte> buf(c.max_compressed_bytes(x.size()));
    for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
      CAPTURE(big, gc::cpu::isa_name(level));
      REQUIRE_THROWS_AS(
          c.compress(std::span<float const>(x), std::span<std::byte>(buf), serial_ctx(level)),
          gc::numeric_error);
    }
  }
  auto x = gaussian(40, 3);
  x[21] = std::nextafter(0x1p127f, 0.0f);
  x[22] = -std::nextafter(0x1p127f, 0.0f);
  for (std::uint32_t step = 0; step < 50; ++step) {
    auto const y = decompress<float>(c, compress(c, x, gc::codec_context{.step = step}), x.size());
    REQUIRE((y[21] == 0x1p126f || y[21] == 0x1p127f));
    REQUIRE((y[22] == -0x1p126f || y[22] == -0x1p127f));
  }
}

TEST_CASE("natural compression rejects malformed payloads", "[codec][natural][malformed]") {
  gc::natural_codec const c(16);
  // Bucket 0: values around 2^-10 (exponent 117, so codes above k = 118 are impossible);
  // bucket 1: only zeros and subnormals (exponent 0: only k <= 1 is possible).
  std::vector<float> x(37, 0.0f);
  for (std::size_t i = 0; i < 16; ++i)
    x[i] = (i % 2 ? -1.0f : 1.0f) * 0x1.3p-10f / static_cast<float>(i + 1);
  x[17] = 1e-40f;
  for (std::size_t i = 32; i < 37; ++i) x[i] = static_cast<float>(i);
  auto const good = compress(c, x);
  REQUIRE(static_cast<unsigned>(good[hdr]) == 117u);
  REQUIRE(static_cast<unsigned>(good[hdr + 1]) == 0u);
  std::size_t const codes = hdr + 3;
  for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
    auto rejects = [&](std::vector<std::byte> const& p) {
      std::vector<float> out(37);
      REQUIRE_THROWS_AS(
          c.decompress(std::span<std::byte const>(p), std::span<float>(out), serial_ctx(level)),
          gc::format_error);
    };
    for (unsigned e : {254u, 255u}) {  // bucket exponent beyond the float range
      for (std::size_t k = 0; k < 3; ++k) {
        auto p = good;
        put_u8(p, hdr + k, e);
        rejects(p);
      }
    }
    for (unsigned code : {0x80u, 119u, 127u, 119u | 0x80u, 0xffu}) {  // -0, k > E + 1 = 118
      auto p = good;
      put_u8(p, codes + 3, code);
      CAPTURE(code);
      rejects(p);
    }
    for (unsigned code : {2u, 3u, 0x82u, 0x80u}) {  // bucket 1 has exponent 0: k <= 1
      auto p = good;
      put_u8(p, codes + 20, code);
      rejects(p);
    }
    auto p = good;
    put_u8(p, field::variant, 1);
    rejects(p);
    p = good;
    put_u32(p, field::param1, 16);
    rejects(p);
  }
  // The largest code of each bucket is accepted: k = E + 1 (bucket 0) and k = 1 (bucket 1).
  auto p = good;
  put_u8(p, codes + 3, 118u | 0x80u);
  put_u8(p, codes + 20, 1u);
  auto const y = decompress<float>(c, p, 37);
  REQUIRE(y[3] == -std::ldexp(1.0f, 117 + 2 - 118 - 127));
  REQUIRE(y[20] == std::ldexp(1.0f, 0 + 2 - 1 - 127));
  // With a bucket exponent of 253 the window is 127 codes wide; k = 127 is valid.
  std::vector<float> big(16, 1.0f);
  big[0] = 0x1.8p126f;
  auto pb = compress(c, big);
  REQUIRE(static_cast<unsigned>(pb[hdr]) == 253u);
  put_u8(pb, hdr + 1 + 5, 127u);
  auto const yb = decompress<float>(c, pb, 16);
  REQUIRE(yb[5] == std::ldexp(1.0f, 253 + 2 - 127 - 127));
}
