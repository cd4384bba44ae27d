// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Error-feedback state: untouched by a rejected step (non-finite gradient, overflow, codec
// error, size mismatch), kept per tensor id, saved and restored exactly, and a malformed saved
// state is refused with the previous state kept.

#include "feedback_support.hpp"

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace gc = gradcomp;
using namespace feedback_test;

namespace {

float const k_nan = std::numeric_limits<float>::quiet_NaN();
float const k_inf = std::numeric_limits<float>::infinity();

// Runs `f`, which must throw E; returns its message.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (E const& e) {
    return e.what();
  } catch (std::exception const& e) {
    return std::string("<wrong exception: ") + e.what() + ">";
  }
  return "<no exception>";
}

template <class Compressor>
void warm_up(Compressor& c, std::vector<gc::tensor_id> const& ids, std::size_t n, int steps,
             std::uint64_t seed) {
  rng r(seed);
  gc::codec_context ctx;
  for (int t = 0; t < steps; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    for (auto id : ids) (void)compress_packet(c, make_gradient(r, n), id, ctx);
  }
}

// Byte-wise equality that Catch reports as true/false rather than printing whole buffers.
bool same_bytes(std::vector<std::byte> const& a, std::vector<std::byte> const& b) { return a == b; }

// Appends little-endian integers / floats to a byte vector (to build saved states by hand).
struct byte_writer {
  std::vector<std::byte> bytes;
  template <class U>
  byte_writer& put(U v) {
    for (std::size_t i = 0; i < sizeof(U); ++i)
      bytes.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  byte_writer& put_f32(float f) { return put(std::bit_cast<std::uint32_t>(f)); }
  byte_writer& header(std::uint8_t policy, std::uint32_t count) {
    for (char ch : {'G', 'C', 'E', 'F'}) bytes.push_back(static_cast<std::byte>(ch));
    put<std::uint8_t>(1)
        .put<std::uint8_t>(policy)
        .put<std::uint16_t>(0)
        .put<std::uint32_t>(count)
        .put<std::uint32_t>(0);
    return *this;
  }
  // The state as version 3: the version byte set and the CRC32C trailer appended.
  [[nodiscard]] std::vector<std::byte> sealed() const {
    auto v = bytes;
    gc::detail::seal_feedback_state(v);
    return v;
  }
};

// A saved (version 3) state edited on purpose, its checksum recomputed so that the edit
// reaches the parser.
std::vector<std::byte> resealed(std::vector<std::byte> v) {
  gc::detail::seal_state(v);
  return v;
}

// The first `len` bytes of a saved state's body (without its checksum), sealed again.
std::vector<std::byte> sealed_prefix(std::vector<std::byte> const& state, std::size_t len) {
  std::vector<std::byte> v(state.begin(), state.begin() + static_cast<std::ptrdiff_t>(len));
  gc::detail::seal_feedback_state(v);
  return v;
}

}  // namespace

