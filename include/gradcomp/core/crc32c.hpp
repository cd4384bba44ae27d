// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// CRC32C (Castagnoli; reflected polynomial 0x82F63B78, initial value and final xor ~0, as in
/// iSCSI, ext4 and RocksDB), portable slicing-by-8 tables: the one implementation below the
/// CPU layer, for the checksums of saved states (core/serialize.hpp).
/// `cpu::kernels::crc32c` (cpu/kernels/crc32c.hpp) adds the SSE4.2 instruction and gives the
/// same values.

#include <gradcomp/config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

namespace crc_detail {

inline constexpr std::uint32_t poly = 0x82F63B78u;

// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) != 0 ? poly : 0u);
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::uint32_t b = 0; b < 256; ++b)
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}();

inline std::uint64_t load_le64(unsigned char const* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace crc_detail

/// CRC32C of `data` continuing `crc` (0 starts a new checksum; pass the previous result to
/// checksum a concatenation piece by piece), by table.
inline std::uint32_t crc32c_table(std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
  auto const& t = crc_detail::tables;
  std::uint32_t c = ~crc;
  auto const* p = reinterpret_cast<unsigned char const*>(data.data());
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t const w = crc_detail::load_le64(p) ^ c;
    c = t[7][w & 0xFFu] ^ t[6][(w >> 8) & 0xFFu] ^ t[5][(w >> 16) & 0xFFu] ^
        t[4][(w >> 24) & 0xFFu] ^ t[3][(w >> 32) & 0xFFu] ^ t[2][(w >> 40) & 0xFFu] ^
        t[1][(w >> 48) & 0xFFu] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFFu];
  return ~c;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
