// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// EF21 and no_feedback through `compressor`: EF21's estimate h is the sum of the decoded
// packets, its update rule, its geometric convergence to a fixed gradient under a contractive
// codec; no_feedback sends exactly the codec's packet.

#include "feedback_support.hpp"

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace gc = gradcomp;
using namespace feedback_test;

namespace {

double distance(std::span<float const> a, std::span<float const> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

double norm(std::span<float const> a) {
  double s = 0.0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

// h after every step equals the sum of the decoded packets. h_t = fl(h_{t-1} + d~_t) rounds
// once per step (at most u|h_t|), and d~ as formed inside decompress_add may differ from an
// independent decode by a rounding (u|d|): the budget is eps * sum_t (|h_t| + |d_t|) per
// element, allowed 4x.
template <class Codec, gc::element T>
void check_estimate_is_sum_of_packets(gc::compressor<Codec, gc::ef21_feedback>& comp, std::size_t n,
                                      std::uint64_t seed, std::function<void(int, Codec&)> swap) {
  rng r(seed);
  gc::tensor_id const id{8};
  std::vector<double> sum(n, 0.0), budget(n, 0.0);
  gc::codec_context ctx;
  ctx.seed = 3;
  for (int t = 0; t < 200; ++t) {
    if (swap) swap(t, comp.codec());
    ctx.step = static_cast<std::uint32_t>(t);
    auto const g = convert<T>(make_gradient(r, n));
    auto const packet = compress_packet(comp, g, id, ctx);
    auto const d = decode_any(packet, n);
    auto const h = comp.state(id).values();
    REQUIRE(h.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += d[i];
      budget[i] += std::fabs(h[i]) + std::fabs(d[i]);
    }
  }
  auto const h = comp.state(id).values();
  double worst = 0.0;
  std::size_t where = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double const tol = 4.0 * float_eps * budget[i] + 1e-30;
    double const ratio = std::fabs(h[i] - sum[i]) / tol;
    if (ratio > worst) {
      worst = ratio;
      where = i;
    }
  }
  INFO("element " << where << ": h = " << h[where] << ", sum of packets = " << sum[where]);
  CHECK(worst <= 1.0);
  CHECK(norm(h) > 0.0);
}

}  // namespace

TEST_CASE("EF21: the estimate is the sum of all decoded packets", "[feedback][ef21]") {
  std::size_t const n = 900;
  SECTION("qsgd 15 -> 3 -> 127") {
    gc::compressor<gc::qsgd_codec, gc::ef21_feedback> c(gc::qsgd_codec(15, 512));
    check_estimate_is_sum_of_packets<gc::qsgd_codec, float>(c, n, 1, [](int t, gc::qsgd_codec& k) {
      if (t == 70) k = gc::qsgd_codec(3, 512);
      if (t == 140) k = gc::qsgd_codec(127, 512);
    });
  }
  SECTION("int8 bucket 512 -> 64") {
    gc::compressor<gc::int8_codec, gc::ef21_feedback> c(gc::int8_codec(512));
    check_estimate_is_sum_of_packets<gc::int8_codec, float>(c, n, 2, [](int t, gc::int8_codec& k) {
      if (t == 100) k = gc::int8_codec(64);
    });
  }
  SECTION("onebit, terngrad, natural, fp16") {
    gc::compressor<gc::onebit_codec, gc::ef21_feedback> a;
    check_estimate_is_sum_of_packets<gc::onebit_codec, float>(a, n, 3, {});
    gc::compressor<gc::terngrad_codec, gc::ef21_feedback> b;
    check_estimate_is_sum_of_packets<gc::terngrad_codec, float>(b, n, 4, {});
    gc::compressor<gc::natural_codec, gc::ef21_feedback> c;
    check_estimate_is_sum_of_packets<gc::natural_codec, float>(c, n, 5, {});
    gc::compressor<gc::fp16_codec, gc::ef21_feedback> d;
    check_estimate_is_sum_of_packets<gc::fp16_codec, float>(d, n, 6, {});
  }
  SECTION("bfloat16 and half gradients, any_codec") {
    gc::compressor<gc::any_codec, gc::ef21_feedback> c(gc::make_codec("qsgd:levels=31,bucket=128"));
    check_estimate_is_sum_of_packets<gc::any_codec, gc::bfloat16>(
        c, n, 7, [](int t, gc::any_codec& k) {
          if (t == 100) k = gc::make_codec("int8:bucket=32");
        });
    gc::compressor<gc::any_codec, gc::ef21_feedback> h(gc::make_codec("natural"));
    check_estimate_is_sum_of_packets<gc::any_codec, gc::half>(h, n, 8, {});
  }
}

TEST_CASE("EF21: sends C(g - h) and adds the decoded packet to h", "[feedback][ef21]") {
  std::size_t const n = 600;
  gc::qsgd_codec const codec(9, 256);
  gc::compressor<gc::qsgd_codec, gc::ef21_feedback> comp(codec);
  rng r(12);
  std::vector<float> h(n, 0.0f);
  gc::codec_context ctx;
  ctx.seed = 1234;
  for (int t = 0; t < 15; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    auto const g = make_gradient(r, n);
    std::vector<float> diff(n);
    for (std::size_t i = 0; i < n; ++i) diff[i] = g[i] - h[i];
    std::vector<std::byte> expect(codec.max_compressed_bytes(n));
    expect.resize(
        codec.compress(gc::tensor_view<float const>(diff, gc::tensor_id{2}), expect, ctx));
    auto const packet = compress_packet(comp, g, gc::tensor_id{2}, ctx);
    INFO("step " << t);
    REQUIRE(packet == expect);
    // h <- h + D(packet), done here with the codec's own decompress_add: identical.
    codec.decompress_add(std::span<std::byte const>(packet), std::span<float>(h), 1.0f);
    auto const lib = comp.state(gc::tensor_id{2}).values();
    REQUIRE(std::equal(lib.begin(), lib.end(), h.begin(), h.end()));
  }
}

TEST_CASE("EF21: with a fixed gradient and a contractive codec, h converges geometrically",
          "[feedback][ef21]") {
  std::size_t const n = 2048;
  rng r(77);
  std::vector<float> g(n);
  for (auto& v : g)
    v = static_cast<float>((r.uniform() < 0.5 ? -1.0 : 1.0) * (0.05 + 3.0 * r.uniform()));
  double const gnorm = norm(g);
  // Below this distance h is as close to g as float h can track (a few ulps per element).
  double const floor = 8.0 * float_eps * gnorm;

  auto run = [&](auto codec, double rho, int steps) {
    gc::compressor<decltype(codec), gc::ef21_feedback> comp(codec);
    gc::codec_context ctx;
    ctx.seed = 5;
    std::vector<double> errs{gnorm};  // h_0 = 0
    for (int t = 0; t < steps; ++t) {
      ctx.step = static_cast<std::uint32_t>(t);
      (void)compress_packet(comp, g, gc::tensor_id{1}, ctx);
      errs.push_back(distance(g, comp.state(gc::tensor_id{1}).values()));
    }
    for (std::size_t t = 1; t < errs.size(); ++t) {
      INFO("step " << t << ": |g - h| = " << errs[t] << ", before " << errs[t - 1] << ", floor "
                   << floor);
      CHECK(errs[t] <= std::max(rho * errs[t - 1], floor));
    }
    CHECK(errs.back() <= floor);
    return errs;
  };
  SECTION("qsgd with 127 levels: E|C(x) - x|^2 <= d/s^2 |x|^2 = 0.03 |x|^2 per bucket") {
    auto const errs = run(gc::qsgd_codec(127, 512), 0.5, 40);
    // Expected contraction sqrt(0.03) ~ 0.18: after 5 steps well below 0.5^5.
    CHECK(errs[5] <= 0.01 * gnorm);
  }
  SECTION("fp16: one step leaves the half rounding error, two the float floor") {
    auto const errs = run(gc::fp16_codec{}, 0.5, 10);
    CHECK(errs[1] <= 0x1p-11 * gnorm);
    CHECK(errs[1] > 0.0);  // the first packet is lossy
    CHECK(errs[3] <= floor);
  }
  SECTION("int8 with 64-element buckets") {
    auto const errs = run(gc::int8_codec(64), 0.5, 30);
    CHECK(errs[1] <= gnorm / 255.0 * 2.0);
  }
}

TEST_CASE("no_feedback sends exactly the codec's packet", "[feedback][none]") {
  std::size_t const n = 1111;
  gc::qsgd_codec const codec(4, 100);
  gc::compressor<gc::qsgd_codec, gc::no_feedback> comp(codec);
  gc::compressor<gc::any_codec, gc::no_feedback> any(gc::make_codec("onebit"));
  rng r(3);
  gc::codec_context ctx;
  ctx.seed = 42;
  for (int t = 0; t < 10; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    auto const g = make_gradient(r, n);
    std::vector<std::byte> expect(codec.max_compressed_bytes(n));
    expect.resize(codec.compress(gc::tensor_view<float const>(g, gc::tensor_id{6}), expect, ctx));
    REQUIRE(compress_packet(comp, g, gc::tensor_id{6}, ctx) == expect);
    // 16-bit gradients go to the codec as they are (the packet records their dtype).
    auto const h = convert<gc::half>(g);
    std::vector<std::byte> expect_h(codec.max_compressed_bytes(n));
    expect_h.resize(
        codec.compress(gc::tensor_view<gc::half const>(h, gc::tensor_id{6}), expect_h, ctx));
    auto const packet_h = compress_packet(comp, h, gc::tensor_id{6}, ctx);
    REQUIRE(packet_h == expect_h);
    CHECK(gc::read_header(packet_h).type == gc::dtype::f16);
    // The same through any_codec.
    gc::onebit_codec const ob;
    std::vector<std::byte> expect_o(ob.max_compressed_bytes(n));
    expect_o.resize(ob.compress(gc::tensor_view<float const>(g, gc::tensor_id{6}), expect_o, ctx));
    REQUIRE(compress_packet(any, g, gc::tensor_id{6}, ctx) == expect_o);
  }
  CHECK(comp.state(gc::tensor_id{6}).values().empty());
  gc::no_feedback::state s;
  CHECK_NOTHROW(s.assign({}));
  std::vector<float> const one{1.0f};
  CHECK_THROWS_AS(s.assign(one), gc::format_error);
}

TEST_CASE("compressor: decompress and decompress_add use the current codec", "[feedback]") {
  std::size_t const n = 257;
  gc::compressor<gc::int8_codec> comp(gc::int8_codec(32));
  rng r(9);
  auto const g = make_gradient(r, n);
  auto const packet = compress_packet(comp, g, gc::tensor_id{0}, {});
  std::vector<float> a(n), b(n);
  comp.decompress(std::span<std::byte const>(packet), std::span<float>(a));
  gc::int8_codec(32).decompress(std::span<std::byte const>(packet), std::span<float>(b));
  CHECK(a == b);
  std::vector<float> acc(n, 1.0f), acc2(n, 1.0f);
  comp.decompress_add(std::span<std::byte const>(packet), std::span<float>(acc), -0.5f);
  gc::int8_codec(32).decompress_add(std::span<std::byte const>(packet), std::span<float>(acc2),
                                    -0.5f);
  CHECK(acc == acc2);
  CHECK(comp.max_compressed_bytes(n) == gc::int8_codec(32).max_compressed_bytes(n));
  comp.codec() = gc::int8_codec(0);
  CHECK(comp.max_compressed_bytes(n) == gc::int8_codec(0).max_compressed_bytes(n));
  CHECK(comp.codec().bucket() == 0);
  // A packet of a different codec is refused by the compressor's codec.
  gc::compressor<gc::onebit_codec> other;
  std::vector<float> out(n);
  CHECK_THROWS_AS(other.decompress(std::span<std::byte const>(packet), std::span<float>(out)),
                  gc::format_error);
}