TEST_CASE("feedback state: a non-finite gradient is rejected and changes nothing",
          "[feedback][state][nonfinite]") {
  std::size_t const n = 200;
  auto bad_gradients = [&] {
    std::vector<std::pair<std::size_t, float>> cases = {
        {37, k_nan}, {0, k_inf}, {199, -k_inf}, {100, -k_nan}};
    return cases;
  };

  auto check_policy = [&](auto& comp, auto& twin) {
    warm_up(comp, {gc::tensor_id{1}, gc::tensor_id{2}}, n, 5, 17);
    warm_up(twin, {gc::tensor_id{1}, gc::tensor_id{2}}, n, 5, 17);
    auto const before = comp.save();
    REQUIRE(before == twin.save());
    rng r(5);
    for (auto [index, value] : bad_gradients()) {
      auto g = make_gradient(r, n);
      g[index] = value;
      std::vector<std::byte> buf(comp.max_compressed_bytes(n));
      gc::codec_context ctx;
      ctx.step = 5;
      std::string const msg = message_of<gc::numeric_error>([&] {
        (void)comp.compress(gc::tensor_view<float const>(g, gc::tensor_id{1}), buf, ctx);
      });
      INFO("bad value " << value << " at " << index << ": " << msg);
      CHECK(msg.find("element " + std::to_string(index)) != std::string::npos);
      CHECK(msg.find("non-finite") != std::string::npos);
      CHECK(same_bytes(comp.save(), before));
      // 16-bit gradients too.
      auto h = convert<gc::half>(g);
      CHECK_THROWS_AS(comp.compress(gc::tensor_view<gc::half const>(h, gc::tensor_id{1}), buf, ctx),
                      gc::numeric_error);
      auto b = convert<gc::bfloat16>(g);
      CHECK_THROWS_AS(
          comp.compress(gc::tensor_view<gc::bfloat16 const>(b, gc::tensor_id{2}), buf, ctx),
          gc::numeric_error);
      CHECK(same_bytes(comp.save(), before));
    }
    // Afterwards it behaves as if the bad steps never happened.
    rng r2(6);
    gc::codec_context ctx;
    for (int t = 5; t < 10; ++t) {
      ctx.step = static_cast<std::uint32_t>(t);
      auto const g = make_gradient(r2, n);
      REQUIRE(compress_packet(comp, g, gc::tensor_id{1}, ctx) ==
              compress_packet(twin, g, gc::tensor_id{1}, ctx));
    }
    CHECK(same_bytes(comp.save(), twin.save()));
  };

  SECTION("residual feedback, qsgd") {
    gc::compressor<gc::qsgd_codec> a, b;
    check_policy(a, b);
  }
  SECTION("residual feedback, fp16 (a codec that itself carries NaN)") {
    gc::compressor<gc::fp16_codec> a, b;
    check_policy(a, b);
  }
  SECTION("EF21, int8") {
    gc::compressor<gc::int8_codec, gc::ef21_feedback> a, b;
    check_policy(a, b);
  }
  SECTION("EF21, any_codec") {
    gc::compressor<gc::any_codec, gc::ef21_feedback> a(gc::make_codec("onebit")),
        b(gc::make_codec("onebit"));
    check_policy(a, b);
  }
}

TEST_CASE("feedback state: a rejected first step leaves no state behind",
          "[feedback][state][nonfinite]") {
  // feedback.hpp requires a policy's compress to leave the state unchanged when it throws; a
  // tensor's very first step is no exception. Afterwards the id must still accept any size.
  std::vector<float> g(64, 1.0f);
  g[10] = k_nan;
  std::vector<std::byte> buf(4096);
  SECTION("policy level: residual_feedback and ef21_feedback") {
    gc::residual_feedback::state s;
    CHECK_THROWS_AS(gc::residual_feedback{}.compress(gc::qsgd_codec{}, s,
                                                     gc::tensor_view<float const>(g), buf, {}),
                    gc::numeric_error);
    CHECK(s.values().empty());
    gc::ef21_feedback::state e;
    CHECK_THROWS_AS(
        gc::ef21_feedback{}.compress(gc::qsgd_codec{}, e, gc::tensor_view<float const>(g), buf, {}),
        gc::numeric_error);
    CHECK(e.values().empty());
  }
  SECTION("compressor level") {
    gc::compressor<gc::qsgd_codec> comp;
    auto const fresh = comp.save();
    CHECK_THROWS_AS(comp.compress(gc::tensor_view<float const>(g, gc::tensor_id{4}), buf),
                    gc::numeric_error);
    CHECK(same_bytes(comp.save(), fresh));
    // A different size for the same id is still a first step, not a mismatch.
    std::vector<float> const other(32, 0.5f);
    CHECK_NOTHROW(comp.compress(gc::tensor_view<float const>(other, gc::tensor_id{4}), buf));
  }
}

TEST_CASE("feedback state: overflow of the state is a numeric_error, state unchanged",
          "[feedback][state][nonfinite]") {
  float const big = 3.0e38f;
  std::vector<std::byte> buf(1024);
  SECTION("residual: signSGD leaves most of a huge gradient in the residual") {
    gc::compressor<gc::onebit_codec> comp{gc::onebit_codec(gc::onebit_codec::scaling::none)};
    std::vector<float> const g(8, big);
    (void)comp.compress(gc::tensor_view<float const>(g), buf);  // residual = big - 1 = big
    auto const before = comp.save();
    std::string const msg = message_of<gc::numeric_error>(
        [&] { (void)comp.compress(gc::tensor_view<float const>(g), buf); });
    CHECK(msg.find("overflow") != std::string::npos);
    CHECK(same_bytes(comp.save(), before));
  }
  SECTION("EF21: g - h beyond the float range") {
    gc::compressor<gc::identity_codec, gc::ef21_feedback> comp;
    std::vector<float> g(8, big);
    (void)comp.compress(gc::tensor_view<float const>(g), buf);  // h = big
    auto const before = comp.save();
    for (auto& v : g) v = -big;
    CHECK_THROWS_AS(comp.compress(gc::tensor_view<float const>(g), buf), gc::numeric_error);
    CHECK(same_bytes(comp.save(), before));
  }
}

