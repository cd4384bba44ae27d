// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The byte writer and the checking reader behind gradcomp's saved states (controllers, the
/// pipeline's checkpoint, two-way, the guard, the 1-bit Adam family). A state is "MAGC"
/// (4 bytes), u8 version, u8 frame 1 (`frame_crc32c`: the state ends in a checksum), u16 0,
/// u64 body length, then the body: little-endian u64 and f64 values, strings and byte blocks
/// as a u64 length plus the bytes, float arrays as a u64 count plus f32 values; then u32
/// CRC32C (core/crc32c.hpp) of every byte before it. The reader checks the checksum before it
/// reads a field, then every length against what is left, and throws `format_error` naming the
/// state on anything malformed: a corrupted state (any flipped byte) is refused before it
/// changes anything, a truncated one too, and a state from before the checksum (frame byte 0)
/// is refused as such.

#include <gradcomp/config.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// Byte 5 of a saved state's frame: the state ends in a u32 CRC32C (see file comment). States
/// written before it held 0 there and carried no checksum; they are refused.
inline constexpr std::uint8_t frame_crc32c = 1;

/// Sets the CRC32C trailer of a framed state: the last 4 bytes become the CRC32C of the bytes
/// before them. What `byte_writer::finish` does last (and what a test that edits a saved
/// state on purpose calls to keep it well formed).
inline void seal_state(std::span<std::byte> state) noexcept {
  if (state.size() < 4) return;
  std::uint32_t const crc = crc32c_table(state.first(state.size() - 4));
  store_le<std::uint32_t>(state.data() + state.size() - 4, crc);
}

/// Appends the values of a saved state (see file comment).
class byte_writer {
 public:
  /// Starts a state with a 4-character `magic` and a `version`.
  void begin(char const* magic, std::uint8_t version) {
    out_.assign(16, std::byte{0});
    std::memcpy(out_.data(), magic, 4);
    out_[4] = static_cast<std::byte>(version);
    out_[5] = static_cast<std::byte>(frame_crc32c);
  }
  void put_u64(std::uint64_t v) {
    std::size_t const at = grow(8);
    store_le<std::uint64_t>(out_.data() + at, v);
  }
  void put_f64(double v) { put_u64(std::bit_cast<std::uint64_t>(v)); }
  void put_bool(bool v) { put_u64(v ? 1 : 0); }
  void put_string(std::string const& s) {
    put_u64(s.size());
    std::size_t const at = grow(s.size());
    if (!s.empty()) std::memcpy(out_.data() + at, s.data(), s.size());
  }
  void put_bytes(std::span<std::byte const> b) {
    put_u64(b.size());
    std::size_t const at = grow(b.size());
    if (!b.empty()) std::memcpy(out_.data() + at, b.data(), b.size());
  }
  void put_floats(std::span<float const> v) {
    put_u64(v.size());
    std::size_t const at = grow(4 * v.size());
    for (std::size_t i = 0; i < v.size(); ++i) store_f32(out_.data() + at + 4 * i, v[i]);
  }
  void put_doubles(std::span<double const> v) {
    put_u64(v.size());
    for (double d : v) put_f64(d);
  }
  /// The finished state (the body length filled in, the CRC32C appended).
  [[nodiscard]] std::vector<std::byte> finish() {
    store_le<std::uint64_t>(out_.data() + 8, out_.size() - 16);
    grow(4);
    seal_state(out_);
    return std::move(out_);
  }

 private:
  std::size_t grow(std::size_t n) {
    std::size_t const at = out_.size();
    out_.resize(at + n);
    return at;
  }
  std::vector<std::byte> out_;
};

