// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// DGC (Deep Gradient Compression) through `compressor`: the update rule on a hand-worked example,
// momentum factor masking, equality with residual feedback at momentum 0, conservation of the
// momentum-corrected stream, local gradient clipping, the sparsity warm-up schedule, state
// save/load, rejection of bad gradients with the state unchanged, 16-bit gradients, and
// thread-count independence.

#include "feedback_support.hpp"

#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace feedback_test;

static_assert(gc::feedback_policy<gc::dgc_feedback, gc::topk_codec>);
static_assert(gc::feedback_policy<gc::dgc_feedback, gc::any_codec>);
static_assert(gc::dgc_feedback::id == gc::feedback_id::dgc);
static_assert(static_cast<int>(gc::feedback_id::dgc) == 3);

namespace {

using dgc_compressor = gc::compressor<gc::topk_codec, gc::dgc_feedback>;

// The indices a sparse packet carries, parsed from its bytes.
std::vector<std::uint32_t> packet_indices(std::vector<std::byte> const& packet) {
  gc::packet_header const h = gc::read_header(packet);
  std::vector<std::uint32_t> idx;
  gc::detail::sparse::read_indices(h, packet.data() + gc::header_bytes, idx);
  return idx;
}

std::vector<float> copy(std::span<float const> s) { return {s.begin(), s.end()}; }

bool same_bits(std::span<float const> a, std::span<float const> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  }
  return true;
}

