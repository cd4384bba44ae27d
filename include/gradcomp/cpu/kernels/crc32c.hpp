// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// CRC32C (Castagnoli; reflected polynomial 0x82F63B78, initial value and final xor ~0, as in
/// iSCSI, ext4 and RocksDB): the checksum of the collectives' `checksum` option. Two
/// implementations give identical values: the SSE4.2 `crc32` instruction (x86-64 CPUs that
/// report SSE4.2 in CPUID, unless `GRADCOMP_ISA=scalar`), and a portable slicing-by-8 table
/// for every other machine. The choice is made at run time, so a binary built for generic
/// x86-64 is correct on any x86-64 CPU, and other architectures always take the table.

#include <gradcomp/config.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if GRADCOMP_X86_SIMD
#  include <cpuid.h>
#  include <nmmintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// CRC32C of `data` continuing `crc` (0 starts a new checksum; pass the previous result to
/// checksum a concatenation piece by piece), portable table implementation
/// (core/crc32c.hpp).
inline std::uint32_t crc32c_portable(std::span<std::byte const> data,
                                     std::uint32_t crc = 0) noexcept {
  return gradcomp::detail::crc32c_table(data, crc);
}

#if GRADCOMP_X86_SIMD
/// True if the CPU has the SSE4.2 `crc32` instruction (CPUID leaf 1, ECX bit 20).
inline bool cpu_has_sse42() noexcept {
  static bool const has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    return ((c >> 20) & 1u) != 0;
  }();
  return has;
}

/// `crc32c_portable` on the SSE4.2 instruction; call only where `cpu_has_sse42()`.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(
    std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
  std::uint64_t c = ~crc;
  auto const* p = reinterpret_cast<unsigned char const*>(data.data());
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // x86 is little-endian
    c = _mm_crc32_u64(c, w);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#endif

/// CRC32C of `data` continuing `crc` (see `crc32c_portable`), on the fastest implementation
/// this machine has.
inline std::uint32_t crc32c(std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
#if GRADCOMP_X86_SIMD
  if (cpu_has_sse42() && machine_isa() != isa::scalar) return crc32c_sse42(data, crc);
#endif
  return crc32c_portable(data, crc);
}

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
