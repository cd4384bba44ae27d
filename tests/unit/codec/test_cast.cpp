// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// identity, fp16 and bf16 codecs: bit-exact round trips where the codec is lossless, float to
// 16-bit rounding checked against an independent double-precision reference (all halfway cases
// and a sweep over the float bit patterns), exhaustive 16-bit widen/narrow checks at every ISA
// level, and the NaN/Inf policy (these three codecs carry non-finite values).

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

// ---------------------------------------------------------------------------------------------
// Independent references, computed in double arithmetic (exact here: a float divided by a power
// of two is exact in double, and nearbyint rounds half to even in the default rounding mode).
// ---------------------------------------------------------------------------------------------

/// Correctly rounded binary16 bits of `f`; NaN quieted keeping the top payload bits.
std::uint16_t ref_half_bits(float f) {
  std::uint32_t const b = bits_of(f);
  auto const sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u | ((b >> 13) & 0x3ffu));
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7c00u);
  double const a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);               // a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  int const exp = std::max(e - 1, -14);  // binade; subnormals share the quantum 2^-24
  double const q = std::ldexp(1.0, exp - 10);
  double const n = std::nearbyint(a / q);  // in [0, 2048]
  long const bits = (static_cast<long>(exp + 15) << 10) + static_cast<long>(n) - 1024;
  if (bits >= 0x7c00) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(bits));
}

/// Correctly rounded bfloat16 bits of `f`; NaN quieted keeping the top payload bits.
std::uint16_t ref_bf16_bits(float f) {
  std::uint32_t const b = bits_of(f);
  auto const sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7f80u);
  double const a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);
  int const exp = std::max(e - 1, -126);
  double const q = std::ldexp(1.0, exp - 7);
  double const n = std::nearbyint(a / q);  // in [0, 256]
  long const bits = (static_cast<long>(exp + 127) << 7) + static_cast<long>(n) - 128;
  if (bits >= 0x7f80) return static_cast<std::uint16_t>(sign | 0x7f80u);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(bits));
}

/// What the codecs send (core/quant/half.hpp): `ref_half_bits`, with a finite value that
/// rounds to an infinity saturated at ±65504.
std::uint16_t ref_half_sat(float f) {
  std::uint16_t const h = ref_half_bits(f);
  if (std::isfinite(f) && (h & 0x7fffu) == 0x7c00u)
    return static_cast<std::uint16_t>((h & 0x8000u) | 0x7bffu);
  return h;
}

/// `ref_bf16_bits`, with a finite value that rounds to an infinity saturated (0x7f7f).
std::uint16_t ref_bf16_sat(float f) {
  std::uint16_t const h = ref_bf16_bits(f);
  if (std::isfinite(f) && (h & 0x7fffu) == 0x7f80u)
    return static_cast<std::uint16_t>((h & 0x8000u) | 0x7f7fu);
  return h;
}

/// Exact value of binary16 bits (NaN for NaN patterns).
double ref_half_value(std::uint16_t h) {
  int const e = (h >> 10) & 31;
  int const m = h & 1023;
  double v;
  if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return (h & 0x8000u) ? -v : v;
}

/// Exact value of bfloat16 bits (NaN for NaN patterns).
double ref_bf16_value(std::uint16_t b) {
  int const e = (b >> 7) & 255;
  int const m = b & 127;
  double v;
  if (e == 255) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -133);
  } else {
    v = std::ldexp(static_cast<double>(128 + m), e - 134);
  }
  return (b & 0x8000u) ? -v : v;
}

bool same_value(float got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
}

