// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The tuning constants of the CPU backend, in one place: chunk and block sizes, the parallel
/// threshold, prefetch distances. Each says what it trades and what chose it: the measurement
/// where there was one (the figures come from docs/performance.md and docs/algorithms.md, on the
/// 2-vCPU AVX-512 Xeon described there), or that it was not measured.
///
/// Retuning for a microarchitecture means editing this header. Most constants hold on every
/// machine measured; where two machines wanted different values (the prefetch distances), the
/// value is chosen once at run time from the CPU vendor (`machine_tuning()`). Every constant here changes
/// speed only, except `chunk_elements`, which also fixes the order of chunked reductions and so
/// the bytes of some packets (see its comment).

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <cpuid.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

// --- Parallel loops (cpu/parallel.hpp, cpu/execution.hpp) ------------------------------------

/// Elements per parallel chunk before alignment: large enough to amortise the hand-off to a
/// worker, small enough to balance two to a few dozen threads. Not measured: set with the
/// first thread pool (commit 2431289) and kept since; at this size a chunk of floats
/// (256 KiB) is re-read from L2 by the quantize pass of the bucketed codecs
/// (docs/performance.md, "Where the time goes"). Not a pure speed knob: onebit's scale and the
/// L2 norms of large buckets are combined in chunk order, so a new value changes those
/// packets (still the same for every thread count and ISA level); treat a change as a
/// wire-visible one.
inline constexpr std::size_t chunk_elements = std::size_t{1} << 16;

/// Default `execution::parallel_threshold` (and `codec_context::parallel_threshold`): tensors
/// smaller than this many elements (1 MiB of floats) run on the calling thread. Not measured:
/// set with the first codecs (commit 2431289); the benchmarks since show the 2^16 rows, which
/// stay below it, L2-resident and a few microseconds per call (docs/performance.md, "Two
/// threads", "Smaller tensors"), but no sweep of the threshold itself.
inline constexpr std::size_t default_parallel_threshold = std::size_t{1} << 18;

// --- Streaming stores (cpu/kernels/stream.hpp) -------------------------------------------------

/// Outputs of at least this many bytes (a packet when compressing, the floats when
/// decompressing without accumulating) are written with streaming (non-temporal) stores, which
/// skip the read-for-ownership of every output line and leave the caches to the input. Below it
/// the output is likely to be read again from cache (by the collective that sends the packet,
/// or the optimizer that applies the gradient), so ordinary stores are kept. Chosen, not swept:
/// twice the 4 MiB L2 of the measured machine. Measured at 2^24 float32 on one thread (Intel
/// Xeon, docs/performance.md, "Streaming stores"): fp16 compress from 0.47 to 0.62 of the read
/// kernel with the packet streamed.
inline constexpr std::size_t streaming_store_min_bytes = std::size_t{8} << 20;

/// Tensors of at most this many bytes compute their L2 bucket norms four buckets at a time
/// (`kernels::bucket_scales` with `interleave`: eight chains of double FMAs instead of two,
/// the same canonical sums), above it one bucket at a time. Measured on the AMD EPYC machine
/// (docs/performance.md, "Update 2026-11-29"), QSGD s=7 and L2 dithering compression, one
/// thread: +11 % at 2^16 and 2^20 elements (cache-resident: the FMA latency bounds a single
/// bucket's two chains), -10 % at 2^24 (from DRAM: four streams 2 KiB apart prefetch worse
/// than one). Set between the two: 8 MiB, like `streaming_store_min_bytes`.
inline constexpr std::size_t interleaved_norms_max_bytes = std::size_t{8} << 20;

// --- Bucket statistics kernels (cpu/kernels/bytecode.hpp, cpu/kernels/dither.hpp) ------------

/// The CPU families whose measurements chose a tuning value of their own.
enum class cpu_vendor : unsigned char { other, intel, amd };

/// The vendor in CPUID leaf 0 ("GenuineIntel", "AuthenticAMD"); `other` elsewhere.
inline cpu_vendor detect_cpu_vendor() noexcept {
#if GRADCOMP_X86_SIMD
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return cpu_vendor::other;
  char name[12];
  std::memcpy(name, &b, 4);
  std::memcpy(name + 4, &d, 4);
  std::memcpy(name + 8, &c, 4);
  if (std::memcmp(name, "GenuineIntel", 12) == 0) return cpu_vendor::intel;
  if (std::memcmp(name, "AuthenticAMD", 12) == 0) return cpu_vendor::amd;
#endif
  return cpu_vendor::other;
}

