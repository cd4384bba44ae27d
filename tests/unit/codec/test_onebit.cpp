// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// onebit codec: decoded elements are exactly ±mean|x| with the scale summed in the canonical
// order of `onebit_sum_order` (recomputed here independently), the sign-bit layout of the
// payload, the unscaled ±1 form and majority vote, and rejection of malformed payloads.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// mean |x| summed as onebit_sum_order documents: blocks of 4096; in a block, 16 double lanes
/// (lane l takes elements l, l + 16, ... of the block, ascending); lanes added 0..15; block
/// sums added in order; the mean rounded once to float.
float canonical_scale(std::vector<float> const& x) {
  std::size_t const n = x.size();
  if (n == 0) return 0.0f;
  double total = 0.0;
  for (std::size_t b = 0; b < n; b += 4096) {
    double lane[16] = {};
    for (std::size_t i = b; i < std::min(n, b + 4096); ++i) {
      lane[(i - b) % 16] += std::fabs(static_cast<double>(x[i]));
    }
    double s = 0.0;
    for (double l : lane) s += l;
    total += s;
  }
  return static_cast<float>(total / static_cast<double>(n));
}

std::vector<float> onebit_input(std::size_t n, std::uint64_t seed) {
  auto x = heavy_tailed(n, seed);
  for (std::size_t i = 0; i < n; i += 97) x[i] = 0.0f;
  for (std::size_t i = 3; i < n; i += 89) x[i] = -0.0f;
  return x;
}

}  // namespace

TEST_CASE("onebit decodes every element to plus or minus the canonical mean |x|",
          "[codec][onebit]") {
  gc::onebit_codec const c;
  REQUIRE(c.scale_mode() == gc::onebit_codec::scaling::mean_abs);
  for (std::size_t n : {1u, 7u, 37u, 4096u, 4097u, 10000u, 140001u}) {
    auto const x = onebit_input(n, n);
    float const scale = canonical_scale(x);
    for (auto const& ctx : {serial_ctx(gc::cpu::isa::scalar), serial_ctx(gc::cpu::isa::avx2),
                            serial_ctx(gc::cpu::isa::avx512), parallel_ctx(3)}) {
      CAPTURE(n, gc::cpu::isa_name(ctx.isa));
      auto const p = compress(c, x, ctx);
      auto const h = gc::onebit_codec::inspect(p);
      REQUIRE(h.variant == 0);
      REQUIRE(p.size() == hdr + 8 + (n + 7) / 8);
      REQUIRE(bits_of(get_f32(p, hdr)) == bits_of(scale));
      REQUIRE(get_u32(p, hdr + 4) == 0);  // reserved
      std::size_t bad_bits = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bool const bit = (static_cast<unsigned>(p[hdr + 8 + i / 8]) >> (i % 8)) & 1u;
        bad_bits += bit != (x[i] < 0.0f);  // -0 and +0 are positive
      }
      REQUIRE(bad_bits == 0);
      if (n % 8 != 0) REQUIRE((static_cast<unsigned>(p.back()) >> (n % 8)) == 0u);

      auto const y = decompress<float>(c, p, n, ctx);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bad += bits_of(y[i]) != bits_of(x[i] < 0.0f ? -scale : scale);
      }
      REQUIRE(bad == 0);
    }
  }
}

TEST_CASE("onebit scale is the L1-optimal scale of the signs", "[codec][onebit]") {
  // For a fixed sign pattern, |x - a sign(x)|^2 is minimised at a = mean |x|: nudging the
  // decoded scale either way increases the error.
  auto const x = gaussian(5000, 17);
  gc::onebit_codec const c;
  auto const y = decompress<float>(c, compress(c, x), x.size());
  auto err = [&](double a) {
    double e = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      double const d = x[i] - (y[i] < 0 ? -a : a);
      e += d * d;
    }
    return e;
  };
  double const a = std::fabs(y[0]);
  REQUIRE(err(a) < err(a * 1.01));
  REQUIRE(err(a) < err(a * 0.99));
}

