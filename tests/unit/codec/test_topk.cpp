// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// topk codec: the selected set equals a sort-based reference (ties toward the lower index) on
// many inputs; packets do not depend on threads or ISA; both index encodings round-trip; a
// golden packet; error feedback conserves mass; malformed packets and bad parameters raise.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// Reference: stable sort of the indices by |x| descending, first k, ascending.
std::vector<std::uint32_t> reference_topk(std::vector<float> const& x, std::size_t k) {
  std::vector<std::uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// Indices and values of a packet, by decoding it (zeros off the support are not selected;
/// a selected zero decodes to 0 too, so the indices are read from the payload).
std::vector<std::uint32_t> packet_indices(std::span<std::byte const> p) {
  auto const h = gc::read_header(p);
  std::vector<std::uint32_t> idx;
  gc::detail::sparse::read_indices(h, p.data() + hdr, idx);
  return idx;
}

std::vector<float> tie_input(std::size_t n, std::uint64_t seed, int levels) {
  auto g = gaussian(n, seed);
  for (auto& v : g) v = std::round(v * static_cast<float>(levels)) / static_cast<float>(levels);
  return g;
}

}  // namespace

static_assert(gc::codec<gc::topk_codec>);

TEST_CASE("topk selects exactly the sort-based reference set", "[codec][topk]") {
  std::vector<std::vector<float>> inputs;
  for (std::size_t n : {0u, 1u, 2u, 7u, 100u, 1000u, 4099u, 70000u}) {
    inputs.push_back(gaussian(n, n + 1));
    inputs.push_back(heavy_tailed(n, n + 2));
    inputs.push_back(tie_input(n, n + 3, 2));
    inputs.push_back(std::vector<float>(n, -0.75f));  // all equal
    inputs.push_back(std::vector<float>(n, 0.0f));    // zeros
    auto mix = gaussian(n, n + 4);
    for (std::size_t i = 0; i < n; i += 3) mix[i] = (i % 2) ? -0.0f : 0.0f;
    inputs.push_back(mix);
  }
  for (auto const& x : inputs) {
    std::size_t const n = x.size();
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{2}, n / 100, n / 10, n / 2,
                          n > 0 ? n - 1 : 0, n, n + 5}) {
      gc::topk_codec const c = gc::topk_codec::count(k);
      CAPTURE(n, k);
      REQUIRE(c.k_for(n) == std::min(k, n));
      auto const p = compress(c, x, serial_ctx());
      auto const idx = packet_indices(p);
      REQUIRE(idx == reference_topk(x, std::min(k, n)));
      auto const y = decompress<float>(c, p, n);
      std::vector<float> expect(n, 0.0f);
      for (auto i : idx) expect[i] = x[i];
      for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(y[i]) == bits_of(expect[i]));
    }
    for (double r : {0.001, 0.01, 0.3, 1.0}) {
      gc::topk_codec const c = gc::topk_codec::ratio(r);
      std::size_t const k = n == 0 ? 0 : std::clamp<std::size_t>(static_cast<std::size_t>(std::floor(r * static_cast<double>(n))), 1, n);
      CAPTURE(n, r);
      REQUIRE(c.k_for(n) == k);
      REQUIRE(packet_indices(compress(c, x, serial_ctx())) == reference_topk(x, k));
    }
  }
}

TEST_CASE("topk packets do not depend on threads or ISA", "[codec][topk]") {
  for (std::size_t n : {1000u, 200000u, 300001u}) {
    for (auto const& x : {gaussian(n, 9), tie_input(n, 10, 4)}) {
      gc::topk_codec const c = gc::topk_codec::ratio(0.01, gc::sparse_values::bf16);
      auto const ref = compress(c, x, serial_ctx(gc::cpu::isa::scalar));
      for (unsigned t : {1u, 2u, 3u}) {
        for (auto level : isa_levels) REQUIRE(compress(c, x, parallel_ctx(t, level)) == ref);
      }
    }
  }
}

