// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// core/philox.hpp: Philox4x32-10 against the Random123 known-answer vectors, the documented
// element -> (block, lane) mapping of `random_stream`, the statistical quality of the draws and
// the stochastic-rounding decision `round_up`.

#include <gradcomp/core/philox.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace gc = gradcomp;

namespace {

// Pearson's chi-square statistic of `counts` against a uniform distribution.
double chi_square_uniform(std::vector<std::uint64_t> const& counts) {
  double total = 0;
  for (auto c : counts) total += static_cast<double>(c);
  double const expect = total / static_cast<double>(counts.size());
  double chi2 = 0;
  for (auto c : counts) {
    double const d = static_cast<double>(c) - expect;
    chi2 += d * d / expect;
  }
  return chi2;
}

// Two-sided 2e-4 acceptance region of the chi-square distribution with 15 degrees of freedom
// (16 buckets): P(X > 44.26) = 1.0e-4 and P(X < 2.42) = 1.0e-4. The lower bound catches
// streams that are too even to be random (a counter, say). A correct generator fails one such
// check in 5,000; the seeds below are fixed, so the outcome is deterministic.
constexpr double chi2_15dof_upper = 44.26;
constexpr double chi2_15dof_lower = 2.42;

bool chi2_plausible(std::vector<std::uint64_t> const& counts) {
  double const x = chi_square_uniform(counts);
  return x > chi2_15dof_lower && x < chi2_15dof_upper;
}

}  // namespace

