// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Run-time codec choice: make_codec builds the codec its spec names (same packets as the
// static type), rejects unknown names, keys and values with config_error; any_codec forwards
// traits and operations; decompress_any decodes a packet of any codec from its header.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

template <gc::codec C>
void same_as_static(std::string const& spec, C const& expected) {
  CAPTURE(spec);
  gc::any_codec const a = gc::make_codec(spec);
  REQUIRE(a.id() == C::id);
  REQUIRE(std::string(a.name()) == gc::codec_name(C::id));
  REQUIRE(a.aggregation() == C::aggregation);
  REQUIRE(a.unbiased() == C::unbiased);
  REQUIRE(a.bits_per_element() == expected.bits_per_element());
  REQUIRE(a.max_compressed_bytes(1001) == expected.max_compressed_bytes(1001));
  auto const x = heavy_tailed(1001, 3);
  gc::codec_context const ctx{.seed = 17, .step = 4};
  auto const pa = compress(a, x, ctx, gc::tensor_id{6});
  auto const pe = compress(expected, x, ctx, gc::tensor_id{6});
  REQUIRE(pa == pe);
  auto const xh = convert_to<gc::half>(x);
  REQUIRE(compress(a, xh, ctx) == compress(expected, xh, ctx));
  REQUIRE(decompress<float>(a, pa, x.size()) == decompress<float>(expected, pe, x.size()));
}

}  // namespace

TEST_CASE("make_codec builds the codec its spec names, with the documented defaults",
          "[codec][any_codec]") {
  using gc::dither_norm;
  using gc::dither_partition;
  same_as_static("identity", gc::identity_codec{});
  same_as_static("fp16", gc::fp16_codec{});
  same_as_static("bf16", gc::bf16_codec{});
  same_as_static("int8", gc::int8_codec(512, gc::int8_rounding::nearest));
  same_as_static("int8:bucket=33,rounding=stochastic",
                 gc::int8_codec(33, gc::int8_rounding::stochastic));
  same_as_static("int8:rounding=nearest,bucket=0", gc::int8_codec(0));
  same_as_static("int4", gc::int4_codec(64));
  same_as_static("chunk_topk", gc::chunk_topk_codec(4096, 64, gc::chunk_values::f32));
  same_as_static("chunk_topk:chunk=64,k=2,values=int2", gc::chunk_topk_codec(64, 2, gc::chunk_values::int2));
  same_as_static("chunk_topk:values=bf16,k=1,chunk=2", gc::chunk_topk_codec(2, 1, gc::chunk_values::bf16));
  same_as_static("dct_sign", gc::dct_sign_codec(64, 8));
  same_as_static("dct_sign:k=3,chunk=16", gc::dct_sign_codec(16, 3));
  same_as_static("int4:bucket=0", gc::int4_codec(0));
  same_as_static("int4:bucket=33", gc::int4_codec(33));
  same_as_static("onebit", gc::onebit_codec(gc::onebit_codec::scaling::mean_abs));
  same_as_static("onebit:scaling=none", gc::onebit_codec(gc::onebit_codec::scaling::none));
  same_as_static("qsgd", gc::qsgd_codec(7, 512));
  same_as_static("qsgd:levels=15,bucket=256", gc::qsgd_codec(15, 256));
  same_as_static("qsgd:bucket=0", gc::qsgd_codec(7, 0));
  same_as_static("terngrad", gc::terngrad_codec(512));
  same_as_static("terngrad:bucket=100", gc::terngrad_codec(100));
  same_as_static("natural", gc::natural_codec(512));
  same_as_static("natural:bucket=7", gc::natural_codec(7));
  same_as_static("dithering",
                 gc::dithering_codec(2, dither_partition::linear, dither_norm::max, 512));
  same_as_static("dithering:levels=5,partition=natural,norm=l2,bucket=64",
                 gc::dithering_codec(5, dither_partition::natural, dither_norm::l2, 64));
  same_as_static("dithering:norm=l2",
                 gc::dithering_codec(2, dither_partition::linear, dither_norm::l2, 512));
}

