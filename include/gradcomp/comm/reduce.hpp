// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Element-wise reduction of byte buffers by `comm_type` and `reduce_op`: the one host
/// reduction of the library, shared by the communicators that reduce on the host (in-process,
/// and MPI's user-defined operations for the 16-bit float types MPI lacks). 16-bit floats are
/// widened to float32, combined and rounded back to nearest even; NaN propagates through `sum`,
/// and `max`/`min` prefer the non-NaN operand as `std::fmax`/`std::fmin` do. Their sum, the hot
/// path (gradients), runs on the SIMD conversion kernels of cpu/kernels/convert.hpp.

#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/convert.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <class T, class Op>
void reduce_typed(std::byte* acc, std::byte const* in, std::size_t count, Op op) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    T a;
    T b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    a = op(a, b);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

// acc[i] += in[i] for 16-bit floats: both widened to float32 a block at a time by the SIMD
// kernels, added, rounded back. Bit-identical to from_float(to_float(a) + to_float(b)) per
// element, at every ISA level.
template <cpu::kernels::half_format F>
void sum_16bit(std::byte* acc, std::byte const* in, std::size_t count) noexcept {
  constexpr std::size_t block = cpu::reduce_16bit_block;  // on the stack, stays in L1
  cpu::isa const level = cpu::machine_isa();
  float sum[block];
  for (std::size_t at = 0; at < count; at += block) {
    std::size_t const m = std::min(block, count - at);
    cpu::kernels::widen<F>(acc + 2 * at, sum, m, 1.0f, false, level);
    cpu::kernels::widen<F>(in + 2 * at, sum, m, 1.0f, true, level);
    cpu::kernels::narrow<F>(sum, acc + 2 * at, m, level);
  }
}

template <class T>
void reduce_with(reduce_op op, std::byte* acc, std::byte const* in, std::size_t count) noexcept {
  if constexpr (std::same_as<T, half> || std::same_as<T, bfloat16>) {
    switch (op) {
      case reduce_op::sum:
        sum_16bit<std::same_as<T, half> ? cpu::kernels::half_format::f16
                                        : cpu::kernels::half_format::bf16>(acc, in, count);
        return;
      case reduce_op::max:
        reduce_typed<T>(acc, in, count,
                        [](T a, T b) { return from_float<T>(std::fmax(to_float(a), to_float(b))); });
        return;
      case reduce_op::min:
        reduce_typed<T>(acc, in, count,
                        [](T a, T b) { return from_float<T>(std::fmin(to_float(a), to_float(b))); });
        return;
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case reduce_op::sum: reduce_typed<T>(acc, in, count, [](T a, T b) { return a + b; }); return;
      case reduce_op::max: reduce_typed<T>(acc, in, count, [](T a, T b) { return std::fmax(a, b); }); return;
      case reduce_op::min: reduce_typed<T>(acc, in, count, [](T a, T b) { return std::fmin(a, b); }); return;
    }
  } else {
    // Unsigned arithmetic wraps; signed sums are computed in the unsigned type so that an
    // overflow wraps too instead of being undefined.
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case reduce_op::sum:
        reduce_typed<T>(acc, in, count, [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
        return;
      case reduce_op::max: reduce_typed<T>(acc, in, count, [](T a, T b) { return std::max(a, b); }); return;
      case reduce_op::min: reduce_typed<T>(acc, in, count, [](T a, T b) { return std::min(a, b); }); return;
    }
  }
}

}  // namespace detail

/// `acc[i] = op(acc[i], in[i])` for the `bytes / comm_type_size(type)` elements of type `type`
/// in `acc` and `in` (which may not overlap). Throws `config_error` for an unknown type or
/// operation, or a byte count that is not a whole number of elements.
inline void reduce_into(comm_type type, reduce_op op, std::byte* acc, std::byte const* in,
                        std::size_t bytes) {
  std::size_t const es = comm_type_size(type);
  if (es == 0) {
    throw config_error("gradcomp: unknown comm_type " + std::to_string(static_cast<unsigned>(type)));
  }
  if (op != reduce_op::sum && op != reduce_op::max && op != reduce_op::min) {
    throw config_error("gradcomp: unknown reduce_op " + std::to_string(static_cast<unsigned>(op)));
  }
  if (bytes % es != 0) {
    throw config_error("gradcomp: a reduction of " + std::string(comm_type_name(type)) + " over " +
                       std::to_string(bytes) + " bytes, which is not a multiple of " +
                       std::to_string(es));
  }
  std::size_t const n = bytes / es;
  switch (type) {
    case comm_type::u8: return detail::reduce_with<std::uint8_t>(op, acc, in, n);
    case comm_type::i32: return detail::reduce_with<std::int32_t>(op, acc, in, n);
    case comm_type::u32: return detail::reduce_with<std::uint32_t>(op, acc, in, n);
    case comm_type::i64: return detail::reduce_with<std::int64_t>(op, acc, in, n);
    case comm_type::u64: return detail::reduce_with<std::uint64_t>(op, acc, in, n);
    case comm_type::f32: return detail::reduce_with<float>(op, acc, in, n);
    case comm_type::f64: return detail::reduce_with<double>(op, acc, in, n);
    case comm_type::f16: return detail::reduce_with<half>(op, acc, in, n);
    case comm_type::bf16: return detail::reduce_with<bfloat16>(op, acc, in, n);
  }
}

GRADCOMP_NAMESPACE_END
