// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// random-k: ranks sharing a seed select the same coordinates (and differ across seeds, steps
// and tensors); coordinates are distinct, ascending and exactly k; inclusion is uniform
// (marginals and pairs, checked over many seeds with stated bounds); the scaled variant is
// unbiased; packets do not depend on threads or ISA; the check word rejects a decoder with
// the wrong seed or step; malformed packets and bad parameters raise.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/format/support.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

gc::codec_context seeded(std::uint64_t seed, std::uint32_t step = 0) {
  gc::codec_context ctx = serial_ctx();
  ctx.seed = seed;
  ctx.step = step;
  return ctx;
}

}  // namespace

static_assert(gc::codec<gc::random_k_codec>);
static_assert(gc::codec<gc::scaled_random_k_codec>);
static_assert(!gc::random_k_codec::unbiased && gc::scaled_random_k_codec::unbiased);
static_assert(gc::random_k_codec::aggregation == gc::aggregation_kind::shared_support);

TEST_CASE("random_k: ranks sharing a seed select the same coordinates, others differ",
          "[codec][randomk]") {
  std::size_t const n = 100000;
  auto const rank0 = gaussian(n, 1);
  auto const rank1 = gaussian(n, 2);  // different data on another "rank"
  gc::random_k_codec const c = gc::random_k_codec::ratio(0.01);
  auto const ctx = seeded(42, 7);
  auto const p0 = compress(c, rank0, ctx, gc::tensor_id{5});
  auto const p1 = compress(c, rank1, parallel_ctx(3, gc::cpu::isa::best, 42, 7), gc::tensor_id{5});
  // Same header and check word: the value sections can be all-reduced.
  REQUIRE(std::equal(p0.begin(), p0.begin() + hdr + 4, p1.begin()));
  auto const i0 = gc::random_k_packet_indices(p0, ctx);
  auto const i1 = gc::random_k_packet_indices(p1, ctx);
  REQUIRE(i0 == i1);
  REQUIRE(i0 == c.indices(n, ctx, gc::tensor_id{5}));
  REQUIRE(i0.size() == 1000);
  // The values are each rank's own values at those coordinates.
  for (std::size_t j = 0; j < i0.size(); ++j) {
    REQUIRE(get_f32(p0, hdr + 4 + 4 * j) == rank0[i0[j]]);
    REQUIRE(get_f32(p1, hdr + 4 + 4 * j) == rank1[i0[j]]);
  }
  // A different seed, step or tensor gives a different set (overlap about k^2/n = 10).
  for (auto const& other : {c.indices(n, seeded(43, 7), gc::tensor_id{5}),
                            c.indices(n, seeded(42, 8), gc::tensor_id{5}),
                            c.indices(n, seeded(42, 7), gc::tensor_id{6})}) {
    std::vector<std::uint32_t> common;
    std::set_intersection(i0.begin(), i0.end(), other.begin(), other.end(),
                          std::back_inserter(common));
    CHECK(other.size() == i0.size());
    CHECK(common.size() < 50);
  }
}

TEST_CASE("random_k: exactly k distinct ascending coordinates, for any n and k",
          "[codec][randomk]") {
  for (std::size_t n : {0u, 1u, 2u, 3u, 255u, 256u, 257u, 1000u, 65537u, 300001u}) {
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{2}, n / 100, n / 3,
                          n > 0 ? n - 1 : 0, n, n + 3}) {
      CAPTURE(n, k);
      gc::random_k_codec const c = gc::random_k_codec::count(k);
      REQUIRE(c.k_for(n) == std::min(k, n));
      auto const idx = c.indices(n, seeded(n * 31 + k));
      REQUIRE(idx.size() == std::min(k, n));
      for (std::size_t j = 0; j < idx.size(); ++j) {
        REQUIRE(idx[j] < n);
        if (j > 0) REQUIRE(idx[j] > idx[j - 1]);
      }
    }
  }
  // Ratios follow top-k's rule: max(1, floor(r n)).
  CHECK(gc::random_k_codec::ratio(0.01).k_for(99) == 1);
  CHECK(gc::random_k_codec::ratio(0.01).k_for(1000) == 10);
  CHECK(gc::random_k_codec::ratio(1.0).k_for(7) == 7);
  CHECK(gc::random_k_codec::ratio(0.5).k_for(0) == 0);
}

