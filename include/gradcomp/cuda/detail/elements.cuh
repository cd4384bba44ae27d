// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// How the CUDA codecs' work items touch elements: the inputs they encode (a tensor of any
/// element type, or g + e for error feedback, which also receives the next residual), the
/// decoded values they store, and the 16-bit random draws of stochastic rounding.
///
/// Draws come only through `gradcomp::random_stream` (core/philox.hpp): `block_of` and `block`
/// fix which Philox call element i uses, `draw_from` which of its bits (and, since wire format
/// 2, which shift), on every backend. `draw_cache` keeps the last Philox outputs a work item
/// computed, tagged with their block number, so an item whose elements share blocks pays one
/// call per block, and whatever mapping core/philox.hpp defines, every element gets its draw.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include <math.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// Whether `v` is a finite float, from its bits (also under flush-to-zero).
GRADCOMP_HOST_DEVICE constexpr bool finite(float v) noexcept {
  return (gradcomp::detail::bit_cast<std::uint32_t>(v) & 0x7f800000u) != 0x7f800000u;
}

/// The elements of a tensor of type `T`, read as float (exactly, as the CPU codecs convert a
/// 16-bit input before encoding it).
template <element T>
struct plain_input {
  using element_type = T;
  static constexpr bool feedback = false;
  T const* x;

  GRADCOMP_HOST_DEVICE float at(std::uint64_t i) const noexcept { return to_float(x[i]); }
  /// The raw element (for codecs that copy an input of their own wire type bit for bit).
  GRADCOMP_HOST_DEVICE T raw(std::uint64_t i) const noexcept { return x[i]; }
  GRADCOMP_HOST_DEVICE void settle(std::uint64_t, float, float) const noexcept {}
};

/// Residual error feedback fused with encoding: the element encoded is p = e + g (e = 0 where
/// the residual is null, as in `residual_feedback`'s combine), a non-finite p is reported to
/// `status->element`, and `settle` stores the next residual p − x̂ (`fma(-1, x̂, p)`, as
/// `decompress_add(packet, p, -1)` computes it).
template <element T>
struct feedback_input {
  using element_type = T;
  static constexpr bool feedback = true;
  T const* g;
  float const* e;  ///< the residual, or null for zero
  float* next;     ///< the next residual (may be `e`)
  status_words* status;

  GRADCOMP_HOST_DEVICE float at(std::uint64_t i) const noexcept {
    float const v = (e != nullptr ? e[i] : 0.0f) + to_float(g[i]);
    if (!finite(v)) report(&status->element, i);
    return v;
  }
  GRADCOMP_HOST_DEVICE float raw(std::uint64_t i) const noexcept { return at(i); }
  GRADCOMP_HOST_DEVICE void settle(std::uint64_t i, float p, float decoded) const noexcept {
    next[i] = fmaf(-1.0f, decoded, p);
  }
};

/// Stores decoded value `v` of element `i` into `out`: `out = v`, or with `add`
/// `out = fma(alpha, v, out)` (in float, then rounded to `T`, as the CPU codecs do).
template <element T>
GRADCOMP_HOST_DEVICE inline void store_decoded(T* out, std::uint64_t i, float v, float alpha,
                                               bool add) noexcept {
  out[i] = add ? from_float<T>(fmaf(alpha, v, to_float(out[i]))) : from_float<T>(v);
}

/// The draws of a work item's elements, with the Philox outputs of the last `Slots` blocks it
/// used kept by block number (direct-mapped on `block % Slots`).
template <unsigned Slots>
class draw_cache {
 public:
  GRADCOMP_HOST_DEVICE explicit draw_cache(random_stream const& rs) noexcept : rs_(rs) {
    for (unsigned s = 0; s < Slots; ++s) tag_[s] = ~std::uint64_t{0};
  }

  /// Element `i`'s uniform 16-bit draw.
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::uint64_t i) noexcept {
    std::uint64_t const b = random_stream::block_of(i);
    unsigned const s = static_cast<unsigned>(b % Slots);
    if (tag_[s] != b) {
      out_[s] = rs_.block(b);
      tag_[s] = b;
    }
    return random_stream::draw_from(out_[s], i);
  }

 private:
  random_stream rs_;
  std::uint64_t tag_[Slots];
  philox_block out_[Slots];
};

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
