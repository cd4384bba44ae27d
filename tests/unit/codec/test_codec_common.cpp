// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Properties every codec shares, checked over the table of all codec variants
// (support/codec_support.hpp): the codec concept, exact packet sizes and the output-buffer
// contract, packets independent of thread count and ISA level, rejection of malformed packets
// (every truncation, bad header fields, random byte flips), the NaN/Inf policy, and
// decompress_add.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

// ---------------------------------------------------------------------------------------------
// The codec concept, both ways.
// ---------------------------------------------------------------------------------------------

static_assert(gc::codec<gc::identity_codec>);
static_assert(gc::codec<gc::fp16_codec>);
static_assert(gc::codec<gc::bf16_codec>);
static_assert(gc::codec<gc::onebit_codec>);
static_assert(gc::codec<gc::int8_codec>);
static_assert(gc::codec<gc::int4_codec>);
static_assert(gc::codec<gc::chunk_topk_codec>);
static_assert(gc::codec<gc::dct_sign_codec>);
static_assert(gc::codec<gc::natural_codec>);
static_assert(gc::codec<gc::qsgd_codec>);
static_assert(gc::codec<gc::terngrad_codec>);
static_assert(gc::codec<gc::dithering_codec>);
// any_codec has the operations but no static traits: it is not a `codec`.
static_assert(gc::codec_operations<gc::any_codec>);
static_assert(!gc::codec<gc::any_codec>);
static_assert(!gc::codec<int>);
static_assert(!gc::codec<gc::half>);

/// Has every operation and trait of a codec, but no opt-in tag.
struct untagged_lookalike {
  static constexpr gc::codec_id id = gc::codec_id::identity;
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::summable;
  static constexpr bool unbiased = true;
  std::size_t max_compressed_bytes(std::size_t) const { return 0; }
  double bits_per_element() const { return 0; }
  template <gc::element T>
  std::size_t compress(gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const {
    return 0;
  }
  template <gc::element T>
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&) const {}
  template <gc::element T>
  void decompress_add(std::span<std::byte const>, std::span<T>, float,
                      gc::codec_context const&) const {}
};
static_assert(gc::codec_operations<untagged_lookalike>);
static_assert(!gc::codec<untagged_lookalike>);

/// The same with the tag: now it is a codec (the tag is what the concept asks for).
struct tagged_lookalike : untagged_lookalike {
  using codec_concept = gc::codec_tag;
};
static_assert(gc::codec<tagged_lookalike>);

/// Tagged, but missing decompress_add: not a codec.
struct tagged_incomplete {
  using codec_concept = gc::codec_tag;
  static constexpr gc::codec_id id = gc::codec_id::identity;
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::summable;
  static constexpr bool unbiased = true;
  std::size_t max_compressed_bytes(std::size_t) const { return 0; }
  double bits_per_element() const { return 0; }
  template <gc::element T>
  std::size_t compress(gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const {
    return 0;
  }
  template <gc::element T>
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&) const {}
};
static_assert(!gc::codec<tagged_incomplete>);

/// Tagged and complete, but without the `unbiased` trait: not a codec.
struct tagged_without_traits : untagged_lookalike {
  using codec_concept = gc::codec_tag;
  static constexpr int id = 0;  // not a codec_id
};
static_assert(!gc::codec<tagged_without_traits>);

std::vector<std::size_t> size_list() {
  std::vector<std::size_t> v = {0, 1, 7, 8, 15, 16, 17, 127, 128, 129, 4095, 4096, 4097, 100003};
  return v;
}

template <class T>
std::vector<T> typed(std::vector<float> const& x) {
  return convert_to<T>(x);
}