double l2(std::vector<float> const& x) {
  double s = 0.0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("dgc follows u = m u + g, v = v + u, send top-k of v, mask u and v", "[feedback][dgc]") {
  // Dyadic values: every step is exact in float.
  dgc_compressor comp(gc::topk_codec::count(2), gc::dgc_feedback(0.5f));
  gc::tensor_id const id{7};
  std::vector<float> const g1 = {1, -4, 2, 0.5f, 3, -1, 0, 0.25f};
  std::vector<float> const g2 = {1, 1, -1, 0.5f, 1, 2, 0.5f, 0};
  gc::codec_context ctx;

  auto const p1 = compress_packet(comp, g1, id, ctx);
  CHECK(packet_indices(p1) == std::vector<std::uint32_t>{1, 4});
  CHECK(decode_any(p1, 8) == std::vector<float>{0, -4, 0, 0, 3, 0, 0, 0});
  CHECK(copy(comp.state(id).momentum()) == std::vector<float>{1, 0, 2, 0.5f, 0, -1, 0, 0.25f});
  CHECK(copy(comp.state(id).accumulation()) == std::vector<float>{1, 0, 2, 0.5f, 0, -1, 0, 0.25f});

  // u = 0.5 u + g2 = [1.5, 1, 0, 0.75, 1, 1.5, 0.5, 0.125]; v = [2.5, 1, 2, 1.25, 1, 0.5, 0.5,
  // 0.375]
  auto const p2 = compress_packet(comp, g2, id, ctx);
  CHECK(packet_indices(p2) == std::vector<std::uint32_t>{0, 2});
  CHECK(decode_any(p2, 8) == std::vector<float>{2.5f, 0, 2, 0, 0, 0, 0, 0});
  CHECK(copy(comp.state(id).momentum()) ==
        std::vector<float>{0, 1, 0, 0.75f, 1, 1.5f, 0.5f, 0.125f});
  CHECK(copy(comp.state(id).accumulation()) ==
        std::vector<float>{0, 1, 0, 1.25f, 1, 0.5f, 0.5f, 0.375f});
  // values() is [u | v].
  auto const all = comp.state(id).values();
  REQUIRE(all.size() == 16);
  CHECK(all[3] == 0.75f);
  CHECK(all[8 + 3] == 1.25f);
}

TEST_CASE("dgc momentum factor masking zeroes u and v at the sent coordinates", "[feedback][dgc]") {
  std::size_t const n = 777;
  float const m = 0.9f;
  auto run = [&](gc::sparse_values values) {
    dgc_compressor comp(gc::topk_codec::ratio(0.02, values), gc::dgc_feedback(m));
    gc::tensor_id const id{3};
    rng r(101);
    gc::codec_context ctx;
    std::vector<float> u_prev(n, 0.0f);
    std::size_t checked_off = 0;
    for (int t = 0; t < 40; ++t) {
      auto const g = make_gradient(r, n);
      auto const packet = compress_packet(comp, g, id, ctx);
      auto const idx = packet_indices(packet);
      REQUIRE(idx.size() == comp.codec().k_for(n));
      auto const decoded = decode_any(packet, n);
      auto const u = comp.state(id).momentum();
      auto const v = comp.state(id).accumulation();
      std::vector<bool> sent(n, false);
      for (std::uint32_t i : idx) {
        sent[i] = true;
        INFO("step " << t << ", sent index " << i);
        CHECK(u[i] == 0.0f);
        if (values == gc::sparse_values::f32) {
          CHECK(v[i] == 0.0f);
        } else {
          // Only the rounding error of the 16-bit value stays behind.
          CHECK(std::fabs(v[i]) <= 0x1p-8 * std::fabs(decoded[i]));
        }
      }
      // Elsewhere u is the momentum update, untouched.
      for (std::size_t i = 0; i < n; ++i) {
        if (sent[i]) continue;
        double const expect = static_cast<double>(m) * u_prev[i] + g[i];
        double const tol = 2.0 * float_eps * (std::fabs(m * u_prev[i]) + std::fabs(g[i]));
        INFO("step " << t << ", unsent index " << i);
        REQUIRE(std::fabs(u[i] - expect) <= tol);
        ++checked_off;
      }
      u_prev = copy(u);
    }
    CHECK(checked_off > 30 * n);
  };
  SECTION("f32 values: v is exactly zero on the support") { run(gc::sparse_values::f32); }
  SECTION("bf16 values: v keeps only the rounding error") { run(gc::sparse_values::bf16); }
}

TEST_CASE("dgc masks the momentum on the selected support, also where a value decodes to zero",
          "[feedback][dgc][regression]") {
  // Regression: masking tested `decoded != 0`, so a selected coordinate whose value rounds to
  // zero in f16 kept its momentum. Values far below f16's smallest subnormal (~6e-8) decode to 0.
  dgc_compressor comp(gc::topk_codec::count(2, gc::sparse_values::f16), gc::dgc_feedback(0.5f));
  gc::tensor_id const id{5};
  std::vector<float> const g = {1e-10f, -2e-10f, 0.0f, 1e-12f};
  gc::codec_context ctx;
  auto const p = compress_packet(comp, g, id, ctx);
  REQUIRE(packet_indices(p) == std::vector<std::uint32_t>{0, 1});
  REQUIRE(decode_any(p, 4) == std::vector<float>{0, 0, 0, 0});
  // u is masked on the support {0, 1}, untouched elsewhere; v keeps what the packet lost.
  CHECK(copy(comp.state(id).momentum()) == std::vector<float>{0, 0, 0, 1e-12f});
  CHECK(copy(comp.state(id).accumulation()) == g);
}

TEST_CASE("dgc with a dense codec masks the momentum everywhere (every coordinate is sent)",
          "[feedback][dgc]") {
  gc::compressor<gc::any_codec, gc::dgc_feedback> comp(gc::make_codec("fp16"), gc::dgc_feedback(0.5f));
  gc::tensor_id const id{6};
  std::vector<float> const g = {1e-10f, 2.0f, -3.0f, 0.0f};
  gc::codec_context ctx;
  auto const p = compress_packet(comp, g, id, ctx);
  CHECK(copy(comp.state(id).momentum()) == std::vector<float>{0, 0, 0, 0});
  CHECK(copy(comp.state(id).accumulation()) == std::vector<float>{1e-10f, 0, 0, 0});
}

TEST_CASE("dgc with momentum 0 and no clipping is residual feedback", "[feedback][dgc]") {
  std::size_t const n = 1001;
  gc::schedule_controller const warm = gc::dgc_warmup(6);  // 25% -> ... -> 0.1% over 24 steps
  dgc_compressor dgc(gc::dgc_topk(warm, 0), gc::dgc_feedback(0.0f));
  gc::compressor<gc::topk_codec, gc::residual_feedback> ef(gc::dgc_topk(warm, 0));
  rng r(202);
  gc::codec_context ctx;
  for (int t = 0; t < 40; ++t) {
    // The warm-up, then f16 and bf16 values for a while: the codec changes between steps.
    gc::sparse_values const values =
        t >= 36 ? gc::sparse_values::bf16
                : (t >= 30 ? gc::sparse_values::f16 : gc::sparse_values::f32);
    dgc.codec() = gc::dgc_topk(warm, static_cast<std::uint64_t>(t), values);
    ef.codec() = dgc.codec();
    auto const g = make_gradient(r, n);
    INFO("step " << t);
    REQUIRE(compress_packet(dgc, g, gc::tensor_id{5}, ctx) ==
            compress_packet(ef, g, gc::tensor_id{5}, ctx));
    REQUIRE(
        same_bits(dgc.state(gc::tensor_id{5}).accumulation(), ef.state(gc::tensor_id{5}).values()));
  }
}

TEST_CASE("dgc conserves the momentum-corrected stream", "[feedback][dgc]") {
  // Sum over steps of (m u_prev + g) = sum of decoded packets + v, up to float rounding: the
  // budget per step is that of the three float operations (u, v, v - d), as in
  // conservation_ledger.
  std::size_t const n = 900;
  float const m = 0.9f;
  auto run = [&](auto make_comp, std::uint64_t seed) {
    auto comp = make_comp();
    gc::tensor_id const id{9};
    gc::schedule_controller const warm = gc::dgc_warmup(10, 100.0, 3);  // 25%, 6.25%, 1.5625%, 1%
    rng r(seed);
    gc::codec_context ctx;
    std::vector<double> stream(n, 0.0), sum_d(n, 0.0), budget(n, 0.0), sum_abs_u(n, 0.0);
    std::vector<float> u_prev(n, 0.0f), v_prev(n, 0.0f);
    int const steps = 120;
    for (int t = 0; t < steps; ++t) {
      if constexpr (std::same_as<typename decltype(comp)::codec_type, gc::topk_codec>) {
        comp.codec() = gc::dgc_topk(warm, static_cast<std::uint64_t>(t));
      }
      auto const g = make_gradient(r, n);
      auto const packet = compress_packet(comp, g, id, ctx);
      auto const d = decode_any(packet, n);
      auto const v = comp.state(id).accumulation();
      for (std::size_t i = 0; i < n; ++i) {
        double const mu = static_cast<double>(m) * u_prev[i];
        double const u_new = mu + g[i];
        stream[i] += u_new;
        sum_d[i] += d[i];
        sum_abs_u[i] += std::fabs(u_new);
        budget[i] += std::fabs(mu) + 2.0 * std::fabs(u_new) + std::fabs(v_prev[i]) +
                     std::fabs(v[i]) + std::fabs(d[i]);
      }
      u_prev = copy(comp.state(id).momentum());
      v_prev = copy(v);
    }
    double worst = 0.0;
    std::size_t where = 0;
    bool meaningful = true;
    for (std::size_t i = 0; i < n; ++i) {
      double const diff = std::fabs(stream[i] - (sum_d[i] + v_prev[i]));
      double const tol = 4.0 * float_eps * budget[i] + 1e-12 * (sum_abs_u[i] + budget[i]) + 1e-30;
      if (diff / tol > worst) {
        worst = diff / tol;
        where = i;
      }
      if (4.0 * float_eps * budget[i] > 0.01 * sum_abs_u[i] / steps) meaningful = false;
    }
    INFO("worst element " << where << ": stream " << stream[where] << ", decoded " << sum_d[where]
                          << ", v " << v_prev[where]);
    CHECK(worst <= 1.0);
    CHECK(meaningful);
  };
  SECTION("top-k through the warm-up") {
    run([&] { return dgc_compressor(gc::topk_codec::ratio(0.25), gc::dgc_feedback(m)); }, 301);
  }
  SECTION("a dense codec (int8): u is masked wherever the packet is non-zero") {
    run(
        [&] {
          return gc::compressor<gc::int8_codec, gc::dgc_feedback>(gc::int8_codec(64),
                                                                  gc::dgc_feedback(m));
        },
        302);
  }
}

TEST_CASE("dgc clips each worker's gradient to clip_norm / sqrt(workers)", "[feedback][dgc]") {
  std::size_t const n = 1000;
  std::vector<float> const big = gradcomp_test::gaussian(n, 401, 10.0);  // norm ~316
  double const norm = l2(big);
  REQUIRE(norm > 100.0);
  SECTION("the first step with momentum 0 sends exactly the clipped gradient") {
    for (std::uint32_t workers : {1u, 4u, 9u}) {
      double const clip = 12.0;
      double const bound = clip / std::sqrt(static_cast<double>(workers));
      // With momentum 0 the first step's u (= v before sending) is the clipped gradient, and
      // decoded + v recovers it exactly.
      dgc_compressor comp(gc::topk_codec::ratio(0.05), gc::dgc_feedback(0.0f, clip, workers));
      CHECK(comp.feedback().local_clip_norm() == Approx(bound).epsilon(1e-15));
      auto const packet = compress_packet(comp, big, gc::tensor_id{1}, gc::codec_context{});
      auto const d = decode_any(packet, n);
      auto const v = comp.state(gc::tensor_id{1}).accumulation();
      std::vector<float> clipped(n);
      for (std::size_t i = 0; i < n; ++i) clipped[i] = d[i] + v[i];
      INFO("workers " << workers);
      CHECK(l2(clipped) <= bound * (1.0 + 1e-6));
      CHECK(l2(clipped) >= bound * (1.0 - 1e-6));
      float const s = static_cast<float>(bound / norm);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(clipped[i] == big[i] * s);
    }
  }
  SECTION("a gradient within the bound is not changed") {
    std::vector<float> const small = gradcomp_test::gaussian(n, 402, 0.1);  // norm ~3.2
    dgc_compressor clipped(gc::topk_codec::ratio(0.05), gc::dgc_feedback(0.9f, 8.0, 4));  // bound 4
    dgc_compressor plain(gc::topk_codec::ratio(0.05), gc::dgc_feedback(0.9f));
    rng r(403);
    for (int t = 0; t < 10; ++t) {
      std::vector<float> g = small;
      for (auto& x : g) x = static_cast<float>(x * (0.9 + 0.2 * r.uniform()));
      REQUIRE(l2(g) < 4.0);
      REQUIRE(compress_packet(clipped, g, gc::tensor_id{2}, {}) ==
              compress_packet(plain, g, gc::tensor_id{2}, {}));
    }
  }
  SECTION("clipping applies before momentum: every step adds at most the bound to the stream") {
    dgc_compressor comp(gc::topk_codec::ratio(0.01), gc::dgc_feedback(0.5f, 2.0, 1));
    rng r(404);
    std::vector<float> u_prev(n, 0.0f);
    for (int t = 0; t < 10; ++t) {
      auto g = make_gradient(r, n);
      for (auto& x : g) x *= 100.0f;
      (void)compress_packet(comp, g, gc::tensor_id{3}, {});
      // Off the support, u - m u_prev is the clipped gradient; its norm there is below 2.
      auto const u = comp.state(gc::tensor_id{3}).momentum();
      double sq = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        if (u[i] == 0.0f) continue;
        double const c = u[i] - 0.5 * u_prev[i];
        sq += c * c;
      }
      CHECK(std::sqrt(sq) <= 2.0 * (1.0 + 1e-5));
      u_prev = copy(u);
    }
  }
}