/// Prefetch distances (bytes of input ahead of the loads) of the streaming kernels. Speed only:
/// no value changes a byte of output.
struct prefetch_tuning {
  /// The streamed 16-bit conversions (cpu/kernels/convert.hpp). With streaming stores the
  /// loop's own loads are the only demand traffic, and the hardware prefetcher alone kept one
  /// thread below the read kernel. Intel Xeon, 2^24 float32, one thread: fp16 from 15.5–16.3
  /// to 18.3–18.6 GB/s, bf16 from 14.4–14.7 to 15.8–16.8 GB/s with 4 KiB; 1 and 8 KiB were no
  /// better.
  std::size_t stream_bytes;
  /// The statistics passes (`block_minmax`, `block_max_exponent`, `block_sumsq`,
  /// `block_absmax`) and onebit's packer. Intel Xeon: 2048 bytes took `block_minmax` over 2^24
  /// elements from 23 to 26 GB/s (commit efb81b1); with streamed codes and the codes pass
  /// re-reading from L1, 4096 measured better (int8 nearest compress 0.55–0.58 of read with
  /// 2048, 0.61–0.63 with 4096 or 8192). AMD EPYC (Zen 5, 2026-11-28, 2^24, one thread, ratio
  /// to the traffic kernel): 4096 gave int8 nearest 0.64–0.65 and onebit 0.81–0.82; 16384 gave
  /// 0.84–0.87 and 0.87–0.92; 32768 no better. The streamed conversions kept 4096 there
  /// (16384 was no better for fp16 and worse for bf16).
  std::size_t stats_bytes;
};

/// The prefetch distances measured best on each vendor's machine; `other` takes Intel's.
inline constexpr prefetch_tuning prefetch_tuning_for(cpu_vendor v) noexcept {
  if (v == cpu_vendor::amd) return {4096, 16384};
  return {4096, 4096};
}

/// The tuning of the machine this runs on (detected once).
inline prefetch_tuning const& machine_tuning() noexcept {
  static prefetch_tuning const tuning = prefetch_tuning_for(detect_cpu_vendor());
  return tuning;
}

/// Elements per block of the bucketed codecs' two passes (int8's range, natural's exponent, then
/// the codes; codec/detail/codec_base.hpp, `bucketed_pass`), rounded up to whole buckets: 16 KiB
/// of floats, so the codes pass re-reads the block from L1. Speed only. Measured at 2^24
/// float32, one thread (Intel Xeon): see docs/performance.md, "Streaming stores".
inline constexpr std::size_t bucketed_pass_block = 4096;

// --- Fused error feedback (codec/detail/codec_base.hpp, feedback/policies.hpp) -----------------

/// Elements per block of fused error feedback: the block of g + residual is written, encoded,
/// decoded into the next residual and left, while it is still in L2 (3 x 64 KiB of floats with
/// g and the old residual). Speed only: packets and residuals are the same for every block size
/// that is a multiple of the codec's alignment. Chosen, not swept: a quarter of a parallel chunk.
inline constexpr std::size_t fused_feedback_block = std::size_t{1} << 14;

// --- GEMM (cpu/kernels/gemm.hpp) --------------------------------------------------------------

/// Rows of B per k block of the GEMM's axpy form: the block of B stays in cache while the
/// register tiles sweep across it. Not swept; 16 rows of a 4096-wide B are 256 KiB (L2).
inline constexpr std::size_t gemm_kc = 16;

/// How far ahead (floats along a row of B) the axpy tiles prefetch: the axpy form reads
/// gemm_kc rows of B at once, more streams than the hardware prefetcher follows well.
/// Measured: Q = Pᵀ M at 4096 × 4096, r = 4 runs twice as fast with it (docs/algorithms.md).
inline constexpr std::size_t gemm_prefetch = 128;

/// Rows of C per parallel GEMM task (columns are split evenly over the threads). Not swept.
inline constexpr std::size_t gemm_task_rows = 64;

/// The GEMM runs on the pool when m·n·k is at least this many times the parallel threshold
/// (a multiply-add is much cheaper than a codec's per-element work). Not swept.
inline constexpr std::size_t gemm_parallel_factor = 32;

// --- Codec-level loops (codec/, comm/) ---------------------------------------------------------

/// Random-k's gather of the kept values prefetches the element this many indices ahead (the
/// indices are random, so the hardware prefetcher cannot). Not swept.
inline constexpr std::size_t gather_prefetch_ahead = 16;

/// Floats widened per step when the host reduction sums 16-bit buffers: 4 KiB on the stack,
/// which stays in L1. Not measured.
inline constexpr std::size_t reduce_16bit_block = 1024;

/// Elements per block of top-k's candidate collection on one thread (the output grows by at
/// most a block between checks of its room). Not swept.
inline constexpr std::size_t topk_serial_block = 4096;

/// The same on the pool: small, because each chunk's buffer needs room for one block beyond
/// its expected share. Not swept.
inline constexpr std::size_t topk_chunk_block = 512;

/// Elements per block of the sparse selection's candidate collection (codec/detail/select.hpp).
/// Not swept.
inline constexpr std::size_t select_collect_block = 2048;

/// Rows per task of PowerSGD's fused phase 1 (add g, subtract P Qᵀ, project onto Q while the
/// rows are in cache). Not swept.
inline constexpr std::size_t powersgd_block_rows = 16;

}  // namespace cpu
GRADCOMP_NAMESPACE_END