/// Reads a state written by `byte_writer`, checking every field (see file comment).
class byte_reader {
 public:
  /// Checks the frame: `magic`, the checksum frame, the body length, the CRC32C of the whole
  /// state, then `version` (the one this reader understands). The fields read afterwards are
  /// those of the body (the trailer is not part of them). `what` names the state in messages.
  byte_reader(std::span<std::byte const> in, char const* magic, std::uint8_t version, std::string what)
      : in_(in), what_(std::move(what)) {
    if (in.size() < 20 || std::memcmp(in.data(), magic, 4) != 0)
      fail(std::string("missing \"") + magic + "\" magic");
    if (static_cast<std::uint8_t>(in[5]) != frame_crc32c) {
      fail(in[5] == std::byte{0}
               ? std::string("the state carries no checksum (saved by a gradcomp from before state "
                             "checksums, or corrupted); it is refused")
               : "unknown frame " + std::to_string(static_cast<unsigned>(in[5])));
    }
    if (in[6] != std::byte{0} || in[7] != std::byte{0}) fail("non-zero reserved bytes");
    if (load_le<std::uint64_t>(in.data() + 8) != in.size() - 20)
      fail("body length does not match the buffer");
    std::uint32_t const want = load_le<std::uint32_t>(in.data() + in.size() - 4);
    if (crc32c_table(in.first(in.size() - 4)) != want)
      fail("checksum (CRC32C) mismatch: the state is corrupted");
    if (static_cast<std::uint8_t>(in[4]) != version) {
      fail("unsupported version " + std::to_string(static_cast<unsigned>(in[4])) + " (this build reads " +
           std::to_string(static_cast<unsigned>(version)) + ")");
    }
    in_ = in.first(in.size() - 4);
    at_ = 16;
  }
  [[noreturn]] void fail(std::string const& why) const { throw format_error("gradcomp: " + what_ + ": " + why); }

  std::uint64_t get_u64() {
    need(8, "a value");
    std::uint64_t const v = load_le<std::uint64_t>(in_.data() + at_);
    at_ += 8;
    return v;
  }
  double get_f64() { return std::bit_cast<double>(get_u64()); }
  bool get_bool() {
    std::uint64_t const v = get_u64();
    if (v > 1) fail("a flag holds " + std::to_string(v));
    return v == 1;
  }
  /// A u64 that must fit 32 bits (an id).
  std::uint32_t get_u32_of_u64(char const* field) {
    std::uint64_t const v = get_u64();
    if (v > 0xffffffffu) fail(std::string(field) + " " + std::to_string(v) + " exceeds 32 bits");
    return static_cast<std::uint32_t>(v);
  }
  std::string get_string() {
    std::uint64_t const n = get_u64();
    need(n, "a string");
    std::string s(reinterpret_cast<char const*>(in_.data() + at_), static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return s;
  }
  std::vector<std::byte> get_bytes() {
    std::uint64_t const n = get_u64();
    need(n, "a byte block");
    std::vector<std::byte> b(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                             in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += static_cast<std::size_t>(n);
    return b;
  }
  std::vector<float> get_floats() {
    std::uint64_t const n = get_u64();
    if (n > (in_.size() - at_) / 4) fail("a float array of " + std::to_string(n) + " values runs past the end");
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_f32(in_.data() + at_ + 4 * i);
    at_ += 4 * v.size();
    return v;
  }
  std::vector<double> get_doubles() {
    std::uint64_t const n = get_u64();
    if (n > (in_.size() - at_) / 8) fail("a double array of " + std::to_string(n) + " values runs past the end");
    std::vector<double> v(static_cast<std::size_t>(n));
    for (double& d : v) d = get_f64();
    return v;
  }
  /// Throws unless every byte was read.
  void expect_end() const {
    if (at_ != in_.size()) fail(std::to_string(in_.size() - at_) + " trailing bytes");
  }

 private:
  void need(std::uint64_t n, char const* what) const {
    if (n > in_.size() - at_) fail(std::string("truncated: ") + what + " of " + std::to_string(n) + " bytes runs past the end");
  }
  std::span<std::byte const> in_;
  std::string what_;
  std::size_t at_ = 0;
};

}  // namespace detail

GRADCOMP_NAMESPACE_END
