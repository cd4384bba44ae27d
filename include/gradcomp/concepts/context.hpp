// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `codec_context`: what a codec call needs besides its data — the random stream's seed and
/// step, and the threads to run on. A vocabulary type of the codec, feedback and low-rank
/// concepts, so it sits with them in `concepts/`, below every layer that uses it; it converts to
/// the `cpu::execution` that the CPU kernels take.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/execution.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/thread_pool.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN

/// Per-call settings shared by all codecs. Value type; the default runs on the process-wide
/// pool with seed 0 at step 0.
struct codec_context {
  /// Seed of the counter-based random stream; ranks that share it draw the same numbers.
  std::uint64_t seed = 0;
  /// Training step; part of the random counter, so each step draws fresh numbers.
  std::uint32_t step = 0;
  /// Pool to run on; `nullptr` means `cpu::default_thread_pool()`.
  cpu::thread_pool* pool = nullptr;
  /// Tensors smaller than this many elements run on the calling thread only.
  std::size_t parallel_threshold = cpu::default_parallel_threshold;
  /// Highest SIMD level to use (`best` = whatever the machine has). Packets do not depend on it.
  cpu::isa isa = cpu::isa::best;

  /// The pool to use.
  [[nodiscard]] cpu::thread_pool& threads() const { return cpu::execution(*this).threads(); }

  /// How the CPU kernels run for this call: the pool, threshold and ISA above. Implicit, so a
  /// context can be handed to `cpu::for_each_chunk` and `cpu::gemm` directly.
  // NOLINTNEXTLINE(google-explicit-constructor): a context is an execution plus a random stream
  operator cpu::execution() const noexcept { return {pool, parallel_threshold, isa}; }
};

GRADCOMP_NAMESPACE_END