TEST_CASE(
    "random_k: every coordinate is kept with probability k/n, every pair with "
    "k(k-1)/(n(n-1))",
    "[codec][randomk]") {
  // Over T seeds the count of coordinate i is Binomial(T, p). With z_i = (c_i - Tp) /
  // sqrt(T p (1 - p)): every |z_i| below z_max and sum z_i^2 within 5 standard deviations of
  // its mean n - 1 (chi-square-like, n - 1 degrees of freedom since the counts sum to T k).
  // z_max = max(5, sqrt(2 ln(1e7 n))) is a union bound over the n coordinates: for a correct
  // implementation the chance that *some* |z_i| exceeds it stays below about 1e-4 even at the
  // largest n, where the counts (mean Tp >= 30) are Poisson-like with a heavier upper tail
  // than the normal (a plain 5 there fails at random: ~70000 coordinates with mean 3 gave
  // z = 5.2). Inputs are fixed, so the test is deterministic; the bounds say how unlikely a
  // correct implementation is to fail it.
  int const trials = quick_mode() ? 3000 : 20000;
  struct tc {
    std::size_t n, k;
  };
  for (auto [n, k] : {tc{50, 10}, tc{7, 3}, tc{300, 150}, tc{1000, 17}, tc{70000, 700}}) {
    CAPTURE(n, k);
    std::vector<double> count(n);
    auto const t_here = static_cast<std::size_t>(trials);
    for (std::size_t s = 0; s < t_here; ++s) {
      for (auto i : gc::random_k_codec::count(k).indices(n, seeded(0x5eed0000 + s * 7919, 3)))
        count[i] += 1;
    }
    double const p = static_cast<double>(k) / static_cast<double>(n);
    double const T = static_cast<double>(t_here);
    double const sd = std::sqrt(T * p * (1 - p));
    double chi = 0, worst = 0;
    for (double c : count) {
      double const z = (c - T * p) / sd;
      chi += z * z;
      worst = std::max(worst, std::fabs(z));
    }
    double const z_max = std::max(5.0, std::sqrt(2.0 * std::log(1e7 * static_cast<double>(n))));
    CAPTURE(worst, chi, z_max);
    CHECK(worst < z_max);
    double const df = static_cast<double>(n - 1);
    CHECK(std::fabs(chi - df) < 5.0 * std::sqrt(2.0 * df));
  }
  // Pairs of a small domain: n = 8, k = 3.
  std::size_t const n = 8, k = 3;
  std::vector<double> pair(n * n);
  for (int s = 0; s < trials; ++s) {
    auto const idx = gc::random_k_codec::count(k).indices(
        n, seeded(0xabc00000ull + static_cast<std::uint64_t>(s)));
    for (std::size_t a = 0; a < idx.size(); ++a) {
      for (std::size_t b = a + 1; b < idx.size(); ++b) pair[idx[a] * n + idx[b]] += 1;
    }
  }
  double const q = static_cast<double>(k * (k - 1)) / static_cast<double>(n * (n - 1));
  double const T = trials;
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = a + 1; b < n; ++b) {
      CAPTURE(a, b, pair[a * n + b]);
      CHECK(std::fabs(pair[a * n + b] - T * q) < 5.0 * std::sqrt(T * q * (1 - q)));
    }
  }
}

