// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// codec/any_codec.hpp: `make_codec` builds, from every spec form in its documentation, a codec
// whose packets and decodings equal those of the static codec; bad specs are config_errors;
// `decompress_any` decodes any codec's packet from its header and refuses unknown codec ids.

#include "feedback_support.hpp"

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace feedback_test;

namespace {

// What a static codec does, captured for comparison with an any_codec.
struct reference {
  std::string spec;
  gc::codec_id id;
  gc::aggregation_kind aggregation;
  bool unbiased;
  std::function<std::size_t(std::size_t)> max_bytes;
  double bits;
  std::function<std::vector<std::byte>(std::vector<float> const&, gc::codec_context const&)>
      compress32;
  std::function<std::vector<std::byte>(std::vector<gc::half> const&, gc::codec_context const&)>
      compress16;
  std::function<std::vector<std::byte>(std::vector<gc::bfloat16> const&, gc::codec_context const&)>
      compressb;
  std::function<std::vector<float>(std::vector<std::byte> const&, std::vector<float>, float, bool)>
      decode32;
  std::function<std::vector<gc::half>(std::vector<std::byte> const&, std::vector<gc::half>, float,
                                      bool)>
      decode16;
};

constexpr gc::tensor_id k_id{21};

template <class C, gc::element T>
std::vector<std::byte> compress_with(C const& c, std::vector<T> const& x,
                                     gc::codec_context const& ctx) {
  std::vector<std::byte> buf(c.max_compressed_bytes(x.size()));
  std::size_t const bytes = c.compress(gc::tensor_view<T const>(std::span<T const>(x), k_id),
                                       std::span<std::byte>(buf), ctx);
  buf.resize(bytes);
  return buf;
}

template <class C, gc::element T>
std::vector<T> decode_with(C const& c, std::vector<std::byte> const& p, std::vector<T> out,
                           float alpha, bool add) {
  if (add) {
    c.decompress_add(std::span<std::byte const>(p), std::span<T>(out), alpha, gc::codec_context{});
  } else {
    c.decompress(std::span<std::byte const>(p), std::span<T>(out), gc::codec_context{});
  }
  return out;
}

template <gc::codec C>
reference ref(std::string spec, C c) {
  return {spec,
          C::id,
          C::aggregation,
          C::unbiased,
          [c](std::size_t n) { return c.max_compressed_bytes(n); },
          c.bits_per_element(),
          [c](auto const& x, auto const& ctx) { return compress_with(c, x, ctx); },
          [c](auto const& x, auto const& ctx) { return compress_with(c, x, ctx); },
          [c](auto const& x, auto const& ctx) { return compress_with(c, x, ctx); },
          [c](auto const& p, auto out, float a, bool add) {
            return decode_with(c, p, std::move(out), a, add);
          },
          [c](auto const& p, auto out, float a, bool add) {
            return decode_with(c, p, std::move(out), a, add);
          }};
}

// Every spec form of make_codec's documentation, defaults included, with its static twin.
std::vector<reference> all_specs() {
  using gc::dither_norm;
  using gc::dither_partition;
  using scaling = gc::onebit_codec::scaling;
  return {
      ref("identity", gc::identity_codec{}),
      ref("fp16", gc::fp16_codec{}),
      ref("bf16", gc::bf16_codec{}),
      ref("int8", gc::int8_codec(512, gc::int8_rounding::nearest)),
      ref("int8:bucket=64", gc::int8_codec(64)),
      ref("int8:rounding=stochastic", gc::int8_codec(512, gc::int8_rounding::stochastic)),
      ref("int8:bucket=0,rounding=nearest", gc::int8_codec(0, gc::int8_rounding::nearest)),
      ref("int8:rounding=stochastic,bucket=100",
          gc::int8_codec(100, gc::int8_rounding::stochastic)),
      ref("onebit", gc::onebit_codec(scaling::mean_abs)),
      ref("onebit:scaling=mean_abs", gc::onebit_codec(scaling::mean_abs)),
      ref("onebit:scaling=none", gc::onebit_codec(scaling::none)),
      ref("qsgd", gc::qsgd_codec(7, 512)),
      ref("qsgd:levels=15,bucket=256", gc::qsgd_codec(15, 256)),
      ref("qsgd:bucket=0,levels=1", gc::qsgd_codec(1, 0)),
      ref("qsgd:levels=32767", gc::qsgd_codec(32767, 512)),
      ref("terngrad", gc::terngrad_codec(512)),
      ref("terngrad:bucket=128", gc::terngrad_codec(128)),
      ref("natural", gc::natural_codec(512)),
      ref("natural:bucket=0", gc::natural_codec(0)),
      ref("dithering", gc::dithering_codec(2, dither_partition::linear, dither_norm::max, 512)),
      ref("dithering:levels=5,partition=natural,norm=l2,bucket=0",
          gc::dithering_codec(5, dither_partition::natural, dither_norm::l2, 0)),
      ref("dithering:norm=l2",
          gc::dithering_codec(2, dither_partition::linear, dither_norm::l2, 512)),
      ref("dithering:partition=natural,levels=30",
          gc::dithering_codec(30, dither_partition::natural, dither_norm::max, 512)),
      ref("dithering:bucket=33,levels=9,partition=linear,norm=max",
          gc::dithering_codec(9, dither_partition::linear, dither_norm::max, 33)),
  };
}

}  // namespace

