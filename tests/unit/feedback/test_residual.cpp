// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Residual error feedback (EF-SGD) through `compressor`: mass conservation over many steps with
// every lossy codec, also when the codec's compression factor is changed mid-run; the exact
// update rule; 16-bit gradient inputs; thread-count independence.

#include "feedback_support.hpp"

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace feedback_test;

namespace {

constexpr int k_steps = 200;

// Runs `steps` steps of residual feedback on tensor `id` with gradients of element type T,
// calling `before_step(t, compressor)` first each step (to swap the codec), and checks that
// the sum of the decoded packets plus the final residual equals the sum of the gradients.
template <gc::element T, class Codec>
void check_conservation(
    gc::compressor<Codec, gc::residual_feedback>& comp, std::size_t n, std::uint64_t seed,
    std::function<void(int, gc::compressor<Codec, gc::residual_feedback>&)> before_step,
    double gain = 1.0) {
  gc::codec_context ctx;
  rng r(seed);
  gc::tensor_id const id{11};
  conservation_ledger ledger(n);
  double sum_abs_residual = 0.0;
  for (int t = 0; t < k_steps; ++t) {
    if (before_step) before_step(t, comp);
    std::vector<float> g32 = make_gradient(r, n);
    for (float& v : g32) v = static_cast<float>(v * gain);
    std::vector<T> const g = convert<T>(g32);
    ctx.seed = 0x5eed;
    ctx.step = static_cast<std::uint32_t>(t);
    auto const packet = compress_packet(comp, g, id, ctx);
    std::vector<float> const decoded = decode_any(packet, n);
    auto const residual = comp.state(id).values();
    REQUIRE(residual.size() == n);
    ledger.add_step(widen(g), decoded, residual);
    for (float e : residual) sum_abs_residual += std::fabs(e);
  }
  std::size_t where = 0;
  double const worst = ledger.worst_ratio(comp.state(id).values(), &where);
  INFO("worst element " << where << ": sum g = " << ledger.sum_g[where]
                        << ", sum decoded = " << ledger.sum_decoded[where] << ", residual = "
                        << comp.state(id).values()[where] << ", error / tolerance = " << worst);
  CHECK(worst <= 1.0);
  CHECK(ledger.tolerance_is_meaningful());
  // The codec did lose information along the way, so the residual was doing work.
  CHECK(sum_abs_residual > 0.0);
}

template <class Codec>
using swap_fn = std::function<void(int, gc::compressor<Codec, gc::residual_feedback>&)>;

}  // namespace

TEST_CASE("residual feedback conserves mass with a fixed codec", "[feedback][residual]") {
  std::size_t const n = 1000;  // not a multiple of any bucket length used here
  SECTION("onebit, mean |x| scaling") {
    gc::compressor<gc::onebit_codec> c;
    check_conservation<float>(c, n, 1, {});
  }
  SECTION("onebit, no scaling") {
    // signSGD sends +-1; gradients mostly below 1 keep its residual bounded.
    gc::compressor<gc::onebit_codec> c{gc::onebit_codec(gc::onebit_codec::scaling::none)};
    check_conservation<float>(c, n, 2, {}, 0.05);
  }
  SECTION("qsgd") {
    gc::compressor<gc::qsgd_codec> c(gc::qsgd_codec(7, 256));
    check_conservation<float>(c, n, 3, {});
  }
  SECTION("terngrad") {
    gc::compressor<gc::terngrad_codec> c;
    check_conservation<float>(c, n, 4, {});
  }
  SECTION("int8, nearest and stochastic") {
    gc::compressor<gc::int8_codec> c;
    check_conservation<float>(c, n, 5, {});
    gc::compressor<gc::int8_codec> s(gc::int8_codec(128, gc::int8_rounding::stochastic));
    check_conservation<float>(s, n, 6, {});
  }
  SECTION("natural") {
    gc::compressor<gc::natural_codec> c;
    check_conservation<float>(c, n, 7, {});
  }
  SECTION("fp16 and bf16") {
    gc::compressor<gc::fp16_codec> c;
    check_conservation<float>(c, n, 8, {});
    gc::compressor<gc::bf16_codec> b;
    check_conservation<float>(b, n, 9, {});
  }
  SECTION("dithering, natural levels") {
    gc::compressor<gc::dithering_codec> c(gc::dithering_codec(3, gc::dither_partition::natural));
    check_conservation<float>(c, n, 10, {});
  }
  SECTION("a tiny tensor") {
    gc::compressor<gc::qsgd_codec> c(gc::qsgd_codec(2, 512));
    check_conservation<float>(c, 3, 11, {});
  }
}