/// Float bit patterns that exercise every special case of the conversions.
std::vector<float> special_floats() {
  std::vector<std::uint32_t> const bits = {
      0x00000000u, 0x80000000u,                            // +-0
      0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu,  // float subnormals
      0x00800000u, 0x80800000u,                            // FLT_MIN
      0x7f7fffffu, 0xff7fffffu,                            // FLT_MAX
      0x7f800000u, 0xff800000u,                            // infinities
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,  // quiet / signalling NaN
      0x7fbfffffu, 0x7fc02000u, 0x7f802000u, 0x7fffffffu,  // NaN payloads
      0x33000000u, 0x33000001u, 0xb3000000u,               // 2^-25 (halfway to 2^-24), just above
      0x33800000u, 0x33c00000u,                            // 2^-24, 1.5 * 2^-24 (tie -> 2^-23)
      0x38800000u, 0x387fc000u, 0x387fe000u, 0x387ff000u,  // 2^-14 and just below
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,  // 65504, below/at/above 65520
      0xc77ff000u, 0x47800000u,                            // -65520, 65536
      0x3f801000u, 0x3f803000u, 0x3f801001u, 0x3f800fffu,  // fp16 ties at 1 (to even / up)
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,  // bf16 ties at 1
      0x7f7f8000u, 0x7f7f7fffu, 0x7f7effffu, 0x7f7f0000u,  // bf16 overflow boundary
  };
  std::vector<float> out;
  for (std::uint32_t b : bits) out.push_back(float_of(b));
  // Fill up past two AVX-512 vectors so every SIMD path (and its scalar tail) sees specials.
  std::size_t const base = out.size();
  for (std::size_t i = 0; out.size() < 3 * base + 5; ++i) out.push_back(out[(i * 7) % base]);
  return out;
}

template <class T>
std::vector<T> all_16bit_patterns() {
  std::vector<T> v(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) v[i] = T::from_bits(static_cast<std::uint16_t>(i));
  return v;
}

std::uint16_t payload_u16(std::vector<std::byte> const& packet, std::size_t i) {
  return static_cast<std::uint16_t>(static_cast<unsigned>(packet[hdr + 2 * i]) |
                                    (static_cast<unsigned>(packet[hdr + 2 * i + 1]) << 8));
}

}  // namespace

TEST_CASE("identity codec round-trips float bit patterns exactly at every ISA and thread count",
          "[codec][identity]") {
  gc::identity_codec const c;
  std::vector<float> x = special_floats();
  std::vector<float> const g = gaussian(5000, 11);
  x.insert(x.end(), g.begin(), g.end());

  for (auto level : isa_levels) {
    for (unsigned threads : {1u, 3u}) {
      gc::codec_context const ctx = parallel_ctx(threads, level);
      auto const p = compress(c, x, ctx);
      REQUIRE(p.size() == hdr + 4 * x.size());
      REQUIRE(std::memcmp(p.data() + hdr, x.data(), 4 * x.size()) == 0);
      auto const y = decompress<float>(c, p, x.size(), ctx);
      CAPTURE(gc::cpu::isa_name(level), threads);
      REQUIRE(std::memcmp(y.data(), x.data(), 4 * x.size()) == 0);
    }
  }
}

TEST_CASE("identity codec round-trips every half and bfloat16 bit pattern exactly",
          "[codec][identity]") {
  gc::identity_codec const c;
  auto const h = all_16bit_patterns<gc::half>();
  auto const b = all_16bit_patterns<gc::bfloat16>();
  for (auto level : isa_levels) {
    gc::codec_context const ctx = serial_ctx(level);
    auto const ph = compress(c, h, ctx);
    REQUIRE(ph.size() == hdr + 2 * h.size());
    REQUIRE(gc::identity_codec::inspect(ph).type == gc::dtype::f16);
    auto const yh = decompress<gc::half>(c, ph, h.size(), ctx);
    REQUIRE(std::memcmp(yh.data(), h.data(), 2 * h.size()) == 0);

    auto const pb = compress(c, b, ctx);
    REQUIRE(gc::identity_codec::inspect(pb).type == gc::dtype::bf16);
    auto const yb = decompress<gc::bfloat16>(c, pb, b.size(), ctx);
    REQUIRE(std::memcmp(yb.data(), b.data(), 2 * b.size()) == 0);

    // Widened to float, every value is exact (NaN stays NaN).
    auto const fh = decompress<float>(c, ph, h.size(), ctx);
    auto const fb = decompress<float>(c, pb, b.size(), ctx);
    std::size_t bad_h = 0, bad_b = 0;
    for (std::size_t i = 0; i < 65536; ++i) {
      bad_h += !same_value(fh[i], ref_half_value(static_cast<std::uint16_t>(i)));
      bad_b += !same_value(fb[i], ref_bf16_value(static_cast<std::uint16_t>(i)));
    }
    CAPTURE(gc::cpu::isa_name(level));
    REQUIRE(bad_h == 0);
    REQUIRE(bad_b == 0);
  }
}

