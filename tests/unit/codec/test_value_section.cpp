// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// codec/value_section.hpp: the summable and shared-support codecs say where their values are
// (the collective layer keeps no per-codec table); any_codec forwards it, and a codec of
// another kind has none.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/value_section.hpp>
#include <gradcomp/collective/sections.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

template <class Codec>
std::vector<std::byte> packet_of(Codec const& c, std::vector<float> const& x, gc::codec_context const& ctx = {}) {
  std::vector<std::byte> p(c.max_compressed_bytes(x.size()));
  p.resize(c.compress(gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{3}), p, ctx));
  return p;
}

}  // namespace

TEST_CASE("codecs own their value section; any_codec forwards it", "[codec][value_section]") {
  std::vector<float> const x = {1.0f, -2.0f, 3.5f, 0.25f, 8.0f, -1.0f, 0.5f, 2.0f};
  std::size_t const h = gc::header_bytes;
  gc::codec_context ctx;
  ctx.seed = 9;
  ctx.step = 4;
  auto const id = gc::identity_codec{}.value_section(packet_of(gc::identity_codec{}, x));
  CHECK(id == gc::value_section{h, 32, gc::dtype::f32});
  CHECK(gc::fp16_codec{}.value_section(packet_of(gc::fp16_codec{}, x)) == gc::value_section{h, 16, gc::dtype::f16});
  CHECK(gc::bf16_codec{}.value_section(packet_of(gc::bf16_codec{}, x)) == gc::value_section{h, 16, gc::dtype::bf16});
  auto const rk = gc::random_k_codec::count(3, gc::sparse_values::bf16);
  auto const rp = packet_of(rk, x, ctx);
  CHECK(rk.value_section(rp) == gc::value_section{h + 4, 6, gc::dtype::bf16});  // after the check word
  // The values really are there: the identity section holds x.
  auto const ip = packet_of(gc::identity_codec{}, x);
  std::vector<float> back(x.size());
  std::memcpy(back.data(), ip.data() + id.offset, id.bytes);
  CHECK(back == x);
  // any_codec forwards; the collective layer asks the codec.
  for (std::string spec : {"identity", "fp16", "bf16", "randomk:k=3,values=bf16"}) {
    CAPTURE(spec);
    gc::any_codec const c = gc::make_codec(spec);
    auto const p = packet_of(c, x, ctx);
    gc::value_section const s = c.value_section(p);
    CHECK(gc::detail::section_of(c, p) == s);
    CHECK(s.offset + s.bytes == p.size());
  }
  CHECK(gc::make_codec("randomk:k=3,values=bf16").value_section(rp) == rk.value_section(rp));
  // A gather codec has none: config_error, from any_codec and from the collective layer.
  gc::any_codec const topk = gc::make_codec("topk:k=2");
  auto const tp = packet_of(topk, x);
  CHECK_THROWS_AS(topk.value_section(tp), gc::config_error);
  CHECK_THROWS_AS(gc::detail::section_of(gc::topk_codec::count(2), tp), gc::config_error);
  // A malformed packet is a format_error.
  auto bad = ip;
  bad.resize(bad.size() - 4);
  CHECK_THROWS_AS(gc::identity_codec{}.value_section(bad), gc::format_error);
}