TEST_CASE("random_k: the scaled variant is unbiased, the plain one shrinks by k/n",
          "[codec][randomk]") {
  // x̂_i = (n/k) x_i with probability p = k/n, else 0: E = x_i, sd = |x_i| sqrt(n/k - 1).
  // Over T seeds the mean is within 5 sd / sqrt(T) of x_i (per coordinate, 5 sigma).
  std::size_t const n = 64, k = 8;
  int const trials = quick_mode() ? 2000 : 20000;
  auto const x = gaussian(n, 11);
  std::vector<double> sum_s(n), sum_u(n);
  gc::scaled_random_k_codec const cs = gc::scaled_random_k_codec::count(k);
  gc::random_k_codec const cu = gc::random_k_codec::count(k);
  for (int s = 0; s < trials; ++s) {
    auto const ctx = seeded(1000 + static_cast<std::uint64_t>(s), 2);
    auto const ys = decompress<float>(cs, compress(cs, x, ctx), n, ctx);
    auto const yu = decompress<float>(cu, compress(cu, x, ctx), n, ctx);
    for (std::size_t i = 0; i < n; ++i) {
      sum_s[i] += ys[i];
      sum_u[i] += yu[i];
    }
  }
  double const T = trials, ratio = static_cast<double>(n) / static_cast<double>(k);
  for (std::size_t i = 0; i < n; ++i) {
    double const xi = x[i];
    double const sd = std::fabs(xi) * std::sqrt(ratio - 1.0);
    CAPTURE(i, xi, sum_s[i] / T);
    CHECK(std::fabs(sum_s[i] / T - xi) <= 5.0 * sd / std::sqrt(T) + 1e-6);
    CHECK(std::fabs(sum_u[i] / T - xi / ratio) <= 5.0 * (sd / ratio) / std::sqrt(T) + 1e-6);
  }
  CHECK(gc::any_codec(cs).unbiased());
  CHECK_FALSE(gc::any_codec(cu).unbiased());
  CHECK(gc::any_codec(cs).aggregation() == gc::aggregation_kind::shared_support);
}

TEST_CASE("random_k packets do not depend on threads or ISA; round trips per value type",
          "[codec][randomk]") {
  for (std::size_t n : {1000u, 200003u, (1u << 20) + 1u}) {
    auto const x = gaussian(n, n);
    for (auto v : {gc::sparse_values::f32, gc::sparse_values::f16, gc::sparse_values::bf16}) {
      gc::scaled_random_k_codec const c = gc::scaled_random_k_codec::ratio(0.01, v);
      CAPTURE(n, static_cast<unsigned>(v));
      auto const ref = compress(c, x, serial_ctx(gc::cpu::isa::scalar, 9, 4), gc::tensor_id{2});
      REQUIRE(ref.size() == c.max_compressed_bytes(n));
      for (unsigned t : {1u, 2u, 3u}) {
        for (auto level : isa_levels) {
          REQUIRE(compress(c, x, parallel_ctx(t, level, 9, 4), gc::tensor_id{2}) == ref);
        }
      }
      auto const ctx = serial_ctx(gc::cpu::isa::best, 9, 4);
      auto const idx = gc::random_k_packet_indices(ref, ctx);
      // The backend-neutral support (codec/format/support.hpp, scalar) is the same set.
      auto const support = gc::sparse_packet_support(ref, ctx);
      REQUIRE(support.has_value());
      CHECK(*support == idx);
      auto const y = decompress<float>(c, ref, n, ctx);
      float const s = static_cast<float>(static_cast<double>(n) / static_cast<double>(idx.size()));
      std::size_t j = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bool const sel = j < idx.size() && idx[j] == i;
        float const scaled = x[i] * s;
        float const want = !sel                          ? 0.0f
                           : v == gc::sparse_values::f32 ? scaled
                           : v == gc::sparse_values::f16 ? gc::to_float(gc::half(scaled))
                                                         : gc::to_float(gc::bfloat16(scaled));
        if (sel) ++j;
        REQUIRE(bits_of(y[i]) == bits_of(want));
      }
      // decompress_add touches the coordinates only; decompress_any needs the same context.
      std::vector<float> acc(n, 0.25f);
      c.decompress_add(std::span<std::byte const>(ref), std::span<float>(acc), -2.0f, ctx);
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(bits_of(acc[i]) == bits_of(std::fma(-2.0f, y[i], 0.25f)));
      std::vector<float> z(n);
      gc::decompress_any(std::span<std::byte const>(ref), std::span<float>(z), 1.0f, false, ctx);
      REQUIRE(z == y);
    }
  }
  // 16-bit inputs gather their own values (no dense conversion).
  auto const x = gaussian(5000, 8);
  auto const xh = convert_to<gc::half>(x);
  gc::random_k_codec const c = gc::random_k_codec::count(50, gc::sparse_values::f16);
  auto const ph = compress(c, xh, seeded(3));
  REQUIRE(gc::read_header(ph).type == gc::dtype::f16);
  auto const yh = decompress<gc::half>(c, ph, x.size(), seeded(3));
  auto const idx = c.indices(x.size(), seeded(3));
  for (auto i : idx) REQUIRE(yh[i].bits == xh[i].bits);
}

