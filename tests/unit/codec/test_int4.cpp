// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// int4 codec: bucket scales stored as documented, worst-case error of nearest rounding (half a
// step plus float slack derived below), round half to even and the nibble layout, the padding
// nibble of an odd count, constant, zero and extreme buckets, byte-identical packets and decodes
// at every ISA level for every tail length, and rejection of malformed payloads.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// Checks the scales and the error bound of an int4 packet of `x` with bucket parameter
/// `bucket`.
///
/// Error bound, with m = max |x| over the bucket, s = f32(m / 7) and inv = f32(7 / m): the
/// encoder rounds v = f32(x * inv), which differs from 7x/m by at most 2^-24 * 7 (inv) + 2^-24
/// * 7 (the product) level units, so the chosen level q is within 1/2 + 2^-20 of 7x/m; the
/// decoder's f32(q * s) adds |q| * |s - m/7| <= 7 * (2^-24 s + 2^-150) (s may be subnormal)
/// and ulp(m) / 2. So |x - x̂| <= s/2 + 2^-20 s + 7 * 2^-24 s + 7 * 2^-150 + ulp(m) / 2
/// <= s/2 + 1e-6 * m + 4 FLT_TRUE_MIN + ulp(m). This needs inv finite, i.e. m >= 7 / FLT_MAX;
/// below that (m < 2^-125) the error is at most m.
void check_nearest(std::vector<float> const& x, std::uint32_t bucket,
                   gc::codec_context const& ctx) {
  gc::int4_codec const c(bucket);
  auto const p = compress(c, x, ctx);
  auto const y = decompress<float>(c, p, x.size(), ctx);
  std::size_t const n = x.size();
  std::size_t const blen = bucket == 0 ? n : bucket;
  std::size_t const nb = (n + blen - 1) / blen;
  REQUIRE(p.size() == hdr + 4 * nb + (n + 1) / 2);
  for (std::size_t k = 0; k < nb; ++k) {
    std::size_t const b = k * blen, e = std::min(n, b + blen);
    float m = 0.0f;
    for (std::size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
    float const s = get_f32(p, hdr + 4 * k);
    REQUIRE(s == static_cast<float>(static_cast<double>(m) / 7.0));
    double const bound = m >= 7.0 / FLT_MAX
                             ? s / 2.0 + 1e-6 * m + 4 * FLT_TRUE_MIN + ulp_of(m)
                             : static_cast<double>(m);
    double worst = 0;
    std::size_t worst_i = b;
    for (std::size_t i = b; i < e; ++i) {
      REQUIRE(std::isfinite(y[i]));
      double const err = std::fabs(static_cast<double>(y[i]) - x[i]);
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
      if (x[i] == 0.0f) REQUIRE(y[i] == 0.0f);  // zero is a level
    }
    CAPTURE(k, m, s, worst, bound, worst_i, x[worst_i], y[worst_i]);
    REQUIRE(worst <= bound);
  }
}

/// The nibble of element i of a packet whose codes start at payload offset `codes`.
unsigned nibble(std::vector<std::byte> const& p, std::size_t codes, std::size_t i) {
  return (static_cast<unsigned>(p[hdr + codes + i / 2]) >> (4 * (i & 1))) & 0xfu;
}

}  // namespace

TEST_CASE("int4 nearest rounding errs by at most half a step per bucket", "[codec][int4]") {
  std::vector<std::vector<float>> inputs = {gaussian(4099, 1), heavy_tailed(4099, 2)};
  auto offset = gaussian(1000, 3, 1e-3);
  for (auto& v : offset) v += 1000.0f;  // a narrow range far from zero
  inputs.push_back(offset);
  auto extreme = gaussian(300, 4);
  extreme[10] = FLT_MAX;
  extreme[20] = -FLT_MAX;
  extreme[200] = 3e38f;
  extreme[250] = -3e38f;
  inputs.push_back(extreme);
  auto tiny = gaussian(300, 5, 1e-39);  // subnormal buckets, some with m < 2^-125
  tiny[3] = 0.0f;
  inputs.push_back(tiny);
  auto small = gaussian(300, 6, 1e-36);  // normal buckets with a subnormal scale
  inputs.push_back(small);
  inputs.push_back(std::vector<float>(100, -2.75f));
  inputs.push_back(std::vector<float>(77, 0.0f));
  for (auto const& x : inputs) {
    for (std::uint32_t bucket : {0u, 1u, 16u, 33u, 64u}) {
      for (auto level : isa_levels) {
        CAPTURE(x.size(), bucket, gc::cpu::isa_name(level));
        check_nearest(x, bucket, serial_ctx(level));
      }
    }
  }
}

TEST_CASE("int4 rounds ties to even and stores the documented nibbles", "[codec][int4]") {
  // With max |x| = 7 the multiplier and the scale are 1, so x * inv = x and ties are exact.
  std::vector<float> const x = {7.0f, -7.0f, 0.0f, 0.5f, 1.5f, 2.5f, -2.5f, 3.4f, -0.5f, -6.6f, 4.5f};
  std::vector<int> const levels = {7, -7, 0, 0, 2, 2, -2, 3, 0, -7, 4};
  gc::int4_codec const c(0);
  for (auto level : isa_levels) {
    CAPTURE(gc::cpu::isa_name(level));
    auto const p = compress(c, x, serial_ctx(level));
    REQUIRE(p.size() == hdr + 4 + 6);
    REQUIRE(get_f32(p, hdr) == 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      CAPTURE(i);
      REQUIRE(static_cast<int>(nibble(p, 4, i)) == levels[i] + 8);
    }
    REQUIRE(nibble(p, 4, 11) == 0u);  // the padding nibble of an odd count
    auto const y = decompress<float>(c, p, x.size(), serial_ctx(level));
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == static_cast<float>(levels[i]));
  }
}

