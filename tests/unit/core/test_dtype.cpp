// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// core/dtype.hpp: the 16-bit float conversions, checked exhaustively where the domain is small
// (every 16-bit pattern) and against an independent double-precision rounding model where it is
// not (millions of float inputs spread over every exponent).

#include <gradcomp/core/dtype.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string_view>

namespace gc = gradcomp;

namespace {

float bits_to_float(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint32_t float_to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Value of a binary16 pattern computed from the IEEE definition, in double (exact).
double half_value(std::uint16_t h) {
  int const s = (h >> 15) & 1;
  int const e = (h >> 10) & 0x1f;
  int const m = h & 0x3ff;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return s ? -v : v;
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Reference rounding of a finite float to a binary format with `p` fraction bits and exponent
// bias `bias` (binary16: 10, 15; bfloat16: 7, 127), round to nearest even, overflow to
// infinity. It works on the value in double precision (where every scaling below is exact)
// and rounds with nearbyint under the default round-to-nearest-even mode; it shares no code or
// bit tricks with the library.
std::uint16_t reference_round(float f, int p, int bias) {
  std::uint16_t const sign = std::signbit(f) ? static_cast<std::uint16_t>(0x8000) : 0;
  double const a = std::fabs(static_cast<double>(f));
  int const emax_field = 2 * bias + 1;  // all-ones exponent: inf / NaN
  std::uint16_t const inf = static_cast<std::uint16_t>(emax_field << p);
  if (a == 0.0) return sign;
  double const min_normal = std::ldexp(1.0, 1 - bias);
  if (a < min_normal) {
    // Subnormal grid: multiples of 2^(1 - bias - p). q may round up to 2^p, which is exactly
    // the bit pattern of the smallest normal.
    double const q = std::nearbyint(std::ldexp(a, bias - 1 + p));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));
  }
  int e = std::ilogb(a);                            // a = 1.f * 2^e
  double q = std::nearbyint(std::ldexp(a, p - e));  // in [2^p, 2^(p+1)]
  if (q == std::ldexp(1.0, p + 1)) {
    q = std::ldexp(1.0, p);
    ++e;
  }
  if (e + bias >= emax_field) return static_cast<std::uint16_t>(sign | inf);
  auto const frac = static_cast<std::uint32_t>(q) - (1u << p);
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(e + bias) << p) | frac);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Compile-time checks.
// ---------------------------------------------------------------------------------------------

static_assert(gc::float_to_half_bits(1.0f) == 0x3c00);
static_assert(gc::float_to_half_bits(-2.0f) == 0xc000);
static_assert(gc::float_to_half_bits(65504.0f) == 0x7bff);
static_assert(gc::float_to_half_bits(65520.0f) == 0x7c00);
static_assert(gc::float_to_half_bits(5.9604644775390625e-8f) == 0x0001);  // 2^-24
static_assert(gc::half_bits_to_float(0x3555) == 0.333251953125f);
static_assert(gc::half_bits_to_float(0x0001) == 5.9604644775390625e-8f);
static_assert(gc::float_to_bfloat16_bits(1.0f) == 0x3f80);
static_assert(gc::float_to_bfloat16_bits(3.14159265f) == 0x4049);
static_assert(gc::bfloat16_bits_to_float(0x4049) == 3.140625f);
static_assert(gc::half(0.5f).bits == 0x3800);
static_assert(static_cast<float>(gc::half::from_bits(0xbc00)) == -1.0f);
static_assert(gc::bfloat16(-0.5f) == gc::bfloat16::from_bits(0xbf00));
static_assert(gc::to_float(gc::bfloat16::from_bits(0x4000)) == 2.0f);
static_assert(gc::from_float<gc::half>(3.0f).bits == 0x4200);
static_assert(gc::from_float<float>(3.0f) == 3.0f);

static_assert(gc::element<float>);
static_assert(gc::element<gc::half>);
static_assert(gc::element<gc::bfloat16>);
static_assert(!gc::element<double>);
static_assert(!gc::element<std::uint16_t>);
static_assert(!gc::element<int>);
static_assert(!gc::element<float const>);
static_assert(!gc::element<float&>);