TEST_CASE("random_k: decoding with another seed or step fails the check word",
          "[codec][randomk][format]") {
  auto const x = gaussian(3000, 4);
  gc::random_k_codec const c = gc::random_k_codec::count(30);
  auto const p = compress(c, x, seeded(77, 5), gc::tensor_id{9});
  std::vector<float> out(x.size());
  CHECK_NOTHROW(c.decompress(std::span<std::byte const>(p), std::span<float>(out), seeded(77, 5)));
  CHECK_THROWS_AS(c.decompress(std::span<std::byte const>(p), std::span<float>(out), seeded(78, 5)),
                  gc::format_error);
  CHECK_THROWS_AS(c.decompress(std::span<std::byte const>(p), std::span<float>(out), seeded(77, 6)),
                  gc::format_error);
  CHECK_THROWS_AS(gc::decompress_any<float>(p, out), gc::format_error);  // default context
  CHECK_THROWS_AS(gc::random_k_packet_indices(p, seeded(1)), gc::format_error);
  // The tensor id travels in the packet: patching it breaks the check word too.
  {
    auto q = p;
    put_u32(q, field::param1, 8);
    CHECK_THROWS_AS(
        c.decompress(std::span<std::byte const>(q), std::span<float>(out), seeded(77, 5)),
        gc::format_error);
  }
}

TEST_CASE("random_k rejects malformed packets", "[codec][randomk][format]") {
  auto const x = gaussian(100, 4);
  gc::random_k_codec const c = gc::random_k_codec::count(10);
  auto const ctx = seeded(1);
  auto const good = compress(c, x, ctx);
  REQUIRE(good.size() == hdr + 4 + 40);
  std::vector<float> out(100);
  auto expect_format = [&](std::vector<std::byte> const& p) {
    CHECK_THROWS_AS(c.decompress(std::span<std::byte const>(p), std::span<float>(out), ctx),
                    gc::format_error);
  };
  for (unsigned v : {0x03u, 0x08u, 0x80u}) {
    auto p = good;
    put_u8(p, field::variant, v);
    expect_format(p);
  }
  {
    auto p = good;
    put_u8(p, field::variant, 1);
    expect_format(p);
  }  // f16 values: payload too long
  {
    auto p = good;
    put_u32(p, field::param0, 101);
    expect_format(p);
  }  // k > n
  {
    auto p = good;
    put_u32(p, field::param0, 9);
    expect_format(p);
  }  // k disagrees with the payload
  {
    auto p = good;
    p.pop_back();
    put_u64(p, field::payload, p.size() - hdr);
    expect_format(p);
  }
  {
    auto p = good;
    p.push_back(std::byte{0});
    put_u64(p, field::payload, p.size() - hdr);
    expect_format(p);
  }
  {
    auto p = good;
    p.pop_back();
    expect_format(p);
  }
  {
    auto p = good;
    put_u8(p, hdr, static_cast<unsigned>(p[hdr]) ^ 1u);
    expect_format(p);
  }  // check word
  {
    auto p = good;  // n beyond 2^32 - 1
    put_u64(p, field::count, std::uint64_t{1} << 33);
    CHECK_THROWS_AS(gc::random_k_codec::inspect(p), gc::format_error);
  }
  {
    auto p = good;
    put_u8(p, field::codec, 10);
    CHECK_THROWS_AS(gc::random_k_codec::inspect(p), gc::format_error);
  }
  std::vector<float> wrong(99);
  CHECK_THROWS_AS(c.decompress(std::span<std::byte const>(good), std::span<float>(wrong), ctx),
                  gc::config_error);
}

