// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Multi-level compression: re-compressing a top-k (approx_topk, threshold) packet to k'
// equals compressing the dense tensor to k' directly (byte for byte for f32 values); a
// random-k packet re-compressed to k' equals the direct random-k packet at k' under the same
// seed; copies when k' >= m; bad input raises.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/codec/threshold.hpp>
#include <gradcomp/codec/topk.hpp>

#include <cmath>
#include <numeric>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

std::vector<std::byte> recompress(std::span<std::byte const> p, std::uint64_t k,
                                  gc::codec_context const& ctx = {}) {
  std::size_t const max = gc::max_recompressed_bytes(p, k);
  std::vector<std::byte> out(max + guard_bytes, guard_byte);
  std::size_t const size = gc::recompress_sparse(p, k, std::span<std::byte>(out), ctx);
  REQUIRE(size <= max);
  for (std::size_t i = max; i < out.size(); ++i) REQUIRE(out[i] == guard_byte);
  out.resize(size);
  return out;
}

std::vector<std::uint32_t> packet_indices(std::span<std::byte const> p) {
  auto const h = gc::read_header(p);
  std::vector<std::uint32_t> idx;
  gc::detail::sparse::read_indices(h, p.data() + hdr, idx);
  return idx;
}

std::vector<float> tied(std::size_t n, std::uint64_t seed) {
  auto x = gaussian(n, seed);
  for (auto& v : x) v = std::round(v * 4.0f) / 4.0f;
  return x;
}

}  // namespace

TEST_CASE("multi-level: top-k of a top-k packet equals top-k of the dense tensor",
          "[codec][multilevel]") {
  for (std::size_t n : {1u, 10u, 1000u, 100000u}) {
    for (auto const& x :
         {gaussian(n, 1), heavy_tailed(n, 2), tied(n, 3), std::vector<float>(n, 1.0f)}) {
      for (std::size_t k1 : {n, n / 2, n / 10, n / 100}) {
        auto const p1 = compress(gc::topk_codec::count(k1), x, serial_ctx());
        for (std::size_t k2 : {std::size_t{0}, std::size_t{1}, k1 / 2, k1 / 7, k1}) {
          if (k2 > k1) continue;  // a packet cannot grow back
          CAPTURE(n, k1, k2);
          REQUIRE(recompress(p1, k2) == compress(gc::topk_codec::count(k2), x, serial_ctx()));
          // Multi-level chains compose: k1 -> k2 -> k2 / 3.
          REQUIRE(recompress(recompress(p1, k2), k2 / 3) ==
                  compress(gc::topk_codec::count(k2 / 3), x, serial_ctx()));
        }
      }
    }
  }
}

TEST_CASE("multi-level: approx_topk and threshold packets re-compress to the exact top-k",
          "[codec][multilevel]") {
  std::size_t const n = 50000;
  auto const x = tied(n, 7);
  auto const pa = compress(gc::approx_topk_codec::ratio(0.05, 0.001, 0.2), x, serial_ctx());
  std::size_t const ma = packet_indices(pa).size();
  auto const pt = compress(gc::threshold_codec(1.5f), x, serial_ctx());
  std::size_t const mt = packet_indices(pt).size();
  REQUIRE(mt > 1000);
  for (std::size_t k : {std::size_t{1}, std::size_t{100}, std::size_t{999}, ma - 1}) {
    CAPTURE(k);
    auto const direct = compress(gc::topk_codec::count(k), x, serial_ctx());
    auto ra = recompress(pa, k);
    REQUIRE(gc::read_header(ra).codec == gc::codec_id::approx_topk);  // the codec id is kept
    put_u8(ra, field::codec, static_cast<unsigned>(gc::codec_id::topk));
    REQUIRE(ra == direct);
    if (k < mt) {
      auto rt = recompress(pt, k);
      put_u8(rt, field::codec, static_cast<unsigned>(gc::codec_id::topk));
      REQUIRE(rt == direct);
    }
  }
}

TEST_CASE("multi-level: 16-bit values rank by the rounded values", "[codec][multilevel]") {
  std::size_t const n = 20000;
  auto const x = gaussian(n, 9);
  for (auto v : {gc::sparse_values::f16, gc::sparse_values::bf16}) {
    auto const p = compress(gc::topk_codec::count(2000, v), x, serial_ctx());
    gc::topk_codec const c = gc::topk_codec::count(2000, v);
    auto const y = decompress<float>(c, p, n);  // the decoded tensor (zeros off the support)
    for (std::size_t k : {std::size_t{1}, std::size_t{150}, std::size_t{1999}}) {
      CAPTURE(k);
      auto const r = recompress(p, k);
      // Top-k of the decoded tensor, re-encoded with the same value type (exact: rounding a
      // rounded value is the identity).
      REQUIRE(r == compress(gc::topk_codec::count(k, v), y, serial_ctx()));
    }
  }
}