TEST_CASE("fp16 codec is lossless on half input and bf16 codec on bfloat16 input",
          "[codec][fp16][bf16]") {
  auto const h = all_16bit_patterns<gc::half>();
  auto const b = all_16bit_patterns<gc::bfloat16>();
  for (auto level : isa_levels) {
    gc::codec_context const ctx = parallel_ctx(2, level);
    gc::fp16_codec const f16;
    auto const ph = compress(f16, h, ctx);
    REQUIRE(ph.size() == hdr + 2 * h.size());
    // The payload is the input itself, NaN payloads and signalling NaNs included.
    REQUIRE(std::memcmp(ph.data() + hdr, h.data(), 2 * h.size()) == 0);
    auto const yh = decompress<gc::half>(f16, ph, h.size(), ctx);
    REQUIRE(std::memcmp(yh.data(), h.data(), 2 * h.size()) == 0);

    gc::bf16_codec const b16;
    auto const pb = compress(b16, b, ctx);
    REQUIRE(std::memcmp(pb.data() + hdr, b.data(), 2 * b.size()) == 0);
    auto const yb = decompress<gc::bfloat16>(b16, pb, b.size(), ctx);
    REQUIRE(std::memcmp(yb.data(), b.data(), 2 * b.size()) == 0);
  }
}

TEST_CASE("widening then narrowing every binary16 and bfloat16 pattern is the identity",
          "[codec][fp16][bf16][dtype]") {
  std::size_t bad_half = 0, bad_bf16 = 0;
  std::uint32_t first_bad_half = 0, first_bad_bf16 = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    auto const u = static_cast<std::uint16_t>(i);
    float const fh = gc::half_bits_to_float(u);
    float const fb = gc::bfloat16_bits_to_float(u);
    bool const ok_h = same_value(fh, ref_half_value(u)) &&
                      (std::isnan(fh) ? gc::float_to_half_bits(fh) == (u | 0x0200u)
                                      : gc::float_to_half_bits(fh) == u);
    bool const ok_b = same_value(fb, ref_bf16_value(u)) &&
                      (std::isnan(fb) ? gc::float_to_bfloat16_bits(fb) == (u | 0x0040u)
                                      : gc::float_to_bfloat16_bits(fb) == u);
    if (!ok_h && bad_half++ == 0) first_bad_half = i;
    if (!ok_b && bad_bf16++ == 0) first_bad_bf16 = i;
  }
  CAPTURE(first_bad_half, first_bad_bf16);
  REQUIRE(bad_half == 0);
  REQUIRE(bad_bf16 == 0);

  // The same through the codecs: 16-bit packet -> float at one ISA -> 16-bit packet at another.
  auto const h = all_16bit_patterns<gc::half>();
  auto const b = all_16bit_patterns<gc::bfloat16>();
  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  auto const ph = compress(f16, h);
  auto const pb = compress(b16, b);
  for (auto dec : isa_levels) {
    auto const wide_h = decompress<float>(f16, ph, 65536, serial_ctx(dec));
    auto const wide_b = decompress<float>(b16, pb, 65536, serial_ctx(dec));
    for (auto enc : isa_levels) {
      auto const back_h = compress(f16, wide_h, serial_ctx(enc));
      auto const back_b = compress(b16, wide_b, serial_ctx(enc));
      std::size_t bad = 0;
      for (std::uint32_t i = 0; i < 65536; ++i) {
        bool const nan_h = std::isnan(wide_h[i]);
        bool const nan_b = std::isnan(wide_b[i]);
        std::uint16_t const got_h = payload_u16(back_h, i);
        std::uint16_t const got_b = payload_u16(back_b, i);
        bad += nan_h ? got_h != (i | 0x0200u) : got_h != i;
        bad += nan_b ? got_b != (i | 0x0040u) : got_b != i;
      }
      CAPTURE(gc::cpu::isa_name(dec), gc::cpu::isa_name(enc));
      REQUIRE(bad == 0);
    }
  }
}