TEST_CASE("topk: both index encodings round-trip; values per value type", "[codec][topk]") {
  std::size_t const n = 5000;
  auto const x = gaussian(n, 77);
  // Dense-ish selection: gaps small, delta wins. One element: 4 bytes either way, the tie
  // goes to absolute.
  auto spread = std::vector<float>(n, 0.001f);
  spread[7] = 5.0f;
  spread[4999] = -4.0f;
  struct tc { std::vector<float> const* in; std::size_t k; unsigned enc; };
  for (auto [in, k, enc] : {tc{&x, 2500, 1u}, tc{&spread, 1, 0u}, tc{&x, n, 1u}}) {
    for (auto v : {gc::sparse_values::f32, gc::sparse_values::f16, gc::sparse_values::bf16}) {
      gc::topk_codec const c = gc::topk_codec::count(k, v);
      auto const p = compress(c, *in, serial_ctx());
      auto const h = gc::topk_codec::inspect(p);
      CAPTURE(k, static_cast<unsigned>(v));
      REQUIRE((h.variant >> 2) == enc);
      REQUIRE((h.variant & 3u) == static_cast<unsigned>(v));
      REQUIRE(h.param0 == k);
      auto const idx = packet_indices(p);
      REQUIRE(idx == reference_topk(*in, k));
      if (enc == 1) {
        std::uint32_t acc = idx[0];
        for (std::size_t i = 1; i < idx.size(); ++i) acc |= idx[i] - idx[i - 1] - 1;
        REQUIRE(h.param1 == gc::detail::bit_width(acc));
        REQUIRE((k * h.param1 + 31) / 32 * 4 < 4 * k);
      }
      auto const y = decompress<float>(c, p, n);
      for (auto i : idx) {
        float const want = v == gc::sparse_values::f32 ? (*in)[i]
                           : v == gc::sparse_values::f16 ? gc::to_float(gc::half((*in)[i]))
                                                         : gc::to_float(gc::bfloat16((*in)[i]));
        REQUIRE(bits_of(y[i]) == bits_of(want));
      }
      // decompress_add touches the selected indices only.
      std::vector<float> acc(n, 0.5f);
      c.decompress_add(std::span<std::byte const>(p), std::span<float>(acc), 2.0f);
      std::size_t j = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bool const sel = j < idx.size() && idx[j] == i;
        float const want = sel ? std::fma(2.0f, y[i], 0.5f) : 0.5f;
        if (sel) ++j;
        REQUIRE(bits_of(acc[i]) == bits_of(want));
      }
    }
  }
}

TEST_CASE("topk golden packet", "[codec][topk][golden]") {
  std::vector<float> const x = {0.5f, -2.0f, 0.0f, 1.0f, 3.0f, 0.0f, 0.0f, -1.0f};
  // Top 3 by |x|: 3 (4), -2 (1), then the tie 1 (3) / -1 (7) goes to index 3. Delta code:
  // first 1, gaps-1 1 and 0, b = 1: bits 1,1,0 -> 0x03, padded to 4 bytes (< 12 absolute).
  auto const p = compress(gc::topk_codec::count(3), x);
  CHECK(to_hex(p) ==
        "4743504b020a0104" "0800000000000000" "1000000000000000" "0300000001000000"
        "03000000" "000000c0" "0000803f" "00004040");
  // k = 2 with f16 values: indices 1, 4; delta b = bit_width(1 | 2) = 2 -> 4 bytes < 8.
  auto const q = compress(gc::topk_codec::count(2, gc::sparse_values::f16), x);
  CHECK(to_hex(q) ==
        "4743504b020a0105" "0800000000000000" "0800000000000000" "0200000002000000"
        "09000000" "00c0" "0042");
  // One element of a large tensor: absolute (4 bytes) ties delta (4 bytes) -> absolute.
  std::vector<float> y(300, 0.0f);
  y[299] = -1.0f;
  auto const r = compress(gc::topk_codec::count(1), y);
  CHECK(to_hex(r) ==
        "4743504b020a0100" "2c01000000000000" "0800000000000000" "0100000000000000"
        "2b010000" "000080bf");
}

TEST_CASE("topk with error feedback conserves mass; the residual is zero where sent",
          "[codec][topk][feedback]") {
  std::size_t const n = 3000;
  gc::compressor<gc::topk_codec> comp(gc::topk_codec::ratio(0.05));
  std::vector<double> sum_g(n), sum_d(n);
  std::vector<std::byte> buf(comp.max_compressed_bytes(n));
  for (int step = 0; step < 20; ++step) {
    auto const g = gaussian(n, 1000 + static_cast<std::uint64_t>(step));
    std::size_t const bytes = comp.compress(gc::tensor_view<float const>(g, gc::tensor_id{3}), buf);
    auto const packet = std::span<std::byte const>(buf).first(bytes);
    std::vector<float> d(n);
    comp.decompress(packet, std::span<float>(d));
    auto const res = comp.state(gc::tensor_id{3}).values();
    for (auto i : packet_indices(packet)) REQUIRE(res[i] == 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i];
      sum_d[i] += d[i];
    }
  }
  auto const res = comp.state(gc::tensor_id{3}).values();
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(std::fabs(sum_d[i] + res[i] - sum_g[i]) <= 1e-4 * (1.0 + std::fabs(sum_g[i])));
  }
}