TEST_CASE("random_k parameters, specs and edge sizes", "[codec][randomk]") {
  CHECK_THROWS_AS(gc::random_k_codec::ratio(0.0), gc::config_error);
  CHECK_THROWS_AS(gc::random_k_codec::ratio(1.01), gc::config_error);
  CHECK_THROWS_AS(gc::random_k_codec::ratio(std::nan("")), gc::config_error);
  CHECK_THROWS_AS(gc::random_k_codec::count(3, static_cast<gc::sparse_values>(3)),
                  gc::config_error);
  CHECK(gc::random_k_codec::ratio(0.01).bits_per_element() == Approx(0.32));
  CHECK(gc::random_k_codec::count(5, gc::sparse_values::bf16).bits_per_element() == 16.0);
  CHECK(gc::random_k_codec::count(5).max_compressed_bytes(3) == 32 + 4 + 12);
  auto const a = gc::make_codec("randomk:ratio=0.01,scale=true,values=f16");
  CHECK(a.id() == gc::codec_id::random_k);
  CHECK(a.unbiased());
  CHECK(a.bits_per_element() == Approx(0.16));
  auto const b = gc::make_codec("random_k:k=7");
  CHECK_FALSE(b.unbiased());
  CHECK_THROWS_AS(gc::make_codec("randomk:k=7,ratio=0.1"), gc::config_error);
  CHECK_THROWS_AS(gc::make_codec("randomk:scale=maybe"), gc::config_error);
  auto const x = gaussian(4000, 6);
  auto const ctx = seeded(5, 1);
  CHECK(compress(a, x, ctx) ==
        compress(gc::scaled_random_k_codec::ratio(0.01, gc::sparse_values::f16), x, ctx));
  CHECK(compress(b, x, ctx) == compress(gc::random_k_codec::count(7), x, ctx));
  // k = 0, k = n, n = 1, n = 0.
  for (std::size_t n : {0u, 1u, 5u}) {
    auto const xs = gaussian(n, 3);
    for (std::size_t k : {std::size_t{0}, n}) {
      CAPTURE(n, k);
      gc::scaled_random_k_codec const c = gc::scaled_random_k_codec::count(k);
      auto const p = compress(c, xs, ctx);
      REQUIRE(p.size() == hdr + 4 + 4 * std::min(k, n));
      auto const y = decompress<float>(c, p, n, ctx);
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(y[i] == (k == 0 ? 0.0f : xs[i]));  // n/k = 1 at k = n
    }
  }
}

