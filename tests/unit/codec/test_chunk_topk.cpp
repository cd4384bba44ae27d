// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// chunk_topk codec: the kept set is each chunk's exact top k (ties to the lower index, checked
// against a sort), f32 values round-trip exactly and the rest decodes to 0, the packed indices
// read back with an independent bit reader, the kept mass bound of top-k, the error bound of the
// 2-/4-bit values, 16-bit value rounding, identical packets for every thread count and ISA
// level, and rejection of bad options, non-finite input and malformed payloads.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// The indices (ascending, tensor-wide) each chunk of `x` keeps: its k largest |x|, ties to the
/// lower index.
std::vector<std::size_t> reference_support(std::vector<float> const& x, std::size_t C, std::size_t k) {
  std::vector<std::size_t> keep;
  for (std::size_t b = 0; b < x.size(); b += C) {
    std::size_t const e = std::min(x.size(), b + C);
    std::vector<std::size_t> order(e - b);
    std::iota(order.begin(), order.end(), b);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t i, std::size_t j) { return std::fabs(x[i]) > std::fabs(x[j]); });
    order.resize(std::min(k, e - b));
    std::sort(order.begin(), order.end());
    keep.insert(keep.end(), order.begin(), order.end());
  }
  return keep;
}

/// Reads `count` fields of `bits` bits, least significant bit first, from `p` at byte `off`.
std::vector<std::uint32_t> read_fields(std::vector<std::byte> const& p, std::size_t off,
                                       std::size_t count, unsigned bits) {
  std::vector<std::uint32_t> f(count, 0);
  for (std::size_t j = 0; j < count; ++j) {
    for (unsigned t = 0; t < bits; ++t) {
      std::size_t const bit = j * bits + t;
      unsigned const v = (static_cast<unsigned>(p[off + bit / 8]) >> (bit % 8)) & 1u;
      f[j] |= v << t;
    }
  }
  return f;
}

gc::chunk_values const all_values[] = {gc::chunk_values::f32, gc::chunk_values::f16,
                                       gc::chunk_values::bf16, gc::chunk_values::int2,
                                       gc::chunk_values::int4};

}  // namespace

TEST_CASE("chunk_topk keeps each chunk's exact top k; f32 values round-trip exactly",
          "[codec][chunk_topk]") {
  struct cfg {
    std::size_t n;
    std::uint32_t C, k;
  };
  for (cfg c : {cfg{1000, 64, 2}, cfg{1000, 64, 64}, cfg{1003, 2, 1}, cfg{4097, 4096, 41},
                cfg{70000, 65536, 700}, cfg{333, 8, 3}, cfg{5, 16, 9}, cfg{2048, 2048, 1},
                cfg{3000, 128, 127}}) {
    auto x = heavy_tailed(c.n, c.C + c.k);
    for (std::size_t i = 0; i < c.n; i += 37) x[i] = x[i / 2];  // ties
    CAPTURE(c.n, c.C, c.k);
    gc::chunk_topk_codec const codec(c.C, c.k);
    auto const p = compress(codec, x);
    auto const keep = reference_support(x, c.C, c.k);
    std::size_t const K = gc::chunk_topk_format::kept(c.C, c.k, c.n);
    REQUIRE(keep.size() == K);
    unsigned const ib = static_cast<unsigned>(std::countr_zero(c.C));
    REQUIRE(p.size() == hdr + (K * 32 + 7) / 8 + (K * ib + 7) / 8);
    // Index packing: every index, read back bit by bit, is the reference's.
    auto const idx = read_fields(p, hdr + 4 * K, K, ib);
    auto const vals = read_fields(p, hdr, K, 32);
    for (std::size_t j = 0; j < K; ++j) {
      REQUIRE(idx[j] == keep[j] % c.C);
      REQUIRE(std::bit_cast<float>(vals[j]) == x[keep[j]]);
    }
    auto const y = decompress<float>(codec, p, c.n);
    std::vector<bool> kept(c.n, false);
    for (std::size_t i : keep) kept[i] = true;
    for (std::size_t i = 0; i < c.n; ++i) REQUIRE(y[i] == (kept[i] ? x[i] : 0.0f));
  }
}

TEST_CASE("chunk_topk keeps at least k / C of each chunk's mass", "[codec][chunk_topk]") {
  std::size_t const C = 256, k = 5;
  auto const x = gaussian(256 * 40 + 17, 3);
  gc::chunk_topk_codec const codec(C, k);
  auto const y = decompress<float>(codec, compress(codec, x), x.size());
  for (std::size_t b = 0; b < x.size(); b += C) {
    std::size_t const e = std::min(x.size(), b + C);
    double all = 0, kept = 0, err = 0, smallest_kept = HUGE_VAL, largest_dropped = 0;
    for (std::size_t i = b; i < e; ++i) {
      all += double(x[i]) * x[i];
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      if (y[i] != 0.0f) {
        kept += double(y[i]) * y[i];
        smallest_kept = std::min(smallest_kept, std::fabs(double(x[i])));
      } else {
        largest_dropped = std::max(largest_dropped, std::fabs(double(x[i])));
      }
    }
    double const share = double(std::min(k, e - b)) / double(e - b);
    CAPTURE(b, all, kept, share);
    REQUIRE(kept >= share * all * (1 - 1e-12));
    REQUIRE(err <= (1 - share) * all * (1 + 1e-12));
    REQUIRE(largest_dropped <= smallest_kept);
  }
}