TEST_CASE("topk rejects malformed packets", "[codec][topk][format]") {
  std::vector<float> const x = {0.5f, -2.0f, 0.0f, 1.0f, 3.0f, 0.0f, 0.0f, -1.0f};
  gc::topk_codec const c = gc::topk_codec::count(3);
  auto const good = compress(c, x);  // delta, b = 1
  REQUIRE((gc::topk_codec::inspect(good).variant >> 2) == 1u);
  auto abs_packet = [](std::uint64_t n, std::vector<std::uint32_t> const& idx) {
    std::vector<std::byte> p(hdr + 8 * idx.size());
    gc::write_header(p, {gc::codec_id::topk, gc::dtype::f32, 0, n, 8 * idx.size(),
                         static_cast<std::uint32_t>(idx.size()), 0});
    for (std::size_t i = 0; i < idx.size(); ++i) {
      put_u32(p, hdr + 4 * i, idx[i]);
      put_f32(p, hdr + 4 * idx.size() + 4 * i, 1.0f + static_cast<float>(i));
    }
    return p;
  };
  std::vector<float> out(8), out300(300);
  auto expect_format = [&](std::vector<std::byte> const& p, std::vector<float>& o) {
    CHECK_THROWS_AS(c.decompress(std::span<std::byte const>(p), std::span<float>(o)), gc::format_error);
  };
  auto const abs_good = abs_packet(300, {0, 5, 299});
  c.decompress(std::span<std::byte const>(abs_good), std::span<float>(out300));
  CHECK(out300[0] == 1.0f);
  CHECK(out300[5] == 2.0f);
  CHECK(out300[299] == 3.0f);
  expect_format(abs_packet(300, {5, 0, 299}), out300);    // unsorted
  expect_format(abs_packet(300, {0, 5, 5}), out300);      // duplicate
  expect_format(abs_packet(300, {0, 5, 300}), out300);    // out of range
  { auto p = abs_good; put_u32(p, 28, 1); expect_format(p, out300); }  // b with absolute
  // Delta: bad b, out of range, set padding, m > n.
  { auto p = good; put_u32(p, 28, 33); expect_format(p, out); }
  { auto p = good; put_u32(p, 28, 3); put_u8(p, hdr, 0xff); put_u8(p, hdr + 1, 0x01); expect_format(p, out); }  // 7, 15: out of range
  { auto p = good; put_u8(p, hdr, 0x03 | 0x08); expect_format(p, out); }  // padding bit
  { auto p = good; put_u8(p, hdr + 1, 0x01); expect_format(p, out); }      // padding byte
  { auto p = good; put_u32(p, 24, 9); expect_format(p, out); }              // m > n
  // Value type 3, encoding 2, high variant bits.
  for (unsigned v : {0x07u, 0x08u, 0x14u}) { auto p = good; put_u8(p, 7, v); expect_format(p, out); }
  // Truncated / oversized (with the header's payload size adjusted to match the buffer).
  { auto p = good; p.pop_back(); put_u64(p, 16, p.size() - hdr); expect_format(p, out); }
  { auto p = good; p.push_back(std::byte{0}); put_u64(p, 16, p.size() - hdr); expect_format(p, out); }
  { auto p = good; p.pop_back(); expect_format(p, out); }
}

TEST_CASE("topk parameters and non-finite input", "[codec][topk]") {
  CHECK_THROWS_AS(gc::topk_codec::ratio(0.0), gc::config_error);
  CHECK_THROWS_AS(gc::topk_codec::ratio(-0.5), gc::config_error);
  CHECK_THROWS_AS(gc::topk_codec::ratio(1.5), gc::config_error);
  CHECK_THROWS_AS(gc::topk_codec::ratio(std::nan("")), gc::config_error);
  CHECK_THROWS_AS(gc::topk_codec::count(1, static_cast<gc::sparse_values>(3)), gc::config_error);
  CHECK(gc::topk_codec::ratio(0.01).bits_per_element() == Approx(0.64));
  CHECK(gc::topk_codec::count(5, gc::sparse_values::f16).bits_per_element() == 48.0);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    auto x = gaussian(200000, 5);
    x[123457] = bad;
    x[150000] = bad;
    std::string msg;
    try {
      (void)compress(gc::topk_codec::count(10), x, parallel_ctx(3));
    } catch (gc::numeric_error const& e) {
      msg = e.what();
    }
    CHECK(msg.find("123457") != std::string::npos);
  }
  // make_codec specs.
  auto const a = gc::make_codec("topk:k=1000");
  CHECK(a.id() == gc::codec_id::topk);
  auto const b = gc::make_codec("topk:ratio=0.01,values=f16");
  CHECK(b.bits_per_element() == Approx(0.48));
  auto const x = gaussian(5000, 6);
  auto const pb = compress(b, x);
  CHECK(pb == compress(gc::topk_codec::ratio(0.01, gc::sparse_values::f16), x));
  std::vector<float> y(5000), z(5000);
  gc::decompress_any<float>(pb, y);
  b.decompress(std::span<std::byte const>(pb), std::span<float>(z));
  CHECK(y == z);
}

