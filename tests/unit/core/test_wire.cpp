// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// core/wire.hpp: the 32-byte packet header — byte layout as documented in the table of
// wire.hpp, round trips, and every rejection of read_header / declared_packet_bytes.

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

std::vector<std::byte> packet_with(gc::packet_header const& h, std::size_t payload) {
  std::vector<std::byte> buf(gc::header_bytes + payload, std::byte{0x5a});
  gc::write_header(buf, h);
  return buf;
}

std::span<std::byte const> cspan(std::vector<std::byte> const& v) { return {v.data(), v.size()}; }

// Runs `f`, which must throw gradcomp::format_error; returns its message ("" if it did not).
template <class F>
std::string format_error_message(F&& f) {
  try {
    f();
  } catch (gc::format_error const& e) {
    return e.what();
  } catch (...) {
    return "<a different exception>";
  }
  return "<no exception>";
}

// Hides a value from the optimizer. GCC 12 at -O3 peels the short-buffer loops below and then
// warns (-Warray-bounds) about header writes that the length check makes unreachable.
std::size_t opaque(std::size_t v) {
  volatile std::size_t x = v;
  return x;
}

unsigned byte_at(std::vector<std::byte> const& v, std::size_t i) {
  return static_cast<unsigned>(v[i]);
}

}  // namespace

static_assert(gc::header_bytes == 32);
static_assert(gc::wire_version == 2 && gc::oldest_wire_version == 1);
static_assert(gc::readable_wire_version(1) && gc::readable_wire_version(2) &&
              !gc::readable_wire_version(0) && !gc::readable_wire_version(3));
static_assert(
    gc::packet_header{gc::codec_id::int8, gc::dtype::f16, 0, 10, 100, 0, 0}.packet_bytes() == 132);

TEST_CASE("wire: header bytes are the documented little-endian layout", "[core][wire]") {
  gc::packet_header const h{
      gc::codec_id::qsgd,    gc::dtype::bf16, 0xA7,       0x0102030405060708ull,
      0x1112131415161718ull, 0x21222324u,     0x31323334u};
  std::vector<std::byte> buf(gc::header_bytes, std::byte{0xEE});
  gc::write_header(buf, h);
  std::vector<unsigned> const expect = {
      0x47, 0x43, 0x50, 0x4B,                          // "GCPK"
      0x02,                                            // version
      0x06,                                            // codec id (qsgd)
      0x03,                                            // dtype (bf16)
      0xA7,                                            // variant
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // count, u64 LE
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // payload bytes, u64 LE
      0x24, 0x23, 0x22, 0x21,                          // param0, u32 LE
      0x34, 0x33, 0x32, 0x31};                         // param1, u32 LE
  for (std::size_t i = 0; i < gc::header_bytes; ++i) {
    INFO("byte " << i);
    CHECK(byte_at(buf, i) == expect[i]);
  }
  // Bytes past the header are not touched.
  std::vector<std::byte> big(40, std::byte{0xEE});
  gc::write_header(big, h);
  for (std::size_t i = 32; i < 40; ++i) CHECK(byte_at(big, i) == 0xEE);
  CHECK(std::memcmp(big.data(), buf.data(), 32) == 0);
}

TEST_CASE("wire: codec ids and names", "[core][wire]") {
  struct entry {
    gc::codec_id id;
    unsigned value;
    char const* name;
  };
  entry const table[] = {
      {gc::codec_id::identity, 1, "identity"},  {gc::codec_id::fp16, 2, "fp16"},
      {gc::codec_id::bf16, 3, "bf16"},          {gc::codec_id::int8, 4, "int8"},
      {gc::codec_id::onebit, 5, "onebit"},      {gc::codec_id::qsgd, 6, "qsgd"},
      {gc::codec_id::terngrad, 7, "terngrad"},  {gc::codec_id::natural, 8, "natural"},
      {gc::codec_id::dithering, 9, "dithering"},
      {gc::codec_id::topk, 10, "topk"},          {gc::codec_id::threshold, 11, "threshold"},
      {gc::codec_id::int4, 15, "int4"},          {gc::codec_id::chunk_topk, 16, "chunk_topk"},
      {gc::codec_id::dct_sign, 17, "dct_sign"}};
  for (auto const& e : table) {
    CHECK(static_cast<unsigned>(e.id) == e.value);
    CHECK(std::string(gc::codec_name(e.id)) == e.name);
  }
  CHECK(std::string(gc::codec_name(static_cast<gc::codec_id>(0))) == "unknown");
  CHECK(std::string(gc::codec_name(static_cast<gc::codec_id>(200))) == "unknown");
}

