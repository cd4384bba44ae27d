// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// codec/any_codec.hpp, run-time codec choice: `make_codec` builds, from every spec form of its
// documentation (defaults included), a codec whose traits, packets (from f32, f16 and bf16) and
// decodings (plain and accumulating) equal those of the static codec; bad specs are
// config_errors that say what was expected; any_codec is copyable and shares its codec;
// `decompress_any` decodes a packet of every codec from its header and refuses unknown codec
// ids, bad magic, truncated packets and a wrong output size.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

// Decodes packet `p` of codec `c` into a copy of `base`, plainly or accumulating alpha * decoded.
template <class C, gc::element T>
std::vector<T> any_test_decode(C const& c, std::vector<std::byte> const& p, std::vector<T> base,
                               float alpha, bool add) {
  if (add) {
    c.decompress_add(std::span<std::byte const>(p), std::span<T>(base), alpha,
                     gc::codec_context{});
  } else {
    c.decompress(std::span<std::byte const>(p), std::span<T>(base), gc::codec_context{});
  }
  return base;
}

// make_codec(spec) behaves exactly as the static codec `expected`.
template <gc::codec C>
void same_as_static(std::string const& spec, C const& expected) {
  CAPTURE(spec);
  gc::any_codec const a = gc::make_codec(spec);
  REQUIRE(a.id() == C::id);
  REQUIRE(std::string(a.name()) == gc::codec_name(C::id));
  REQUIRE(a.aggregation() == C::aggregation);
  REQUIRE(a.unbiased() == C::unbiased);
  REQUIRE(a.bits_per_element() == expected.bits_per_element());
  for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{511}, std::size_t{513},
                        std::size_t{1001}, std::size_t{100000}}) {
    CAPTURE(m);
    REQUIRE(a.max_compressed_bytes(m) == expected.max_compressed_bytes(m));
  }
  // Packets, from each element type.
  auto const x = heavy_tailed(1001, 3);
  gc::codec_context const ctx{.seed = 17, .step = 4};
  auto const p = compress(a, x, ctx, gc::tensor_id{6});
  REQUIRE(p == compress(expected, x, ctx, gc::tensor_id{6}));
  auto const xh = convert_to<gc::half>(x);
  REQUIRE(compress(a, xh, ctx) == compress(expected, xh, ctx));
  auto const xb = convert_to<gc::bfloat16>(x);
  REQUIRE(compress(a, xb, ctx) == compress(expected, xb, ctx));
  // A copy shares the codec and behaves the same.
  gc::any_codec const copy = a;
  REQUIRE(compress(copy, x, ctx, gc::tensor_id{6}) == p);
  // Decoding, plain and accumulating, into f32 and f16.
  std::vector<float> const base(x.size(), 0.25f);
  REQUIRE(any_test_decode(a, p, base, 1.0f, false) ==
          any_test_decode(expected, p, base, 1.0f, false));
  REQUIRE(any_test_decode(a, p, base, -0.5f, true) ==
          any_test_decode(expected, p, base, -0.5f, true));
  std::vector<gc::half> const hbase(x.size(), gc::half(1.0f));
  REQUIRE(any_test_decode(a, p, hbase, 1.0f, false) ==
          any_test_decode(expected, p, hbase, 1.0f, false));
  REQUIRE(any_test_decode(a, p, hbase, 2.0f, true) ==
          any_test_decode(expected, p, hbase, 2.0f, true));
}

}  // namespace

TEST_CASE("any_codec is a run-time codec, not a static one", "[codec][any_codec]") {
  STATIC_REQUIRE(gc::codec_operations<gc::any_codec>);
  STATIC_REQUIRE(!gc::codec<gc::any_codec>);
  STATIC_REQUIRE(std::is_copy_constructible_v<gc::any_codec>);
  STATIC_REQUIRE(!std::is_default_constructible_v<gc::any_codec>);
}

