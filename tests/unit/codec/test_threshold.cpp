// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// threshold codec: selects exactly |x| >= v, packets independent of threads and ISA, round
// trip, bad parameters and non-finite input.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/threshold.hpp>

#include <cmath>
#include <vector>

namespace {
using namespace gradcomp_test;
namespace gc = gradcomp;
}  // namespace

static_assert(gc::codec<gc::threshold_codec>);

TEST_CASE("threshold selects exactly |x| >= v", "[codec][threshold]") {
  for (std::size_t n : {0u, 1u, 9u, 1000u, 70001u}) {
    auto x = gaussian(n, n + 11);
    for (std::size_t i = 0; i < n; i += 5) x[i] = (i % 2) ? -0.5f : 0.5f;
    for (float v : {0.0f, 0.5f, 1.0f, 2.5f, 100.0f}) {
      for (auto vt : {gc::sparse_values::f32, gc::sparse_values::f16}) {
        gc::threshold_codec const c(v, vt);
        CAPTURE(n, v);
        auto const p = compress(c, x, serial_ctx());
        for (unsigned t : {1u, 2u, 3u}) {
          for (auto level : isa_levels) REQUIRE(compress(c, x, parallel_ctx(t, level)) == p);
        }
        auto const h = gc::threshold_codec::inspect(p);
        std::vector<std::uint32_t> idx;
        gc::detail::sparse::read_indices(h, p.data() + hdr, idx);
        std::vector<std::uint32_t> want;
        for (std::size_t i = 0; i < n; ++i) {
          if (std::fabs(x[i]) >= v) want.push_back(static_cast<std::uint32_t>(i));
        }
        REQUIRE(idx == want);
        auto const y = decompress<float>(c, p, n);
        std::size_t j = 0;
        for (std::size_t i = 0; i < n; ++i) {
          bool const sel = j < idx.size() && idx[j] == i;
          float const e = !sel ? 0.0f : vt == gc::sparse_values::f32 ? x[i] : gc::to_float(gc::half(x[i]));
          if (sel) ++j;
          REQUIRE(bits_of(y[i]) == bits_of(e));
        }
      }
    }
  }
}

TEST_CASE("threshold golden packet", "[codec][threshold][golden]") {
  std::vector<float> const x = {0.5f, -2.0f, 0.0f, 1.0f, 3.0f, 0.0f, 0.0f, -1.0f};
  // |x| >= 1: indices 1, 3, 4, 7; delta entries 1, 1, 0, 2 in b = 2 bits:
  // 01 01 00 10 -> 0b10000101 = 0x85, padded to 4 bytes.
  auto const p = compress(gc::threshold_codec(1.0f), x);
  CHECK(to_hex(p) ==
        "4743504b020b0104" "0800000000000000" "1400000000000000" "0400000002000000"
        "85000000" "000000c0" "0000803f" "00004040" "000080bf");
}

TEST_CASE("threshold parameters, specs and non-finite input", "[codec][threshold]") {
  CHECK_THROWS_AS(gc::threshold_codec(-1.0f), gc::config_error);
  CHECK_THROWS_AS(gc::threshold_codec(INFINITY), gc::config_error);
  CHECK_THROWS_AS(gc::threshold_codec(std::nanf("")), gc::config_error);
  CHECK_THROWS_AS(gc::threshold_codec(1.0f, static_cast<gc::sparse_values>(7)), gc::config_error);
  CHECK(gc::threshold_codec(1.0f).bits_per_element() == 64.0);
  CHECK(gc::threshold_codec(1.0f).max_compressed_bytes(10) == 32 + 80);
  auto x = gaussian(100000, 3);
  x[77777] = std::nanf("");
  std::string msg;
  try {
    (void)compress(gc::threshold_codec(0.5f), x, parallel_ctx(2));
  } catch (gc::numeric_error const& e) {
    msg = e.what();
  }
  CHECK(msg.find("77777") != std::string::npos);
  auto const a = gc::make_codec("threshold:value=0.5,values=bf16");
  CHECK(a.id() == gc::codec_id::threshold);
  auto const y = gaussian(3000, 4);
  auto const p = compress(a, y);
  CHECK(p == compress(gc::threshold_codec(0.5f, gc::sparse_values::bf16), y));
  std::vector<float> o1(3000), o2(3000);
  gc::decompress_any<float>(p, o1);
  a.decompress(std::span<std::byte const>(p), std::span<float>(o2));
  CHECK(o1 == o2);
}
