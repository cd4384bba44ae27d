// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Error feedback fused with compression (`fused_feedback_codec`, feedback/policies.hpp): over
// several steps, the fused one-call path gives byte-identical packets and bit-identical
// residuals (EF) and estimates (EF21) to the reference written out here pass by pass (combine,
// compress, decompress_add), at every ISA level and thread count, for the static codec and
// through `any_codec`; a non-finite gradient fails it with the reference's message and leaves
// the state as it was; codecs without the block interface say so.

#include "../support/codec_support.hpp"

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

using namespace gradcomp_test;

// Bucket sizes that cut blocks, random groups and chunks unevenly, the whole-tensor bucket
// included; sizes that end mid-window, mid-bucket and mid-block.
std::vector<std::string> const fused_specs = {
    "fp16", "bf16", "int8", "int8:rounding=stochastic", "int8:bucket=100,rounding=stochastic",
    "int8:bucket=0", "int8:bucket=40000", "natural", "natural:bucket=100", "natural:bucket=0",
    "qsgd:levels=7", "qsgd:levels=127,bucket=0", "terngrad:bucket=300",
    "dithering:levels=8,partition=natural,norm=max,bucket=300",
    "dithering:levels=2,partition=linear,norm=l2,bucket=512"};
std::vector<std::size_t> const full_sizes = {1, 17, 1000, 16384 + 3, 70001, 300000};
// under sanitizers: a block boundary and a partial block still, over two blocks' worth of chunks
std::vector<std::size_t> const quick_sizes = {17, 16384 + 3, 70001};

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

// The three passes the fused step replaces, for residual feedback: p = e + g; C(p); e = p - D(C(p)).
std::size_t reference_residual(gc::any_codec const& c, std::vector<float>& e, std::vector<float> const& g,
                               gc::tensor_id id, std::vector<std::byte>& out, gc::codec_context const& ctx) {
  std::vector<float> p(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) p[i] = (e.empty() ? 0.0f : e[i]) + g[i];
  std::size_t const bytes = c.compress(gc::tensor_view<float const>(std::span<float const>(p), id),
                                       std::span<std::byte>(out), ctx);
  c.decompress_add(std::span<std::byte const>(out).first(bytes), std::span<float>(p), -1.0f, ctx);
  e = std::move(p);
  return bytes;
}

// The same for EF21: d = g - h; C(d); h = h + D(C(d)).
std::size_t reference_ef21(gc::any_codec const& c, std::vector<float>& h, std::vector<float> const& g,
                           gc::tensor_id id, std::vector<std::byte>& out, gc::codec_context const& ctx) {
  std::vector<float> d(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) d[i] = -((h.empty() ? 0.0f : h[i]) + -1.0f * g[i]);
  std::size_t const bytes = c.compress(gc::tensor_view<float const>(std::span<float const>(d), id),
                                       std::span<std::byte>(out), ctx);
  std::vector<float> next = h.empty() ? std::vector<float>(g.size(), 0.0f) : h;
  c.decompress_add(std::span<std::byte const>(out).first(bytes), std::span<float>(next), 1.0f, ctx);
  h = std::move(next);
  return bytes;
}