TEST_CASE("make_codec builds the codec its spec names, with the documented defaults",
          "[codec][any_codec]") {
  using gc::dither_norm;
  using gc::dither_partition;
  using scaling = gc::onebit_codec::scaling;
  using rounding = gc::int8_rounding;
  same_as_static("identity", gc::identity_codec{});
  same_as_static("fp16", gc::fp16_codec{});
  same_as_static("bf16", gc::bf16_codec{});
  same_as_static("int8", gc::int8_codec(512, rounding::nearest));
  same_as_static("int8:bucket=64", gc::int8_codec(64));
  same_as_static("int8:rounding=stochastic", gc::int8_codec(512, rounding::stochastic));
  same_as_static("int8:bucket=33,rounding=stochastic", gc::int8_codec(33, rounding::stochastic));
  same_as_static("int8:rounding=nearest,bucket=0", gc::int8_codec(0));
  same_as_static("int8:bucket=0,rounding=nearest", gc::int8_codec(0, rounding::nearest));
  same_as_static("onebit", gc::onebit_codec(scaling::mean_abs));
  same_as_static("onebit:scaling=mean_abs", gc::onebit_codec(scaling::mean_abs));
  same_as_static("onebit:scaling=none", gc::onebit_codec(scaling::none));
  same_as_static("int4", gc::int4_codec(64));
  same_as_static("chunk_topk", gc::chunk_topk_codec(4096, 64, gc::chunk_values::f32));
  same_as_static("chunk_topk:chunk=64,k=2,values=int2", gc::chunk_topk_codec(64, 2, gc::chunk_values::int2));
  same_as_static("chunk_topk:values=bf16,k=1,chunk=2", gc::chunk_topk_codec(2, 1, gc::chunk_values::bf16));
  same_as_static("dct_sign", gc::dct_sign_codec(64, 8));
  same_as_static("dct_sign:k=3,chunk=16", gc::dct_sign_codec(16, 3));
  same_as_static("int4:bucket=0", gc::int4_codec(0));
  same_as_static("int4:bucket=33", gc::int4_codec(33));
  same_as_static("qsgd", gc::qsgd_codec(7, 512));
  same_as_static("qsgd:levels=15,bucket=256", gc::qsgd_codec(15, 256));
  same_as_static("qsgd:bucket=0", gc::qsgd_codec(7, 0));
  same_as_static("qsgd:bucket=0,levels=1", gc::qsgd_codec(1, 0));
  same_as_static("qsgd:levels=32767", gc::qsgd_codec(32767, 512));
  same_as_static("terngrad", gc::terngrad_codec(512));
  same_as_static("terngrad:bucket=100", gc::terngrad_codec(100));
  same_as_static("natural", gc::natural_codec(512));
  same_as_static("natural:bucket=7", gc::natural_codec(7));
  same_as_static("natural:bucket=0", gc::natural_codec(0));
  same_as_static("dithering",
                 gc::dithering_codec(2, dither_partition::linear, dither_norm::max, 512));
  same_as_static("dithering:levels=5,partition=natural,norm=l2,bucket=64",
                 gc::dithering_codec(5, dither_partition::natural, dither_norm::l2, 64));
  same_as_static("dithering:norm=l2",
                 gc::dithering_codec(2, dither_partition::linear, dither_norm::l2, 512));
  same_as_static("dithering:partition=natural,levels=30",
                 gc::dithering_codec(30, dither_partition::natural, dither_norm::max, 512));
  same_as_static("dithering:bucket=33,levels=9,partition=linear,norm=max",
                 gc::dithering_codec(9, dither_partition::linear, dither_norm::max, 33));
}