TEST_CASE("decoding a 16-bit packet to float gives the same bits at every ISA level",
          "[codec][fp16][bf16][isa]") {
  // convert.hpp: "All levels give bit-identical results". Covers every pattern, the signalling
  // NaNs included (binary16 0x7c01..0x7dff, bfloat16 0x7f81..0x7fbf).
  auto const h = all_16bit_patterns<gc::half>();
  auto const b = all_16bit_patterns<gc::bfloat16>();
  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  auto const ph = compress(f16, h);
  auto const pb = compress(b16, b);
  auto const ref_h = decompress<float>(f16, ph, 65536, serial_ctx(gc::cpu::isa::scalar));
  auto const ref_b = decompress<float>(b16, pb, 65536, serial_ctx(gc::cpu::isa::scalar));
  for (auto level : isa_levels) {
    auto const yh = decompress<float>(f16, ph, 65536, serial_ctx(level));
    auto const yb = decompress<float>(b16, pb, 65536, serial_ctx(level));
    std::size_t bad_h = 0, bad_b = 0;
    std::uint32_t first_h = 0, got_h = 0, want_h = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
      if (bits_of(yh[i]) != bits_of(ref_h[i]) && bad_h++ == 0) {
        first_h = i;
        got_h = bits_of(yh[i]);
        want_h = bits_of(ref_h[i]);
      }
      bad_b += bits_of(yb[i]) != bits_of(ref_b[i]);
    }
    INFO("isa " << gc::cpu::isa_name(level) << ": binary16 0x" << std::hex << first_h
                << " widens to 0x" << got_h << ", scalar gives 0x" << want_h << std::dec << " ("
                << bad_h << " patterns differ)");
    CHECK(bad_h == 0);
    CHECK(bad_b == 0);
  }
}

TEST_CASE("fp16 and bf16 codecs match the reference conversions for special values",
          "[codec][fp16][bf16]") {
  std::vector<float> const x = special_floats();
  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  for (auto level : isa_levels) {
    for (unsigned threads : {1u, 2u}) {
      gc::codec_context const ctx = parallel_ctx(threads, level);
      auto const ph = compress(f16, x, ctx);
      auto const pb = compress(b16, x, ctx);
      REQUIRE(ph.size() == hdr + 2 * x.size());
      REQUIRE(pb.size() == hdr + 2 * x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        CAPTURE(gc::cpu::isa_name(level), i, bits_of(x[i]));
        REQUIRE(payload_u16(ph, i) == gc::quant::half_bits_saturated(x[i]));
        REQUIRE(payload_u16(ph, i) == ref_half_sat(x[i]));
        REQUIRE(payload_u16(pb, i) == gc::quant::bfloat16_bits_saturated(x[i]));
        REQUIRE(payload_u16(pb, i) == ref_bf16_sat(x[i]));
      }
    }
  }
  // A few hand-checked values (documented behaviour, core/dtype.hpp).
  REQUIRE(gc::float_to_half_bits(65504.0f) == 0x7bffu);
  REQUIRE(gc::float_to_half_bits(65519.996f) == 0x7bffu);
  REQUIRE(gc::float_to_half_bits(65520.0f) == 0x7c00u);  // overflow to infinity
  REQUIRE(gc::float_to_half_bits(-1e6f) == 0xfc00u);
  REQUIRE(gc::float_to_half_bits(0x1p-25f) == 0x0000u);  // tie between 0 and 2^-24: even
  REQUIRE(gc::float_to_half_bits(0x1.000002p-25f) == 0x0001u);
  REQUIRE(gc::float_to_half_bits(0x1.8p-24f) == 0x0002u);  // tie between 1 and 2 units: even
  REQUIRE(gc::float_to_half_bits(1.0f + 0x1p-11f) == 0x3c00u);
  REQUIRE(gc::float_to_half_bits(1.0f + 0x3p-11f) == 0x3c02u);
  REQUIRE(gc::float_to_half_bits(-0.0f) == 0x8000u);
  REQUIRE(gc::float_to_bfloat16_bits(1.0f + 0x1p-8f) == 0x3f80u);
  REQUIRE(gc::float_to_bfloat16_bits(1.0f + 0x3p-8f) == 0x3f82u);
  REQUIRE(gc::float_to_bfloat16_bits(FLT_MAX) == 0x7f80u);
  REQUIRE(gc::float_to_bfloat16_bits(float_of(0x7f800001u)) == 0x7fc0u);  // sNaN quieted
}

