// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `cpu::execution`: where and how a CPU kernel runs — the thread pool, the size above which it
/// goes parallel, and the highest SIMD level. The parallel loops (`cpu/parallel.hpp`) and the
/// GEMM take this, not a codec's context, so that `cpu/` depends on nothing above it; the
/// execution context of the codecs (`codec_context`, `concepts/context.hpp`) converts to it.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/thread_pool.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// How a kernel runs. Value type; the default runs on the process-wide pool above 2^18 elements
/// (`default_parallel_threshold`, cpu/tuning.hpp) with the best ISA of the machine.
struct execution {
  /// Pool to run on; `nullptr` means `default_thread_pool()`.
  thread_pool* pool = nullptr;
  /// Tensors smaller than this many elements run on the calling thread only.
  std::size_t parallel_threshold = default_parallel_threshold;
  /// Highest SIMD level to use (`best` = whatever the machine has). Results do not depend on it.
  cpu::isa isa = cpu::isa::best;

  /// The pool to use.
  [[nodiscard]] thread_pool& threads() const {
    return pool != nullptr ? *pool : default_thread_pool();
  }
};

}  // namespace cpu
GRADCOMP_NAMESPACE_END