static_assert(gc::codec_operations<gc::any_codec>);
static_assert(!gc::codec<gc::any_codec>);
static_assert(std::is_copy_constructible_v<gc::any_codec>);
static_assert(!std::is_default_constructible_v<gc::any_codec>);

TEST_CASE("make_codec: every documented spec equals its static codec", "[feedback][any_codec]") {
  std::size_t const n = 777;
  rng r(1);
  auto const x = make_gradient(r, n);
  auto const xh = convert<gc::half>(x);
  auto const xb = convert<gc::bfloat16>(x);
  gc::codec_context ctx;
  ctx.seed = 0xabcdef;
  ctx.step = 3;
  for (auto const& ref : all_specs()) {
    INFO("spec \"" << ref.spec << "\"");
    gc::any_codec const any = gc::make_codec(ref.spec);
    CHECK(any.id() == ref.id);
    CHECK(std::string(any.name()) == gc::codec_name(ref.id));
    CHECK(any.aggregation() == ref.aggregation);
    CHECK(any.unbiased() == ref.unbiased);
    CHECK(any.bits_per_element() == ref.bits);
    for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{511}, std::size_t{513}, n,
                          std::size_t{100000}}) {
      CHECK(any.max_compressed_bytes(m) == ref.max_bytes(m));
    }
    // Packets, from each element type.
    auto const p = compress_with(any, x, ctx);
    REQUIRE(p == ref.compress32(x, ctx));
    REQUIRE(compress_with(any, xh, ctx) == ref.compress16(xh, ctx));
    REQUIRE(compress_with(any, xb, ctx) == ref.compressb(xb, ctx));
    // A copy shares the codec and behaves the same.
    gc::any_codec const copy = any;
    REQUIRE(compress_with(copy, x, ctx) == p);
    // Decoding, plain and accumulating.
    std::vector<float> const base(n, 0.25f);
    CHECK(decode_with(any, p, base, 1.0f, false) == ref.decode32(p, base, 1.0f, false));
    CHECK(decode_with(any, p, base, -0.5f, true) == ref.decode32(p, base, -0.5f, true));
    std::vector<gc::half> const hbase(n, gc::half(1.0f));
    CHECK(decode_with(any, p, hbase, 1.0f, false) == ref.decode16(p, hbase, 1.0f, false));
    CHECK(decode_with(any, p, hbase, 2.0f, true) == ref.decode16(p, hbase, 2.0f, true));
  }
}