TEST_CASE("feedback state: codec errors and size mismatches leave the state unchanged",
          "[feedback][state]") {
  std::size_t const n = 100;
  gc::compressor<gc::int8_codec> comp(gc::int8_codec(16));
  warm_up(comp, {gc::tensor_id{5}}, n, 3, 1);
  auto const before = comp.save();
  rng r(2);
  auto const g = make_gradient(r, n);
  SECTION("output buffer one byte short") {
    std::vector<std::byte> small(comp.max_compressed_bytes(n) - 1);
    CHECK_THROWS_AS(comp.compress(gc::tensor_view<float const>(g, gc::tensor_id{5}), small),
                    gc::config_error);
    CHECK(same_bytes(comp.save(), before));
  }
  SECTION("a different size for the same tensor id") {
    std::vector<std::byte> buf(4096);
    for (std::size_t m : {std::size_t{99}, std::size_t{101}, std::size_t{1}}) {
      std::vector<float> const h(m, 1.0f);
      std::string const msg = message_of<gc::config_error>(
          [&] { (void)comp.compress(gc::tensor_view<float const>(h, gc::tensor_id{5}), buf); });
      INFO(msg);
      CHECK(msg.find("holds 100 elements") != std::string::npos);
      CHECK(msg.find("has " + std::to_string(m)) != std::string::npos);
      CHECK(same_bytes(comp.save(), before));
    }
    // Another id may have any size.
    std::vector<float> const h(101, 1.0f);
    CHECK_NOTHROW(comp.compress(gc::tensor_view<float const>(h, gc::tensor_id{6}), buf));
    CHECK(comp.state(gc::tensor_id{6}).values().size() == 101);
    CHECK(comp.state(gc::tensor_id{5}).values().size() == 100);
  }
  SECTION("reset forgets everything") {
    comp.reset();
    CHECK(comp.save().size() == 16 + 4);  // head and checksum
    std::vector<std::byte> buf(4096);
    std::vector<float> const h(7, 1.0f);
    CHECK_NOTHROW(comp.compress(gc::tensor_view<float const>(h, gc::tensor_id{5}), buf));
  }
}