std::string expect_numeric_error(gc::any_codec const& c, std::span<float const> x,
                                 gc::codec_context const& ctx) {
  std::size_t const max = c.max_compressed_bytes(x.size());
  std::vector<std::byte> buf(max + guard_bytes, guard_byte);
  std::string msg;
  try {
    c.compress(gc::tensor_view<float const>(x), std::span<std::byte>(buf).first(max), ctx);
  } catch (gc::numeric_error const& e) {
    msg = e.what();
  }
  for (std::size_t i = max; i < buf.size(); ++i) {
    if (buf[i] != guard_byte) FAIL("a failing compress wrote past its buffer at offset " << i);
  }
  return msg;
}

}  // namespace

TEST_CASE(
    "packet size equals the header plus the documented payload for every codec, size "
    "and bucket",
    "[codec][size]") {
  for (std::uint32_t bucket : {0u, 16u, 33u, 100u, 512u}) {
    for (auto const& v : all_variants(bucket)) {
      for (std::size_t n : size_list()) {
        if (quick_mode() && n == 100003 && bucket != 33) continue;
        CAPTURE(v.name, bucket, n);
        auto const x = gaussian(n, n + bucket);
        auto const p = compress(v.codec, x);  // also checks max_compressed_bytes and the guard
        REQUIRE(p.size() == hdr + v.payload(n, gc::dtype::f32));
        auto const h = gc::read_header(p);
        REQUIRE(h.count == n);
        REQUIRE(h.payload_bytes == v.payload(n, gc::dtype::f32));
        REQUIRE(h.type == gc::dtype::f32);
        REQUIRE(h.codec == v.codec.id());
        if (n == 4097) {
          auto const ph = compress(v.codec, typed<gc::half>(x));
          REQUIRE(ph.size() == hdr + v.payload(n, gc::dtype::f16));
          REQUIRE(gc::read_header(ph).type == gc::dtype::f16);
          auto const pb = compress(v.codec, typed<gc::bfloat16>(x));
          REQUIRE(pb.size() == hdr + v.payload(n, gc::dtype::bf16));
          REQUIRE(gc::read_header(pb).type == gc::dtype::bf16);
        }
        if (n == 129 || n == 0) {
          // An exact-size buffer is enough; one byte less is a config_error that leaves the
          // bytes past the buffer alone.
          std::vector<std::byte> buf(p.size() + guard_bytes, guard_byte);
          REQUIRE(v.codec.compress(gc::tensor_view<float const>(x),
                                   std::span<std::byte>(buf).first(p.size())) == p.size());
          REQUIRE(std::equal(p.begin(), p.end(), buf.begin()));
          std::fill(buf.begin(), buf.end(), guard_byte);
          REQUIRE_THROWS_AS(v.codec.compress(gc::tensor_view<float const>(x),
                                             std::span<std::byte>(buf).first(p.size() - 1)),
                            gc::config_error);
          REQUIRE(std::all_of(buf.begin() + static_cast<std::ptrdiff_t>(p.size()) - 1, buf.end(),
                              [](std::byte b) { return b == guard_byte; }));
        }
      }
    }
  }
}

TEST_CASE("nominal bits per element follow the payload layouts", "[codec][size]") {
  REQUIRE(gc::identity_codec{}.bits_per_element() == 32.0);
  REQUIRE(gc::fp16_codec{}.bits_per_element() == 16.0);
  REQUIRE(gc::bf16_codec{}.bits_per_element() == 16.0);
  REQUIRE(gc::onebit_codec{}.bits_per_element() == 1.0);
  REQUIRE(gc::int8_codec(64).bits_per_element() == 9.0);
  REQUIRE(gc::int8_codec(0).bits_per_element() == 8.0);
  REQUIRE(gc::int4_codec(64).bits_per_element() == 4.5);
  REQUIRE(gc::int4_codec(0).bits_per_element() == 4.0);
  REQUIRE(gc::natural_codec(64).bits_per_element() == 8.125);
  REQUIRE(gc::qsgd_codec(7, 64).bits_per_element() == 4.5);  // 1 + 3 bits, 32/64 for the norm
  REQUIRE(gc::qsgd_codec(8, 0).bits_per_element() == 5.0);
  REQUIRE(gc::terngrad_codec(32).bits_per_element() == 3.0);
  REQUIRE(gc::dithering_codec(30, gc::dither_partition::natural, gc::dither_norm::max, 0)
              .bits_per_element() == 6.0);
  // max_compressed_bytes is an upper bound of every dtype's packet, and exact for float.
  for (auto const& v : all_variants(100)) {
    for (std::size_t n : {0u, 1u, 1000u}) {
      REQUIRE(v.codec.max_compressed_bytes(n) == hdr + v.payload(n, gc::dtype::f32));
      REQUIRE(v.codec.max_compressed_bytes(n) >= hdr + v.payload(n, gc::dtype::f16));
    }
  }
}