static_assert(gc::dtype_of<float> == gc::dtype::f32);
static_assert(gc::dtype_of<gc::half> == gc::dtype::f16);
static_assert(gc::dtype_of<gc::bfloat16> == gc::dtype::bf16);
static_assert(static_cast<int>(gc::dtype::f32) == 1 && static_cast<int>(gc::dtype::f16) == 2 &&
              static_cast<int>(gc::dtype::bf16) == 3);
static_assert(gc::dtype_size(gc::dtype::f32) == 4);
static_assert(gc::dtype_size(gc::dtype::f16) == 2);
static_assert(gc::dtype_size(gc::dtype::bf16) == 2);
static_assert(gc::dtype_size(static_cast<gc::dtype>(0)) == 0);
static_assert(gc::dtype_size(static_cast<gc::dtype>(4)) == 0);
static_assert(sizeof(gc::half) == 2 && sizeof(gc::bfloat16) == 2);

TEST_CASE("dtype: names and sizes", "[core][dtype]") {
  CHECK(gc::dtype_name(gc::dtype::f32) == std::string_view("f32"));
  CHECK(gc::dtype_name(gc::dtype::f16) == std::string_view("f16"));
  CHECK(gc::dtype_name(gc::dtype::bf16) == std::string_view("bf16"));
  CHECK(gc::dtype_name(static_cast<gc::dtype>(0)) == std::string_view("invalid"));
  CHECK(gc::dtype_name(static_cast<gc::dtype>(200)) == std::string_view("invalid"));
  CHECK(gc::dtype_size(static_cast<gc::dtype>(255)) == 0);
}

// ---------------------------------------------------------------------------------------------
// binary16
// ---------------------------------------------------------------------------------------------

TEST_CASE("half: every bit pattern widens exactly and narrows back", "[core][dtype][half]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  int mismatched_value = 0, bad_roundtrip = 0, bad_nan = 0;
  for (std::uint32_t i = 0; i < 0x10000u; ++i) {
    auto const h = static_cast<std::uint16_t>(i);
    float const f = gc::half_bits_to_float(h);
    std::uint16_t const back = gc::float_to_half_bits(f);
    if (half_is_nan(h)) {
      // NaN stays NaN, with its sign and payload, and the quiet bit set.
      if (!std::isnan(f) || std::signbit(f) != static_cast<bool>(h & 0x8000) ||
          back != (h | 0x0200)) {
        ++bad_nan;
      }
      continue;
    }
    double const expect = half_value(h);
    if (static_cast<double>(f) != expect || std::signbit(f) != static_cast<bool>(h & 0x8000)) {
      ++mismatched_value;
    }
    if (back != h) ++bad_roundtrip;
    // The struct wraps the same conversions.
    if (static_cast<float>(gc::half::from_bits(h)) != f || gc::half(f).bits != h)
      ++mismatched_value;
  }
  CHECK(mismatched_value == 0);
  CHECK(bad_roundtrip == 0);
  CHECK(bad_nan == 0);
}

TEST_CASE("half: ties round to even", "[core][dtype][half]") {
  long checked = 0, wrong = 0;
  std::uint32_t first_wrong = 0;
  auto expect = [&](float f, std::uint32_t want) {
    ++checked;
    if (gc::float_to_half_bits(f) != want && wrong++ == 0) first_wrong = float_to_bits(f);
  };
  // Normal halves: the float halfway between h and h + 1 is float(h) plus half a binary16 unit,
  // which in float bits is + 2^12 (float has 13 more fraction bits). The pattern h + 1 of the
  // largest finite half is +Inf, which is also where its halfway point (65520) must go.
  for (std::uint32_t h = 0x0400; h < 0x7c00; ++h) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      std::uint32_t const hs = h | sign;
      std::uint32_t const fb =
          float_to_bits(gc::half_bits_to_float(static_cast<std::uint16_t>(hs)));
      expect(bits_to_float(fb + 0x1000), (h & 1u) ? hs + 1 : hs);  // the tie
      expect(bits_to_float(fb + 0x0fff), hs);                      // just below
      expect(bits_to_float(fb + 0x1001), hs + 1);                  // just above
    }
  }
  // Subnormal halves: m * 2^-24; the midpoint (m + 1/2) * 2^-24 is exact in float.
  for (std::uint32_t m = 0; m < 0x400; ++m) {
    float const mid = static_cast<float>(std::ldexp(m + 0.5, -24));
    std::uint32_t const even = (m & 1u) ? m + 1 : m;
    expect(mid, even);
    expect(-mid, even | 0x8000u);
    expect(std::nextafter(mid, 0.0f), m);
    expect(std::nextafter(mid, 1.0f), m + 1);
  }
  INFO("first wrong rounding for float bits 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
  CHECK(checked == 6 * (0x7c00 - 0x0400) + 4 * 0x400);
  // Hand-picked ties.
  CHECK(gc::float_to_half_bits(1.0f + 0x1p-11f) == 0x3c00);      // 1 + half ulp -> 1
  CHECK(gc::float_to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);  // 1 + 1.5 ulp -> 1 + 2 ulp
  CHECK(gc::float_to_half_bits(2049.0f) == 0x6800);              // -> 2048
  CHECK(gc::float_to_half_bits(2051.0f) == 0x6802);              // -> 2052
}