TEST_CASE("make_codec rejects bad specs with a config_error that says what was expected",
          "[codec][any_codec][config]") {
  struct bad_spec {
    char const* spec;
    char const* says;  // a part of the message; "" where only the type is checked
  };
  bad_spec const cases[] = {
      {"", "codec spec '' has an empty name"},
      {"randk", "unknown codec 'randk'"},
      {"QSGD", "unknown codec 'QSGD'"},
      {"qsgd ", "unknown codec"},
      {" qsgd", ""},
      {"fp32", "expected identity, fp16, bf16"},
      {"topk", "needs exactly one of k or ratio"},
      {"topk:k=3,ratio=0.5", "needs exactly one of k or ratio"},
      {"topk:ratio=0", "ratio"},
      {"topk:ratio=1.5", "ratio"},
      {"topk:ratio=x", "needs a number"},
      {"topk:k=10,values=f64", "must be one of f32, f16, bf16"},
      {"threshold", "needs value"},
      {"threshold:value=-1", "threshold value"},
      {"threshold:value=nan", "threshold value"},
      {"qsgd:level=3", "has no option 'level'"},
      {"qsgd:bogus=1", "has no option 'bogus'"},
      {"identity:bucket=3", "has no option 'bucket'"},
      {"identity:x=1", "has no option 'x'"},
      {"fp16:bucket=4", "has no option 'bucket'"},
      {"fp16:x=1", "has no option 'x'"},
      {"bf16:levels=2", "has no option 'levels'"},
      {"onebit:levels=2", "has no option 'levels'"},
      {"onebit:bucket=8", "has no option 'bucket'"},
      {"int8:levels=3", "has no option 'levels'"},
      {"terngrad:levels=2", "has no option 'levels'"},
      {"natural:levels=3", "has no option 'levels'"},
      {"qsgd:levels", "is not key=value"},
      {"qsgd:=3", "is not key=value"},
      {"qsgd:levels=3,,bucket=4", ""},
      {"qsgd:levels=", "needs an unsigned integer"},
      {"qsgd:levels=x", "needs an unsigned integer"},
      {"qsgd:levels=abc", "needs an unsigned integer"},
      {"qsgd:levels=-1", "needs an unsigned integer"},
      {"qsgd:levels=3x", "needs an unsigned integer"},
      {"qsgd:levels=+3", ""},
      {"qsgd:levels=4294967296", "needs an unsigned integer"},
      {"qsgd:levels=99999999999", ""},
      {"qsgd:bucket=1.5", "needs an unsigned integer"},
      {"int8:bucket=-4", "needs an unsigned integer"},
      {"natural:bucket=1x", "needs an unsigned integer"},
      {"qsgd:levels=0", "levels"},
      {"qsgd:levels=32768", "levels"},
      {"int8:rounding=up", "must be one of nearest, stochastic"},
      {"int8:rounding=", ""},
      {"int4:rounding=nearest", "has no option 'rounding'"},
      {"int4:bucket=x", "needs an unsigned integer"},
      {"onebit:scaling=max", "must be one of mean_abs, none"},
      {"dithering:partition=log", "must be one of linear, natural"},
      {"dithering:partition=cubic", "must be one of linear, natural"},
      {"dithering:norm=l1", "must be one of max, l2"},
      {"dithering:partition=natural,levels=31", "levels"},
      {"dithering:levels=0", "levels"},
      {"dithering:levels=32768", "levels"},
  };
  for (auto const& c : cases) {
    INFO("spec \"" << c.spec << "\"");
    std::string msg = "<no exception>";
    try {
      (void)gc::make_codec(c.spec);
    } catch (gc::config_error const& e) {
      msg = e.what();
    } catch (std::exception const& e) {
      msg = std::string("<wrong exception type: ") + e.what() + ">";
    }
    INFO("message: " << msg);
    CHECK(msg != "<no exception>");
    CHECK(msg.rfind("<wrong exception type", 0) == std::string::npos);
    CHECK(msg.find(c.says) != std::string::npos);
  }
  // "onebit:" has an empty option list after the colon: accepted or rejected, but never with
  // anything other than config_error.
  try {
    (void)gc::make_codec("onebit:");
  } catch (gc::config_error const&) {
  }
  // The limits themselves are accepted.
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
      // Packets compressed from each element type: the header says which.
      for (int source = 0; source < 3; ++source) {
        CAPTURE(v.name, bucket, source);
        gc::codec_context const ctx{.seed = 2};
        auto const p = source == 0   ? compress(v.codec, x, ctx)
                       : source == 1 ? compress(v.codec, convert_to<gc::half>(x), ctx)
                                     : compress(v.codec, convert_to<gc::bfloat16>(x), ctx);
        std::vector<float> got(x.size());
        gc::decompress_any(std::span<std::byte const>(p), std::span<float>(got));
        REQUIRE(got == decompress<float>(v.codec, p, x.size()));
        std::vector<float> const base(x.size(), 1.0f);
        std::vector<float> acc = base;
        gc::decompress_any(std::span<std::byte const>(p), std::span<float>(acc), -2.0f, true);
        REQUIRE(acc == any_test_decode(v.codec, p, base, -2.0f, true));
        std::vector<gc::half> const hbase(x.size(), gc::half(0.5f));
        std::vector<gc::half> hacc = hbase;
        gc::decompress_any(std::span<std::byte const>(p), std::span<gc::half>(hacc), -3.0f, true);
        REQUIRE(hacc == any_test_decode(v.codec, p, hbase, -3.0f, true));
        std::vector<gc::bfloat16> gb(x.size());
        gc::decompress_any(std::span<std::byte const>(p), std::span<gc::bfloat16>(gb));
        REQUIRE(gb == decompress<gc::bfloat16>(v.codec, p, x.size()));
      }
    }
  }
}