// The generator is usable in constant expressions (Random123 vector 1).
static_assert(gc::philox4x32<10>({0, 0, 0, 0}, {0, 0}) ==
              gc::philox_block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
static_assert(gc::random_stream::block_of(0) == 0 && gc::random_stream::block_of(16) == 0 &&
              gc::random_stream::block_of(128) == 0 && gc::random_stream::block_of(131) == 3 &&
              gc::random_stream::block_of(512) == 16 && gc::random_stream::block_of(515) == 19);
static_assert(gc::draw_share == 4 && gc::random_stream::quarter_of(127) == 0 &&
              gc::random_stream::quarter_of(128) == 1 && gc::random_stream::quarter_of(511) == 3 &&
              gc::random_stream::quarter_of(512) == 0);
static_assert(gc::random_stream::shifted(0xc000u, 1) == 0 &&
              gc::random_stream::shifted(0x1234u, 3) == 0xd234u);
static_assert(gc::random_stream::lane_of(15) == 0 && gc::random_stream::lane_of(16) == 1 &&
              gc::random_stream::lane_of(127) == 7 && gc::random_stream::lane_of(128) == 0);

TEST_CASE("philox4x32-10 reproduces the Random123 known-answer vectors", "[core][philox]") {
  CHECK(gc::philox4x32<10>({0u, 0u, 0u, 0u}, {0u, 0u}) ==
        gc::philox_block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(gc::philox4x32<10>({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                           {0xffffffffu, 0xffffffffu}) ==
        gc::philox_block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(gc::philox4x32<10>({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                           {0xa4093822u, 0x299f31d0u}) ==
        gc::philox_block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  // The default round count is 10, and fewer rounds give something else.
  CHECK(gc::philox4x32({0u, 0u, 0u, 0u}, {0u, 0u}) ==
        gc::philox4x32<10>({0u, 0u, 0u, 0u}, {0u, 0u}));
  CHECK(gc::philox4x32<7>({0u, 0u, 0u, 0u}, {0u, 0u}) !=
        gc::philox4x32<10>({0u, 0u, 0u, 0u}, {0u, 0u}));
}

TEST_CASE("random_stream: key and counter layout", "[core][philox]") {
  gc::random_stream const rs{0x0123456789abcdefull, 0xdeadbeefu, 0x00c0ffeeu};
  CHECK(rs.key() == gc::philox_key{0x89abcdefu, 0x01234567u});
  CHECK(rs.counter(0x1122334455667788ull) ==
        gc::philox_block{0x55667788u, 0x11223344u, 0xdeadbeefu, 0x00c0ffeeu});
  // block(b) is Philox4x32-10 of that counter under that key, built here word by word.
  for (std::uint64_t b :
       {0ull, 1ull, 15ull, 16ull, 0xffffffffull, 0x100000000ull, 0xfedcba9876ull}) {
    gc::philox_block const ctr{static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
                               0xdeadbeefu, 0x00c0ffeeu};
    CHECK(rs.block(b) == gc::philox4x32<10>(ctr, {0x89abcdefu, 0x01234567u}));
  }
}

TEST_CASE("random_stream: element i draws the documented 16 bits", "[core][philox]") {
  gc::random_stream const rs{42, 7, 3};
  // philox.hpp (wire format 2): block(i) = (i / 512) * 16 + (i % 16), lane(i) = (i / 16) % 8,
  // shift(i) = ((i / 128) % 4) * 2^14, draw(i) = ((out[lane / 2] >> (16 * (lane % 2))) +
  // shift(i)) mod 2^16.
  auto expected_draw = [&](std::uint64_t i) {
    std::uint64_t const block = (i / 512) * 16 + (i % 16);
    unsigned const lane = static_cast<unsigned>((i / 16) % 8);
    gc::philox_block const out = rs.block(block);
    std::uint32_t const shift = static_cast<std::uint32_t>((i / 128) % 4) * 0x4000u;
    return (((out[lane / 2] >> (16 * (lane % 2))) & 0xffffu) + shift) & 0xffffu;
  };
  std::vector<std::uint64_t> indices;
  for (std::uint64_t i = 0; i < 1024; ++i) indices.push_back(i);
  for (std::uint64_t i :
       {1ull << 20, (1ull << 32) + 5, (1ull << 36) + 77, (1ull << 40) + 129, 0xffffffffffffull}) {
    indices.push_back(i);
  }
  for (std::uint64_t i : indices) {
    INFO("element " << i);
    REQUIRE(gc::random_stream::block_of(i) == (i / 512) * 16 + (i % 16));
    REQUIRE(gc::random_stream::lane_of(i) == (i / 16) % 8);
    REQUIRE(rs.draw16(i) == expected_draw(i));
  }
  // lane16 picks the halves in order low, high of words 0..3.
  gc::philox_block const out{0x11112222u, 0x33334444u, 0x55556666u, 0x77778888u};
  std::uint32_t const lanes[8] = {0x2222, 0x1111, 0x4444, 0x3333, 0x6666, 0x5555, 0x8888, 0x7777};
  for (unsigned l = 0; l < 8; ++l) CHECK(gc::random_stream::lane16(out, l) == lanes[l]);
}

TEST_CASE("random_stream: known-answer draws of wire format 2", "[core][philox][wire]") {
  // Pinned: these are the draws every stochastic packet of format 2 is made of (the golden
  // packets' 37 elements lie in the first 128-element group, where formats 1 and 2 agree, so
  // this is what pins the sharing). Element 128 shares element 0's draw shifted by 2^14, 511
  // shares 127's shifted by 3 * 2^14.
  gc::random_stream const rs{0x0123456789abcdefull, 7, 3};
  std::pair<std::uint64_t, std::uint32_t> const kat[] = {
      {0, 0x54be},   {1, 0x2d21},    {127, 0xf7ec},  {128, 0x94be},
      {300, 0x9843}, {511, 0xb7ec},  {512, 0x3add},  {1000, 0xe405},
      {(std::uint64_t{1} << 33) + 389, 0x3590}};
  for (auto const& [i, d] : kat) {
    INFO("element " << i);
    CHECK(rs.draw16(i) == d);
  }
}

TEST_CASE("random_stream: every draw of a block serves draw_share elements, one per quarter",
          "[core][philox]") {
  // Elements [0, 512 k) map onto the 8 lanes of blocks [0, 16 k), each (block, lane) taken by
  // exactly draw_share = 4 elements, 128 apart, with the quarters 0, 1, 2, 3.
  constexpr std::uint64_t groups = 5;
  std::set<std::tuple<std::uint64_t, unsigned, unsigned>> used;
  for (std::uint64_t i = 0; i < 512 * groups; ++i) {
    std::uint64_t const b = gc::random_stream::block_of(i);
    unsigned const l = gc::random_stream::lane_of(i);
    unsigned const q = gc::random_stream::quarter_of(i);
    REQUIRE(b < 16 * groups);
    REQUIRE(l < 8);
    REQUIRE(q < gc::draw_share);
    REQUIRE(used.insert({b, l, q}).second);
    if (i % 512 < 128) {
      for (unsigned k = 1; k < gc::draw_share; ++k) {
        REQUIRE(gc::random_stream::block_of(i + 128 * k) == b);
        REQUIRE(gc::random_stream::lane_of(i + 128 * k) == l);
      }
    }
  }
  CHECK(used.size() == 512 * groups);
  // 16 consecutive elements (a SIMD vector) share one lane and quarter and use 16 consecutive
  // blocks.
  for (std::uint64_t start = 0; start < 512 * groups; start += 16) {
    for (std::uint64_t k = 1; k < 16; ++k) {
      REQUIRE(gc::random_stream::lane_of(start + k) == gc::random_stream::lane_of(start));
      REQUIRE(gc::random_stream::quarter_of(start + k) == gc::random_stream::quarter_of(start));
      REQUIRE(gc::random_stream::block_of(start + k) == gc::random_stream::block_of(start) + k);
    }
  }
}

TEST_CASE("random_stream: elements sharing a draw round up as a stratified sample",
          "[core][philox][statistics]") {
  // The four elements i, i + 128, i + 256, i + 384 draw d, d + 2^14, d + 2^15, d + 3 * 2^14
  // (mod 2^16). For a common fraction p, the number of them that round up is floor(4p) or
  // ceil(4p), whatever d is; alone, each still rounds up with probability p (checked below by
  // frequency over 2^18 shared draws, and in "round_up" over all 2^16 values).
  gc::random_stream const rs{77, 4, 11};
  for (float const p : {0.1f, 0.3f, 0.5f, 0.77f, 0.999f}) {
    std::uint64_t ups[4] = {0, 0, 0, 0};
    std::uint64_t supers = 0;
    for (std::uint64_t base = 0; base < (std::uint64_t{1} << 20); base += 512) {
      for (std::uint64_t j = 0; j < 128; j += 7) {
        unsigned count = 0;
        for (unsigned k = 0; k < 4; ++k) {
          bool const up = gc::round_up(rs.draw16(base + j + 128 * k), p);
          count += up ? 1u : 0u;
          ups[k] += up ? 1u : 0u;
        }
        double const lo = std::floor(4.0 * p), hi = std::ceil(4.0 * p);
        INFO("p = " << p << ", element " << base + j);
        REQUIRE(count >= lo);
        REQUIRE(count <= hi);
      }
      ++supers;
    }
    std::uint64_t const trials = supers * ((128 + 6) / 7);
    double const sigma = std::sqrt(static_cast<double>(p) * (1.0 - p) / static_cast<double>(trials));
    for (unsigned k = 0; k < 4; ++k) {
      double const freq = static_cast<double>(ups[k]) / static_cast<double>(trials);
      INFO("p = " << p << ", quarter " << k << ", frequency " << freq);
      CHECK(std::fabs(freq - static_cast<double>(p)) <= 6 * sigma + 0x1p-17);
    }
  }
}

TEST_CASE("random_stream: draws are uniform (chi-square, 16 buckets, 1M draws)",
          "[core][philox][statistics]") {
  for (gc::random_stream const rs : {gc::random_stream{0, 0, 0}, gc::random_stream{12345, 9, 4},
                                     gc::random_stream{0xffffffffffffffffull, 0xffffffffu, 77}}) {
    constexpr std::uint64_t n = 1u << 20;
    std::vector<std::uint64_t> high(16), low(16), mid(16);
    // Element by element through the block form (the same draws as draw16, 8 per call).
    for (std::uint64_t g = 0; g < n / 128; ++g) {
      gc::philox_block out[16];
      for (unsigned l = 0; l < 16; ++l) out[l] = rs.block(g * 16 + l);
      for (unsigned j = 0; j < 128; ++j) {
        std::uint32_t const d = gc::random_stream::lane16(out[j % 16], (j / 16) % 8);
        ++high[d >> 12];
        ++mid[(d >> 6) & 15u];
        ++low[d & 15u];
      }
    }
    INFO("seed " << rs.seed << " step " << rs.step << " tensor " << rs.tensor << ": chi2 "
                 << chi_square_uniform(high) << ", " << chi_square_uniform(mid) << ", "
                 << chi_square_uniform(low));
    CHECK(chi2_plausible(high));
    CHECK(chi2_plausible(mid));
    CHECK(chi2_plausible(low));
    // Spot-check that the loop above used the raw numbers behind draw16.
    CHECK(rs.draw16(777) ==
          gc::random_stream::shifted(gc::random_stream::lane16(rs.block(gc::random_stream::block_of(777)),
                                                               gc::random_stream::lane_of(777)),
                                     gc::random_stream::quarter_of(777)));
  }
}

TEST_CASE("random_stream: seed, step and tensor each select a different stream", "[core][philox]") {
  gc::random_stream const base{1000, 5, 9};
  std::vector<gc::random_stream> const others = {
      {1001, 5, 9}, {1000ull | (1ull << 40), 5, 9}, {1000, 6, 9}, {1000, 5, 10}, {0, 0, 0}};
  constexpr std::uint64_t n = 4096;
  for (auto const& o : others) {
    std::uint64_t equal = 0;
    for (std::uint64_t i = 0; i < n; ++i) equal += base.draw16(i) == o.draw16(i);
    INFO("other stream seed " << o.seed << " step " << o.step << " tensor " << o.tensor);
    // Independent streams agree on a 16-bit draw with probability 2^-16: ~0.06 of 4096 here.
    CHECK(equal <= 4);
  }
  // Different elements of one stream differ too (no short period).
  std::set<std::uint32_t> distinct;
  for (std::uint64_t i = 0; i < n; ++i) distinct.insert(base.draw16(i));
  CHECK(distinct.size() > 3900);  // 4096 draws from 65536 values: ~3970 distinct expected
  // Same stream, same answer.
  CHECK(gc::random_stream{1000, 5, 9}.draw16(100) == base.draw16(100));
}

TEST_CASE("round_up: probability equals frac within 2^-17", "[core][philox]") {
  // Over all 65536 draw values the decision is exact: the fraction of draws d with
  // (d + 0.5) / 65536 < frac differs from frac by at most half a step, 2^-17.
  for (float const p : {0.0f, 1e-6f, 0.1f, 0.25f, 1.0f / 3.0f, 0.5f, 0.7f, 0.999f, 0.99999f, 1.0f,
                        0x1p-16f, 0x1p-17f, 1.0f - 0x1p-17f}) {
    std::uint32_t ups = 0;
    for (std::uint32_t d = 0; d < 65536; ++d) ups += gc::round_up(d, p) ? 1u : 0u;
    double const freq = ups / 65536.0;
    INFO("frac = " << p);
    CHECK(std::fabs(freq - static_cast<double>(p)) <= 0x1p-17);
  }
  CHECK_FALSE(gc::round_up(0, 0.0f));
  CHECK(gc::round_up(65535, 1.0f));
  // Monotone in the draw: up for small draws, down for large ones.
  for (std::uint32_t d = 1; d < 65536; ++d) {
    if (gc::round_up(d, 0.4f)) REQUIRE(gc::round_up(d - 1, 0.4f));
  }

  // With Philox draws: 1M Bernoulli(p) decisions; the frequency is within 6 standard
  // deviations plus the 2^-17 resolution (a false failure has probability ~2e-9).
  gc::random_stream const rs{2024, 1, 2};
  constexpr std::uint64_t n = 1u << 20;
  for (float const p : {0.05f, 0.3f, 0.5f, 0.85f}) {
    std::uint64_t ups = 0;
    for (std::uint64_t g = 0; g < n / 128; ++g) {
      gc::philox_block out[16];
      for (unsigned l = 0; l < 16; ++l) out[l] = rs.block(g * 16 + l);
      for (unsigned j = 0; j < 128; ++j) {
        ups += gc::round_up(gc::random_stream::lane16(out[j % 16], (j / 16) % 8), p) ? 1 : 0;
      }
    }
    double const freq = static_cast<double>(ups) / n;
    double const sigma = std::sqrt(static_cast<double>(p) * (1.0 - p) / n);
    INFO("frac = " << p << ", frequency " << freq);
    CHECK(std::fabs(freq - static_cast<double>(p)) <= 6 * sigma + 0x1p-17);
  }
}