TEST_CASE("packets and decoded tensors are identical for every thread count and ISA level",
          "[codec][determinism][isa][threads]") {
  std::size_t const n = quick_mode() ? 140001 : 200003;  // several parallel chunks
  auto x = heavy_tailed(n, 2024);
  x[7] = 0.0f;
  x[8] = -0.0f;
  std::vector<std::uint32_t> buckets = {0, 33};
  if (!quick_mode()) buckets.push_back(512);
  for (std::uint32_t bucket : buckets) {
    for (auto const& v : all_variants(bucket)) {
      CAPTURE(v.name, bucket);
      gc::codec_context const ref_ctx = serial_ctx(gc::cpu::isa::scalar, 99, 3);
      auto const ref = compress(v.codec, x, ref_ctx, gc::tensor_id{5});
      auto const ref_out = decompress<float>(v.codec, ref, n, ref_ctx);
      std::vector<float> ref_add(n, 0.25f);
      v.codec.decompress_add(std::span<std::byte const>(ref), std::span<float>(ref_add), -0.75f,
                             ref_ctx);

      struct combo {
        unsigned threads;
        gc::cpu::isa level;
      };
      for (combo k : {combo{1, gc::cpu::isa::best}, combo{2, gc::cpu::isa::best},
                      combo{3, gc::cpu::isa::best}, combo{2, gc::cpu::isa::scalar},
                      combo{3, gc::cpu::isa::avx2}, combo{2, gc::cpu::isa::avx512},
                      combo{0, gc::cpu::isa::avx512}}) {
        gc::codec_context const ctx =
            k.threads == 0 ? serial_ctx(k.level, 99, 3) : parallel_ctx(k.threads, k.level, 99, 3);
        CAPTURE(k.threads, gc::cpu::isa_name(k.level));
        auto const p = compress(v.codec, x, ctx, gc::tensor_id{5});
        REQUIRE(p == ref);
        auto const out = decompress<float>(v.codec, ref, n, ctx);
        REQUIRE(std::memcmp(out.data(), ref_out.data(), 4 * n) == 0);
        std::vector<float> add(n, 0.25f);
        v.codec.decompress_add(std::span<std::byte const>(ref), std::span<float>(add), -0.75f, ctx);
        REQUIRE(std::memcmp(add.data(), ref_add.data(), 4 * n) == 0);
      }
    }
  }
}

TEST_CASE("empty tensors give a header-only packet that decodes to nothing", "[codec][size]") {
  for (auto const& v : all_variants(16)) {
    CAPTURE(v.name);
    std::vector<float> const none;
    auto const p = compress(v.codec, none);
    REQUIRE(gc::read_header(p).count == 0);
    std::vector<float> out;
    v.codec.decompress(std::span<std::byte const>(p), std::span<float>(out));
    v.codec.decompress_add(std::span<std::byte const>(p), std::span<float>(out), 2.0f);
    std::vector<float> one(1);
    REQUIRE_THROWS_AS(v.codec.decompress(std::span<std::byte const>(p), std::span<float>(one)),
                      gc::config_error);
  }
}