TEST_CASE(
    "unscaled onebit decodes to plus or minus one and summed packets give the majority "
    "vote",
    "[codec][onebit]") {
  gc::onebit_codec const c(gc::onebit_codec::scaling::none);
  std::size_t const n = 1001;
  std::size_t const workers = 5;
  auto const common = gaussian(n, 1);
  std::vector<std::vector<float>> grads;
  for (std::size_t w = 0; w < workers; ++w) {
    auto g = gaussian(n, 100 + w);
    for (std::size_t i = 0; i < n; ++i) g[i] = 0.3f * common[i] + g[i];
    grads.push_back(g);
  }
  std::vector<float> sum(n, 0.0f);
  std::vector<gc::half> sum_h(n, gc::half(0.0f));
  for (auto const& g : grads) {
    auto const p = compress(c, g);
    REQUIRE(gc::onebit_codec::inspect(p).variant == 1);
    REQUIRE(get_f32(p, hdr) == 1.0f);
    auto const y = decompress<float>(c, p, n);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(y[i] == (g[i] < 0.0f ? -1.0f : 1.0f));
    c.decompress_add(std::span<std::byte const>(p), std::span<float>(sum));
    c.decompress_add(std::span<std::byte const>(p), std::span<gc::half>(sum_h));
  }
  for (std::size_t i = 0; i < n; ++i) {
    int votes = 0;
    for (auto const& g : grads) votes += g[i] < 0.0f ? -1 : 1;
    REQUIRE(sum[i] == static_cast<float>(votes));
    REQUIRE(gc::to_float(sum_h[i]) == static_cast<float>(votes));
    REQUIRE((sum[i] > 0) == (votes > 0));  // the sign of the sum is the majority
  }
}

TEST_CASE("onebit of an all-zero or empty tensor has scale zero", "[codec][onebit]") {
  gc::onebit_codec const c;
  std::vector<float> const z(19, 0.0f);
  auto const p = compress(c, z);
  REQUIRE(get_f32(p, hdr) == 0.0f);
  auto const y = decompress<float>(c, p, z.size());
  for (float v : y) REQUIRE(bits_of(v) == 0u);
  auto const e = compress(c, std::vector<float>{});
  REQUIRE(e.size() == hdr + 8);
  REQUIRE(get_f32(e, hdr) == 0.0f);
}

TEST_CASE("onebit rejects malformed payloads", "[codec][onebit][malformed]") {
  auto const x = formula_input(37);
  for (auto mode : {gc::onebit_codec::scaling::mean_abs, gc::onebit_codec::scaling::none}) {
    gc::onebit_codec const c(mode);
    auto const good = compress(c, x);
    for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
      gc::codec_context const ctx = serial_ctx(level);
      auto rejects = [&](std::vector<std::byte> const& p) {
        std::vector<float> out(37);
        REQUIRE_THROWS_AS(c.decompress(std::span<std::byte const>(p), std::span<float>(out), ctx),
                          gc::format_error);
        REQUIRE_THROWS_AS(
            c.decompress_add(std::span<std::byte const>(p), std::span<float>(out), 1.0f, ctx),
            gc::format_error);
      };
      CAPTURE(static_cast<int>(mode), gc::cpu::isa_name(level));
      for (float s : {NAN, INFINITY, -INFINITY, -1.0f, -FLT_MIN, -FLT_TRUE_MIN}) {
        auto p = good;
        put_f32(p, hdr, s);
        rejects(p);
      }
      if (mode == gc::onebit_codec::scaling::none) {
        for (float s : {0.0f, 0.5f, 2.0f}) {
          auto p = good;
          put_f32(p, hdr, s);
          rejects(p);
        }
      }
      for (std::size_t k = 0; k < 4; ++k) {  // reserved word
        auto p = good;
        put_u8(p, hdr + 4 + k, 1);
        rejects(p);
      }
      for (unsigned bit = 37 % 8; bit < 8; ++bit) {  // padding bits of the last byte
        auto p = good;
        p.back() |= static_cast<std::byte>(1u << bit);
        rejects(p);
      }
      for (unsigned variant : {2u, 3u, 255u}) {
        auto p = good;
        put_u8(p, field::variant, variant);
        rejects(p);
      }
    }
  }
  // The two variants are distinguished by the header: a scaled packet whose scale happens to
  // be 1 is still valid, and decodes to ±1.
  gc::onebit_codec const scaled;
  auto p = compress(scaled, x);
  put_f32(p, hdr, 1.0f);
  auto const y = decompress<float>(scaled, p, 37);
  for (std::size_t i = 0; i < 37; ++i) REQUIRE(y[i] == (x[i] < 0 ? -1.0f : 1.0f));
}
