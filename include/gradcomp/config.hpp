// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Configuration macros shared by every gradcomp header: the ABI namespace, the one
/// host/device macro family, and the compile-time ISA switches of the CPU backend.

// gradcomp is C++20; without it the first error would come from deep inside the concepts. MSVC
// reports __cplusplus as 199711L unless /Zc:__cplusplus is given, and _MSVC_LANG instead.
#if !defined(__cplusplus) || \
    (__cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L))
#  error "gradcomp needs C++20: compile with -std=c++20 or later (MSVC: /std:c++20)"
#endif

#include <gradcomp/version.hpp>

/// Opens `namespace gradcomp { inline namespace v1 {`. The inline namespace carries the ABI
/// version so that two incompatible copies of the library in one program do not collide.
#define GRADCOMP_NAMESPACE_BEGIN \
  namespace gradcomp {           \
  inline namespace v1 {
#define GRADCOMP_NAMESPACE_END \
  }                            \
  }

/// Explicit instantiation switch (default 0: off). With `GRADCOMP_EXTERN_TEMPLATES` defined to 1,
/// the headers declare the run-time erasures of the codecs `make_codec` builds and of the
/// controllers `make_controller` builds as explicit instantiations made elsewhere
/// (`extern template`), so a translation unit that uses them no longer compiles every codec and
/// controller behind them; exactly one translation unit of the program must then include
/// <gradcomp/instantiate.hpp>, which makes them. Behaviour is the same either way; only where the
/// code is compiled changes. For programs of many translation units (gradcomp's own tests use it:
/// a test file that calls `make_codec` compiles in about a third of the time). All translation
/// units of a program should agree on the setting; mixing is allowed but gains nothing.
#if !defined(GRADCOMP_EXTERN_TEMPLATES)
#  define GRADCOMP_EXTERN_TEMPLATES 0
#endif

#if defined(__CUDACC__) || defined(__HIP__)
#  define GRADCOMP_HOST_DEVICE __host__ __device__
#  define GRADCOMP_DEVICE __device__
#  define GRADCOMP_FORCEINLINE __forceinline__
#else
/// Marks a function usable from host and device code (plain `inline` without CUDA).
#  define GRADCOMP_HOST_DEVICE
/// Marks a device-only function (empty without CUDA).
#  define GRADCOMP_DEVICE
#  if defined(__GNUC__) || defined(__clang__)
/// Forces inlining where the compiler supports it.
#    define GRADCOMP_FORCEINLINE inline __attribute__((always_inline))
#  else
#    define GRADCOMP_FORCEINLINE inline
#  endif
#endif

/// True when the x86-64 SIMD kernels of the CPU backend may be compiled. They are built with
/// per-function `target` attributes and chosen at run time from CPUID, so the translation unit
/// itself needs no `-m` flags and the program runs on any x86-64. Define
/// `GRADCOMP_DISABLE_SIMD` to force the portable kernels everywhere.
#if !defined(GRADCOMP_DISABLE_SIMD) && defined(__x86_64__) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__NVCOMPILER)
#  define GRADCOMP_X86_SIMD 1
#else
#  define GRADCOMP_X86_SIMD 0
#endif

#if GRADCOMP_X86_SIMD
/// Function attribute enabling AVX2 + FMA + F16C code generation for one kernel.
#  define GRADCOMP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))
/// Function attribute enabling AVX-512 (F, BW, DQ, VL) code generation for one kernel.
#  define GRADCOMP_TARGET_AVX512 \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi2")))
#endif

#if defined(__GNUC__) && !defined(__clang__)
/// Silences GCC's false "may be used uninitialized" reports on `_mm*_undefined_*` inside
/// intrinsics (GCC 12); wraps the SIMD kernel sections only.
#  define GRADCOMP_SIMD_DIAGNOSTICS_PUSH \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
        _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#  define GRADCOMP_SIMD_DIAGNOSTICS_POP _Pragma("GCC diagnostic pop")
#else
#  define GRADCOMP_SIMD_DIAGNOSTICS_PUSH
#  define GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif
