// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// QSGD, TernGrad and random dithering (one kernel): bucket norms summed in the canonical order
// (recomputed here), decoded values on the documented levels, scale invariance of tiny buckets,
// header fields, parameter limits, and rejection of malformed payloads (scales, codes above s,
// negative-zero codes, padding bits, bad parameters) by the scalar and SIMD decoders.
// Unbiasedness and variance bounds: test_stochastic.cpp.

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

/// Sum of squares of x[b, e) in the canonical order (dither.hpp): blocks of 4096 from the
/// bucket start; in a block 16 double lanes, lane l accumulating fma(v, v, lane) over elements
/// l, l + 16, ...; lanes added 0..15; blocks added in order.
double canonical_sumsq(std::vector<float> const& x, std::size_t b, std::size_t e) {
  double sum = 0.0;
  for (std::size_t s = b; s < e; s += 4096) {
    double lane[16] = {};
    for (std::size_t i = s; i < std::min(e, s + 4096); ++i) {
      double const v = x[i];
      lane[(i - s) % 16] = std::fma(v, v, lane[(i - s) % 16]);
    }
    double t = 0.0;
    for (double l : lane) t += l;
    sum += t;
  }
  return sum;
}

float expected_scale(std::vector<float> const& x, std::size_t b, std::size_t e, bool l2) {
  if (l2) return static_cast<float>(std::sqrt(canonical_sumsq(x, b, e)));
  float m = 0.0f;
  for (std::size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

struct dither_case {
  std::string name;
  gc::any_codec codec;
  std::uint32_t s;
  bool natural;
  bool l2;
};

std::vector<dither_case> dither_cases(std::uint32_t bucket) {
  using gc::dither_norm;
  using gc::dither_partition;
  std::vector<dither_case> v;
  for (std::uint32_t s : {1u, 2u, 7u, 127u, 128u, 255u, 256u, 32767u}) {
    v.push_back({"qsgd s=" + std::to_string(s), gc::qsgd_codec(s, bucket), s, false, true});
  }
  v.push_back({"terngrad", gc::terngrad_codec(bucket), 1, false, false});
  for (std::uint32_t s : {1u, 3u, 1000u}) {
    v.push_back({"linear max s=" + std::to_string(s),
                 gc::dithering_codec(s, dither_partition::linear, dither_norm::max, bucket), s,
                 false, false});
  }
  for (std::uint32_t s : {1u, 2u, 8u, 30u}) {
    v.push_back({"natural max s=" + std::to_string(s),
                 gc::dithering_codec(s, dither_partition::natural, dither_norm::max, bucket), s,
                 true, false});
    v.push_back({"natural l2 s=" + std::to_string(s),
                 gc::dithering_codec(s, dither_partition::natural, dither_norm::l2, bucket), s,
                 true, true});
  }
  return v;
}

/// Checks that every decoded element of packet `p` (of `x`) lies on one of the two levels
/// around it, with the sign of x; returns the number of violations.
std::size_t off_level(dither_case const& c, std::vector<float> const& x,
                      std::vector<std::byte> const& p, std::vector<float> const& y,
                      std::size_t blen) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    float const scale = get_f32(p, hdr + 4 * (i / blen));
    float const L =
        c.natural ? std::ldexp(1.0f, static_cast<int>(c.s) - 1) : static_cast<float>(c.s);
    float const step = scale / L;
    if (step == 0.0f) {
      bad += bits_of(y[i]) != 0u;
      continue;
    }
    double const u = std::fabs(static_cast<double>(x[i])) / step;
    float const mag = std::fabs(y[i]);
    bool ok = !(std::signbit(y[i]) && (mag == 0.0f || x[i] >= 0.0f));  // sign only when x < 0
    ok = ok && (y[i] == 0.0f || std::signbit(y[i]) == std::signbit(x[i]));
    if (!c.natural) {
      double const q = std::round(mag / static_cast<double>(step));
      ok = ok && q <= c.s && static_cast<float>(q) * step == mag && std::fabs(q - u) < 1.0 + 1e-3;
    } else {
      double level = mag / static_cast<double>(step);
      if (level != 0.0) {
        int e = 0;
        double const m = std::frexp(level, &e);
        double const p2 = std::ldexp(1.0, e - 1);  // the power of two at or below level
        level = m == 0.5 ? level : p2;
        ok = ok && e - 1 <= static_cast<int>(c.s) - 1 && static_cast<float>(level) * step == mag;
      }
      if (u < 1.0) {
        ok = ok && (level == 0.0 || level == 1.0);
      } else {
        ok = ok && level >= u / 2 * (1 - 1e-5) && level <= 2 * u * (1 + 1e-5);
      }
    }
    bad += !ok;
  }
  return bad;
}

/// Replaces element i's w-bit code in the stream starting at byte `codes`.
void put_code(std::vector<std::byte>& p, std::size_t codes, std::size_t i, unsigned w,
              std::uint32_t code) {
  for (unsigned k = 0; k < w; ++k) {
    std::size_t const bit = i * w + k;
    auto const mask = static_cast<std::byte>(1u << (bit % 8));
    std::byte& b = p.at(codes + bit / 8);
    b = ((code >> k) & 1u) ? (b | mask) : (b & ~mask);
  }
}

}  // namespace

TEST_CASE("dither bucket scales are the canonical L2 norms or the max |x|",
          "[codec][dithering][qsgd]") {
  for (std::size_t n : {37u, 10007u, 140001u}) {
    auto x = heavy_tailed(n, n + 1);
    for (std::size_t i = 0; i < n; i += 50) x[i] = 0.0f;
    for (std::uint32_t bucket : {0u, 16u, 33u, 5000u}) {
      if (quick_mode() && n == 140001 && bucket != 0) continue;
      std::size_t const blen = bucket == 0 ? n : bucket;
      std::size_t const nb = (n + blen - 1) / blen;
      std::vector<float> want_l2(nb), want_max(nb);
      for (std::size_t k = 0; k < nb; ++k) {
        want_l2[k] = expected_scale(x, k * blen, std::min(n, (k + 1) * blen), true);
        want_max[k] = expected_scale(x, k * blen, std::min(n, (k + 1) * blen), false);
      }
      for (auto const& c : dither_cases(bucket)) {
        if (c.s == 256 || c.s == 128 || c.s == 8 || c.s == 2) continue;  // nothing new for scales
        for (auto const& ctx :
             {serial_ctx(gc::cpu::isa::scalar), serial_ctx(gc::cpu::isa::best), parallel_ctx(3)}) {
          CAPTURE(n, bucket, c.name, gc::cpu::isa_name(ctx.isa));
          auto const p = compress(c.codec, x, ctx, gc::tensor_id{9});
          std::size_t bad = 0;
          for (std::size_t k = 0; k < nb; ++k) {
            bad += bits_of(get_f32(p, hdr + 4 * k)) != bits_of(c.l2 ? want_l2[k] : want_max[k]);
          }
          REQUIRE(bad == 0);
        }
      }
    }
  }
}

TEST_CASE("dither codecs decode every element to a level adjacent to it",
          "[codec][dithering][qsgd]") {
  auto x = heavy_tailed(3000, 6);
  for (std::size_t i = 0; i < x.size(); i += 37) x[i] = 0.0f;
  for (std::size_t i = 5; i < x.size(); i += 41) x[i] = -0.0f;
  for (std::uint32_t bucket : {0u, 100u}) {
    for (auto const& c : dither_cases(bucket)) {
      for (std::uint32_t step : {0u, 1u, 2u}) {
        for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
          gc::codec_context const ctx = serial_ctx(level, 11, step);
          auto const p = compress(c.codec, x, ctx);
          auto const y = decompress<float>(c.codec, p, x.size(), ctx);
          CAPTURE(c.name, bucket, step, gc::cpu::isa_name(level));
          REQUIRE(off_level(c, x, p, y, bucket == 0 ? x.size() : bucket) == 0);
        }
      }
    }
  }
}

