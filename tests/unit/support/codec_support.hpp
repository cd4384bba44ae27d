// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Shared helpers of the codec unit tests: deterministic gradient generators, compress and
/// decompress wrappers that check the buffer contract, hex encoding of packets, header field
/// patching, the table of every codec variant with its documented payload size, and the
/// contexts (thread pools, ISA levels) packets must not depend on.

#include <catch2/catch.hpp>

#include <gradcomp/gradcomp.hpp>

#include "golden_packets.hpp"

#include <bit>
#include <cfloat>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define GRADCOMP_TEST_SANITIZED 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer) || \
      __has_feature(thread_sanitizer)
#    define GRADCOMP_TEST_SANITIZED 1
#  endif
#endif
#ifndef GRADCOMP_TEST_SANITIZED
#  define GRADCOMP_TEST_SANITIZED 0
#endif

namespace gradcomp_test {

namespace gc = gradcomp;

/// True under sanitizers or when GRADCOMP_TEST_QUICK is set: statistical tests use fewer
/// samples (with their confidence bounds widened accordingly), sweeps use larger strides.
inline bool quick_mode() {
  static bool const quick =
      GRADCOMP_TEST_SANITIZED != 0 || std::getenv("GRADCOMP_TEST_QUICK") != nullptr;
  return quick;
}

// ---------------------------------------------------------------------------------------------
// Deterministic random data (independent of the library's own Philox).
// ---------------------------------------------------------------------------------------------

/// SplitMix64: a tiny, well-mixed 64-bit generator for test data.
class test_rng {
 public:
  explicit test_rng(std::uint64_t seed) noexcept : state_(seed) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1), never 0 or 1.
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }
  /// Standard normal (Box-Muller).
  double gaussian() noexcept {
    double const u = uniform();
    double const v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  std::uint32_t below(std::uint32_t bound) noexcept {
    return static_cast<std::uint32_t>(next() % bound);
  }

 private:
  std::uint64_t state_;
};

/// n samples of N(0, sigma^2) as float.
inline std::vector<float> gaussian(std::size_t n, std::uint64_t seed, double sigma = 1.0) {
  test_rng r(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(sigma * r.gaussian());
  return x;
}

/// n heavy-tailed samples: a Gaussian times a log-normal scale (e^(2 N(0,1))), so magnitudes
/// span many binades and a few elements dominate each bucket, as in real gradients.
inline std::vector<float> heavy_tailed(std::size_t n, std::uint64_t seed) {
  test_rng r(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(r.gaussian() * std::exp(2.0 * r.gaussian()) * 1e-3);
  return x;
}

template <class T>
std::vector<T> convert_to(std::vector<float> const& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = gc::from_float<T>(x[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Bits and bytes.
// ---------------------------------------------------------------------------------------------

/// The spacing of float32 values at |v| (one unit in the last place); FLT_TRUE_MIN below the
/// normal range. The error bounds of the quantizing codecs' tests are written in it.
inline double ulp_of(double v) {
  v = std::fabs(v);
  if (v < FLT_MIN) return FLT_TRUE_MIN;
  return std::ldexp(1.0, std::ilogb(v) - 23);
}

inline std::uint32_t bits_of(float f) noexcept { return std::bit_cast<std::uint32_t>(f); }
inline float float_of(std::uint32_t b) noexcept { return std::bit_cast<float>(b); }

template <class T>
std::uint32_t raw_bits(T v) noexcept {
  if constexpr (std::same_as<T, float>) {
    return bits_of(v);
  } else {
    return v.bits;
  }
}

inline std::string to_hex(std::span<std::byte const> bytes) {
  static char const digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    auto const v = static_cast<unsigned>(b);
    s += digits[v >> 4];
    s += digits[v & 15u];
  }
  return s;
}

inline std::vector<std::byte> from_hex(std::string_view s) {
  auto nibble = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    return static_cast<unsigned>(c - 'a' + 10);
  };
  std::vector<std::byte> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>((nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]));
  }
  return out;
}

inline void put_u8(std::vector<std::byte>& p, std::size_t off, unsigned v) {
  p.at(off) = static_cast<std::byte>(v);
}
inline void put_u32(std::vector<std::byte>& p, std::size_t off, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) p.at(off + k) = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}
inline void put_u64(std::vector<std::byte>& p, std::size_t off, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) p.at(off + k) = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}
inline void put_f32(std::vector<std::byte>& p, std::size_t off, float f) {
  put_u32(p, off, bits_of(f));
}
inline std::uint32_t get_u32(std::span<std::byte const> p, std::size_t off) {
  std::uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= static_cast<std::uint32_t>(p[off + k]) << (8 * k);
  return v;
}
inline std::uint64_t get_u64(std::span<std::byte const> p, std::size_t off) {
  std::uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= static_cast<std::uint64_t>(p[off + k]) << (8 * k);
  return v;
}
inline float get_f32(std::span<std::byte const> p, std::size_t off) {
  return float_of(get_u32(p, off));
}

