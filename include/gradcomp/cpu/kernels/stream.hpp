// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Streaming (non-temporal) stores for outputs larger than the caches.
///
/// An ordinary store to a line that is not in cache first reads the line (read-for-ownership),
/// so a kernel that writes B bytes moves 2B through the memory bus. A streaming store writes a
/// whole 32- or 64-byte line through the write-combining buffers without reading it, and does
/// not evict the input from the caches. It pays off only when the output will not be read
/// again soon from cache, i.e. when it is larger than the caches: `cpu::stream_output` decides
/// that from the output's size (`cpu::streaming_store_min_bytes`, cpu/tuning.hpp).
///
/// Primitives, per ISA level:
///
/// - `stream_copy(tag, dst, src, bytes)`: copies bytes with ordinary stores up to the first
///   aligned line of `dst`, streams the aligned lines (the source may have any alignment), and
///   copies the tail with ordinary stores;
/// - `stream_fence()`: orders the streaming stores before whatever the caller does next (a
///   kernel that streams calls it once before it returns; x86 `sfence`).
///
/// Streaming changes no result: the same bytes land in memory.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// Whether an output of `bytes` bytes is written with streaming stores.
constexpr bool stream_output(std::size_t bytes) noexcept {
  return bytes >= streaming_store_min_bytes;
}

namespace kernels {

/// Bytes from `p` up to the next multiple of `align` (a power of two); 0 if `p` is aligned.
inline std::size_t bytes_to_alignment(void const* p, std::size_t align) noexcept {
  return (align - (reinterpret_cast<std::uintptr_t>(p) & (align - 1))) & (align - 1);
}

/// Orders earlier streaming stores before later memory operations of this thread.
inline void stream_fence() noexcept {
#if GRADCOMP_X86_SIMD
  _mm_sfence();
#endif
}

namespace scalar {

/// The portable level has no streaming stores: a plain copy.
inline void stream_copy(isa_tag, std::byte* dst, std::byte const* src, std::size_t bytes) noexcept {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

}  // namespace scalar

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
namespace avx512 {

GRADCOMP_TARGET_AVX512 inline void stream_copy(isa_tag, std::byte* dst, std::byte const* src,
                                               std::size_t bytes) noexcept {
  std::size_t head = bytes_to_alignment(dst, 64);
  if (head >= bytes) {
    scalar::stream_copy(scalar_tag{}, dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                        _mm512_loadu_si512(reinterpret_cast<void const*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
  stream_fence();
}

}  // namespace avx512

namespace avx2 {

GRADCOMP_TARGET_AVX2 inline void stream_copy(isa_tag, std::byte* dst, std::byte const* src,
                                             std::size_t bytes) noexcept {
  std::size_t head = bytes_to_alignment(dst, 32);
  if (head >= bytes) {
    scalar::stream_copy(scalar_tag{}, dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<__m256i const*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
  stream_fence();
}

}  // namespace avx2
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

/// Copies `bytes` bytes from `src` to `dst` (not overlapping) with streaming stores where the
/// level has them.
inline void stream_copy(std::byte* dst, std::byte const* src, std::size_t bytes,
                        isa level) noexcept {
  dispatch(level, [&](auto t) { stream_copy(t, dst, src, bytes); });
}

}  // namespace kernels
}  // namespace cpu
GRADCOMP_NAMESPACE_END