TEST_CASE(
    "malformed packets are rejected with format_error, a wrong output size with "
    "config_error",
    "[codec][malformed]") {
  auto const x = formula_input(37);
  auto const variants = all_variants(16);
  for (auto const& v : variants) {
    CAPTURE(v.name);
    auto const good = compress(v.codec, x, gc::codec_context{}, gc::tensor_id{1});
    std::vector<float> out(37);
    auto decode = [&](std::vector<std::byte> const& p) {
      v.codec.decompress(std::span<std::byte const>(p), std::span<float>(out));
    };
    auto decode_any = [&](std::vector<std::byte> const& p) {
      gc::decompress_any(std::span<std::byte const>(p), std::span<float>(out));
    };
    REQUIRE_NOTHROW(decode(good));
    REQUIRE_NOTHROW(decode_any(good));

    {  // every truncation
      for (std::size_t len = 0; len < good.size(); ++len) {
        CAPTURE(len);
        std::vector<std::byte> const p(good.begin(),
                                       good.begin() + static_cast<std::ptrdiff_t>(len));
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
    }
    {  // a trailing byte
      auto p = good;
      p.push_back(std::byte{0});
      REQUIRE_THROWS_AS(decode(p), gc::format_error);
      REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
    }
    {  // bad magic, version or dtype
      for (std::size_t i = 0; i < 4; ++i) {
        auto p = good;
        put_u8(p, i, static_cast<unsigned>(p[i]) ^ 0x20u);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
      for (unsigned ver : {0u, 3u, 255u}) {
        auto p = good;
        put_u8(p, field::version, ver);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
      }
      for (unsigned t : {0u, 4u, 255u}) {
        auto p = good;
        put_u8(p, field::dtype, t);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
    }
    {  // wrong codec
      for (unsigned id : {0u, 10u, 200u, 255u}) {
        auto p = good;
        put_u8(p, field::codec, id);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
      for (auto const& other : variants) {
        if (other.codec.id() == v.codec.id()) continue;
        CAPTURE(other.name);
        REQUIRE_THROWS_AS(
            other.codec.decompress(std::span<std::byte const>(good), std::span<float>(out)),
            gc::format_error);
      }
    }
    {  // payload size field that disagrees with the buffer
      std::uint64_t const pl = good.size() - hdr;
      for (std::uint64_t bad : {pl + 1, pl - 1, std::uint64_t{0}, UINT64_MAX, UINT64_MAX - 31}) {
        if (bad == pl) continue;
        auto p = good;
        put_u64(p, field::payload, bad);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
      // A consistent header and buffer that are both too large for the codec's parameters.
      auto p = good;
      p.insert(p.end(), 8, std::byte{0});
      put_u64(p, field::payload, pl + 8);
      REQUIRE_THROWS_AS(decode(p), gc::format_error);
    }
    {  // element count that disagrees with the payload
      for (std::uint64_t count : {std::uint64_t{37 + 64}, std::uint64_t{37 * 3},
                                  std::uint64_t{1} << 62, std::uint64_t{1} << 63, UINT64_MAX,
                                  UINT64_MAX / 4 + 1, UINT64_MAX / 16 + 1, UINT64_MAX / 32 + 1}) {
        CAPTURE(count);
        auto p = good;
        put_u64(p, field::count, count);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
        REQUIRE_THROWS_AS(decode_any(p), gc::format_error);
      }
    }
    {  // an output span of the wrong size
      for (std::size_t m : {0u, 36u, 38u, 100u}) {
        std::vector<float> o(m);
        REQUIRE_THROWS_AS(v.codec.decompress(std::span<std::byte const>(good), std::span<float>(o)),
                          gc::config_error);
        REQUIRE_THROWS_AS(
            v.codec.decompress_add(std::span<std::byte const>(good), std::span<float>(o)),
            gc::config_error);
        std::vector<gc::half> oh(m);
        REQUIRE_THROWS_AS(
            v.codec.decompress(std::span<std::byte const>(good), std::span<gc::half>(oh)),
            gc::config_error);
        REQUIRE_THROWS_AS(gc::decompress_any(std::span<std::byte const>(good), std::span<float>(o)),
                          gc::config_error);
      }
    }
    {  // non-zero unused header fields
      // Each codec documents which of variant/param0/param1 it uses; flipping a bit of every
      // field either is rejected or leaves a packet the codec documents as valid. Fields a
      // codec does not use must be zero.
      std::string const name = v.name.substr(0, v.name.find(':'));
      bool const uses_p0 = name == "int8" || name == "int4" || name == "chunk_topk" || name == "dct_sign" || name == "natural" || name == "qsgd" ||
                           name == "terngrad" || name == "dithering";
      bool const uses_p1 = name == "chunk_topk" || name == "dct_sign" || name == "qsgd" || name == "terngrad" || name == "dithering";
      if (!uses_p0) {
        auto p = good;
        put_u32(p, field::param0, 1);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
      }
      if (!uses_p1) {
        auto p = good;
        put_u32(p, field::param1, 1u << 31);
        REQUIRE_THROWS_AS(decode(p), gc::format_error);
      }
      auto p = good;
      put_u8(p, field::variant, 0x80);  // no codec has 128 variants
      REQUIRE_THROWS_AS(decode(p), gc::format_error);
    }
  }
}

TEST_CASE("decoding randomly corrupted packets either succeeds or throws gradcomp::error",
          "[codec][malformed][fuzz]") {
  test_rng rng(0xf022);
  std::size_t const rounds = quick_mode() ? 250 : 1500;
  std::size_t failures_seen = 0, successes_seen = 0;
  for (std::uint32_t bucket : {16u, 0u}) {
    for (auto const& v : all_variants(bucket)) {
      for (std::size_t n : {std::size_t{37}, std::size_t{300}}) {
        CAPTURE(v.name, bucket, n);
        auto const x = heavy_tailed(n, n);
        auto const good = compress(v.codec, x, gc::codec_context{.seed = 7, .step = 1});
        for (std::size_t r = 0; r < rounds; ++r) {
          auto p = good;
          unsigned const flips = 1 + rng.below(3);
          for (unsigned f = 0; f < flips; ++f) {
            // Half of the mutations hit the header, where the checks are.
            std::size_t const pos = rng.below(2) == 0
                                        ? rng.below(static_cast<std::uint32_t>(hdr))
                                        : rng.below(static_cast<std::uint32_t>(p.size()));
            if (rng.below(2) == 0) {
              p[pos] ^= static_cast<std::byte>(1u << rng.below(8));
            } else {
              p[pos] = static_cast<std::byte>(rng.below(256));
            }
          }
          if (rng.below(8) == 0) p.resize(rng.below(static_cast<std::uint32_t>(p.size()) + 8));
          gc::codec_context ctx;
          ctx.isa = isa_levels[rng.below(3)];
          // Decode into the middle of a guarded buffer.
          std::vector<float> buf(n + 32, 1234.5f);
          std::span<float> out(buf.data() + 16, n);
          bool const threw = throws_gradcomp_error([&] {
            if (r % 2 == 0) {
              v.codec.decompress(std::span<std::byte const>(p), out, ctx);
            } else {
              gc::decompress_any(std::span<std::byte const>(p), out, 0.5f, true, ctx);
            }
          });
          (threw ? failures_seen : successes_seen)++;
          for (std::size_t i = 0; i < 16; ++i) {
            if (bits_of(buf[i]) != bits_of(1234.5f) ||
                bits_of(buf[n + 16 + i]) != bits_of(1234.5f)) {
              FAIL("decoding wrote outside its output span (round " << r << ")");
            }
          }
        }
      }
    }
  }
  // The fuzzer reached both outcomes (mutations in the code stream often stay valid).
  REQUIRE(failures_seen > 0);
  REQUIRE(successes_seen > 0);
}

TEST_CASE("lossy codecs reject NaN and infinite elements with numeric_error naming the index",
          "[codec][nonfinite]") {
  std::size_t const small = 37;
  std::size_t const large = 140001;
  auto const xs = gaussian(small, 4);
  auto const xl = gaussian(large, 5);
  for (std::uint32_t bucket : {16u, 0u}) {
    for (auto const& v : all_variants(bucket)) {
      std::string const name = v.name.substr(0, v.name.find(':'));
      if (name == "identity" || name == "fp16" || name == "bf16") continue;
      for (float bad : {NAN, INFINITY, -INFINITY, -NAN}) {
        for (std::size_t idx : {std::size_t{0}, std::size_t{5}, std::size_t{36}}) {
          CAPTURE(v.name, bucket, bad, idx);
          auto x = xs;
          x[idx] = bad;
          for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
            std::string const msg = expect_numeric_error(v.codec, x, serial_ctx(level));
            CAPTURE(msg);
            REQUIRE(msg.find("at element " + std::to_string(idx) + ";") != std::string::npos);
          }
          // As half input too.
          auto const xh = typed<gc::half>(x);
          std::vector<std::byte> buf(v.codec.max_compressed_bytes(small));
          REQUIRE_THROWS_AS(
              v.codec.compress(gc::tensor_view<gc::half const>(std::span<gc::half const>(xh)),
                               std::span<std::byte>(buf)),
              gc::numeric_error);
        }
        // Two bad elements in different parallel chunks: the first one is named.
        auto x = xl;
        x[large - 3] = bad;
        x[100001] = bad;
        std::string const msg = expect_numeric_error(v.codec, x, parallel_ctx(3));
        CAPTURE(v.name, bucket, msg);
        REQUIRE(msg.find("at element 100001;") != std::string::npos);
      }
    }
  }
}

TEST_CASE("decompress_add adds alpha times the decoded tensor with one fused multiply-add",
          "[codec][decompress_add]") {
  auto const x = heavy_tailed(1000, 31);
  test_rng rng(5);
  std::vector<float> y0(x.size());
  for (auto& v : y0) v = static_cast<float>(rng.gaussian() * 1e-2);
  for (auto const& v : all_variants(64)) {
    for (float alpha : {1.0f, -0.5f, 0.3f, 0.0f}) {
      auto check_input = [&]<class In>(In) {
        auto const xin = typed<In>(x);
        auto const p = compress(v.codec, xin);
        for (auto level : {gc::cpu::isa::scalar, gc::cpu::isa::best}) {
          gc::codec_context const ctx = serial_ctx(level);
          auto const ref = decompress<float>(v.codec, p, x.size(), ctx);
          auto check_output = [&]<class Out>(Out) {
            std::vector<Out> const start = typed<Out>(y0);
            std::vector<Out> out = start;
            v.codec.decompress_add(std::span<std::byte const>(p), std::span<Out>(out), alpha, ctx);
            std::size_t bad = 0, first = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
              Out const want = gc::from_float<Out>(std::fma(alpha, ref[i], gc::to_float(start[i])));
              if (raw_bits(out[i]) != raw_bits(want) && bad++ == 0) first = i;
            }
            CAPTURE(v.name, alpha, gc::dtype_name(gc::dtype_of<In>),
                    gc::dtype_name(gc::dtype_of<Out>), gc::cpu::isa_name(level), first, ref[first]);
            CHECK(bad == 0);
          };
          check_output(float{});
          check_output(gc::half{});
          check_output(gc::bfloat16{});
        }
      };
      check_input(float{});
      check_input(gc::half{});
      check_input(gc::bfloat16{});
    }
  }
}

TEST_CASE("16-bit inputs give the packet of their exact float values", "[codec][dtype]") {
  auto const x = heavy_tailed(3001, 77);
  auto const xh = typed<gc::half>(x);
  auto const xb = typed<gc::bfloat16>(x);
  std::vector<float> wide_h(x.size()), wide_b(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    wide_h[i] = gc::to_float(xh[i]);
    wide_b[i] = gc::to_float(xb[i]);
  }
  gc::codec_context const ctx{.seed = 3, .step = 9};
  for (auto const& v : all_variants(100)) {
    if (v.codec.id() == gc::codec_id::identity) continue;  // carries the input type itself
    CAPTURE(v.name);
    auto ph = compress(v.codec, xh, ctx, gc::tensor_id{2});
    auto pb = compress(v.codec, xb, ctx, gc::tensor_id{2});
    auto const fh = compress(v.codec, wide_h, ctx, gc::tensor_id{2});
    auto const fb = compress(v.codec, wide_b, ctx, gc::tensor_id{2});
    REQUIRE(static_cast<unsigned>(ph[field::dtype]) == 2u);
    REQUIRE(static_cast<unsigned>(pb[field::dtype]) == 3u);
    put_u8(ph, field::dtype, 1);
    put_u8(pb, field::dtype, 1);
    REQUIRE(ph == fh);
    REQUIRE(pb == fb);
  }
}

TEST_CASE("max_compressed_bytes throws instead of wrapping around for impossibly large tensors",
          "[codec][size]") {
  std::size_t const limit = static_cast<std::size_t>(gc::max_packet_elements);
  for (std::uint32_t bucket : {0u, 512u}) {
    for (auto const& v : all_variants(bucket)) {
      CAPTURE(v.name, bucket);
      // At the limit the bound is exact arithmetic: at least the header and growing with n.
      std::size_t const at_limit = v.codec.max_compressed_bytes(limit);
      REQUIRE(at_limit >= v.codec.max_compressed_bytes(limit / 2));
      REQUIRE(at_limit >= hdr);
      // Beyond it (identity at 2^62 used to give 32 bytes) a config_error, never a wrapped size.
      for (std::size_t n : {limit + 1, std::size_t{1} << 62, std::size_t{1} << 63, SIZE_MAX}) {
        CAPTURE(n);
        REQUIRE_THROWS_AS(v.codec.max_compressed_bytes(n), gc::config_error);
      }
    }
  }
  gc::powersgd_options o;
  o.rank = 4;
  gc::powersgd psgd(o);
  REQUIRE(psgd.max_compressed_bytes(1000, 1000) == hdr + 4 * 4 * 2000);
  REQUIRE_THROWS_AS(psgd.max_compressed_bytes(std::size_t{1} << 32, std::size_t{1} << 32),
                    gc::config_error);
  REQUIRE_THROWS_AS(psgd.max_compressed_bytes(SIZE_MAX, 2), gc::config_error);
}

TEST_CASE("the device-usable bit helpers of the packet formats agree with <bit>", "[codec][format]") {
  // format/common.hpp: single_bit and trailing_zeros stand in for std::has_single_bit and
  // std::countr_zero in functions that CUDA kernels call (nvcc cannot call the std ones there).
  std::vector<std::uint32_t> values;
  for (std::uint32_t v = 0; v <= 4100; ++v) values.push_back(v);
  for (unsigned b = 0; b < 32; ++b) {
    std::uint32_t const p = std::uint32_t{1} << b;
    for (std::uint32_t v : {p - 1, p, p + 1, p | 0x80000000u}) values.push_back(v);
  }
  values.push_back(0xffffffffu);
  for (std::uint32_t v : values) {
    INFO("v = " << v);
    REQUIRE(gc::detail::single_bit(v) == std::has_single_bit(v));
    REQUIRE(gc::detail::trailing_zeros(v) == static_cast<unsigned>(std::countr_zero(v)));
  }
  STATIC_REQUIRE(gc::detail::trailing_zeros(1024) == 10);
  STATIC_REQUIRE(!gc::detail::single_bit(0));
}