TEST_CASE("half: range limits, zeros, subnormals and infinities", "[core][dtype][half]") {
  CHECK(gc::float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(gc::half_bits_to_float(0x7bff) == 65504.0f);
  CHECK(gc::float_to_half_bits(-65504.0f) == 0xfbff);
  // Everything below 65520 rounds to 65504; 65520 (the tie, 0x7bff odd) and above overflow.
  CHECK(gc::float_to_half_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(gc::float_to_half_bits(65519.0f) == 0x7bff);
  CHECK(gc::float_to_half_bits(65520.0f) == 0x7c00);
  CHECK(gc::float_to_half_bits(-65520.0f) == 0xfc00);
  CHECK(gc::float_to_half_bits(65536.0f) == 0x7c00);
  CHECK(gc::float_to_half_bits(1e10f) == 0x7c00);
  CHECK(gc::float_to_half_bits(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(gc::float_to_half_bits(-std::numeric_limits<float>::max()) == 0xfc00);
  CHECK(gc::float_to_half_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(gc::float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(std::isinf(gc::half_bits_to_float(0x7c00)));
  CHECK(gc::half_bits_to_float(0xfc00) == -std::numeric_limits<float>::infinity());

  // Zeros keep their sign.
  CHECK(gc::float_to_half_bits(0.0f) == 0x0000);
  CHECK(gc::float_to_half_bits(-0.0f) == 0x8000);
  float const nz = gc::half_bits_to_float(0x8000);
  CHECK(nz == 0.0f);
  CHECK(std::signbit(nz));
  CHECK(!std::signbit(gc::half_bits_to_float(0x0000)));

  // Subnormals: 2^-24 is the smallest, 2^-14 the smallest normal, 2^-25 a tie to zero.
  CHECK(gc::float_to_half_bits(0x1p-24f) == 0x0001);
  CHECK(gc::float_to_half_bits(0x1p-14f) == 0x0400);
  CHECK(gc::float_to_half_bits(0x1p-15f) == 0x0200);
  CHECK(gc::float_to_half_bits(0x3ffp-24f) == 0x03ff);
  CHECK(gc::float_to_half_bits(0x1p-25f) == 0x0000);
  CHECK(gc::float_to_half_bits(-0x1p-25f) == 0x8000);
  CHECK(gc::float_to_half_bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(gc::float_to_half_bits(0x1p-30f) == 0x0000);
  CHECK(gc::float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(gc::float_to_half_bits(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(gc::half_bits_to_float(0x0001) == 0x1p-24f);
  CHECK(gc::half_bits_to_float(0x83ff) == -0x3ffp-24f);
  // Rounding a subnormal up across into the normal range.
  CHECK(gc::float_to_half_bits(std::nextafter(0x1p-14f, 0.0f)) == 0x0400);
}

TEST_CASE("half and bfloat16: NaN payload rule", "[core][dtype][nan]") {
  // dtype.hpp: NaNs stay NaN, quieted, with as much of the payload as fits: binary16 keeps the
  // top 10 fraction bits of the float (bit 9, the quiet bit, forced on) and the sign; bfloat16
  // keeps the top 7 (bit 6 forced on) and the sign.
  std::uint32_t const patterns[] = {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fbfffffu,
                                    0x7fffffffu, 0x7f802000u, 0x7fc12345u, 0x7f800100u,
                                    0xffc00000u, 0xff800001u, 0xffabcdefu, 0x7f8fe000u};
  for (std::uint32_t p : patterns) {
    INFO("float bits 0x" << std::hex << p);
    float const f = bits_to_float(p);
    REQUIRE(std::isnan(f));
    std::uint16_t const h = gc::float_to_half_bits(f);
    std::uint16_t const expect_h =
        static_cast<std::uint16_t>(((p >> 16) & 0x8000u) | 0x7e00u | ((p >> 13) & 0x3ffu));
    CHECK(h == expect_h);
    CHECK(half_is_nan(h));
    CHECK(std::isnan(gc::half_bits_to_float(h)));
    std::uint16_t const b = gc::float_to_bfloat16_bits(f);
    CHECK(b == static_cast<std::uint16_t>((p >> 16) | 0x40u));
    CHECK(bf16_is_nan(b));
    CHECK(std::isnan(gc::bfloat16_bits_to_float(b)));
  }
  // A signalling float NaN whose payload lives only in the low bits: truncation would leave an
  // infinity, the quiet bit keeps it a NaN.
  CHECK(gc::float_to_half_bits(bits_to_float(0x7f800001u)) == 0x7e00);
  CHECK(gc::float_to_bfloat16_bits(bits_to_float(0x7f800001u)) == 0x7fc0);
  CHECK(gc::float_to_bfloat16_bits(bits_to_float(0xff800001u)) == 0xffc0);
}

TEST_CASE("half: float to half matches an independent rounding model",
          "[core][dtype][half][reference]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::mt19937_64 rng(20260101);
  long mismatches = 0;
  long tested = 0;
  std::uint32_t first_bad = 0;
  auto check = [&](std::uint32_t bits) {
    float const f = bits_to_float(bits);
    if (std::isnan(f)) return;
    ++tested;
    if (gc::float_to_half_bits(f) != reference_round(f, 10, 15)) {
      if (mismatches++ == 0) first_bad = bits;
    }
  };
  // 3M uniformly random patterns: every float exponent equally often.
  for (int i = 0; i < 3'000'000; ++i) check(static_cast<std::uint32_t>(rng()));
  // 3M more with exponents 100..145 (the binary16 subnormal, normal and overflow ranges) and a
  // bias towards fraction bits near a tie (low 13 bits of 0x1000 +- a few).
  for (int i = 0; i < 3'000'000; ++i) {
    std::uint64_t const r = rng();
    std::uint32_t const exp = 100u + static_cast<std::uint32_t>(r % 46);
    std::uint32_t frac = static_cast<std::uint32_t>(r >> 8) & 0x7fffffu;
    if ((r >> 40) & 1u) frac = (frac & ~0x1fffu) | ((0x1000u + ((r >> 41) & 7u) - 3u) & 0x1fffu);
    std::uint32_t const sign = static_cast<std::uint32_t>((r >> 63) << 31);
    check(sign | (exp << 23) | frac);
  }
  // Every float from 65000 to 66000 and every float in [2^-26, 2^-23].
  for (std::uint32_t b = float_to_bits(65000.0f); b <= float_to_bits(66000.0f); ++b) check(b);
  for (std::uint32_t b = float_to_bits(0x1p-26f); b <= float_to_bits(0x1p-23f); ++b) check(b);
  INFO("first mismatch at float bits 0x" << std::hex << first_bad);
  CHECK(mismatches == 0);
  CHECK(tested > 6'000'000);
}

// ---------------------------------------------------------------------------------------------
// bfloat16
// ---------------------------------------------------------------------------------------------

TEST_CASE("bfloat16: every bit pattern widens exactly and narrows back", "[core][dtype][bf16]") {
  int bad = 0, bad_nan = 0;
  for (std::uint32_t i = 0; i < 0x10000u; ++i) {
    auto const b = static_cast<std::uint16_t>(i);
    float const f = gc::bfloat16_bits_to_float(b);
    // Widening is exactly the upper half of the float.
    if (float_to_bits(f) != (i << 16)) ++bad;
    std::uint16_t const back = gc::float_to_bfloat16_bits(f);
    if (bf16_is_nan(b)) {
      if (!std::isnan(f) || back != (b | 0x40)) ++bad_nan;
    } else if (back != b) {
      ++bad;
    }
    if (gc::bfloat16::from_bits(b).bits != b) ++bad;
  }
  CHECK(bad == 0);
  CHECK(bad_nan == 0);
}

TEST_CASE("bfloat16: ties to even, overflow, zeros, subnormals", "[core][dtype][bf16]") {
  // The halfway point between bfloat16 b and b + 1 is float bits (b << 16) + 0x8000.
  long wrong = 0;
  std::uint32_t first_wrong = 0;
  auto expect = [&](std::uint32_t fbits, std::uint32_t want) {
    if (gc::float_to_bfloat16_bits(bits_to_float(fbits)) != want && wrong++ == 0)
      first_wrong = fbits;
  };
  for (std::uint32_t b = 0; b < 0x7f80u; ++b) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      std::uint32_t const bs = b | sign;
      expect((bs << 16) + 0x8000u, (b & 1u) ? bs + 1 : bs);
      expect((bs << 16) + 0x7fffu, bs);
      expect((bs << 16) + 0x8001u, bs + 1);
    }
  }
  INFO("first wrong rounding for float bits 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
  // The largest float rounds to infinity (its bfloat16 neighbours are 0x7f7f and +Inf).
  CHECK(gc::float_to_bfloat16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(gc::float_to_bfloat16_bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(gc::float_to_bfloat16_bits(bits_to_float(0x7f7f7fffu)) == 0x7f7f);
  CHECK(gc::float_to_bfloat16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(gc::float_to_bfloat16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(gc::float_to_bfloat16_bits(-0.0f) == 0x8000);
  CHECK(std::signbit(gc::bfloat16_bits_to_float(0x8000)));
  CHECK(gc::float_to_bfloat16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(gc::float_to_bfloat16_bits(bits_to_float(0x00018000u)) == 0x0002);  // tie, odd -> up
  CHECK(gc::float_to_bfloat16_bits(bits_to_float(0x00008000u)) == 0x0000);  // tie, even -> 0
  CHECK(gc::bfloat16_bits_to_float(0x0001) == bits_to_float(0x00010000u));
}

TEST_CASE("bfloat16: float to bfloat16 matches an independent rounding model",
          "[core][dtype][bf16][reference]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::mt19937_64 rng(77);
  long mismatches = 0;
  std::uint32_t first_bad = 0;
  for (int i = 0; i < 3'000'000; ++i) {
    std::uint64_t const r = rng();
    std::uint32_t bits = static_cast<std::uint32_t>(r);
    if ((r >> 40) & 1u) bits = (bits & ~0xffffu) | ((0x8000u + ((r >> 41) & 3u) - 1u) & 0xffffu);
    float const f = bits_to_float(bits);
    if (std::isnan(f)) continue;
    if (gc::float_to_bfloat16_bits(f) != reference_round(f, 7, 127)) {
      if (mismatches++ == 0) first_bad = bits;
    }
  }
  INFO("first mismatch at float bits 0x" << std::hex << first_bad);
  CHECK(mismatches == 0);
}

TEST_CASE("dtype: element conversions through to_float and from_float", "[core][dtype]") {
  CHECK(gc::to_float(1.5f) == 1.5f);
  CHECK(gc::to_float(gc::half(1.5f)) == 1.5f);
  CHECK(gc::to_float(gc::bfloat16(1.5f)) == 1.5f);
  CHECK(gc::from_float<gc::half>(0.1f).bits == gc::float_to_half_bits(0.1f));
  CHECK(gc::from_float<gc::bfloat16>(0.1f).bits == gc::float_to_bfloat16_bits(0.1f));
  CHECK(gc::half() == gc::half::from_bits(0));
  CHECK(gc::bfloat16() == gc::bfloat16::from_bits(0));
  CHECK_FALSE(gc::half(1.0f) == gc::half(-1.0f));
  // Equality is bitwise: +0 and -0 differ, a NaN equals itself.
  CHECK_FALSE(gc::half(0.0f) == gc::half(-0.0f));
  CHECK(gc::half::from_bits(0x7e00) == gc::half::from_bits(0x7e00));
}
