// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Deterministic chunked loops over a tensor: the chunk boundaries depend only on the size and
/// an alignment (bucket size, bit-packing group), never on the number of threads.

#include <gradcomp/config.hpp>
#include <gradcomp/cpu/execution.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace cpu {

/// Chunk length for `align`: `chunk_elements` (cpu/tuning.hpp) rounded up to a multiple of `align`.
constexpr std::size_t chunk_length(std::size_t align) noexcept {
  if (align == 0) align = 1;
  return (chunk_elements + align - 1) / align * align;
}

/// Number of chunks covering `n` elements with chunks of `chunk_length(align)`.
constexpr std::size_t chunk_count(std::size_t n, std::size_t align) noexcept {
  std::size_t const len = chunk_length(align);
  return (n + len - 1) / len;
}

/// Calls `fn(chunk, begin, end)` for every chunk of `[0, n)`, on `ctx`'s pool when
/// `n >= ctx.parallel_threshold`, else on the calling thread. A `codec_context` converts to the
/// `execution` taken here.
template <class Fn>
void for_each_chunk(std::size_t n, std::size_t align, execution const& ctx, Fn&& fn) {
  std::size_t const len = chunk_length(align);
  std::size_t const chunks = chunk_count(n, align);
  auto body = [&](std::size_t c) {
    std::size_t const b = c * len;
    std::size_t const e = b + len < n ? b + len : n;
    fn(c, b, e);
  };
  if (n >= ctx.parallel_threshold && chunks > 1) {
    ctx.threads().run(chunks, body);
  } else {
    for (std::size_t c = 0; c < chunks; ++c) body(c);
  }
}

}  // namespace cpu
GRADCOMP_NAMESPACE_END