TEST_CASE("dgc parameters are validated", "[feedback][dgc]") {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  double const inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(gc::dgc_feedback(-0.1f), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(1.0f), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(nan), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(0.9f, -1.0), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(0.9f, inf), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(0.9f, static_cast<double>(nan)), gc::config_error);
  CHECK_THROWS_AS(gc::dgc_feedback(0.9f, 1.0, 0), gc::config_error);
  CHECK_THROWS_WITH(gc::dgc_feedback(1.5f), Catch::Contains("[0, 1)"));
  gc::dgc_feedback const d(0.0f, 0.0, 3);
  CHECK(d.momentum() == 0.0f);
  CHECK(d.local_clip_norm() == 0.0);
  gc::dgc_feedback const def;
  CHECK(def.momentum() == 0.9f);
  CHECK(def.clip_norm() == 0.0);
  CHECK(def.workers() == 1);
}

TEST_CASE("sparsity warm-up: dgc_topk follows DGC's exponential schedule (dgc_warmup)",
          "[feedback][dgc][schedule]") {
  gc::schedule_controller const w = gc::dgc_warmup(100);
  std::vector<std::pair<std::uint64_t, double>> const expect = {
      {0, 0.25},         {99, 0.25},        {100, 0.0625}, {199, 0.0625},      {200, 0.015625},
      {300, 0.00390625}, {399, 0.00390625}, {400, 0.001},  {1000000000, 0.001}};
  for (auto [step, density] : expect) {
    INFO("step " << step);
    CHECK(gc::dgc_topk(w, step).ratio_value() == density);
  }
  // The paper's sparsities: 75%, 93.75%, 98.4375%, 99.6%, 99.9%.
  CHECK(1.0 - gc::dgc_topk(w, 0).ratio_value() == 0.75);
  CHECK(1.0 - gc::dgc_topk(w, 100).ratio_value() == 0.9375);
  CHECK(1.0 - gc::dgc_topk(w, 200).ratio_value() == 0.984375);
  CHECK(1.0 - gc::dgc_topk(w, 300).ratio_value() == Approx(0.996).margin(1e-3));
  CHECK(1.0 - gc::dgc_topk(w, 400).ratio_value() == Approx(0.999).epsilon(1e-15));

  gc::schedule_controller const halves = gc::dgc_warmup(10, 10.0, 3, 2.0);
  CHECK(gc::dgc_topk(halves, 0).ratio_value() == 0.5);
  CHECK(gc::dgc_topk(halves, 10).ratio_value() == 0.25);
  CHECK(gc::dgc_topk(halves, 25).ratio_value() == 0.125);
  CHECK(gc::dgc_topk(halves, 30).ratio_value() == 0.1);
  CHECK(gc::dgc_topk(gc::dgc_warmup(5, 100.0, 0), 0).ratio_value() == 0.01);  // no warm-up

  // The matching top-k codec.
  gc::topk_codec const c = gc::dgc_topk(w, 150, gc::sparse_values::f16);
  CHECK(c.ratio_value() == 0.0625);
  CHECK(c.value_type() == gc::sparse_values::f16);
  CHECK(c.k_for(1600) == 100);
}