TEST_CASE("topk on large inputs that mislead a sample equals the reference", "[codec][topk]") {
  std::size_t const n = std::size_t{1} << 18;
  std::vector<std::vector<float>> inputs;
  inputs.push_back(gaussian(n, 21));
  auto strided = gaussian(n, 22);  // the elements at multiples of 16 are tiny: a sample of them misleads
  for (std::size_t i = 0; i < n; i += 16) strided[i] *= 1e-6f;
  inputs.push_back(strided);
  auto ramp = std::vector<float>(n);
  for (std::size_t i = 0; i < n; ++i) ramp[i] = static_cast<float>(i / 1000);  // sorted, tied
  inputs.push_back(ramp);
  inputs.push_back(tie_input(n, 23, 1));
  for (auto const& x : inputs) {
    for (std::size_t k : {std::size_t{1}, std::size_t{37}, n / 1000, n / 100, n / 3}) {
      CAPTURE(k);
      auto const p = compress(gc::topk_codec::count(k), x, parallel_ctx(2));
      REQUIRE(packet_indices(p) == reference_topk(x, k));
      REQUIRE(p == compress(gc::topk_codec::count(k), x, serial_ctx()));
    }
  }
}

TEST_CASE("topk falls back to the histogram select when the sample overshoots", "[codec][topk]") {
  // The sampled elements (multiples of n / 2^14 = 16) are the largest: the sampled bound lies
  // above the k-th largest key for any k beyond 2^14, fewer than k elements reach it, and the
  // histogram path must give the same result.
  std::size_t const n = std::size_t{1} << 18;
  auto x = gaussian(n, 31);
  for (std::size_t i = 0; i < n; i += 16) x[i] = 100.0f + static_cast<float>(i % 7);
  for (std::size_t k : {std::size_t{100}, std::size_t{20000}, n / 3}) {
    CAPTURE(k);
    auto const ref = reference_topk(x, k);
    for (auto level : isa_levels) {
      REQUIRE(packet_indices(compress(gc::topk_codec::count(k), x, serial_ctx(level))) == ref);
      REQUIRE(packet_indices(compress(gc::topk_codec::count(k), x, parallel_ctx(3, level))) == ref);
    }
  }
}

TEST_CASE("topk select with values returns x at the selected indices", "[codec][topk]") {
  std::size_t const n = (std::size_t{1} << 17) + 5;
  for (auto const& x : {gaussian(n, 41), heavy_tailed(n, 42), tie_input(n, 43, 3)}) {
    for (double r : {0.001, 0.01, 0.2}) {
      gc::topk_codec const c = gc::topk_codec::ratio(r);
      auto const ref = reference_topk(x, c.k_for(n));
      for (auto level : isa_levels) {
        for (auto const& ctx : {serial_ctx(level), parallel_ctx(2, level)}) {
          CAPTURE(r, gc::cpu::isa_name(level));
          std::vector<std::uint32_t> idx, idx2;
          std::vector<float> values;
          c.select(x.data(), n, idx, values, ctx);
          c.select(x.data(), n, idx2, ctx);
          REQUIRE(idx == ref);
          REQUIRE(idx2 == ref);
          REQUIRE(values.size() == idx.size());
          for (std::size_t j = 0; j < idx.size(); ++j) REQUIRE(bits_of(values[j]) == bits_of(x[idx[j]]));
        }
      }
    }
  }
  // The histogram path (small n) fills the values too.
  auto const small = gaussian(1000, 44);
  std::vector<std::uint32_t> idx;
  std::vector<float> values;
  gc::topk_codec::count(10).select(small.data(), small.size(), idx, values, serial_ctx());
  REQUIRE(idx == reference_topk(small, 10));
  for (std::size_t j = 0; j < idx.size(); ++j) REQUIRE(values[j] == small[idx[j]]);
  gc::topk_codec::count(5000).select(small.data(), small.size(), idx, values, serial_ctx());
  REQUIRE(values == small);
}

TEST_CASE("topk reports the first non-finite value wherever the sample falls", "[codec][topk]") {
  std::size_t const n = std::size_t{1} << 18;  // sample stride 16
  for (std::size_t where : {std::size_t{0}, std::size_t{16 * 1001}, std::size_t{16 * 1001 + 3}, n - 3}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      auto x = gaussian(n, 51);
      x[where] = bad;
      x[n - 2] = -INFINITY;  // a later one is not reported
      for (auto const& ctx : {serial_ctx(), parallel_ctx(3)}) {
        CAPTURE(where, bad);
        std::string msg;
        try {
          (void)compress(gc::topk_codec::ratio(0.01), x, ctx);
        } catch (gc::numeric_error const& e) {
          msg = e.what();
        }
        CHECK(msg.find(std::to_string(where)) != std::string::npos);
      }
    }
  }
}
