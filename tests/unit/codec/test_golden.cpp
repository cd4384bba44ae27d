// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Golden packets: for every codec variant, a fixed 37-element input (formula_input, exact
// dyadic values) compressed with seed 0x0123456789abcdef, step 7 and tensor id 3 must give
// exactly these bytes, at every ISA level and thread count, and its header must decode to the
// listed fields.
//
// These bytes ARE the wire format (docs/wire-format.md). If one of them changes, the change is
// a wire-format change: bump `wire_version`, update docs/wire-format.md and regenerate the
// vectors deliberately — never just paste the new output here. Packets written by older builds
// (and by the CUDA backend, which must match the CPU) would otherwise decode differently.
//
// To regenerate after a deliberate format change, run
//   GRADCOMP_GOLDEN_PRINT=1 gradcomp_tests "golden packets: every codec writes*"
// which prints the current packets, then review them as described below before pasting.
//
// The vectors were generated once with the CPU backend and reviewed: magic "GCPK", version 1
// (now 2: wire format 2 changed only how stochastic codecs share their draws, which for these
// 37 elements, all in the first 128-element group, gives the draws of format 1; the mapping
// itself is pinned by the known-answer draws of test_philox.cpp),
// codec/dtype/variant bytes, count 37, payload sizes per the codec headers, parameters
// (bucket, levels); identity payloads are the input bytes, fp16 of f32 equals identity of the
// same values as binary16, onebit's scale is mean|x| with sign bits 0x19 for elements 0..7
// (-0 counted positive), int8 ranges are the bucket min/max, natural's exponent bytes are
// 0x81/0x80/0x80 (max |x| 4, 2.25, 3.5), TernGrad scales are the bucket max |x|. random_k
// (added later): both packets share the check word of (seed, step, tensor 3); the k = 5
// support is a subset of the k = 9 one (values 4.111 = 37/9 times the inputs there);
// approx_topk k = 6, tolerance 0.2: format 1 stopped at the first histogram's bin boundary
// holding 5 elements (4, 4, 3.5, 2.75, 2.75); since 0.2.0 a single tensor gets the exact top 6,
// those five and 2.25 (approx_topk.hpp). int4 (added with
// codec id 15): scales f32(m / 7) for bucket maxima 4, 2.25, 3.5 (4/7, 9/28, 1/2); element 0,
// -0.5625, is level -1 (nibble 7), element 1, 2.75, level 5 (nibble 13): byte 0xd7; the last
// byte 0x07 holds element 36 (-0.3125, level -1) and the zero padding nibble.
// chunk_topk (codec id 16), chunks of 16 keeping 3: values 2.75, 4, -4 at indices 1, 5, 9 of
// chunk 0 (index nibbles 0x51, then 9 and chunk 1's first index 3: 0x39), and in the 5-element
// last chunk its three largest, -0.46875, 3.5, 0.75 at indices 0, 1, 2; with 2-bit values and
// chunks of 8 the steps are m / 2 (2, 2, 1.0625, 1.125, 1.75).

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"
#include "../support/golden_packets.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

std::vector<std::byte> make_packet(golden const& g, gc::codec_context const& ctx) {
  gc::any_codec const c = gc::make_codec(g.spec);
  auto const x = formula_input(37);
  switch (g.input) {
    case gc::dtype::f16: return compress(c, convert_to<gc::half>(x), ctx, golden_tensor);
    case gc::dtype::bf16: return compress(c, convert_to<gc::bfloat16>(x), ctx, golden_tensor);
    default: return compress(c, x, ctx, golden_tensor);
  }
}

}  // namespace

TEST_CASE("golden packets: every codec writes the frozen wire bytes", "[codec][golden][wire]") {
  if (std::getenv("GRADCOMP_GOLDEN_PRINT") != nullptr) {
    for (auto const& g : goldens) {
      std::string const hex =
          to_hex(make_packet(g, serial_ctx(gc::cpu::isa::scalar, golden_seed, golden_step)));
      std::printf("%s (%s input):\n", g.spec, std::string(gc::dtype_name(g.input)).c_str());
      for (std::size_t i = 0; i < hex.size(); i += 80)
        std::printf("  \"%s\"\n", hex.substr(i, 80).c_str());
    }
  }
  for (auto const& g : goldens) {
    CAPTURE(g.spec, gc::dtype_name(g.input));
    auto const want = from_hex(g.hex);
    REQUIRE(to_hex(want) == g.hex);  // the literal is well-formed lower-case hex
    REQUIRE(gc::read_header(want) == g.header);
    for (auto const& ctx : {serial_ctx(gc::cpu::isa::scalar, golden_seed, golden_step),
                            serial_ctx(gc::cpu::isa::avx2, golden_seed, golden_step),
                            serial_ctx(gc::cpu::isa::avx512, golden_seed, golden_step),
                            parallel_ctx(2, gc::cpu::isa::best, golden_seed, golden_step)}) {
      CAPTURE(gc::cpu::isa_name(ctx.isa));
      auto const got = make_packet(g, ctx);
      REQUIRE(to_hex(got) == g.hex);
    }
  }
}

TEST_CASE("golden packets decode to the values their codec documents", "[codec][golden][wire]") {
  auto const x = formula_input(37);
  for (auto const& g : goldens) {
    CAPTURE(g.spec);
    gc::any_codec const c = gc::make_codec(g.spec);
    auto const p = from_hex(g.hex);
    // random_k regenerates its coordinates from the sender's seed and step.
    auto const ctx = serial_ctx(gc::cpu::isa::best, golden_seed, golden_step);
    auto const y = decompress<float>(c, p, 37, ctx);
    std::string const spec = g.spec;
    if (spec == "identity" || spec == "fp16" || spec == "bf16") {
      // Lossless for these dyadic inputs (all fit binary16 and bfloat16).
      for (std::size_t i = 0; i < 37; ++i) REQUIRE(bits_of(y[i]) == bits_of(x[i]));
    } else if (spec.rfind("onebit", 0) == 0) {
      float const s = get_f32(p, hdr);
      REQUIRE(s == (g.header.variant == 1 ? 1.0f : 0x1.28dd68p+0f));
      for (std::size_t i = 0; i < 37; ++i) REQUIRE(y[i] == (x[i] < 0 ? -s : s));
    } else if (spec == "terngrad:bucket=16") {
      float const m[3] = {4.0f, 2.25f, 3.5f};
      for (std::size_t i = 0; i < 37; ++i) {
        REQUIRE((y[i] == 0.0f || y[i] == (x[i] < 0 ? -m[i / 16] : m[i / 16])));
      }
    } else if (spec == "natural:bucket=16") {
      for (std::size_t i = 0; i < 37; ++i) {
        double const r = std::fabs(static_cast<double>(y[i])),
                     a = std::fabs(static_cast<double>(x[i]));
        REQUIRE((r == 0 ? a == 0 : (r >= a / 2 && r <= 2 * a)));
      }
    }
    // Every golden packet survives a decode-encode-free round trip through decompress_any.
    std::vector<float> z(37);
    gc::decompress_any(std::span<std::byte const>(p), std::span<float>(z), 1.0f, false, ctx);
    REQUIRE(z == y);
    // The same packet written by a format-1 build (version byte 1) decodes to the same values.
    auto v1 = p;
    v1[4] = std::byte{1};
    auto const y1 = decompress<float>(c, v1, 37, ctx);
    for (std::size_t i = 0; i < 37; ++i) REQUIRE(bits_of(y1[i]) == bits_of(y[i]));
  }
}