TEST_CASE("dgc state is saved and restored exactly", "[feedback][dgc][state]") {
  auto make = [] {
    return dgc_compressor(gc::topk_codec::ratio(0.03), gc::dgc_feedback(0.9f, 50.0, 2));
  };
  dgc_compressor a = make();
  rng r(501);
  gc::codec_context ctx;
  for (int t = 0; t < 8; ++t) {
    (void)compress_packet(a, make_gradient(r, 300), gc::tensor_id{1}, ctx);
    (void)compress_packet(a, make_gradient(r, 50), gc::tensor_id{4}, ctx);
  }
  auto const saved = a.save();
  // Header, then per tensor id, n = 2 x elements, [u | v].
  CHECK(saved.size() == 16 + (12 + 4 * 600) + (12 + 4 * 100) + 4);  // and the checksum
  dgc_compressor b = make();
  b.load(saved);
  CHECK(b.save() == saved);
  CHECK(same_bits(b.state(gc::tensor_id{1}).momentum(), a.state(gc::tensor_id{1}).momentum()));
  CHECK(same_bits(b.state(gc::tensor_id{4}).accumulation(),
                  a.state(gc::tensor_id{4}).accumulation()));
  for (int t = 0; t < 5; ++t) {
    auto const g1 = make_gradient(r, 300);
    auto const g4 = make_gradient(r, 50);
    REQUIRE(compress_packet(a, g1, gc::tensor_id{1}, ctx) ==
            compress_packet(b, g1, gc::tensor_id{1}, ctx));
    REQUIRE(compress_packet(a, g4, gc::tensor_id{4}, ctx) ==
            compress_packet(b, g4, gc::tensor_id{4}, ctx));
  }
  CHECK(a.save() == b.save());

  SECTION("an odd-length record is refused, the state kept") {
    auto bad = saved;
    // Tensor 1's record: n 600 -> 599, and drop one value (the last 4 bytes of its record).
    gc::detail::store_le<std::uint64_t>(bad.data() + 16 + 4, 599);
    bad.erase(bad.begin() + 16 + 12 + 4 * 599, bad.begin() + 16 + 12 + 4 * 600);
    gc::detail::seal_state(bad);  // the checksum recomputed: the parser refuses it
    auto const before = b.save();
    CHECK_THROWS_AS(b.load(bad), gc::format_error);
    CHECK(b.save() == before);
  }
  SECTION("another policy's state is refused") {
    gc::compressor<gc::topk_codec, gc::residual_feedback> ef;
    (void)compress_packet(ef, make_gradient(r, 300), gc::tensor_id{1}, ctx);
    CHECK_THROWS_AS(b.load(ef.save()), gc::format_error);
    CHECK_THROWS_AS(ef.load(saved), gc::format_error);
  }
  SECTION("a restored state of another size is refused at the next step") {
    auto const before = b.save();
    CHECK_THROWS_AS(compress_packet(b, make_gradient(r, 301), gc::tensor_id{1}, ctx),
                    gc::config_error);
    CHECK(b.save() == before);
  }
}