/// Header field offsets (core/wire.hpp).
namespace field {
inline constexpr std::size_t magic = 0, version = 4, codec = 5, dtype = 6, variant = 7, count = 8,
                             payload = 16, param0 = 24, param1 = 28;
}

inline constexpr std::size_t hdr = gc::header_bytes;

// ---------------------------------------------------------------------------------------------
// Compress / decompress with the buffer contract checked.
// ---------------------------------------------------------------------------------------------

/// Bytes of 0xA5 after the space a codec may use; they must never be touched.
inline constexpr std::size_t guard_bytes = 64;
inline constexpr std::byte guard_byte{0xA5};

/// Compresses `x` (as tensor `id`) into a buffer of `max_compressed_bytes + guard_bytes` bytes,
/// checks that the packet fits `max_compressed_bytes` and that the guard is intact, and
/// returns the packet.
template <class C, class T>
std::vector<std::byte> compress(C const& c, std::span<T const> x, gc::codec_context const& ctx = {},
                                gc::tensor_id id = gc::tensor_id{0}) {
  std::size_t const max = c.max_compressed_bytes(x.size());
  std::vector<std::byte> buf(max + guard_bytes, guard_byte);
  std::size_t const size =
      c.compress(gc::tensor_view<T const>(x, id), std::span<std::byte>(buf), ctx);
  if (size > max) FAIL("packet of " << size << " bytes exceeds max_compressed_bytes = " << max);
  for (std::size_t i = max; i < buf.size(); ++i) {
    if (buf[i] != guard_byte) FAIL("compress wrote past max_compressed_bytes at offset " << i);
  }
  buf.resize(size);
  return buf;
}

template <class C, class T>
std::vector<std::byte> compress(C const& c, std::vector<T> const& x,
                                gc::codec_context const& ctx = {},
                                gc::tensor_id id = gc::tensor_id{0}) {
  return compress(c, std::span<T const>(x), ctx, id);
}

/// Decodes `packet` into a fresh vector of `n` elements of `T`.
template <class T = float, class C>
std::vector<T> decompress(C const& c, std::span<std::byte const> packet, std::size_t n,
                          gc::codec_context const& ctx = {}) {
  std::vector<T> out(n);
  c.decompress(packet, std::span<T>(out), ctx);
  return out;
}