TEST_CASE("residual feedback conserves mass when the codec changes mid-run",
          "[feedback][residual]") {
  std::size_t const n = 1000;
  SECTION("qsgd levels 15 -> 3 -> 127, bucket 512 -> 64") {
    gc::compressor<gc::qsgd_codec> c(gc::qsgd_codec(15, 512));
    check_conservation<float, gc::qsgd_codec>(c, n, 21, [](int t, auto& comp) {
      if (t == 60) comp.codec() = gc::qsgd_codec(3, 512);
      if (t == 120) comp.codec() = gc::qsgd_codec(127, 512);
      if (t == 170) comp.codec() = gc::qsgd_codec(127, 64);
    });
  }
  SECTION("int8 bucket 512 -> 64 -> whole tensor, nearest -> stochastic") {
    gc::compressor<gc::int8_codec> c(gc::int8_codec(512));
    check_conservation<float, gc::int8_codec>(c, n, 22, [](int t, auto& comp) {
      if (t == 50) comp.codec() = gc::int8_codec(64);
      if (t == 100) comp.codec() = gc::int8_codec(0);
      if (t == 150) comp.codec() = gc::int8_codec(96, gc::int8_rounding::stochastic);
    });
  }
  SECTION("onebit scaling toggled every step") {
    gc::compressor<gc::onebit_codec> c;
    check_conservation<float, gc::onebit_codec>(c, n, 23, [](int t, auto& comp) {
      comp.codec() = gc::onebit_codec(t % 2 ? gc::onebit_codec::scaling::none
                                            : gc::onebit_codec::scaling::mean_abs);
    });
  }
  SECTION("terngrad and natural buckets") {
    gc::compressor<gc::terngrad_codec> c(gc::terngrad_codec(512));
    check_conservation<float, gc::terngrad_codec>(c, n, 24, [](int t, auto& comp) {
      if (t == 100) comp.codec() = gc::terngrad_codec(0);
    });
    gc::compressor<gc::natural_codec> m(gc::natural_codec(512));
    check_conservation<float, gc::natural_codec>(m, n, 25, [](int t, auto& comp) {
      if (t % 40 == 0) comp.codec() = gc::natural_codec(t % 80 == 0 ? 16 : 512);
    });
  }
  SECTION("any_codec: a different codec every 25 steps") {
    gc::compressor<gc::any_codec> c(gc::make_codec("qsgd:levels=15"));
    char const* const specs[] = {"qsgd:levels=15",
                                 "int8:bucket=64",
                                 "onebit",
                                 "qsgd:levels=3,bucket=0",
                                 "natural:bucket=100",
                                 "fp16",
                                 "terngrad:bucket=32",
                                 "dithering:levels=4,partition=natural,norm=l2"};
    check_conservation<float, gc::any_codec>(c, n, 26, [&](int t, auto& comp) {
      if (t % 25 == 0) comp.codec() = gc::make_codec(specs[(t / 25) % 8]);
    });
  }
}

TEST_CASE("residual feedback conserves mass for 16-bit gradients", "[feedback][residual]") {
  std::size_t const n = 700;
  SECTION("half gradients, qsgd 15 -> 3") {
    gc::compressor<gc::qsgd_codec> c(gc::qsgd_codec(15, 128));
    check_conservation<gc::half, gc::qsgd_codec>(c, n, 31, [](int t, auto& comp) {
      if (t == 100) comp.codec() = gc::qsgd_codec(3, 128);
    });
  }
  SECTION("bfloat16 gradients, int8") {
    gc::compressor<gc::int8_codec> c(gc::int8_codec(64));
    check_conservation<gc::bfloat16>(c, n, 32, {});
  }
  SECTION("half gradients, onebit via any_codec") {
    gc::compressor<gc::any_codec> c(gc::make_codec("onebit"));
    check_conservation<gc::half>(c, n, 33, {});
  }
}