TEST_CASE("dgc rejects a non-finite gradient or an overflow and keeps its state",
          "[feedback][dgc][state][nonfinite]") {
  std::size_t const n = 400;
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  SECTION("NaN and infinities, with and without clipping") {
    for (double clip : {0.0, 5.0}) {
      dgc_compressor comp(gc::topk_codec::ratio(0.05), gc::dgc_feedback(0.9f, clip, 1));
      rng r(601);
      for (int t = 0; t < 5; ++t)
        (void)compress_packet(comp, make_gradient(r, n), gc::tensor_id{2}, {});
      auto const before = comp.save();
      for (float bad : {nan, inf, -inf}) {
        auto g = make_gradient(r, n);
        g[137] = bad;
        INFO("clip " << clip << ", value " << bad);
        std::vector<std::byte> buf(comp.max_compressed_bytes(n));
        CHECK_THROWS_WITH(
            comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{2}),
                          std::span<std::byte>(buf)),
            Catch::Contains("element 137") && Catch::Contains("unchanged"));
        CHECK(comp.save() == before);
        // A fresh tensor id gets no state either.
        CHECK_THROWS_AS(
            comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{8}),
                          std::span<std::byte>(buf)),
            gc::numeric_error);
        CHECK(comp.save() == before);
      }
    }
  }
  SECTION("the momentum overflowing float32") {
    dgc_compressor comp(gc::topk_codec::count(1), gc::dgc_feedback(0.9f));
    std::vector<float> g(8, 1.0f);
    g[0] = g[1] = 3.0e38f;
    (void)compress_packet(comp, g, gc::tensor_id{1}, {});  // sends element 0; u[1] = v[1] = 3e38
    CHECK(comp.state(gc::tensor_id{1}).momentum()[1] == 3.0e38f);
    auto const before = comp.save();
    std::vector<std::byte> buf(comp.max_compressed_bytes(8));
    CHECK_THROWS_WITH(
        comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{1}),
                      std::span<std::byte>(buf)),
        Catch::Contains("overflowed"));
    CHECK(comp.save() == before);
  }
  SECTION("a codec error (output too small) keeps the state") {
    dgc_compressor comp(gc::topk_codec::ratio(0.05), gc::dgc_feedback(0.9f));
    rng r(602);
    (void)compress_packet(comp, make_gradient(r, n), gc::tensor_id{2}, {});
    auto const before = comp.save();
    auto const g = make_gradient(r, n);
    std::vector<std::byte> buf(40);
    CHECK_THROWS_AS(
        comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{2}),
                      std::span<std::byte>(buf)),
        gc::config_error);
    CHECK(comp.save() == before);
  }
}