TEST_CASE("terngrad decodes to minus m, zero or m with m the bucket's max |x|",
          "[codec][terngrad]") {
  auto const x = gaussian(1000, 14);
  gc::terngrad_codec const c(64);
  auto const p = compress(c, x, gc::codec_context{.seed = 1});
  auto const h = gc::terngrad_codec::inspect(p);
  REQUIRE(h.param0 == 1);
  REQUIRE(h.param1 == 64);
  REQUIRE(p.size() == hdr + 4 * 16 + (2 * 1000 + 7) / 8);
  auto const y = decompress<float>(c, p, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    float const m = get_f32(p, hdr + 4 * (i / 64));
    REQUIRE((y[i] == 0.0f || y[i] == (x[i] < 0 ? -m : m)));
    if (std::fabs(x[i]) == m) REQUIRE(y[i] == x[i]);  // the maximum is always kept
  }
}

TEST_CASE("tiny buckets are quantized exactly as the same bucket scaled by 2^64",
          "[codec][dithering][qsgd]") {
  // Buckets whose norm is below 2^-60 are pre-scaled by 2^64 (dither.hpp); the codes must then
  // equal those of the input multiplied by 2^64, and the stored scale differ by exactly 2^64.
  auto small = gaussian(200, 21, 1e-25);
  auto sub = gaussian(64, 22, 1e-41);  // subnormal floats (max norm only: exact scaling)
  std::vector<std::uint32_t> const bucket_list = {0u, 32u};
  for (std::uint32_t bucket : bucket_list) {
    for (auto const& c : dither_cases(bucket)) {
      for (auto const* in : {&small, &sub}) {
        if (in == &sub && c.l2) continue;  // a subnormal norm does not scale exactly
        std::vector<float> big(in->size());
        for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::ldexp((*in)[i], 64);
        gc::codec_context const ctx{.seed = 8, .step = 2};
        auto const pa = compress(c.codec, *in, ctx);
        auto const pb = compress(c.codec, big, ctx);
        std::size_t const nb =
            (in->size() + (bucket ? bucket : in->size()) - 1) / (bucket ? bucket : in->size());
        CAPTURE(c.name, bucket, in == &sub);
        for (std::size_t k = 0; k < nb; ++k) {
          float const sa = get_f32(pa, hdr + 4 * k);
          REQUIRE(sa < 0x1p-60f);
          REQUIRE(std::ldexp(sa, 64) == get_f32(pb, hdr + 4 * k));
        }
        REQUIRE(std::equal(pa.begin() + static_cast<std::ptrdiff_t>(hdr + 4 * nb), pa.end(),
                           pb.begin() + static_cast<std::ptrdiff_t>(hdr + 4 * nb), pb.end()));
        if (in == &small) {  // (subnormal steps are too coarse to locate the level exactly)
          auto const y = decompress<float>(c.codec, pa, in->size());
          REQUIRE(off_level(c, *in, pa, y, bucket ? bucket : in->size()) == 0);
        }
      }
    }
  }
}

TEST_CASE("dither codecs decode finite inputs to finite values, even at the float range limit",
          "[codec][dithering][qsgd]") {
  // A bucket whose max |x| is FLT_MAX stores scale FLT_MAX; the top level decodes to
  // s * (FLT_MAX / s) in float, which must not round up to infinity.
  std::size_t infinite = 0;
  std::string first;
  for (std::uint32_t s = 1; s <= 64; ++s) {
    std::vector<gc::any_codec> codecs = {
        gc::dithering_codec(s, gc::dither_partition::linear, gc::dither_norm::max, 0),
        gc::qsgd_codec(s, 0)};
    if (s <= 30) {
      codecs.push_back(
          gc::dithering_codec(s, gc::dither_partition::natural, gc::dither_norm::max, 0));
    }
    for (auto const& c : codecs) {
      std::vector<float> const x = {FLT_MAX,
                                    -FLT_MAX * (c.id() == gc::codec_id::qsgd ? 0.0f : 1.0f), 1.0f};
      auto const y = decompress<float>(c, compress(c, x), x.size());
      for (float v : y) {
        if (!std::isfinite(v) && infinite++ == 0) {
          first = std::string(c.name()) + " s=" + std::to_string(s) + " decodes FLT_MAX to " +
                  std::to_string(v);
        }
      }
    }
  }
  INFO(first << " (" << infinite << " infinite outputs)");
  CHECK(infinite == 0);
  // An L2 norm beyond the float range is a numeric_error, not an infinite scale.
  gc::qsgd_codec const q(4, 0);
  std::vector<float> const two = {FLT_MAX, FLT_MAX};
  std::vector<std::byte> buf(q.max_compressed_bytes(2));
  REQUIRE_THROWS_AS(q.compress(std::span<float const>(two), std::span<std::byte>(buf)),
                    gc::numeric_error);
}