TEST_CASE("wire: write_header / read_header round trip", "[core][wire]") {
  std::mt19937_64 rng(99);
  std::vector<gc::packet_header> headers = {
      {gc::codec_id::identity, gc::dtype::f32, 0, 0, 0, 0, 0},
      {gc::codec_id::dithering, gc::dtype::f16, 255, UINT64_MAX, 3, UINT32_MAX, UINT32_MAX},
      {static_cast<gc::codec_id>(0), gc::dtype::bf16, 1, 1, 1, 1, 1},  // codec id is not checked
      {static_cast<gc::codec_id>(255), gc::dtype::f32, 7, 12345, 17, 0x80000000u, 1},
  };
  for (int i = 0; i < 500; ++i) {
    gc::packet_header h;
    h.codec = static_cast<gc::codec_id>(rng() & 0xff);
    h.type = static_cast<gc::dtype>(1 + rng() % 3);
    h.variant = static_cast<std::uint8_t>(rng());
    h.count = rng() >> (rng() % 64);
    h.payload_bytes = rng() % 300;
    h.param0 = static_cast<std::uint32_t>(rng());
    h.param1 = static_cast<std::uint32_t>(rng() >> (rng() % 32));
    headers.push_back(h);
  }
  for (auto const& h : headers) {
    auto const buf = packet_with(h, h.payload_bytes);
    gc::packet_header const r = gc::read_header(cspan(buf));
    REQUIRE(r == h);
    REQUIRE(r.packet_bytes() == buf.size());
    REQUIRE(gc::declared_packet_bytes(cspan(buf)) == buf.size());
    // declared_packet_bytes needs only the header.
    REQUIRE(gc::declared_packet_bytes(cspan(buf).first(gc::header_bytes)) == buf.size());
  }
}

TEST_CASE("wire: write_header rejects a short buffer", "[core][wire]") {
  gc::packet_header const h{gc::codec_id::fp16, gc::dtype::f32, 0, 4, 8, 0, 0};
  for (std::size_t len = 0; len < gc::header_bytes; ++len) {
    std::vector<std::byte> buf(opaque(len), std::byte{0x11});
    CHECK_THROWS_AS(gc::write_header(buf, h), gc::config_error);
    for (auto b : buf) REQUIRE(b == std::byte{0x11});  // nothing written
  }
}

TEST_CASE("wire: read_header rejects malformed packets with a format_error", "[core][wire]") {
  gc::packet_header const h{gc::codec_id::int8, gc::dtype::f16, 1, 100, 20, 512, 0};
  auto const good = packet_with(h, 20);
  REQUIRE(gc::read_header(cspan(good)) == h);

  SECTION("buffers shorter than the header, every length") {
    for (std::size_t len = 0; len < gc::header_bytes; ++len) {
      INFO("length " << len);
      std::string const msg =
          format_error_message([&] { (void)gc::read_header(cspan(good).first(len)); });
      CHECK(msg.find(std::to_string(len) + " bytes") != std::string::npos);
      CHECK(msg.find("32-byte header") != std::string::npos);
      std::string const msg2 =
          format_error_message([&] { (void)gc::declared_packet_bytes(cspan(good).first(len)); });
      CHECK(msg2.find("need 32 bytes") != std::string::npos);
    }
  }
  SECTION("each magic byte wrong") {
    for (std::size_t i = 0; i < 4; ++i) {
      for (unsigned flip : {0x01u, 0x20u, 0x80u, 0xffu}) {
        auto bad = good;
        bad[i] ^= static_cast<std::byte>(flip);
        INFO("byte " << i << " xor " << flip);
        CHECK(format_error_message([&] { (void)gc::read_header(cspan(bad)); }).find("\"GCPK\"") !=
              std::string::npos);
        CHECK(format_error_message([&] {
                (void)gc::declared_packet_bytes(cspan(bad));
              }).find("bad magic") != std::string::npos);
      }
    }
  }
  SECTION("wrong version") {
    for (unsigned v : {0u, 3u, 4u, 0x81u, 255u}) {
      auto bad = good;
      bad[4] = static_cast<std::byte>(v);
      INFO("version " << v);
      std::string const msg = format_error_message([&] { (void)gc::read_header(cspan(bad)); });
      CHECK(msg.find("version " + std::to_string(v)) != std::string::npos);
      CHECK(msg.find("reads 1 to 2") != std::string::npos);
      CHECK(format_error_message([&] {
              (void)gc::declared_packet_bytes(cspan(bad));
            }).find("of a version this library reads") != std::string::npos);
    }
  }
  SECTION("version 1 is still read") {
    auto old = good;
    old[4] = std::byte{1};
    CHECK(gc::read_header(cspan(old)).count == gc::read_header(cspan(good)).count);
    CHECK(gc::declared_packet_bytes(cspan(old)) == gc::declared_packet_bytes(cspan(good)));
  }
  SECTION("unknown dtype") {
    for (unsigned t : {0u, 4u, 5u, 0x7fu, 255u}) {
      auto bad = good;
      bad[6] = static_cast<std::byte>(t);
      INFO("dtype " << t);
      std::string const msg = format_error_message([&] { (void)gc::read_header(cspan(bad)); });
      CHECK(msg.find("dtype code " + std::to_string(t)) != std::string::npos);
      CHECK(msg.find("expected") != std::string::npos);
      // Framing does not look at the dtype.
      CHECK(gc::declared_packet_bytes(cspan(bad)) == good.size());
    }
  }
  SECTION("payload size disagrees with the bytes that follow") {
    for (std::uint64_t declared : std::vector<std::uint64_t>{
             0, 1, 19, 21, 40, std::uint64_t{1} << 40, UINT64_MAX - 32, UINT64_MAX}) {
      auto bad = good;
      gc::packet_header hb = h;
      hb.payload_bytes = declared;
      gc::write_header(bad, hb);
      INFO("declared " << declared);
      std::string const msg = format_error_message([&] { (void)gc::read_header(cspan(bad)); });
      CHECK(msg.find("declares " + std::to_string(declared)) != std::string::npos);
      CHECK(msg.find("holds 20") != std::string::npos);
    }
    // The same header over a buffer with one byte more or less.
    auto longer = good;
    longer.push_back(std::byte{0});
    CHECK_THROWS_AS(gc::read_header(cspan(longer)), gc::format_error);
    CHECK_THROWS_AS(gc::read_header(cspan(good).first(good.size() - 1)), gc::format_error);
  }
  SECTION("every rejection is a gradcomp::error and a std::runtime_error") {
    auto bad = good;
    bad[0] = std::byte{0};
    CHECK_THROWS_AS(gc::read_header(cspan(bad)), gc::error);
    CHECK_THROWS_AS(gc::read_header(cspan(bad)), std::runtime_error);
  }
}