TEST_CASE("dgc treats f16 and bf16 gradients as their float values", "[feedback][dgc]") {
  std::size_t const n = 600;
  dgc_compressor from_half(gc::topk_codec::ratio(0.02), gc::dgc_feedback(0.9f, 30.0, 4));
  dgc_compressor from_float(gc::topk_codec::ratio(0.02), gc::dgc_feedback(0.9f, 30.0, 4));
  dgc_compressor from_bf16(gc::topk_codec::ratio(0.02, gc::sparse_values::bf16),
                           gc::dgc_feedback(0.8f));
  dgc_compressor from_float2(gc::topk_codec::ratio(0.02, gc::sparse_values::bf16),
                             gc::dgc_feedback(0.8f));
  rng r(701);
  for (int t = 0; t < 12; ++t) {
    auto const h = convert<gc::half>(make_gradient(r, n));
    auto const b = convert<gc::bfloat16>(make_gradient(r, n));
    INFO("step " << t);
    auto const ph = compress_packet(from_half, h, gc::tensor_id{1}, {});
    REQUIRE(ph == compress_packet(from_float, widen(h), gc::tensor_id{1}, {}));
    // The packet carries v, which is float whatever the gradient's type (as with residual
    // feedback).
    CHECK(gc::read_header(ph).type == gc::dtype::f32);
    REQUIRE(compress_packet(from_bf16, b, gc::tensor_id{2}, {}) ==
            compress_packet(from_float2, widen(b), gc::tensor_id{2}, {}));
  }
  CHECK(from_half.save() == from_float.save());
  CHECK(from_bf16.save() == from_float2.save());
}

TEST_CASE("dgc gives the same packets and state on any number of threads",
          "[feedback][dgc][threads]") {
  gc::cpu::thread_pool pool(3);
  gc::codec_context par;
  par.pool = &pool;
  par.parallel_threshold = 0;
  gc::codec_context ser = par;
  ser.parallel_threshold = SIZE_MAX;
  std::size_t const n = 3 * gc::cpu::chunk_elements + 1234;
  dgc_compressor a(gc::topk_codec::ratio(0.01), gc::dgc_feedback(0.9f, 100.0, 4));
  dgc_compressor b(gc::topk_codec::ratio(0.01), gc::dgc_feedback(0.9f, 100.0, 4));
  rng r(801);
  for (int t = 0; t < 4; ++t) {
    auto const g = make_gradient(r, n);
    REQUIRE(compress_packet(a, g, gc::tensor_id{1}, par) ==
            compress_packet(b, g, gc::tensor_id{1}, ser));
  }
  CHECK(a.save() == b.save());
}
