// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The golden packets (the frozen wire bytes of every codec variant for one fixed input) and
/// that input. The CPU suite checks them in tests/unit/codec/test_golden.cpp (which explains
/// how they were made and when they may change); the CUDA backend's tests (tests/cuda/) check
/// the device codecs against the same bytes. Depends on core/ only, so nvcc compiles it too.

#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomp_test {

namespace gc = gradcomp;

/// A fixed, platform-independent input (every value an exact dyadic rational): used by the
/// golden-vector tests, so it must never change.
inline std::vector<float> formula_input(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    int const k = static_cast<int>((i * 29) % 37) - 18;  // -18..18, a permutation of i
    float const scale = (i % 4 == 0) ? 0.125f : (i % 4 == 1 ? 1.0f : 0.5f);
    x[i] = static_cast<float>(k) * 0.25f * scale;
  }
  if (n > 6) x[6] = -0.0f;
  return x;
}

struct golden {
  char const* spec;  ///< make_codec spec
  gc::dtype input;   ///< element type fed to compress
  gc::packet_header header;
  char const* hex;
};

// clang-format off
inline golden const goldens[] = {
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
    {"int4:bucket=16", gc::dtype::f32, {gc::codec_id(15), gc::dtype(1), 0, 37, 31, 16, 0},
         "4743504b020f010025000000000000001f0000000000000010000000000000002549123f4992a43e"
         "0000003fd779f788189b38ac38e37914b936fa58f78a07"},
    {"chunk_topk:chunk=16,k=3", gc::dtype::f32, {gc::codec_id(16), gc::dtype(1), 0, 37, 41, 16, 3},
         "4743504b021001002500000000000000290000000000000010000000030000000000304000008040"
         "000080c00000f03f000008c0000010400000f0be000060400000403f5139d71002"},
    {"chunk_topk:chunk=8,k=2,values=int2", gc::dtype::f32, {gc::codec_id(16), gc::dtype(1), 3, 37, 27, 8, 2},
         "4743504b0210010325000000000000001b0000000000000008000000020000000000004000000040"
         "0000883f0000903f0000e03fb46d0169baaf11"},
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

inline constexpr std::uint64_t golden_seed = 0x0123456789abcdefull;
inline constexpr std::uint32_t golden_step = 7;
inline constexpr gc::tensor_id golden_tensor{3};

}  // namespace gradcomp_test
