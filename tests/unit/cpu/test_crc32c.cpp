// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// CRC32C (cpu/kernels/crc32c.hpp): the standard check values, the SSE4.2 and table
// implementations equal on every length and alignment, and chaining.

#include <gradcomp/cpu/kernels/crc32c.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace gc = gradcomp;
namespace k = gradcomp::cpu::kernels;

namespace {
std::span<std::byte const> bytes_of(std::string_view s) {
  return std::as_bytes(std::span<char const>(s.data(), s.size()));
}
}  // namespace

TEST_CASE("crc32c: check values", "[cpu][faults]") {
  REQUIRE(k::crc32c_portable(bytes_of("123456789")) == 0xE3069283u);  // the CRC-32C check value
  REQUIRE(k::crc32c(bytes_of("123456789")) == 0xE3069283u);
  REQUIRE(k::crc32c_portable({}) == 0u);
  std::vector<std::byte> zeros(32, std::byte{0}), ones(32, std::byte{0xFF});
  REQUIRE(k::crc32c_portable(zeros) == 0x8A9136AAu);  // RFC 3720, B.4
  REQUIRE(k::crc32c_portable(ones) == 0x62A8AB43u);
}

TEST_CASE("crc32c: the hardware and table implementations agree, and chain", "[cpu][faults]") {
  std::vector<std::byte> data(1000);
  std::uint64_t x = 88172645463325252ull;
  for (auto& b : data) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  for (std::size_t off : {0u, 1u, 3u, 7u}) {
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 65u, 500u, 993u}) {
      if (off + n > data.size()) continue;
      auto const s = std::span<std::byte const>(data).subspan(off, n);
      CAPTURE(off, n);
      std::uint32_t const want = k::crc32c_portable(s);
      REQUIRE(k::crc32c(s) == want);
#if GRADCOMP_X86_SIMD
      if (k::cpu_has_sse42()) REQUIRE(k::crc32c_sse42(s) == want);
#endif
      for (std::size_t cut : {std::size_t{0}, n / 3, n}) {
        REQUIRE(k::crc32c(s.subspan(cut), k::crc32c(s.first(cut))) == want);
      }
    }
  }
}
