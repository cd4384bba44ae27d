// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Instruction-set levels of the CPU backend, their run-time detection, the ISA tag types and
/// the one dispatcher from a run-time level to a tag. Kernels exist for each level; a call uses
/// the best level both the machine and its `cpu::execution` allow. Every level produces
/// byte-identical packets.
///
/// Tags, in the manner of xsimd's architecture tags: `avx512_tag` derives from `avx2_tag`,
/// which derives from `scalar_tag`, and each names the next weaker one as its `fallback`. Each
/// tag is declared in the namespace that holds its level's kernels (`cpu::kernels::avx512`,
/// ...), so an unqualified call `kernel(tag, args...)` finds the kernels of every level by
/// argument-dependent lookup, and overload resolution picks the strongest one not above the
/// tag: a kernel that has no AVX-512 version runs its AVX2 one, then its scalar one. A public
/// kernel entry point is then one line, `return dispatch(level, [&](auto t) { return
/// kernel(t, args...); });`.

#include <gradcomp/config.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#if GRADCOMP_X86_SIMD
#  include <cpuid.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// SIMD levels, weakest first.
enum class isa : unsigned char {
  scalar = 0,  ///< portable C++ (any architecture)
  avx2 = 1,    ///< x86-64 AVX2 + FMA + F16C + BMI2
  avx512 = 2,  ///< x86-64 AVX-512 F/BW/DQ/VL
  best = 255,  ///< whatever the machine supports
};

/// Name of an ISA level.
constexpr char const* isa_name(isa i) noexcept {
  switch (i) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::best: return "best";
  }
  return "unknown";
}

namespace kernels {
namespace scalar {
/// Tag of the portable C++ kernels; the end of every fallback chain.
struct isa_tag {
  static constexpr cpu::isa level = cpu::isa::scalar;
  using fallback = void;
};
}  // namespace scalar
namespace avx2 {
/// Tag of the AVX2 kernels; falls back to scalar.
struct isa_tag : scalar::isa_tag {
  static constexpr cpu::isa level = cpu::isa::avx2;
  using fallback = scalar::isa_tag;
};
}  // namespace avx2
namespace avx512 {
/// Tag of the AVX-512 kernels; falls back to AVX2.
struct isa_tag : avx2::isa_tag {
  static constexpr cpu::isa level = cpu::isa::avx512;
  using fallback = avx2::isa_tag;
};
}  // namespace avx512
}  // namespace kernels

/// Tag of the portable kernels (any architecture).
using scalar_tag = kernels::scalar::isa_tag;
/// Tag of the AVX2 + FMA + F16C + BMI2 kernels (x86-64 only).
using avx2_tag = kernels::avx2::isa_tag;
/// Tag of the AVX-512 F/BW/DQ/VL kernels (x86-64 only).
using avx512_tag = kernels::avx512::isa_tag;

/// Whether `T` is one of the ISA tags.
template <class T>
inline constexpr bool is_isa_tag = std::is_base_of_v<scalar_tag, T>;

namespace detail {

#if GRADCOMP_X86_SIMD
// Reads XCR0 (which register states the OS saves); only called when OSXSAVE is set.
__attribute__((target("xsave"))) inline std::uint64_t read_xcr0() noexcept {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

// CPUID feature bits plus OS support for the register state, for each level.
inline isa detect_isa() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return isa::scalar;
  __cpuid_count(1, 0, a, b, c, d);
  bool const fma = (c >> 12) & 1u, osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u,
             f16c = (c >> 29) & 1u;
  if (!(osxsave && avx)) return isa::scalar;
  std::uint64_t const xcr0 = read_xcr0();
  bool const ymm_state = (xcr0 & 0x6u) == 0x6u;     // SSE and AVX state
  bool const zmm_state = (xcr0 & 0xe6u) == 0xe6u;   // plus opmask and both ZMM halves
  __cpuid_count(7, 0, a, b, c, d);
  bool const avx2 = (b >> 5) & 1u, bmi2 = (b >> 8) & 1u, f = (b >> 16) & 1u, dq = (b >> 17) & 1u,
             bw = (b >> 30) & 1u, vl = (b >> 31) & 1u;
  if (!(ymm_state && avx2 && fma && f16c && bmi2)) return isa::scalar;
  if (zmm_state && f && dq && bw && vl) return isa::avx512;
  return isa::avx2;
}
#endif

}  // namespace detail

/// The best level this machine supports (CPUID features and OS register-state support),
/// capped by the environment variable `GRADCOMP_ISA` (`scalar`, `avx2` or `avx512`) when set.
/// Detected once.
inline isa machine_isa() noexcept {
  static isa const detected = [] {
    isa found = isa::scalar;
#if GRADCOMP_X86_SIMD
    found = detail::detect_isa();
#endif
    if (char const* env = std::getenv("GRADCOMP_ISA")) {
      isa cap = found;
      if (std::strcmp(env, "scalar") == 0) cap = isa::scalar;
      if (std::strcmp(env, "avx2") == 0) cap = isa::avx2;
      if (std::strcmp(env, "avx512") == 0) cap = isa::avx512;
      if (static_cast<unsigned>(cap) < static_cast<unsigned>(found)) found = cap;
    }
    return found;
  }();
  return detected;
}

/// The level to run at when the caller asks for at most `requested`.
inline isa effective_isa(isa requested) noexcept {
  isa const m = machine_isa();
  return static_cast<unsigned>(requested) < static_cast<unsigned>(m) ? requested : m;
}

/// Calls `fn` with the tag of `level` and returns what it returns: the one place where a
/// run-time level (from `effective_isa`, which applies `GRADCOMP_ISA` and the level a
/// `cpu::execution` or a test forces) turns into a compile-time tag. `best` means
/// `machine_isa()`. The caller passes a level the machine supports; on a build without x86
/// SIMD every level maps to `scalar_tag`. Adding an ISA means a tag above and a case here.
/// Forced inline: the per-bucket kernels (`block_minmax`, ...) go through it on every call.
template <class Fn>
GRADCOMP_FORCEINLINE decltype(auto) dispatch(isa level, Fn&& fn) {
  if (level == isa::best) level = machine_isa();
#if GRADCOMP_X86_SIMD
  switch (level) {
    case isa::avx512: return std::forward<Fn>(fn)(avx512_tag{});
    case isa::avx2: return std::forward<Fn>(fn)(avx2_tag{});
    default: break;
  }
#endif
  return std::forward<Fn>(fn)(scalar_tag{});
}

}  // namespace cpu
GRADCOMP_NAMESPACE_END
