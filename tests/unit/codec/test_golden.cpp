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
// those five and 2.25 (approx_topk.hpp).

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

struct golden {
  char const* spec;  ///< make_codec spec
  gc::dtype input;   ///< element type fed to compress
  gc::packet_header header;
  char const* hex;
};

// clang-format off
golden const goldens[] = {
    {"identity", gc::dtype::f32, {gc::codec_id(1), gc::dtype(1), 0, 37, 148, 0, 0},
         "4743504b02010100250000000000000094000000000000000000000000000000"
         "000010bf000030400000c03e000020bf0000d0be000080400000008000000000000080be000080c0"
         "0000d03f0000203f0000c0bd000030c0000010400000a03f0000803d0000c0bf0000e0bf0000f03f"
         "0000603e000080be000090bf000008c00000c03e0000803f000000bf0000c0bf0000083f00001040"
         "0000003e000060bf0000f0be000060400000403f000080be0000a0be"},
    {"identity", gc::dtype::f16, {gc::codec_id(1), gc::dtype(2), 0, 37, 74, 0, 0},
         "4743504b0201020025000000000000004a000000000000000000000000000000"
         "80b88041003600b980b600440080000000b400c4803e003900ae80c18040003d002c00be00bf803f"
         "003300b480bc40c00036003c00b800be40388040003000bb80b70043003a00b400b5"},
    {"identity", gc::dtype::bf16, {gc::codec_id(1), gc::dtype(3), 0, 37, 74, 0, 0},
         "4743504b0201030025000000000000004a000000000000000000000000000000"
         "10bf3040c03e20bfd0be80400080000080be80c0d03f203fc0bd30c01040a03f803dc0bfe0bff03f"
         "603e80be90bf08c0c03e803f00bfc0bf083f1040003e60bff0be6040403f80bea0be"},
    {"fp16", gc::dtype::f32, {gc::codec_id(2), gc::dtype(1), 0, 37, 74, 0, 0},
         "4743504b0202010025000000000000004a000000000000000000000000000000"
         "80b88041003600b980b600440080000000b400c4803e003900ae80c18040003d002c00be00bf803f"
         "003300b480bc40c00036003c00b800be40388040003000bb80b70043003a00b400b5"},
    {"bf16", gc::dtype::f32, {gc::codec_id(3), gc::dtype(1), 0, 37, 74, 0, 0},
         "4743504b0203010025000000000000004a000000000000000000000000000000"
         "10bf3040c03e20bfd0be80400080000080be80c0d03f203fc0bd30c01040a03f803dc0bfe0bff03f"
         "603e80be90bf08c0c03e803f00bfc0bf083f1040003e60bff0be6040403f80bea0be"},
    {"onebit", gc::dtype::f32, {gc::codec_id(5), gc::dtype(1), 0, 37, 13, 0, 0},
         "4743504b0205010025000000000000000d000000000000000000000000000000"
         "b46e943f000000001933e68c19"},
    {"onebit:scaling=none", gc::dtype::f32, {gc::codec_id(5), gc::dtype(1), 1, 37, 13, 0, 0},
         "4743504b0205010125000000000000000d000000000000000000000000000000"
         "0000803f000000001933e68c19"},
    {"int8:bucket=16", gc::dtype::f32, {gc::codec_id(4), gc::dtype(1), 0, 37, 61, 16, 0},
         "4743504b0204010025000000000000003d000000000000001000000000000000"
         "000080c000008040000008c0000010400000f0be000060406ed78b6c73ff80807800b3937d28c7a7"
         "802416e9896d3a0092b65f249bff834900ff4e0e0a"},
    {"int8:bucket=16,rounding=stochastic",
      gc::dtype::f32, {gc::codec_id(4), gc::dtype(1), 1, 37, 61, 16, 0},
         "4743504b0204010125000000000000003d000000000000001000000000000000"
         "000080c000008040000008c0000010400000f0be000060406dd78c6b72ff7f807800b3947d28c7a7"
         "7f2416e9896d3a0092b65f259aff834900ff4e0e0a"},
    {"natural:bucket=16", gc::dtype::f32, {gc::codec_id(8), gc::dtype(1), 0, 37, 40, 16, 0},
         "4743504b02080100250000000000000028000000000000001000000000000000"
         "81808085020685850200008682030588820304078283020585828204038483030206848501038585"},
    {"qsgd:levels=7,bucket=16", gc::dtype::f32, {gc::codec_id(6), gc::dtype(1), 0, 37, 31, 7, 16},
         "4743504b0206010025000000000000001f000000000000000700000010000000"
         "e46bf340405c9e40da74684020014000c011a012a02b00b910a930a0699100"},
    {"qsgd:levels=255,bucket=0", gc::dtype::f32, {gc::codec_id(6), gc::dtype(1), 0, 37, 46, 255, 0},
         "4743504b0206010025000000000000002e00000000000000ff00000000000000"
         "d2651c410f8f2880a8300d000007d3aa883010e90e10024eba8c61e060479c0a34343cd940c7808b"
         "0db74c388810"},
    {"terngrad:bucket=16", gc::dtype::f32, {gc::codec_id(7), gc::dtype(1), 0, 37, 22, 1, 16},
         "4743504b02070100250000000000000016000000000000000100000010000000"
         "00008040000010400000604000044c1030c0c0c40700"},
    {"dithering:levels=2,partition=linear,norm=max,bucket=16",
      gc::dtype::f32, {gc::codec_id(9), gc::dtype(1), 0, 37, 26, 2, 16},
         "4743504b0209010025000000000000001a000000000000000200000010000000"
         "000080400000104000006040080001308206a803d4480da11500"},
    {"dithering:levels=5,partition=linear,norm=l2,bucket=16",
      gc::dtype::f32, {gc::codec_id(9), gc::dtype(1), 2, 37, 31, 5, 16},
         "4743504b0209010225000000000000001f000000000000000500000010000000"
         "e46bf340405c9e40da74684010013000b011a012902a00a910a92090499100"},
    {"dithering:levels=3,partition=natural,norm=max,bucket=16",
      gc::dtype::f32, {gc::codec_id(9), gc::dtype(1), 1, 37, 26, 3, 16},
         "4743504b0209010125000000000000001a000000000000000300000010000000"
         "00008040000010400000604050800178022bf005f8498fc15d0a"},
    {"dithering:levels=30,partition=natural,norm=l2,bucket=16",
      gc::dtype::f32, {gc::codec_id(9), gc::dtype(1), 3, 37, 40, 30, 16},
         "4743504b02090103250000000000000028000000000000001e00000010000000"
         "e46bf340405c9e40da7468403aa7e979070079bf6d38cf6d18df7399bef7dab6f75a97f17cb7e93a"},
    {"randomk:k=9,scale=true", gc::dtype::f32, {gc::codec_id(12), gc::dtype(1), 4, 37, 40, 9, 3},
         "4743504b020c0104250000000000000028000000000000000900000003000000f59b8c89000014c0"
         "398e834100000000398e83bf398e83c1398e833ee438e6c0e438663fe4386641"},
    {"randomk:k=5,values=bf16", gc::dtype::f16, {gc::codec_id(12), gc::dtype(2), 2, 37, 14, 5, 3},
         "4743504b020c020225000000000000000e000000000000000500000003000000f59b8c8910bf8040"
         "000080c0e0bf"},
    {"approx_topk:k=6,tolerance=0.2", gc::dtype::f32, {gc::codec_id(13), gc::dtype(1), 4, 37, 28, 6, 5},
         "4743504b020d010425000000000000001c000000000000000600000005000000618c012400003040"
         "00008040000080c0000030c00000104000006040"},
};
// clang-format on

constexpr std::uint64_t golden_seed = 0x0123456789abcdefull;
constexpr std::uint32_t golden_step = 7;
constexpr gc::tensor_id golden_tensor{3};

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