TEST_CASE("residual feedback conserves mass on a tensor split over threads",
          "[feedback][residual][threads]") {
  // Big enough for several parallel chunks; fewer steps to keep the run short.
  gc::cpu::thread_pool pool(3);
  gc::codec_context ctx;
  ctx.pool = &pool;
  ctx.parallel_threshold = 0;
  std::size_t const n = 3 * gc::cpu::chunk_elements + 1234;
  gc::compressor<gc::qsgd_codec> par(gc::qsgd_codec(7, 512));
  gc::compressor<gc::qsgd_codec> ser(gc::qsgd_codec(7, 512));
  gc::codec_context serial = ctx;
  serial.parallel_threshold = SIZE_MAX;
  rng r(41);
  conservation_ledger ledger(n);
  for (int t = 0; t < 12; ++t) {
    if (t == 6) {
      par.codec() = gc::qsgd_codec(2, 1024);
      ser.codec() = gc::qsgd_codec(2, 1024);
    }
    auto const g = make_gradient(r, n);
    ctx.step = serial.step = static_cast<std::uint32_t>(t);
    auto const p = compress_packet(par, g, gc::tensor_id{3}, ctx);
    auto const q = compress_packet(ser, g, gc::tensor_id{3}, serial);
    // Same packet whatever the threading.
    REQUIRE(p == q);
    ledger.add_step(g, decode_any(p, n), par.state(gc::tensor_id{3}).values());
  }
  CHECK(ledger.worst_ratio(par.state(gc::tensor_id{3}).values()) <= 1.0);
  auto const a = par.state(gc::tensor_id{3}).values();
  auto const b = ser.state(gc::tensor_id{3}).values();
  CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
}

TEST_CASE("residual feedback follows p = g + e, send C(p), e <- p - D(C(p))",
          "[feedback][residual]") {
  std::size_t const n = 513;
  gc::qsgd_codec const codec(5, 128);
  gc::compressor<gc::qsgd_codec> comp(codec);
  rng r(51);
  std::vector<float> e(n, 0.0f);  // the test's own residual
  gc::codec_context ctx;
  ctx.seed = 99;
  for (int t = 0; t < 20; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    auto const g = make_gradient(r, n);
    std::vector<float> p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = e[i] + g[i];
    // The packet is exactly the codec's packet of p (same tensor id, same context).
    std::vector<std::byte> expect(codec.max_compressed_bytes(n));
    expect.resize(codec.compress(gc::tensor_view<float const>(p, gc::tensor_id{4}), expect, ctx));
    auto const packet = compress_packet(comp, g, gc::tensor_id{4}, ctx);
    INFO("step " << t);
    REQUIRE(packet == expect);
    // The new residual is p minus the decoded packet (up to the rounding of that subtraction
    // and of how decompress_add forms the decoded value: 2 ulps of the larger operand).
    std::vector<float> d(n);
    codec.decompress(std::span<std::byte const>(packet), std::span<float>(d));
    auto const lib = comp.state(gc::tensor_id{4}).values();
    for (std::size_t i = 0; i < n; ++i) {
      float const mine = p[i] - d[i];
      double const tol = 2.0 * float_eps * (std::fabs(p[i]) + std::fabs(d[i]));
      REQUIRE(std::fabs(static_cast<double>(lib[i]) - mine) <= tol);
      e[i] = lib[i];
    }
  }
}

TEST_CASE("residual feedback treats 16-bit gradients as their float values",
          "[feedback][residual]") {
  // A half (or bfloat16) gradient gives exactly the packets of the same values in float.
  std::size_t const n = 300;
  rng r(61);
  gc::compressor<gc::int8_codec> from_half(gc::int8_codec(64, gc::int8_rounding::stochastic));
  gc::compressor<gc::int8_codec> from_float(gc::int8_codec(64, gc::int8_rounding::stochastic));
  gc::compressor<gc::onebit_codec> from_bf16;
  gc::compressor<gc::onebit_codec> from_float2;
  gc::codec_context ctx;
  for (int t = 0; t < 10; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    auto const h = convert<gc::half>(make_gradient(r, n));
    auto const b = convert<gc::bfloat16>(make_gradient(r, n));
    REQUIRE(compress_packet(from_half, h, gc::tensor_id{1}, ctx) ==
            compress_packet(from_float, widen(h), gc::tensor_id{1}, ctx));
    REQUIRE(compress_packet(from_bf16, b, gc::tensor_id{2}, ctx) ==
            compress_packet(from_float2, widen(b), gc::tensor_id{2}, ctx));
  }
}
