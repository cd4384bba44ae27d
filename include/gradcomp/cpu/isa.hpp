// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Instruction-set levels of the CPU backend and their run-time detection. Kernels exist for
/// each level; a call uses the best level both the machine and its `codec_context` allow.
/// Every level produces byte-identical packets.

#include <gradcomp/config.hpp>

#include <cstdlib>
#include <cstring>

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

/// The best level this machine supports, capped by the environment variable `GRADCOMP_ISA`
/// (`scalar`, `avx2` or `avx512`) when set. Detected once.
inline isa machine_isa() noexcept {
  static isa const detected = [] {
    isa found = isa::scalar;
#if GRADCOMP_X86_SIMD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2")) {
      found = isa::avx2;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
        found = isa::avx512;
      }
    }
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

}  // namespace cpu
GRADCOMP_NAMESPACE_END