TEST_CASE("chunk_topk 2- and 4-bit values err by at most half a step", "[codec][chunk_topk]") {
  for (auto v : {gc::chunk_values::int2, gc::chunk_values::int4}) {
    unsigned const bits = v == gc::chunk_values::int2 ? 2 : 4;
    unsigned const levels = 1u << (bits - 1);
    for (std::uint32_t k : {1u, 3u, 16u, 64u}) {
      auto x = heavy_tailed(64 * 30 + 9, 7 + k);
      std::fill(x.begin() + 64, x.begin() + 128, 0.0f);  // a zero chunk: step 0
      x[200] = FLT_MAX;                                    // a chunk with the largest finite value
      gc::chunk_topk_codec const codec(64, k, v);
      CAPTURE(bits, k);
      auto const p = compress(codec, x);
      auto const keep = reference_support(x, 64, k);
      auto const y = decompress<float>(codec, p, x.size());
      std::size_t j = 0;
      for (std::size_t b = 0, c = 0; b < x.size(); b += 64, ++c) {
        std::size_t const e = std::min(x.size(), b + 64);
        float m = 0;
        for (std::size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
        float const step = get_f32(p, hdr + 4 * c);
        REQUIRE(step == static_cast<float>(double(m) / levels));
        for (; j < keep.size() && keep[j] < e; ++j) {
          std::size_t const i = keep[j];
          double const a = std::fabs(double(x[i]));
          double const err = std::fabs(double(y[i]) - x[i]);
          double const slack = 1e-6 * m + FLT_TRUE_MIN;
          CAPTURE(i, x[i], y[i], step);
          if (a >= step / 2.0) {
            REQUIRE(err <= step / 2.0 + slack);
            REQUIRE((y[i] < 0) == (x[i] < 0));
          } else {
            REQUIRE(err <= double(step) + slack);
          }
          if (std::fabs(x[i]) == m) REQUIRE(std::fabs(y[i]) == m);  // the largest is exact
        }
      }
      // Only kept elements are non-zero.
      std::vector<bool> kept(x.size(), false);
      for (std::size_t i : keep) kept[i] = true;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!kept[i]) REQUIRE(y[i] == 0.0f);
    }
  }
}

TEST_CASE("chunk_topk 16-bit values are the rounded kept values", "[codec][chunk_topk]") {
  auto x = gaussian(1000, 12, 100.0);
  x[5] = 1e6f;  // beyond binary16: saturates
  for (auto v : {gc::chunk_values::f16, gc::chunk_values::bf16}) {
    gc::chunk_topk_codec const codec(32, 4, v);
    auto const y = decompress<float>(codec, compress(codec, x), x.size());
    for (std::size_t i : reference_support(x, 32, 4)) {
      float const want = v == gc::chunk_values::f16
                             ? gc::half_bits_to_float(gc::quant::half_bits_saturated(x[i]))
                             : gc::bfloat16_bits_to_float(gc::quant::bfloat16_bits_saturated(x[i]));
      REQUIRE(y[i] == want);
    }
    if (v == gc::chunk_values::f16) REQUIRE(y[5] == 65504.0f);
  }
}

TEST_CASE("chunk_topk packets are identical for every thread count and ISA level",
          "[codec][chunk_topk][determinism]") {
  auto const x = heavy_tailed(300007, 5);
  for (auto v : all_values) {
    for (std::uint32_t C : {64u, 4096u}) {
      gc::chunk_topk_codec const codec(C, C / 32 + 1, v);
      CAPTURE(C, static_cast<unsigned>(v));
      auto const ref = compress(codec, x, serial_ctx(gc::cpu::isa::scalar));
      auto const ref_out = decompress<float>(codec, ref, x.size(), serial_ctx(gc::cpu::isa::scalar));
      for (unsigned threads : {2u, 3u}) {
        auto const ctx = parallel_ctx(threads, gc::cpu::isa::best);
        REQUIRE(compress(codec, x, ctx) == ref);
        auto const out = decompress<float>(codec, ref, x.size(), ctx);
        REQUIRE(std::memcmp(out.data(), ref_out.data(), 4 * x.size()) == 0);
      }
    }
  }
}