TEST_CASE("random_k with error feedback conserves mass", "[codec][randomk][feedback]") {
  std::size_t const n = 2000;
  gc::compressor<gc::random_k_codec> comp(gc::random_k_codec::ratio(0.05));
  std::vector<double> sum_g(n), sum_d(n);
  std::vector<std::byte> buf(comp.max_compressed_bytes(n));
  for (std::uint32_t step = 0; step < 10; ++step) {
    auto const g = gaussian(n, 500 + step);
    auto const ctx = seeded(99, step);
    std::size_t const bytes =
        comp.compress(gc::tensor_view<float const>(g, gc::tensor_id{4}), buf, ctx);
    std::vector<float> d(n);
    comp.decompress(std::span<std::byte const>(buf).first(bytes), std::span<float>(d), ctx);
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i];
      sum_d[i] += d[i];
    }
  }
  auto const res = comp.state(gc::tensor_id{4}).values();
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(std::fabs(sum_d[i] + res[i] - sum_g[i]) <= 1e-4 * (1.0 + std::fabs(sum_g[i])));
  }
}

namespace {

/// The permutation written out from docs/wire-format.md ("random_k"), independently of the
/// library's kernels: 8-round unbalanced Feistel on w = max(8, bit_width(n - 1)) bits with
/// cycle-walking, round keys from Philox4x32-10 counters (j, 0x524b5031, step, tensor).
std::uint32_t spec_pi(std::uint64_t n, std::uint64_t seed, std::uint32_t step, std::uint32_t tensor,
                      std::uint64_t i) {
  if (n <= 1) return 0;
  gc::philox_key const key{static_cast<std::uint32_t>(seed),
                           static_cast<std::uint32_t>(seed >> 32)};
  std::uint32_t rk[8];
  for (std::uint32_t j = 0; j < 2; ++j) {
    auto const o = gc::philox4x32<10>(gc::philox_block{j, 0x524b5031u, step, tensor}, key);
    for (unsigned w = 0; w < 4; ++w) rk[4 * j + w] = o[w];
  }
  auto mix = [](std::uint32_t x) {
    x = (x ^ (x >> 16)) * 0x7feb352du;
    x = (x ^ (x >> 15)) * 0x846ca68bu;
    return x ^ (x >> 16);
  };
  unsigned const w = std::max(8u, static_cast<unsigned>(std::bit_width(n - 1)));
  std::uint64_t x = i;
  do {
    unsigned wl = w / 2, wr = w - w / 2;
    std::uint64_t l = x >> wr, r = x & ((std::uint64_t{1} << wr) - 1);
    for (int round = 0; round < 8; ++round) {
      std::uint64_t const f =
          mix(static_cast<std::uint32_t>(r) ^ rk[round]) & ((std::uint64_t{1} << wl) - 1);
      std::uint64_t const nl = r;
      r = l ^ f;
      l = nl;
      std::swap(wl, wr);
    }
    x = (l << wr) | r;
  } while (x >= n);
  return static_cast<std::uint32_t>(x);
}

}  // namespace

TEST_CASE("random_k coordinates and check word follow the documented construction",
          "[codec][randomk][wire]") {
  for (std::uint64_t n : {1u, 2u, 3u, 200u, 256u, 257u, 4097u, 65536u, 1000003u}) {
    for (std::uint64_t k : {std::uint64_t{1}, n / 7, n / 2}) {
      if (k == 0 || k >= n) continue;
      std::uint64_t const seed = 0x0123456789abcdefull ^ n;
      std::vector<std::uint32_t> want;
      for (std::uint64_t r = 0; r < k; ++r) want.push_back(spec_pi(n, seed, 7, 3, r));
      std::sort(want.begin(), want.end());
      CAPTURE(n, k);
      for (auto level : isa_levels) {
        REQUIRE(gc::random_k_codec::count(k).indices(n, serial_ctx(level, seed, 7),
                                                     gc::tensor_id{3}) == want);
      }
    }
  }
  auto const x = gaussian(50, 1);
  auto const p = compress(gc::random_k_codec::count(5), x, serial_ctx(gc::cpu::isa::best, 11, 22),
                          gc::tensor_id{33});
  auto const o =
      gc::philox4x32<10>(gc::philox_block{0, 0x524b4331u, 22, 33}, gc::philox_key{11, 0});
  CHECK(get_u32(p, hdr) == o[0]);
}