TEST_CASE("make_codec rejects unknown names, keys and values with config_error",
          "[codec][any_codec][config]") {
  for (char const* spec : {"",
                           "QSGD",
                           "topk",
                           "qsgd ",
                           " qsgd",
                           "fp32",
                           "onebit:",
                           "identity:bucket=3",
                           "fp16:x=1",
                           "bf16:levels=2",
                           "qsgd:levels",
                           "qsgd:=3",
                           "qsgd:levels=",
                           "qsgd:levels=abc",
                           "qsgd:levels=-1",
                           "qsgd:levels=3x",
                           "qsgd:levels=+3",
                           "qsgd:levels=99999999999",
                           "qsgd:levels=0",
                           "qsgd:levels=32768",
                           "qsgd:bogus=1",
                           "qsgd:levels=3,,bucket=4",
                           "int8:rounding=up",
                           "int8:rounding=",
                           "int8:levels=3",
                           "int8:bucket=-4",
                           "int4:rounding=nearest",
                           "int4:bucket=x",
                           "onebit:scaling=max",
                           "onebit:bucket=8",
                           "terngrad:levels=2",
                           "natural:bucket=1x",
                           "natural:levels=3",
                           "dithering:partition=cubic",
                           "dithering:norm=l1",
                           "dithering:levels=31,partition=natural",
                           "dithering:levels=0",
                           "dithering:levels=32768"}) {
    CAPTURE(spec);
    // "onebit:" has an empty option list after the colon: accepted or rejected, but never
    // anything other than config_error.
    if (std::string(spec) == "onebit:") {
      try {
        (void)gc::make_codec(spec);
      } catch (gc::config_error const&) {
      }
      continue;
    }
    REQUIRE_THROWS_AS(gc::make_codec(spec), gc::config_error);
  }
  REQUIRE_NOTHROW(gc::make_codec("qsgd:levels=32767"));
  REQUIRE_NOTHROW(gc::make_codec("dithering:levels=30,partition=natural"));
}

TEST_CASE("any_codec is copyable and shares its codec", "[codec][any_codec]") {
  gc::any_codec a = gc::make_codec("qsgd:levels=3,bucket=8");
  gc::any_codec const b = a;
  a = gc::make_codec("fp16");
  REQUIRE(b.id() == gc::codec_id::qsgd);
  REQUIRE(a.id() == gc::codec_id::fp16);
  auto const x = gaussian(20, 1);
  REQUIRE(compress(b, x) == compress(gc::qsgd_codec(3, 8), x));
}

TEST_CASE("decompress_any decodes a packet of every codec from its header", "[codec][any_codec]") {
  auto const x = heavy_tailed(777, 5);
  for (std::uint32_t bucket : {0u, 50u}) {
    for (auto const& v : all_variants(bucket)) {
      CAPTURE(v.name, bucket);
      auto const p = compress(v.codec, x, gc::codec_context{.seed = 2});
      auto const want = decompress<float>(v.codec, p, x.size());
      std::vector<float> got(x.size());
      gc::decompress_any(std::span<std::byte const>(p), std::span<float>(got));
      REQUIRE(got == want);
      std::vector<float> acc(x.size(), 1.0f), acc_want(x.size(), 1.0f);
      gc::decompress_any(std::span<std::byte const>(p), std::span<float>(acc), -2.0f, true);
      v.codec.decompress_add(std::span<std::byte const>(p), std::span<float>(acc_want), -2.0f);
      REQUIRE(acc == acc_want);
      std::vector<gc::bfloat16> gb(x.size());
      gc::decompress_any(std::span<std::byte const>(p), std::span<gc::bfloat16>(gb));
      REQUIRE(gb == decompress<gc::bfloat16>(v.codec, p, x.size()));
    }
  }
}