TEST_CASE("decompress_any rejects unknown codec ids and bad headers", "[codec][any_codec]") {
  std::vector<float> const x(16, 1.5f);
  auto const good = compress(gc::identity_codec{}, x);
  std::vector<float> out(16);
  REQUIRE_NOTHROW(gc::decompress_any<float>(good, out));
  CHECK(out == x);
  for (unsigned id : {0u, 99u, 100u, 255u}) {
    auto bad = good;
    bad[field::codec] = static_cast<std::byte>(id);
    INFO("codec id " << id);
    std::string msg = "<no exception>";
    try {
      gc::decompress_any<float>(bad, out);
    } catch (gc::format_error const& e) {
      msg = e.what();
    }
    CHECK(msg.find("unknown codec id " + std::to_string(id)) != std::string::npos);
  }
  auto bad_magic = good;
  bad_magic[field::magic + 1] = std::byte{0};
  CHECK_THROWS_AS(gc::decompress_any<float>(bad_magic, out), gc::format_error);
  CHECK_THROWS_AS(gc::decompress_any<float>(std::span<std::byte const>(good).first(31), out),
                  gc::format_error);
  auto truncated = good;
  truncated.pop_back();
  CHECK_THROWS_AS(gc::decompress_any<float>(truncated, out), gc::format_error);
  // A packet of one codec is refused by another through any_codec.
  CHECK_THROWS_AS(
      gc::make_codec("fp16").decompress(std::span<std::byte const>(good), std::span<float>(out)),
      gc::format_error);
  // Wrong output size.
  std::vector<float> small(15);
  CHECK_THROWS_AS(gc::decompress_any<float>(good, small), gc::config_error);
}

TEST_CASE("the explicit-instantiation list names every codec make_codec builds",
          "[codec][any_codec][instantiate]") {
  // GRADCOMP_EXTERN_TEMPLATES (config.hpp) instantiates the erasures of the types in
  // GRADCOMP_DETAIL_MAKE_CODEC_TYPES once per program; a codec missing from the list would be
  // compiled in every translation unit again. Every known codec id but PowerSGD's (not an
  // any_codec) must be in it, and nothing else.
  std::vector<gc::codec_id> listed;
#define GRADCOMP_TEST_LISTED_ID(C) listed.push_back(gc::C::id);
  GRADCOMP_DETAIL_MAKE_CODEC_TYPES(GRADCOMP_TEST_LISTED_ID)
#undef GRADCOMP_TEST_LISTED_ID
  std::vector<gc::codec_id> known;
  for (unsigned id = 0; id < 256; ++id) {
    auto const c = static_cast<gc::codec_id>(id);
    if (std::string(gc::codec_name(c)) != "unknown" && c != gc::codec_id::powersgd) known.push_back(c);
  }
  for (gc::codec_id c : known) {
    INFO("codec " << gc::codec_name(c));
    CHECK(std::count(listed.begin(), listed.end(), c) >= 1);
  }
  for (gc::codec_id c : listed) {
    INFO("codec " << gc::codec_name(c));
    CHECK(std::count(known.begin(), known.end(), c) == 1);
  }
  // random_k's two types (plain and scaled) share one id; every other id has one type.
  CHECK(listed.size() == known.size() + 1);
}