TEST_CASE(
    "float to binary16 and bfloat16 rounding matches the reference on halfway cases and a "
    "sweep of float bit patterns",
    "[codec][fp16][bf16]") {
  std::vector<float> samples;
  auto add_around = [&](float m) {
    for (float v : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)}) {
      samples.push_back(v);
      samples.push_back(-v);
    }
  };
  // Every binary16 value and every midpoint between neighbours (ties), with one float ulp on
  // either side.
  for (std::uint32_t h = 0; h < 0x7c00u; ++h) {
    double const lo = ref_half_value(static_cast<std::uint16_t>(h));
    double const hi =
        h + 1 == 0x7c00u ? 65536.0 : ref_half_value(static_cast<std::uint16_t>(h + 1));
    samples.push_back(static_cast<float>(lo));
    add_around(static_cast<float>((lo + hi) / 2));  // 12 significant bits: exact in float
  }
  // Every bfloat16 midpoint (float bits b << 16 | 0x8000), with one ulp on either side.
  for (std::uint32_t b = 0; b < 0x7f80u; ++b) add_around(float_of((b << 16) | 0x8000u));
  // A sweep over all float bit patterns (NaNs and infinities included).
  std::uint32_t const stride = quick_mode() ? 65521u : 4093u;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += stride) {
    samples.push_back(float_of(static_cast<std::uint32_t>(u)));
  }

  std::size_t bad_h = 0, bad_b = 0;
  std::uint32_t first_h = 0, first_b = 0;
  for (float f : samples) {
    if (gc::float_to_half_bits(f) != ref_half_bits(f) && bad_h++ == 0) first_h = bits_of(f);
    if (gc::float_to_bfloat16_bits(f) != ref_bf16_bits(f) && bad_b++ == 0) first_b = bits_of(f);
    if (gc::quant::half_bits_saturated(f) != ref_half_sat(f) && bad_h++ == 0) first_h = bits_of(f);
    if (gc::quant::bfloat16_bits_saturated(f) != ref_bf16_sat(f) && bad_b++ == 0)
      first_b = bits_of(f);
  }
  CAPTURE(samples.size(), first_h, first_b);
  REQUIRE(bad_h == 0);
  REQUIRE(bad_b == 0);

  // The SIMD kernels give the same bits as the reference.
  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  for (auto level : isa_levels) {
    auto const ph = compress(f16, samples, parallel_ctx(2, level));
    auto const pb = compress(b16, samples, parallel_ctx(2, level));
    std::size_t bad = 0;
    std::uint32_t first = 0;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      bool const wrong = payload_u16(ph, i) != ref_half_sat(samples[i]) ||
                         payload_u16(pb, i) != ref_bf16_sat(samples[i]);
      if (wrong && bad++ == 0) first = bits_of(samples[i]);
    }
    CAPTURE(gc::cpu::isa_name(level), first);
    REQUIRE(bad == 0);
  }
}

