// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// What the fuzz targets (tests/fuzz/*.cpp) share: the input reader, the rule for outcomes (a
/// gradcomp error is an accepted answer to bad input; any other exception escapes to libFuzzer,
/// which reports it), oracle checks that abort with a message, and the fixed codec context that
/// the targets and the corpus generator (make_corpus.cpp) agree on.

#include <gradcomp/concepts/context.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace gradcomp_fuzz {

/// Largest element count a target allocates an output for. A harness limit that keeps
/// executions fast, not a library limit: the library must not allocate from a header field
/// anyway (a target would then fail under libFuzzer's -malloc_limit_mb).
inline constexpr std::size_t max_elements = std::size_t{1} << 16;

/// The codec context of every target and of the generated corpus (random_k packets carry a
/// check word of the seed and step they were made with).
inline gradcomp::codec_context context() {
  gradcomp::codec_context c;
  c.seed = 0x5eed;
  c.step = 3;
  return c;
}

/// Reads a fuzz input front to back; reads past the end give zeros.
class input {
 public:
  input(std::uint8_t const* data, std::size_t size) noexcept
      : bytes_(reinterpret_cast<std::byte const*>(data), size) {}
  explicit input(std::span<std::byte const> bytes) noexcept : bytes_(bytes) {}

  [[nodiscard]] std::size_t left() const noexcept { return bytes_.size() - at_; }
  [[nodiscard]] bool empty() const noexcept { return left() == 0; }

  std::uint8_t u8() noexcept {
    return at_ < bytes_.size() ? static_cast<std::uint8_t>(bytes_[at_++]) : 0;
  }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() noexcept { return u16() | (static_cast<std::uint32_t>(u16()) << 16); }

  /// Up to `n` of the remaining bytes.
  std::span<std::byte const> take(std::size_t n) noexcept {
    n = std::min(n, left());
    auto const s = bytes_.subspan(at_, n);
    at_ += n;
    return s;
  }
  /// All remaining bytes.
  std::span<std::byte const> rest() noexcept { return take(left()); }

 private:
  std::span<std::byte const> bytes_;
  std::size_t at_ = 0;
};

/// The input as a state of the shared frame (core/serialize.hpp) with its CRC32C trailer
/// recomputed, so that the fuzzer reaches the loaders' parsing instead of stopping at the
/// checksum (a flipped byte is always refused: tests/unit/pipeline/test_checkpoint_integrity.cpp).
inline std::vector<std::byte> sealed(std::span<std::byte const> state) {
  std::vector<std::byte> v(state.begin(), state.end());
  gradcomp::detail::seal_state(v);
  return v;
}

/// Reports a failed oracle and aborts (libFuzzer saves the input as a crash).
[[noreturn]] inline void oracle_failed(char const* where, char const* what) {
  std::fprintf(stderr, "==gradcomp-fuzz== oracle failed at %s: %s\n", where, what);
  std::fflush(stderr);
  std::abort();
}

#define GRADCOMP_FUZZ_STR2(x) #x
#define GRADCOMP_FUZZ_STR(x) GRADCOMP_FUZZ_STR2(x)
/// Aborts with `what` unless `cond` holds.
#define GRADCOMP_FUZZ_CHECK(cond, what) \
  ((cond) ? void(0)                     \
          : ::gradcomp_fuzz::oracle_failed(__FILE__ ":" GRADCOMP_FUZZ_STR(__LINE__), what))

/// Runs `f`: true when it returns, false when it throws a gradcomp error (an accepted answer
/// to malformed input). Any other exception propagates, and libFuzzer reports it.
template <class F>
bool accepted(F&& f) {
  try {
    f();
    return true;
  } catch (gradcomp::error const&) {
    return false;
  }
}

/// `accepted`, and a thrown gradcomp error must be an `E` (e.g. `format_error` for a decoder
/// given an output of the right size).
template <class E, class F>
bool accepted_only(F&& f, char const* what) {
  try {
    f();
    return true;
  } catch (E const&) {
    return false;
  } catch (gradcomp::error const& e) {
    std::fprintf(stderr, "==gradcomp-fuzz== unexpected error kind: %s\n", e.what());
    oracle_failed("accepted_only", what);
  }
}

/// Bits of an element (so NaNs compare by payload).
template <class T>
std::uint32_t bits_of(T v) noexcept {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<std::uint32_t>(v);
  } else {
    return v.bits;
  }
}

/// Same value, or both NaN.
inline bool same_value(float a, float b) noexcept {
  return a == b || (std::isnan(a) && std::isnan(b));
}

/// A fixed, finite, non-trivial tensor of `n` values (the generator and the targets use the
/// same one, so recorded exchanges replay exactly).
inline std::vector<float> sample_tensor(std::size_t n, std::uint32_t salt = 0) {
  std::vector<float> v(n);
  std::uint32_t x = 0x9e3779b9u ^ salt;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = (static_cast<float>(x % 2001u) - 1000.0f) / 256.0f;
  }
  return v;
}

}  // namespace gradcomp_fuzz