template <class Feedback, class Reference>
void check_against_reference(std::string const& spec, Reference reference) {
  gc::any_codec const codec = gc::make_codec(spec);
  REQUIRE(codec.fusable());
  constexpr std::uint32_t steps = 3;
  bool const quick = quick_mode();
  for (std::size_t n : quick ? quick_sizes : full_sizes) {
    gc::tensor_id const id{static_cast<std::uint32_t>(n % 1000)};
    // the reference, once per size: packets and states after each step
    std::vector<float> ref_state;
    std::vector<std::vector<float>> grads, states;
    std::vector<std::vector<std::byte>> packets;
    for (std::uint32_t step = 0; step < steps; ++step) {
      grads.push_back(heavy_tailed(n, 100 * step + n));
      std::vector<std::byte> out(codec.max_compressed_bytes(n));
      out.resize(reference(codec, ref_state, grads.back(), id, out, serial_ctx(gc::cpu::isa::scalar, 7, step)));
      packets.push_back(std::move(out));
      states.push_back(ref_state);
    }
    for (unsigned threads : {1u, 2u, 3u}) {
      if (quick && threads == 2) continue;
      for (gc::cpu::isa level : isa_levels) {
        if (quick && level != gc::cpu::isa::scalar && level != gc::cpu::isa::best) continue;
        gc::compressor<gc::any_codec, Feedback> fused(codec);
        std::vector<std::byte> out(codec.max_compressed_bytes(n));
        for (std::uint32_t step = 0; step < steps; ++step) {
          std::vector<float> const& g = grads[step];
          std::size_t const got = fused.compress(gc::tensor_view<float const>(std::span<float const>(g), id),
                                                 std::span<std::byte>(out), parallel_ctx(threads, level, 7, step));
          INFO(spec << ", n " << n << ", " << threads << " threads, ISA " << static_cast<int>(level) << ", step " << step);
          REQUIRE(got == packets[step].size());
          REQUIRE(std::memcmp(out.data(), packets[step].data(), got) == 0);
          auto const v = fused.state(id).values();
          REQUIRE(same_bits(std::vector<float>(v.begin(), v.end()), states[step]));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("fused residual feedback: packets and residuals identical to the three passes", "[feedback][fused]") {
  for (auto const& spec : fused_specs) check_against_reference<gc::residual_feedback>(spec, reference_residual);
}

TEST_CASE("fused EF21: packets and estimates identical to the three passes", "[feedback][fused]") {
  for (auto const& spec : fused_specs) check_against_reference<gc::ef21_feedback>(spec, reference_ef21);
}

TEST_CASE("fused feedback through the static codec type matches any_codec", "[feedback][fused]") {
  STATIC_REQUIRE(gc::fused_feedback_codec<gc::int8_codec>);
  STATIC_REQUIRE(gc::fused_feedback_codec<gc::fp16_codec>);
  STATIC_REQUIRE(gc::fused_feedback_codec<gc::qsgd_codec>);
  STATIC_REQUIRE(gc::fused_feedback_codec<gc::natural_codec>);
  STATIC_REQUIRE(gc::fused_feedback_codec<gc::any_codec>);
  STATIC_REQUIRE(!gc::fused_feedback_codec<gc::topk_codec>);
  std::size_t const n = 50000;
  gc::compressor<gc::int8_codec> typed(gc::int8_codec(256, gc::int8_rounding::stochastic));
  gc::compressor<gc::any_codec> erased(gc::make_codec("int8:bucket=256,rounding=stochastic"));
  std::vector<std::byte> a(typed.max_compressed_bytes(n)), b(a.size());
  for (std::uint32_t step = 0; step < 3; ++step) {
    std::vector<float> const g = gaussian(n, step);
    gc::codec_context const ctx = parallel_ctx(2, gc::cpu::isa::best, 3, step);
    gc::tensor_view<float const> const v(std::span<float const>(g), gc::tensor_id{5});
    std::size_t const x = typed.compress(v, std::span<std::byte>(a), ctx);
    std::size_t const y = erased.compress(v, std::span<std::byte>(b), ctx);
    REQUIRE(x == y);
    REQUIRE(std::memcmp(a.data(), b.data(), x) == 0);
  }
}

TEST_CASE("fused feedback: a non-finite gradient fails with the unfused message, state unchanged", "[feedback][fused]") {
  std::size_t const n = 40000;
  gc::compressor<gc::any_codec> comp(gc::make_codec("int8"));
  std::vector<std::byte> out(comp.max_compressed_bytes(n));
  gc::codec_context const ctx = parallel_ctx(2);
  std::vector<float> g = gaussian(n, 1);
  comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{1}), std::span<std::byte>(out), ctx);
  auto const before = std::vector<float>(comp.state(gc::tensor_id{1}).values().begin(), comp.state(gc::tensor_id{1}).values().end());
  g[33333] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(
      comp.compress(gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{1}), std::span<std::byte>(out), ctx),
      Catch::Contains("residual_feedback got the non-finite gradient value nan at element 33333 of tensor 1") &&
          Catch::Contains("state was left unchanged"));
  auto const after = comp.state(gc::tensor_id{1}).values();
  REQUIRE(same_bits(std::vector<float>(after.begin(), after.end()), before));
  // an overflow of the residual, not of the gradient: fp16 sends 3e38 as infinity, which leaves
  // an infinite residual
  std::vector<float> big(n, 3e38f);
  gc::compressor<gc::any_codec> over(gc::make_codec("fp16"));
  out.resize(over.max_compressed_bytes(n));
  over.compress(gc::tensor_view<float const>(std::span<float const>(big), gc::tensor_id{2}), std::span<std::byte>(out), ctx);
  auto const kept = std::vector<float>(over.state(gc::tensor_id{2}).values().begin(), over.state(gc::tensor_id{2}).values().end());
  REQUIRE_THROWS_WITH(
      over.compress(gc::tensor_view<float const>(std::span<float const>(big), gc::tensor_id{2}), std::span<std::byte>(out), ctx),
      Catch::Contains("state overflowed float32 on tensor 2"));
  auto const still = over.state(gc::tensor_id{2}).values();
  REQUIRE(same_bits(std::vector<float>(still.begin(), still.end()), kept));
}

TEST_CASE("codecs without the block interface are not fusable and say so", "[feedback][fused]") {
  for (char const* spec : {"topk:ratio=0.01", "onebit", "randomk:ratio=0.1", "identity"}) {
    gc::any_codec const c = gc::make_codec(spec);
    INFO(spec);
    REQUIRE_FALSE(c.fusable());
    std::vector<float> x(10);
    std::vector<std::byte> out(c.max_compressed_bytes(10));
    auto fill = [](std::size_t, std::size_t) { return true; };
    REQUIRE_THROWS_WITH(c.compress_fused(x.data(), 10, gc::tensor_id{0}, std::span<std::byte>(out), gc::block_fill(fill),
                                         gc::block_fill(fill), -1.0f),
                        Catch::Contains("does not fuse error feedback"));
  }
}
