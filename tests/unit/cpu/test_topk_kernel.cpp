// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The scan kernel of exact top-k (`cpu::kernels::collect_at_least`): every SIMD level writes the
// same entries as the scalar reference and as a plain loop, with and without the "many" hint (indices ascending, values bit for
// bit, the bound inclusive, tails and offsets handled), flags non-finite values it collects, and
// leaves the outputs past its count alone beyond the stated slack.

#include <gradcomp/cpu/kernels/topk.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace gc = gradcomp;
namespace kn = gradcomp::cpu::kernels;
using gc::cpu::isa;

namespace {

struct collected {
  std::vector<std::uint32_t> at;
  std::vector<std::uint32_t> bits;  // values, as bits
  bool nonfinite = false;
};

// A plain loop: what every level must produce.
collected plain(std::vector<float> const& x, std::size_t b, std::size_t len, std::uint32_t base,
                std::uint32_t lo) {
  collected c;
  for (std::size_t i = 0; i < len; ++i) {
    std::uint32_t const u = std::bit_cast<std::uint32_t>(x[b + i]);
    if ((u & 0x7fffffffu) < lo) continue;
    c.at.push_back(base + static_cast<std::uint32_t>(i));
    c.bits.push_back(u);
    c.nonfinite |= (u & 0x7fffffffu) >= 0x7f800000u;
  }
  return c;
}

collected run(std::vector<float> const& x, std::size_t b, std::size_t len, std::uint32_t base,
              std::uint32_t lo, isa level, bool many = false) {
  // Sentinels after the room the caller must give (count + slack) must survive.
  std::size_t const room = len + kn::collect_slack;
  std::vector<std::uint32_t> at(room + 8, 0xdeadbeefu);
  std::vector<float> v(room + 8, -7.0f);
  kn::collect_counts const got = kn::collect_at_least(x.data() + b, len, base, lo, at.data(), v.data(), level, many);
  REQUIRE(got.count <= len);
  for (std::size_t i = room; i < room + 8; ++i) {
    REQUIRE(at[i] == 0xdeadbeefu);
    REQUIRE(v[i] == -7.0f);
  }
  collected c;
  c.nonfinite = got.nonfinite;
  for (std::size_t i = 0; i < got.count; ++i) {
    c.at.push_back(at[i]);
    c.bits.push_back(std::bit_cast<std::uint32_t>(v[i]));
  }
  return c;
}

}  // namespace

TEST_CASE("topk scan kernel: every level collects what a plain loop does", "[cpu][isa][topk]") {
  std::vector<float> x = gradcomp_test::gaussian(5000, 91);
  for (std::size_t i = 0; i < x.size(); i += 97) x[i] = -x[i];
  for (std::size_t i = 5; i < x.size(); i += 131) x[i] = 1.5f;   // ties at a bound
  for (std::size_t i = 9; i < x.size(); i += 173) x[i] = -1.5f;
  for (std::size_t i = 11; i < x.size(); i += 59) x[i] = -0.0f;
  float const bounds[] = {0.0f, 1e-30f, 0.5f, 1.5f, 2.5f, 3.9f, 100.0f};
  for (float bf : bounds) {
    std::uint32_t const lo = std::bit_cast<std::uint32_t>(bf);
    for (std::size_t b : {std::size_t{0}, std::size_t{3}, std::size_t{16}}) {
      for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                              std::size_t{100}, std::size_t{4096}, x.size() - 16}) {
        std::uint32_t const base = 1000000u + static_cast<std::uint32_t>(b);
        collected const want = plain(x, b, len, base, lo);
        for (isa level : gradcomp_test::isa_levels) {
          if (static_cast<unsigned>(level) > static_cast<unsigned>(gc::cpu::machine_isa())) continue;
          for (bool many : {false, true}) {
            CAPTURE(bf, b, len, gc::cpu::isa_name(level), many);
            collected const got = run(x, b, len, base, lo, level, many);
            REQUIRE(got.at == want.at);
            REQUIRE(got.bits == want.bits);
            REQUIRE(got.nonfinite == want.nonfinite);
            REQUIRE_FALSE(got.nonfinite);
          }
        }
      }
    }
  }
  // A bound of 0 collects everything, in order; one above every key collects nothing.
  collected const all = run(x, 0, 64, 0, 0, gc::cpu::effective_isa(gc::cpu::isa::best));
  REQUIRE(all.at.size() == 64);
  for (std::uint32_t i = 0; i < 64; ++i) REQUIRE(all.at[i] == i);
  REQUIRE(run(x, 0, 64, 0, 0x80000000u, gc::cpu::effective_isa(gc::cpu::isa::best)).at.empty());
}

TEST_CASE("topk scan kernel: non-finite values are collected and flagged", "[cpu][isa][topk]") {
  float const specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  for (float bad : specials) {
    for (std::size_t where : {std::size_t{0}, std::size_t{15}, std::size_t{16}, std::size_t{777}, std::size_t{998}}) {
      std::vector<float> x = gradcomp_test::gaussian(999, 92);
      x[where] = bad;
      for (isa level : gradcomp_test::isa_levels) {
        if (static_cast<unsigned>(level) > static_cast<unsigned>(gc::cpu::machine_isa())) continue;
        for (bool many : {false, true}) {
          CAPTURE(where, gc::cpu::isa_name(level), many);
          collected const got = run(x, 0, x.size(), 0, std::bit_cast<std::uint32_t>(2.0f), level, many);
          REQUIRE(got.nonfinite);
          REQUIRE(std::find(got.at.begin(), got.at.end(), static_cast<std::uint32_t>(where)) != got.at.end());
          collected const want = plain(x, 0, x.size(), 0, std::bit_cast<std::uint32_t>(2.0f));
          REQUIRE(got.at == want.at);
          REQUIRE(got.bits == want.bits);
        }
      }
    }
  }
}