TEST_CASE("chunk_topk options are checked and named", "[codec][chunk_topk][config]") {
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(48, 2), gc::config_error);
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(1, 1), gc::config_error);
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(131072, 2), gc::config_error);
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(64, 0), gc::config_error);
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(64, 65), gc::config_error);
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(64, 2, static_cast<gc::chunk_values>(5)), gc::config_error);
  REQUIRE_THROWS_WITH(gc::make_codec("chunk_topk:chunk=100"), Catch::Contains("chunk"));
  REQUIRE_THROWS_WITH(gc::make_codec("chunk_topk:k=0"), Catch::Contains("k must"));
  REQUIRE_THROWS_AS(gc::make_codec("chunk_topk:values=int3"), gc::config_error);
  auto const c = gc::make_codec("chunk_topk:chunk=64,k=2,values=int2");
  REQUIRE(c.id() == gc::codec_id::chunk_topk);
  REQUIRE(c.bits_per_element() == (2.0 * (2 + 6) + 32) / 64);
  REQUIRE(gc::chunk_topk_codec().chunk() == 4096);
  REQUIRE(gc::chunk_topk_codec().k() == 64);
  REQUIRE(std::string(gc::codec_name(gc::codec_id::chunk_topk)) == "chunk_topk");
  auto x = gaussian(100, 1);
  x[50] = NAN;
  std::vector<std::byte> out(gc::chunk_topk_codec(64, 2).max_compressed_bytes(100));
  REQUIRE_THROWS_AS(gc::chunk_topk_codec(64, 2).compress(
                        gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{0}),
                        std::span<std::byte>(out)),
                    gc::numeric_error);
}

TEST_CASE("chunk_topk rejects malformed payloads and leaves the output untouched",
          "[codec][chunk_topk][malformed]") {
  auto const x = gaussian(40, 21);  // chunks of 16: 16, 16, 8 elements
  for (auto v : all_values) {
    gc::chunk_topk_codec const codec(16, 3, v);
    CAPTURE(static_cast<unsigned>(v));
    auto const good = compress(codec, x);
    std::size_t const K = 9;
    unsigned const vb = gc::chunk_topk_format::value_bits(v);
    std::size_t const voff = hdr + gc::chunk_topk_format::values_offset(16, v, 40);
    std::size_t const ioff = hdr + gc::chunk_topk_format::indices_offset(16, 3, v, 40);
    auto rejects = [&](std::vector<std::byte> const& p) {
      std::vector<float> out(40, 5.0f);
      REQUIRE_THROWS_AS(codec.decompress(std::span<std::byte const>(p), std::span<float>(out)),
                        gc::format_error);
      REQUIRE(std::all_of(out.begin(), out.end(), [](float f) { return f == 5.0f; }));
      REQUIRE_THROWS_AS(codec.decompress_add(std::span<std::byte const>(p), std::span<float>(out), 1.0f),
                        gc::format_error);
      REQUIRE(std::all_of(out.begin(), out.end(), [](float f) { return f == 5.0f; }));
    };
    auto set_index = [&](std::vector<std::byte>& p, std::size_t j, unsigned value) {
      for (unsigned t = 0; t < 4; ++t) {
        std::size_t const bit = j * 4 + t;
        auto b = static_cast<unsigned>(p[ioff + bit / 8]);
        b = (b & ~(1u << (bit % 8))) | (((value >> t) & 1u) << (bit % 8));
        p[ioff + bit / 8] = std::byte(b);
      }
    };
    auto const idx = read_fields(good, ioff, K, 4);
    {  // a duplicate index and a descending pair in chunk 1
      auto p = good;
      set_index(p, 4, idx[3]);
      rejects(p);
      p = good;
      set_index(p, 3, idx[5]);
      set_index(p, 5, idx[3]);
      rejects(p);
    }
    {  // an index past the 8-element last chunk
      auto p = good;
      set_index(p, 8, 9);
      rejects(p);
    }
    if (gc::chunk_topk_format::quantized(v)) {
      for (float bad : {NAN, INFINITY, -1.0f, FLT_MAX}) {
        auto p = good;
        put_f32(p, hdr + 4, bad);
        rejects(p);
      }
    } else {
      auto p = good;  // an infinite value
      if (vb == 32) {
        put_f32(p, voff + 4 * 2, INFINITY);
      } else {  // +inf: binary16 0x7c00, bfloat16 0x7f80 (little-endian)
        put_u8(p, voff + 2 * 2, v == gc::chunk_values::f16 ? 0x00 : 0x80);
        put_u8(p, voff + 2 * 2 + 1, v == gc::chunk_values::f16 ? 0x7c : 0x7f);
      }
      rejects(p);
    }
    for (unsigned variant : {5u, 255u}) {
      auto p = good;
      put_u8(p, field::variant, variant);
      rejects(p);
    }
    for (std::uint32_t chunk : {0u, 12u, 32u, 131072u}) {
      auto p = good;
      put_u32(p, field::param0, chunk);
      rejects(p);
    }
    for (std::uint32_t k : {0u, 2u, 17u}) {
      auto p = good;
      put_u32(p, field::param1, k);
      rejects(p);
    }
  }
}