TEST_CASE("wire: declared_packet_bytes", "[core][wire]") {
  gc::packet_header h{gc::codec_id::onebit, gc::dtype::f32, 0, 1000, 133, 0, 0};
  std::vector<std::byte> prefix(gc::header_bytes);
  gc::write_header(prefix, h);
  CHECK(gc::declared_packet_bytes(cspan(prefix)) == 165);
  // The largest representable total.
  h.payload_bytes = UINT64_MAX - 32;
  gc::write_header(prefix, h);
  CHECK(gc::declared_packet_bytes(cspan(prefix)) == UINT64_MAX);
  // One more would wrap around.
  for (std::uint64_t p : std::vector<std::uint64_t>{UINT64_MAX - 31, UINT64_MAX}) {
    h.payload_bytes = p;
    gc::write_header(prefix, h);
    CHECK(format_error_message([&] {
            (void)gc::declared_packet_bytes(cspan(prefix));
          }).find("impossible payload size") != std::string::npos);
  }
}

TEST_CASE("wire: little-endian load/store helpers", "[core][wire]") {
  std::byte buf[8];
  gc::detail::store_le<std::uint32_t>(buf, 0xA1B2C3D4u);
  CHECK(static_cast<unsigned>(buf[0]) == 0xD4);
  CHECK(static_cast<unsigned>(buf[3]) == 0xA1);
  CHECK(gc::detail::load_le<std::uint32_t>(buf) == 0xA1B2C3D4u);
  gc::detail::store_le<std::uint16_t>(buf, 0x1234);
  CHECK(static_cast<unsigned>(buf[0]) == 0x34);
  CHECK(static_cast<unsigned>(buf[1]) == 0x12);
  gc::detail::store_f32(buf, -1.5f);  // 0xBFC00000
  CHECK(static_cast<unsigned>(buf[0]) == 0x00);
  CHECK(static_cast<unsigned>(buf[2]) == 0xC0);
  CHECK(static_cast<unsigned>(buf[3]) == 0xBF);
  CHECK(gc::detail::load_f32(buf) == -1.5f);
  static_assert(gc::detail::byteswap<std::uint32_t>(0x11223344u) == 0x44332211u);
  static_assert(gc::detail::byteswap<std::uint64_t>(0x0102030405060708ull) ==
                0x0807060504030201ull);
  static_assert(gc::detail::byteswap<std::uint16_t>(0xABCD) == 0xCDAB);
}