TEST_CASE("dither codecs record their parameters in the header", "[codec][dithering][qsgd]") {
  auto const x = gaussian(50, 1);
  auto const hq = gc::qsgd_codec::inspect(compress(gc::qsgd_codec(15, 256), x));
  REQUIRE(hq.variant == 0);
  REQUIRE(hq.param0 == 15);
  REQUIRE(hq.param1 == 256);
  REQUIRE(gc::qsgd_codec().levels() == 7);
  REQUIRE(gc::qsgd_codec().bucket() == 512);
  using gc::dither_norm;
  using gc::dither_partition;
  for (auto part : {dither_partition::linear, dither_partition::natural}) {
    for (auto norm : {dither_norm::max, dither_norm::l2}) {
      auto const h =
          gc::dithering_codec::inspect(compress(gc::dithering_codec(3, part, norm, 10), x));
      REQUIRE(h.variant == (static_cast<unsigned>(part) | static_cast<unsigned>(norm) << 1));
      REQUIRE(h.param0 == 3);
      REQUIRE(h.param1 == 10);
    }
  }
}

TEST_CASE("dither codecs reject out-of-range levels at construction",
          "[codec][dithering][qsgd][config]") {
  using gc::dither_norm;
  using gc::dither_partition;
  REQUIRE_THROWS_AS(gc::qsgd_codec(0), gc::config_error);
  REQUIRE_THROWS_AS(gc::qsgd_codec(32768), gc::config_error);
  REQUIRE_THROWS_AS(gc::qsgd_codec(0xffffffffu), gc::config_error);
  REQUIRE_NOTHROW(gc::qsgd_codec(32767));
  REQUIRE_NOTHROW(gc::qsgd_codec(1, 0));
  REQUIRE_THROWS_AS(gc::dithering_codec(0), gc::config_error);
  REQUIRE_THROWS_AS(gc::dithering_codec(32768, dither_partition::linear), gc::config_error);
  REQUIRE_NOTHROW(gc::dithering_codec(32767, dither_partition::linear));
  REQUIRE_THROWS_AS(gc::dithering_codec(31, dither_partition::natural), gc::config_error);
  REQUIRE_THROWS_AS(gc::dithering_codec(31, dither_partition::natural, dither_norm::l2),
                    gc::config_error);
  REQUIRE_NOTHROW(gc::dithering_codec(30, dither_partition::natural));
}