TEST_CASE("identity, fp16 and bf16 carry NaN and infinities instead of rejecting them",
          "[codec][nonfinite]") {
  std::vector<float> x = gaussian(100, 5);
  x[3] = NAN;
  x[17] = INFINITY;
  x[18] = -INFINITY;
  x[64] = -NAN;
  std::vector<gc::any_codec> const codecs = {gc::identity_codec{}, gc::fp16_codec{},
                                             gc::bf16_codec{}};
  for (auto const& c : codecs) {
    for (auto level : isa_levels) {
      auto const p = compress(c, x, serial_ctx(level));
      auto const y = decompress<float>(c, p, x.size(), serial_ctx(level));
      CAPTURE(c.name(), gc::cpu::isa_name(level));
      REQUIRE(std::isnan(y[3]));
      REQUIRE(std::isnan(y[64]));
      REQUIRE(y[17] == INFINITY);
      REQUIRE(y[18] == -INFINITY);
      auto const yh = decompress<gc::half>(c, p, x.size(), serial_ctx(level));
      REQUIRE(std::isnan(gc::to_float(yh[3])));
      REQUIRE(gc::to_float(yh[17]) == INFINITY);
      REQUIRE(gc::to_float(yh[18]) == -INFINITY);
    }
  }
}

TEST_CASE(
    "16-bit codecs convert between mismatched input, wire and output types by rounding "
    "once through float",
    "[codec][fp16][bf16]") {
  std::vector<float> g = heavy_tailed(300, 21);
  g[0] = 70000.0f;  // beyond binary16 (the fp16 codec saturates it), inside bfloat16
  auto const hb = convert_to<gc::bfloat16>(g);
  auto const hh = convert_to<gc::half>(g);

  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  // bfloat16 input to the fp16 codec: each element rounds from its exact float value.
  auto const p1 = compress(f16, hb);
  REQUIRE(gc::fp16_codec::inspect(p1).type == gc::dtype::bf16);
  for (std::size_t i = 0; i < hb.size(); ++i) {
    REQUIRE(payload_u16(p1, i) == ref_half_sat(gc::to_float(hb[i])));
  }
  // Decoding it into bfloat16 rounds the binary16 value to bfloat16.
  auto const o1 = decompress<gc::bfloat16>(f16, p1, hb.size());
  for (std::size_t i = 0; i < hb.size(); ++i) {
    REQUIRE(o1[i].bits == ref_bf16_bits(gc::half_bits_to_float(payload_u16(p1, i))));
  }
  // half input to the bf16 codec, decoded into half.
  auto const p2 = compress(b16, hh);
  auto const o2 = decompress<gc::half>(b16, p2, hh.size());
  for (std::size_t i = 0; i < hh.size(); ++i) {
    std::uint16_t const wire = ref_bf16_bits(gc::to_float(hh[i]));
    REQUIRE(payload_u16(p2, i) == wire);
    REQUIRE(o2[i].bits == ref_half_bits(gc::bfloat16_bits_to_float(wire)));
  }
  // identity of bfloat16 decoded into half.
  gc::identity_codec const id;
  auto const o3 = decompress<gc::half>(id, compress(id, hb), hb.size());
  for (std::size_t i = 0; i < hb.size(); ++i) {
    REQUIRE(o3[i].bits == ref_half_bits(gc::to_float(hb[i])));
  }
  REQUIRE(o3[0].bits == 0x7c00u);  // 70000 (as bfloat16) overflows binary16
}

TEST_CASE("fp16 and bf16 round float input to nearest within half an ulp", "[codec][fp16][bf16]") {
  auto const x = gaussian(4099, 3, 10.0);
  gc::fp16_codec const f16;
  gc::bf16_codec const b16;
  auto const yh = decompress<float>(f16, compress(f16, x), x.size());
  auto const yb = decompress<float>(b16, compress(b16, x), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const a = std::fabs(static_cast<double>(x[i]));
    // Half-ulp bounds: binary16 has 11 significant bits (quantum >= 2^-24), bfloat16 8.
    double const ulp_h =
        std::ldexp(1.0, std::max(static_cast<int>(std::floor(std::log2(a))), -14) - 10);
    double const ulp_b = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 7);
    REQUIRE(std::fabs(yh[i] - static_cast<double>(x[i])) <= ulp_h / 2);
    REQUIRE(std::fabs(yb[i] - static_cast<double>(x[i])) <= ulp_b / 2);
  }
}