TEST_CASE("feedback state: one independent state per tensor id", "[feedback][state]") {
  // Interleaving three tensors in one compressor gives the same packets and residuals as three
  // compressors that each see one tensor.
  std::map<std::uint32_t, std::size_t> const sizes = {{1, 100}, {2, 300}, {70000, 7}};
  gc::compressor<gc::qsgd_codec> shared(gc::qsgd_codec(3, 64));
  std::map<std::uint32_t, gc::compressor<gc::qsgd_codec>> alone;
  for (auto const& [id, n] : sizes)
    alone.emplace(id, gc::compressor<gc::qsgd_codec>(gc::qsgd_codec(3, 64)));
  rng r(8);
  gc::codec_context ctx;
  ctx.seed = 11;
  for (int t = 0; t < 20; ++t) {
    ctx.step = static_cast<std::uint32_t>(t);
    for (auto const& [id, n] : sizes) {
      auto const g = make_gradient(r, n);
      gc::tensor_id const tid{id};
      REQUIRE(compress_packet(shared, g, tid, ctx) == compress_packet(alone.at(id), g, tid, ctx));
    }
  }
  for (auto const& [id, n] : sizes) {
    auto const a = shared.state(gc::tensor_id{id}).values();
    auto const b = alone.at(id).state(gc::tensor_id{id}).values();
    CHECK(a.size() == n);
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
  // The same gradient under two ids draws different random numbers (the id keys the stream).
  gc::compressor<gc::qsgd_codec> c2(gc::qsgd_codec(3, 64));
  auto const g = make_gradient(r, 500);
  auto p1 = compress_packet(c2, g, gc::tensor_id{1}, ctx);
  auto p2 = compress_packet(c2, g, gc::tensor_id{2}, ctx);
  CHECK(p1 != p2);
}

TEST_CASE("feedback state: save layout and round trip", "[feedback][state][save]") {
  gc::compressor<gc::qsgd_codec> comp(gc::qsgd_codec(5, 32));
  warm_up(comp, {gc::tensor_id{9}, gc::tensor_id{2}, gc::tensor_id{0x01020304}}, 50, 4, 3);
  auto const saved = comp.save();

  SECTION("bytes as documented (docs/wire-format.md, Error-feedback state)") {
    REQUIRE(saved.size() == 16 + 3 * (12 + 4 * 50) + 4);
    CHECK(std::memcmp(saved.data(), "GCEF", 4) == 0);
    CHECK(static_cast<unsigned>(saved[4]) == 3);  // version
    // the trailer: CRC32C of every byte before it
    CHECK(gc::detail::load_le<std::uint32_t>(saved.data() + saved.size() - 4) ==
          gc::detail::crc32c_table(std::span<std::byte const>(saved).first(saved.size() - 4)));
    CHECK(static_cast<unsigned>(saved[5]) == 1);  // residual
    CHECK(gc::detail::load_le<std::uint16_t>(saved.data() + 6) == 0);
    CHECK(gc::detail::load_le<std::uint32_t>(saved.data() + 8) == 3);
    CHECK(gc::detail::load_le<std::uint32_t>(saved.data() + 12) == 0);  // no receiver records
    std::size_t at = 16;
    for (std::uint32_t id : {2u, 9u, 0x01020304u}) {  // ascending ids
      CHECK(gc::detail::load_le<std::uint32_t>(saved.data() + at) == id);
      CHECK(gc::detail::load_le<std::uint64_t>(saved.data() + at + 4) == 50);
      auto const v = comp.state(gc::tensor_id{id}).values();
      for (std::size_t i = 0; i < 50; ++i) {
        REQUIRE(std::bit_cast<std::uint32_t>(v[i]) ==
                gc::detail::load_le<std::uint32_t>(saved.data() + at + 12 + 4 * i));
      }
      at += 12 + 4 * 50;
    }
    // Policy ids of the other policies.
    gc::compressor<gc::qsgd_codec, gc::ef21_feedback> e;
    gc::compressor<gc::qsgd_codec, gc::no_feedback> z;
    CHECK(static_cast<unsigned>(e.save()[5]) == 2);
    CHECK(static_cast<unsigned>(z.save()[5]) == 0);
    CHECK(e.save().size() == 16 + 4);
  }

  SECTION("restored state gives identical future packets") {
    gc::compressor<gc::qsgd_codec> restored(gc::qsgd_codec(5, 32));
    warm_up(restored, {gc::tensor_id{77}}, 10, 1, 4);  // state to be replaced
    restored.load(saved);
    CHECK(same_bytes(restored.save(), saved));
    rng r(10);
    gc::codec_context ctx;
    for (int t = 4; t < 12; ++t) {
      ctx.step = static_cast<std::uint32_t>(t);
      for (std::uint32_t id : {9u, 2u, 0x01020304u}) {
        auto const g = make_gradient(r, 50);
        REQUIRE(compress_packet(comp, g, gc::tensor_id{id}, ctx) ==
                compress_packet(restored, g, gc::tensor_id{id}, ctx));
      }
    }
    CHECK(same_bytes(restored.save(), comp.save()));
    // The replaced tensor is gone: a new size for id 77 is accepted.
    std::vector<float> const g(3, 1.0f);
    std::vector<std::byte> buf(256);
    CHECK_NOTHROW(restored.compress(gc::tensor_view<float const>(g, gc::tensor_id{77}), buf));
  }

  SECTION("EF21 and no_feedback round trip") {
    gc::compressor<gc::int8_codec, gc::ef21_feedback> e(gc::int8_codec(8));
    warm_up(e, {gc::tensor_id{1}, gc::tensor_id{3}}, 40, 3, 5);
    gc::compressor<gc::int8_codec, gc::ef21_feedback> e2(gc::int8_codec(8));
    e2.load(e.save());
    CHECK(same_bytes(e2.save(), e.save()));
    rng r(1);
    auto const g = make_gradient(r, 40);
    CHECK(compress_packet(e, g, gc::tensor_id{3}, {}) ==
          compress_packet(e2, g, gc::tensor_id{3}, {}));
    CHECK(same_bytes(e.save(), e2.save()));

    gc::compressor<gc::int8_codec, gc::no_feedback> z;
    warm_up(z, {gc::tensor_id{1}}, 40, 1, 5);
    gc::compressor<gc::int8_codec, gc::no_feedback> z2;
    z2.load(z.save());
    CHECK(same_bytes(z2.save(), z.save()));
  }

  SECTION("an empty compressor saves 20 bytes (head and checksum) and loads them back") {
    gc::compressor<gc::qsgd_codec> empty;
    auto const s = empty.save();
    CHECK(s.size() == 20);
    comp.load(s);
    CHECK(same_bytes(comp.save(), s));
  }
}

TEST_CASE("feedback state: load rejects malformed input and keeps the previous state",
          "[feedback][state][save]") {
  gc::compressor<gc::qsgd_codec> comp;
  warm_up(comp, {gc::tensor_id{1}, gc::tensor_id{4}}, 20, 3, 12);
  auto const good = comp.save();
  auto const previous = comp.save();

  auto rejects = [&](std::vector<std::byte> const& bytes, char const* what) {
    std::string const msg = message_of<gc::format_error>([&] { comp.load(bytes); });
    INFO("message: " << msg);
    CHECK(msg.find(what) != std::string::npos);
    CHECK(same_bytes(comp.save(), previous));
  };

  SECTION("too short for the header, or bad magic") {
    for (std::size_t len = 0; len < 16; ++len) {
      INFO("length " << len);
      rejects(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)),
              "GCEF");
    }
    for (std::size_t i = 0; i < 4; ++i) {
      auto bad = good;
      bad[i] ^= std::byte{0x20};
      INFO("magic byte " << i);
      rejects(bad, "GCEF");
    }
  }
  SECTION("unsupported version") {
    for (unsigned v : {0u, 4u, 255u}) {
      auto bad = good;
      bad[4] = static_cast<std::byte>(v);
      rejects(bad, ("version " + std::to_string(v)).c_str());
    }
  }
  SECTION("saved by another policy") {
    gc::compressor<gc::qsgd_codec, gc::ef21_feedback> e;
    warm_up(e, {gc::tensor_id{1}}, 20, 1, 1);
    rejects(e.save(), "policy 2");
    auto bad = good;
    bad[5] = std::byte{7};
    rejects(resealed(bad), "policy 7");
    // And the other way round.
    auto const e_before = e.save();
    CHECK_THROWS_AS(e.load(good), gc::format_error);
    CHECK(same_bytes(e.save(), e_before));
    gc::compressor<gc::qsgd_codec, gc::no_feedback> z;
    CHECK_THROWS_AS(z.load(good), gc::format_error);
  }
  SECTION("truncated at every length") {
    for (std::size_t len = 16; len < good.size(); ++len) {  // the checksum refuses each
      INFO("length " << len << " of " << good.size());
      std::vector<std::byte> const cut(good.begin(),
                                       good.begin() + static_cast<std::ptrdiff_t>(len));
      CHECK_THROWS_AS(comp.load(cut), gc::format_error);
      REQUIRE(same_bytes(comp.save(), previous));
    }
    rejects(std::vector<std::byte>(good.begin(), good.begin() + 20), "checksum");
    // cut and sealed again: the parser's own checks
    rejects(sealed_prefix(good, 20), "truncated");
    rejects(sealed_prefix(good, 16 + 12 + 4), "beyond the buffer");
  }
  SECTION("trailing bytes") {
    for (std::size_t extra : {1u, 3u, 4u, 12u}) {
      auto bad = good;
      bad.insert(bad.end(), extra, std::byte{0});
      INFO(extra << " extra bytes");
      rejects(bad, "checksum");
      rejects(resealed(bad), "trailing");
    }
  }
  SECTION("a tensor count larger or smaller than the records") {
    auto more = good;
    gc::detail::store_le<std::uint32_t>(more.data() + 8, 3);
    rejects(resealed(more), "truncated");
    auto fewer = good;
    gc::detail::store_le<std::uint32_t>(fewer.data() + 8, 1);
    rejects(resealed(fewer), "trailing");
    auto huge = good;
    gc::detail::store_le<std::uint32_t>(huge.data() + 8, 0xffffffffu);
    rejects(resealed(huge), "truncated");
  }
  SECTION("duplicate tensor ids") {
    byte_writer w;
    w.header(1, 2);
    w.put<std::uint32_t>(3).put<std::uint64_t>(1).put_f32(0.5f);
    w.put<std::uint32_t>(3).put<std::uint64_t>(1).put_f32(0.25f);
    rejects(w.sealed(), "appears twice");
    // Unsorted but distinct ids are fine.
    byte_writer ok;
    ok.header(1, 2);
    ok.put<std::uint32_t>(5).put<std::uint64_t>(1).put_f32(0.5f);
    ok.put<std::uint32_t>(3).put<std::uint64_t>(2).put_f32(0.25f).put_f32(-1.0f);
    gc::compressor<gc::qsgd_codec> other;
    CHECK_NOTHROW(other.load(ok.sealed()));
    CHECK(other.state(gc::tensor_id{3}).values().size() == 2);
    CHECK(other.state(gc::tensor_id{3}).values()[1] == -1.0f);
    CHECK(other.state(gc::tensor_id{5}).values()[0] == 0.5f);
  }
  SECTION("an element count too large for the buffer (and for memory)") {
    for (std::uint64_t n :
         {std::uint64_t{2}, std::uint64_t{1} << 40, std::uint64_t{1} << 62, ~std::uint64_t{0}}) {
      byte_writer w;
      w.header(1, 1);
      w.put<std::uint32_t>(0).put<std::uint64_t>(n).put_f32(1.0f);
      INFO("n = " << n);
      rejects(w.sealed(), "beyond the buffer");
    }
  }
  SECTION("no_feedback state with values") {
    gc::compressor<gc::qsgd_codec, gc::no_feedback> z;
    warm_up(z, {gc::tensor_id{2}}, 10, 1, 3);
    auto const z_before = z.save();
    byte_writer w;
    w.header(0, 1);
    w.put<std::uint32_t>(0).put<std::uint64_t>(1).put_f32(1.0f);
    CHECK_THROWS_AS(z.load(w.sealed()), gc::format_error);
    CHECK(same_bytes(z.save(), z_before));
  }
  SECTION("every byte flipped, and a state without a checksum, is refused") {
    for (std::size_t i = 0; i < good.size(); ++i) {
      for (std::byte mask : {std::byte{0xff}, std::byte{0x01}}) {
        auto bad = good;
        bad[i] ^= mask;
        INFO("byte " << i << " of " << good.size());
        CHECK_THROWS_AS(comp.load(bad), gc::format_error);
      }
    }
    REQUIRE(same_bytes(comp.save(), previous));
    // versions 2 and 1 (no checksum): refused on their own, taken inside a checked container
    std::vector<std::byte> v2(good.begin(), good.end() - 4);
    v2[4] = std::byte{2};
    rejects(v2, "version 2 carries no checksum");
    gc::compressor<gc::qsgd_codec> other;
    other.load(v2, gc::state_check::container);
    CHECK(same_bytes(other.save(), good));
    byte_writer w1;
    w1.header(1, 1);
    w1.put<std::uint32_t>(3).put<std::uint64_t>(1).put_f32(0.5f);
    rejects(w1.bytes, "version 1 carries no checksum");
    other.load(w1.bytes, gc::state_check::container);
    CHECK(other.state(gc::tensor_id{3}).values()[0] == 0.5f);
  }
  SECTION("after a failure a good state still loads") {
    auto bad = good;
    bad.push_back(std::byte{1});
    CHECK_THROWS_AS(comp.load(bad), gc::format_error);
    gc::compressor<gc::qsgd_codec> other;
    warm_up(other, {gc::tensor_id{9}}, 5, 2, 2);
    comp.load(other.save());
    CHECK(same_bytes(comp.save(), other.save()));
  }
}