TEST_CASE("dither codecs reject malformed payloads in every decoder",
          "[codec][dithering][qsgd][malformed]") {
  auto const x = formula_input(37);
  struct bad_code_case {
    std::string name;
    gc::any_codec codec;
    unsigned w;
    std::vector<std::uint32_t> bad_codes;  // codes above s, or the sign bit with level 0
  };
  using gc::dither_norm;
  using gc::dither_partition;
  std::vector<bad_code_case> const cases = {
      {"qsgd s=5", gc::qsgd_codec(5, 16), 4, {6, 7, 8, 14, 15}},
      {"terngrad", gc::terngrad_codec(16), 2, {2}},
      {"qsgd s=32767", gc::qsgd_codec(32767, 16), 16, {0x8000}},
      {"qsgd s=32766", gc::qsgd_codec(32766, 16), 16, {32767, 0xffff, 0x8000}},
      {"qsgd s=255", gc::qsgd_codec(255, 16), 9, {256}},
      {"natural s=30",
       gc::dithering_codec(30, dither_partition::natural, dither_norm::l2, 16),
       6,
       {31, 63, 32}},
      {"linear s=2",
       gc::dithering_codec(2, dither_partition::linear, dither_norm::max, 16),
       3,
       {3, 4, 7}},
  };
  for (auto const& c : cases) {
    auto const good = compress(c.codec, x);
    std::size_t const codes = hdr + 4 * 3;
    REQUIRE(good.size() == codes + (37 * c.w + 7) / 8);
    for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::avx2, gc::cpu::isa::best}) {
      CAPTURE(c.name, gc::cpu::isa_name(level));
      auto rejects = [&](std::vector<std::byte> const& p) {
        std::vector<float> out(37, 0.0f);
        REQUIRE_THROWS_AS(c.codec.decompress(std::span<std::byte const>(p), std::span<float>(out),
                                             serial_ctx(level)),
                          gc::format_error);
        REQUIRE_THROWS_AS(c.codec.decompress_add(std::span<std::byte const>(p),
                                                 std::span<float>(out), 1.0f, serial_ctx(level)),
                          gc::format_error);
      };
      // Codes: in a full SIMD window (elements 0, 15), the last partial one (36).
      for (std::size_t i : {std::size_t{0}, std::size_t{15}, std::size_t{36}}) {
        for (std::uint32_t code : c.bad_codes) {
          CAPTURE(i, code);
          auto p = good;
          put_code(p, codes, i, c.w, code);
          rejects(p);
        }
      }
      // Padding bits after the last code.
      if ((37 * c.w) % 8 != 0) {
        for (unsigned bit = (37 * c.w) % 8; bit < 8; ++bit) {
          auto p = good;
          p.back() |= static_cast<std::byte>(1u << bit);
          rejects(p);
        }
      }
      // Scales.
      for (std::size_t k = 0; k < 3; ++k) {
        for (float s : {NAN, INFINITY, -INFINITY, -1.0f, -FLT_MIN, -FLT_TRUE_MIN}) {
          auto p = good;
          put_f32(p, hdr + 4 * k, s);
          rejects(p);
        }
      }
      // Parameters.
      auto const h = gc::read_header(good);
      for (std::uint32_t s : {0u, 32768u, 65535u, 0xffffffffu}) {
        auto p = good;
        put_u32(p, field::param0, s);
        rejects(p);
      }
      if (h.codec == gc::codec_id::dithering && (h.variant & 1u)) {
        auto p = good;
        put_u32(p, field::param0, 31);  // natural levels above 30
        rejects(p);
      }
      for (unsigned v : {4u, 5u, 8u, 255u}) {
        auto p = good;
        put_u8(p, field::variant, v);
        rejects(p);
      }
      if (h.codec != gc::codec_id::dithering) {
        auto p = good;
        put_u8(p, field::variant, 1);
        rejects(p);
      }
      if (h.codec == gc::codec_id::terngrad) {
        auto p = good;
        put_u32(p, field::param0, 2);
        rejects(p);
      }
      for (std::uint32_t bucket : {0u, 1u, 12u, 36u}) {  // payload no longer matches
        auto p = good;
        put_u32(p, field::param1, bucket);
        rejects(p);
      }
    }
  }
  // The largest canonical codes are accepted: level s with and without sign.
  gc::qsgd_codec const q(5, 16);
  auto p = compress(q, x);
  put_code(p, hdr + 12, 0, 4, 5);
  put_code(p, hdr + 12, 1, 4, 5 | 8);
  auto const y = decompress<float>(q, p, 37);
  float const step = get_f32(p, hdr) / 5.0f;
  REQUIRE(y[0] == 5.0f * step);
  REQUIRE(y[1] == -5.0f * step);
}