/// Runs `fn()` and reports whether it threw a `gradcomp::error` (true) or returned (false).
/// Any other exception escapes to Catch and fails the test.
template <class Fn>
bool throws_gradcomp_error(Fn&& fn) {
  try {
    fn();
  } catch (gc::error const&) {
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Contexts a packet must not depend on.
// ---------------------------------------------------------------------------------------------

/// A process-wide pool of `n` threads (1..4), created on first use.
inline gc::cpu::thread_pool& pool(unsigned n) {
  static std::unique_ptr<gc::cpu::thread_pool> pools[5];
  static std::mutex m;
  std::lock_guard lock(m);
  if (!pools[n]) pools[n] = std::make_unique<gc::cpu::thread_pool>(n);
  return *pools[n];
}

/// The ISA levels to compare. A codec caps each to what the machine has (`codec_context`); a
/// test that calls a kernel directly caps it itself with `cpu::effective_isa`, since a kernel runs
/// the level it is given (an AVX-512 kernel on a machine without AVX-512 is SIGILL).
inline constexpr gc::cpu::isa isa_levels[] = {gc::cpu::isa::scalar, gc::cpu::isa::avx2,
                                              gc::cpu::isa::avx512, gc::cpu::isa::best};

/// A context at ISA `level` on a pool of `threads` threads that always takes the parallel path.
inline gc::codec_context parallel_ctx(unsigned threads, gc::cpu::isa level = gc::cpu::isa::best,
                                      std::uint64_t seed = 0, std::uint32_t step = 0) {
  gc::codec_context ctx;
  ctx.seed = seed;
  ctx.step = step;
  ctx.pool = &pool(threads);
  ctx.parallel_threshold = 0;
  ctx.isa = level;
  return ctx;
}

/// A serial context at ISA `level`.
inline gc::codec_context serial_ctx(gc::cpu::isa level = gc::cpu::isa::best, std::uint64_t seed = 0,
                                    std::uint32_t step = 0) {
  gc::codec_context ctx;
  ctx.seed = seed;
  ctx.step = step;
  ctx.pool = &pool(1);
  ctx.parallel_threshold = SIZE_MAX;
  ctx.isa = level;
  return ctx;
}

// ---------------------------------------------------------------------------------------------
// Every codec variant with its documented payload size (docs/wire-format.md, codec headers).
// ---------------------------------------------------------------------------------------------

inline std::uint64_t buckets_of(std::uint64_t n, std::uint32_t bucket) {
  if (n == 0) return 0;
  std::uint64_t const len = bucket == 0 ? n : bucket;
  return (n + len - 1) / len;
}

/// Bits per dither code for s levels: a sign bit above bit_width(s) bits of level index.
inline unsigned dither_width(std::uint32_t s) {
  return 1u + static_cast<unsigned>(std::bit_width(s));
}

struct variant {
  std::string name;  ///< a make_codec spec
  gc::any_codec codec;
  /// Documented payload bytes for n elements of dtype t.
  std::function<std::uint64_t(std::uint64_t, gc::dtype)> payload;
  bool stochastic = false;
};

/// Every codec variant with bucket length `bucket` where the codec has one. Built from
/// make_codec specs, so the spec parser is exercised too.
inline std::vector<variant> all_variants(std::uint32_t bucket = 16) {
  std::string const b = std::to_string(bucket);
  std::vector<variant> v;
  auto add = [&](std::string spec, std::function<std::uint64_t(std::uint64_t, gc::dtype)> payload,
                 bool stochastic) {
    gc::any_codec c = gc::make_codec(spec);
    v.push_back(variant{std::move(spec), std::move(c), std::move(payload), stochastic});
  };
  add(
      "identity", [](std::uint64_t n, gc::dtype t) { return n * gc::dtype_size(t); }, false);
  add(
      "fp16", [](std::uint64_t n, gc::dtype) { return 2 * n; }, false);
  add(
      "bf16", [](std::uint64_t n, gc::dtype) { return 2 * n; }, false);
  add(
      "onebit:scaling=mean_abs", [](std::uint64_t n, gc::dtype) { return 8 + (n + 7) / 8; }, false);
  add(
      "onebit:scaling=none", [](std::uint64_t n, gc::dtype) { return 8 + (n + 7) / 8; }, false);
  for (char const* r : {"nearest", "stochastic"}) {
    add(
        "int8:bucket=" + b + ",rounding=" + r,
        [bucket](std::uint64_t n, gc::dtype) { return 8 * buckets_of(n, bucket) + n; },
        std::string(r) == "stochastic");
  }
  add(
      "int4:bucket=" + b,
      [bucket](std::uint64_t n, gc::dtype) { return 4 * buckets_of(n, bucket) + (n + 1) / 2; },
      false);
  struct chunk_cfg {
    char const* values;
    unsigned bits;
  };
  for (chunk_cfg cc : {chunk_cfg{"f32", 32}, chunk_cfg{"f16", 16}, chunk_cfg{"int2", 2}, chunk_cfg{"int4", 4}}) {
    // Chunks of 16 keeping 3 (the last, short chunk min(3, its length)), 4-bit indices.
    add(
        std::string("chunk_topk:chunk=16,k=3,values=") + cc.values,
        [cc](std::uint64_t n, gc::dtype) {
          std::uint64_t const nc = (n + 15) / 16;
          std::uint64_t const K = n == 0 ? 0 : (nc - 1) * 3 + std::min<std::uint64_t>(3, n - (nc - 1) * 16);
          return (cc.bits < 8 ? 4 * nc : 0) + (K * cc.bits + 7) / 8 + (K * 4 + 7) / 8;
        },
        false);
  }
  add(
      "dct_sign:chunk=16,k=3",
      [](std::uint64_t n, gc::dtype) {
        std::uint64_t const K = (n + 15) / 16 * 3;
        return 4 + (K + 7) / 8 + (K * 4 + 7) / 8;
      },
      false);
  add(
      "natural:bucket=" + b,
      [bucket](std::uint64_t n, gc::dtype) { return buckets_of(n, bucket) + n; }, true);
  auto dither = [&](std::string spec, std::uint32_t s) {
    add(
        std::move(spec),
        [bucket, s](std::uint64_t n, gc::dtype) {
          return 4 * buckets_of(n, bucket) + (n * dither_width(s) + 7) / 8;
        },
        true);
  };
  for (std::uint32_t s : {1u, 7u, 127u, 255u, 32767u}) {
    dither("qsgd:levels=" + std::to_string(s) + ",bucket=" + b, s);
  }
  dither("terngrad:bucket=" + b, 1);
  dither("dithering:levels=2,partition=linear,norm=max,bucket=" + b, 2);
  dither("dithering:levels=5,partition=linear,norm=l2,bucket=" + b, 5);
  dither("dithering:levels=3,partition=natural,norm=max,bucket=" + b, 3);
  dither("dithering:levels=30,partition=natural,norm=l2,bucket=" + b, 30);
  return v;
}

// ---------------------------------------------------------------------------------------------
// 16-bit element types
// ---------------------------------------------------------------------------------------------

/// Each value rounded to T (float16 / bfloat16: nearest even).
template <class T>
std::vector<T> round_vec(std::vector<float> const& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = gc::from_float<T>(v[i]);
  return out;
}

/// Each value widened to float32 (exact).
template <class T>
std::vector<float> widen_vec(std::vector<T> const& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = gc::to_float(v[i]);
  return out;
}

}  // namespace gradcomp_test
