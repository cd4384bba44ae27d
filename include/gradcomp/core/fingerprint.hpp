// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `fingerprint`: the 64-bit digest of configuration fields that the collectives' agreement
/// round compares across ranks (collective/agreement.hpp), here below every layer so that a
/// backend's session (cuda/powersgd.cuh) states the same fingerprint as the CPU's.

#include <gradcomp/config.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

GRADCOMP_NAMESPACE_BEGIN

/// Incremental 64-bit fingerprint of configuration fields (FNV-1a over their little-endian
/// bytes). Equal inputs give equal fingerprints on every platform.
class fingerprint {
 public:
  /// Adds an integer (as 8 little-endian bytes).
  fingerprint& add(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  /// Adds a double by its bit pattern.
  fingerprint& add_double(double v) noexcept { return add(std::bit_cast<std::uint64_t>(v)); }
  /// Adds a string (its length, then its bytes).
  fingerprint& add(std::string_view s) noexcept {
    add(static_cast<std::uint64_t>(s.size()));
    for (char c : s) mix(static_cast<unsigned char>(c));
    return *this;
  }
  /// Adds raw bytes (their length, then the bytes).
  fingerprint& add_bytes(std::span<std::byte const> b) noexcept {
    add(static_cast<std::uint64_t>(b.size()));
    for (std::byte c : b) mix(static_cast<unsigned char>(c));
    return *this;
  }
  /// The fingerprint so far.
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  void mix(unsigned char c) noexcept {
    h_ ^= c;
    h_ *= 0x100000001b3ull;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

GRADCOMP_NAMESPACE_END