TEST_CASE("int4 packets and decodes agree at every ISA level for every tail", "[codec][int4][isa]") {
  for (std::size_t n = 0; n <= 70; ++n) {
    auto const x = heavy_tailed(n, 100 + n);
    for (std::uint32_t bucket : {0u, 1u, 3u, 7u, 16u, 17u, 64u}) {
      gc::int4_codec const c(bucket);
      CAPTURE(n, bucket);
      auto const ref = compress(c, x, serial_ctx(gc::cpu::isa::scalar));
      auto const ref_out = decompress<float>(c, ref, n, serial_ctx(gc::cpu::isa::scalar));
      std::vector<float> ref_add(n, 0.25f);
      c.decompress_add(std::span<std::byte const>(ref), std::span<float>(ref_add), -0.75f,
                       serial_ctx(gc::cpu::isa::scalar));
      for (auto level : isa_levels) {
        CAPTURE(gc::cpu::isa_name(level));
        REQUIRE(compress(c, x, serial_ctx(level)) == ref);
        auto const out = decompress<float>(c, ref, n, serial_ctx(level));
        REQUIRE((n == 0 || std::memcmp(out.data(), ref_out.data(), 4 * n) == 0));  // memcmp takes no null
        std::vector<float> add(n, 0.25f);
        c.decompress_add(std::span<std::byte const>(ref), std::span<float>(add), -0.75f,
                         serial_ctx(level));
        REQUIRE((n == 0 || std::memcmp(add.data(), ref_add.data(), 4 * n) == 0));
      }
    }
  }
}

TEST_CASE("int4 header records the bucket; sizes follow the format", "[codec][int4]") {
  auto const x = gaussian(101, 9);
  auto const h = gc::int4_codec::inspect(compress(gc::int4_codec(33), x));
  REQUIRE(h.codec == gc::codec_id::int4);
  REQUIRE(h.param0 == 33);
  REQUIRE(h.variant == 0);
  REQUIRE(h.param1 == 0);
  REQUIRE(h.payload_bytes == 4 * 4 + 51);
  REQUIRE(gc::int4_codec::inspect(compress(gc::int4_codec(), x)).param0 == 64);
  REQUIRE(gc::int4_codec(64).bits_per_element() == 4.5);
  REQUIRE(gc::int4_codec(0).bits_per_element() == 4.0);
  REQUIRE(gc::int4_codec(64).max_compressed_bytes(128) == hdr + 8 + 64);
  REQUIRE(std::string(gc::codec_name(gc::codec_id::int4)) == "int4");
}

TEST_CASE("int4 refuses non-finite input", "[codec][int4]") {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    auto x = gaussian(100, 11);
    x[70] = bad;
    for (auto level : isa_levels) {
      std::vector<std::byte> out(gc::int4_codec(16).max_compressed_bytes(100));
      REQUIRE_THROWS_AS(gc::int4_codec(16).compress(
                            gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{0}),
                            std::span<std::byte>(out), serial_ctx(level)),
                        gc::numeric_error);
    }
  }
}

TEST_CASE("int4 rejects malformed payloads", "[codec][int4][malformed]") {
  auto const x = formula_input(37);
  gc::int4_codec const c(16);
  auto const good = compress(c, x);
  for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
    auto rejects = [&](std::vector<std::byte> const& p) {
      std::vector<float> out(37);
      REQUIRE_THROWS_AS(
          c.decompress(std::span<std::byte const>(p), std::span<float>(out), serial_ctx(level)),
          gc::format_error);
    };
    for (std::size_t k = 0; k < 3; ++k) {  // every bucket's scale
      CAPTURE(k);
      for (float bad : {NAN, INFINITY, -INFINITY, -1.0f, -FLT_TRUE_MIN, FLT_MAX,
                        std::nextafter(gc::int4_format::max_scale(), INFINITY)}) {
        auto p = good;
        put_f32(p, hdr + 4 * k, bad);
        rejects(p);
      }
    }
    for (unsigned variant : {1u, 2u, 255u}) {
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
  // Every nibble is accepted (0, never written, is -8 steps), and so are the largest scale and
  // -0 (a zero bucket).
  auto p = good;
  for (std::size_t i = hdr + 12; i < p.size(); ++i) p[i] = std::byte{0x0f};
  put_f32(p, hdr, 0.5f);
  put_f32(p, hdr + 4, gc::int4_format::max_scale());
  put_f32(p, hdr + 8, -0.0f);
  auto const y = decompress<float>(c, p, 37);
  for (std::size_t i = 0; i < 16; i += 2) {
    REQUIRE(y[i] == 3.5f);
    REQUIRE(y[i + 1] == -4.0f);
  }
  REQUIRE(y[16] == 7.0f * gc::int4_format::max_scale());
  REQUIRE(std::isinf(y[17]));  // -8 * max_scale overflows, as any decoder computes it
  REQUIRE(y[36] == 0.0f);
}