TEST_CASE("make_codec: bad specs are config_errors that say what was expected",
          "[feedback][any_codec]") {
  struct bad_spec {
    char const* spec;
    char const* says;
  };
  bad_spec const cases[] = {
      {"", "codec spec '' has an empty name"},
      {"randk", "unknown codec 'randk'"},
      {"topk", "needs exactly one of k or ratio"},
      {"topk:k=3,ratio=0.5", "needs exactly one of k or ratio"},
      {"topk:ratio=0", "ratio"},
      {"topk:ratio=1.5", "ratio"},
      {"topk:ratio=x", "needs a number"},
      {"topk:k=10,values=f64", "must be one of f32, f16, bf16"},
      {"threshold", "needs value"},
      {"threshold:value=-1", "threshold value"},
      {"threshold:value=nan", "threshold value"},
      {"QSGD", "unknown codec 'QSGD'"},
      {"qsgd ", "unknown codec"},
      {"fp32", "expected identity, fp16, bf16"},
      {"qsgd:level=3", "has no option 'level'"},
      {"fp16:bucket=4", "has no option 'bucket'"},
      {"identity:x=1", "has no option 'x'"},
      {"onebit:levels=2", "has no option 'levels'"},
      {"qsgd:levels=x", "needs an unsigned integer"},
      {"qsgd:levels=-1", "needs an unsigned integer"},
      {"qsgd:levels=3x", "needs an unsigned integer"},
      {"qsgd:levels=", "needs an unsigned integer"},
      {"qsgd:levels=4294967296", "needs an unsigned integer"},
      {"qsgd:bucket=1.5", "needs an unsigned integer"},
      {"int8:rounding=up", "must be one of nearest, stochastic"},
      {"onebit:scaling=max", "must be one of mean_abs, none"},
      {"dithering:partition=log", "must be one of linear, natural"},
      {"dithering:norm=l1", "must be one of max, l2"},
      {"qsgd:levels", "is not key=value"},
      {"qsgd:=3", "is not key=value"},
      {"qsgd:levels=0", "levels"},
      {"qsgd:levels=32768", "levels"},
      {"dithering:partition=natural,levels=31", "levels"},
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
    CHECK(msg.find(c.says) != std::string::npos);
  }
}

TEST_CASE("decompress_any decodes every codec's packet from its header", "[feedback][any_codec]") {
  std::size_t const n = 300;
  rng r(2);
  auto const x = make_gradient(r, n);
  gc::codec_context ctx;
  ctx.seed = 7;
  for (auto const& ref : all_specs()) {
    INFO("spec \"" << ref.spec << "\"");
    for (int src = 0; src < 3; ++src) {
      std::vector<std::byte> const p = src == 0   ? ref.compress32(x, ctx)
                                       : src == 1 ? ref.compress16(convert<gc::half>(x), ctx)
                                                  : ref.compressb(convert<gc::bfloat16>(x), ctx);
      std::vector<float> base(n, -1.0f);
      std::vector<float> got = base;
      gc::decompress_any<float>(p, got);
      REQUIRE(got == ref.decode32(p, base, 1.0f, false));
      got = base;
      gc::decompress_any<float>(p, got, 0.75f, true);
      REQUIRE(got == ref.decode32(p, base, 0.75f, true));
      std::vector<gc::half> hbase(n, gc::half(0.5f));
      std::vector<gc::half> hgot = hbase;
      gc::decompress_any<gc::half>(p, hgot);
      REQUIRE(hgot == ref.decode16(p, hbase, 1.0f, false));
      hgot = hbase;
      gc::decompress_any<gc::half>(p, hgot, -3.0f, true);
      REQUIRE(hgot == ref.decode16(p, hbase, -3.0f, true));
    }
  }
}

TEST_CASE("decompress_any rejects unknown codec ids and bad headers", "[feedback][any_codec]") {
  std::vector<float> const x(16, 1.5f);
  auto const good = compress_with(gc::identity_codec{}, x, {});
  std::vector<float> out(16);
  REQUIRE_NOTHROW(gc::decompress_any<float>(good, out));
  CHECK(out == x);
  for (unsigned id : {0u, 99u, 100u, 255u}) {
    auto bad = good;
    bad[5] = static_cast<std::byte>(id);
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
  bad_magic[1] = std::byte{0};
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