TEST_CASE("multi-level: random-k re-compresses to the direct random-k packet",
          "[codec][multilevel][randomk]") {
  for (std::size_t n : {1u, 300u, 100000u}) {
    auto const x = gaussian(n, n + 1);
    auto const ctx = serial_ctx(gc::cpu::isa::best, 1234, 9);
    for (std::size_t k1 : {n, n / 3, n / 100}) {
      auto const p1 = compress(gc::random_k_codec::count(k1, gc::sparse_values::bf16), x, ctx,
                               gc::tensor_id{4});
      auto const s1 = compress(gc::scaled_random_k_codec::count(k1), x, ctx, gc::tensor_id{4});
      for (std::size_t k2 : {std::size_t{0}, std::size_t{1}, k1 / 2, k1}) {
        if (k2 > k1) continue;
        CAPTURE(n, k1, k2);
        REQUIRE(recompress(p1, k2, ctx) ==
                compress(gc::random_k_codec::count(k2, gc::sparse_values::bf16), x, ctx,
                         gc::tensor_id{4}));
        // Scaled: the same support and header; values n/k2 x up to float rounding of the
        // two-step scale (k1/k2 after n/k1).
        auto const r = recompress(s1, k2, ctx);
        auto const d = compress(gc::scaled_random_k_codec::count(k2), x, ctx, gc::tensor_id{4});
        REQUIRE(r.size() == d.size());
        REQUIRE(std::equal(r.begin(), r.begin() + hdr + 4, d.begin()));
        for (std::size_t j = 0; j < k2; ++j) {
          float const a = get_f32(r, hdr + 4 + 4 * j), b = get_f32(d, hdr + 4 + 4 * j);
          REQUIRE(std::fabs(a - b) <= 6e-7f * std::fabs(b));
        }
      }
    }
  }
  // The subset depends on the seed: a receiver with another seed is refused.
  auto const x = gaussian(1000, 2);
  auto const p = compress(gc::random_k_codec::count(100), x, serial_ctx(gc::cpu::isa::best, 5, 1));
  std::vector<std::byte> out(1000);
  CHECK_THROWS_AS(gc::recompress_sparse(p, 10, out, serial_ctx(gc::cpu::isa::best, 6, 1)),
                  gc::format_error);
}

TEST_CASE("multi-level: copies, bounds and errors", "[codec][multilevel][format]") {
  auto const x = gaussian(1000, 4);
  auto const p = compress(gc::topk_codec::count(100), x);
  CHECK(recompress(p, 100) == p);
  CHECK(recompress(p, 5000) == p);
  CHECK(gc::max_recompressed_bytes(p, 10) == 32 + 10 * 8);
  auto const q = recompress(p, 0);
  CHECK(q.size() == hdr);
  CHECK(gc::read_header(q).param0 == 0);
  // Output too small: config_error; another codec: config_error; malformed: format_error.
  std::vector<std::byte> small(40);
  CHECK_THROWS_AS(gc::recompress_sparse(p, 10, small), gc::config_error);
  CHECK_THROWS_AS(gc::recompress_sparse(p, 200, small), gc::config_error);
  auto const dense = compress(gc::identity_codec{}, x);
  std::vector<std::byte> out(10000);
  CHECK_THROWS_AS(gc::recompress_sparse(dense, 10, out), gc::config_error);
  CHECK_THROWS_AS(gc::max_recompressed_bytes(dense, 10), gc::config_error);
  {
    auto b = p;
    put_u32(b, field::param0, 2000);
    CHECK_THROWS_AS(gc::recompress_sparse(b, 10, out), gc::format_error);
  }
  {
    auto b = p;
    b.pop_back();
    CHECK_THROWS_AS(gc::recompress_sparse(b, 10, out), gc::format_error);
  }
  {
    // Unsorted absolute indices.
    std::vector<std::byte> b(hdr + 8 * 3);
    gc::write_header(b, {gc::codec_id::topk, gc::dtype::f32, 0, 300, 24, 3, 0});
    put_u32(b, hdr, 7);
    put_u32(b, hdr + 4, 3);
    put_u32(b, hdr + 8, 9);
    CHECK_THROWS_AS(gc::recompress_sparse(b, 1, out), gc::format_error);
  }
  {
    // Regression (fuzz, tests/fuzz/regressions/recompress/copy-unchecked-padding): with k >= m
    // the packet was copied without reading its indices, so one with non-zero delta padding
    // (approx_topk, f16 values, m = 2, b = 1, padding byte 0xf6) came back as a valid packet.
    std::vector<std::byte> b(hdr + 8);
    gc::write_header(b, {gc::codec_id::approx_topk, gc::dtype::bf16, 5, 8, 8, 2, 1});
    put_u32(b, hdr, 0x00f60001);
    put_u32(b, hdr + 4, 0xc2a84180);
    CHECK_THROWS_WITH(gc::recompress_sparse(b, 2, out), Catch::Contains("padding"));
    CHECK_THROWS_AS(gc::recompress_sparse(b, 2, out), gc::format_error);
    CHECK_THROWS_AS(gc::recompress_sparse(b, 1, out), gc::format_error);
  }
}
