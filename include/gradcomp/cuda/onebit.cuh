// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::onebit_codec`: the sign codec on the GPU, with packets byte-identical to
/// the CPU `gradcomp::onebit_codec` in both scaling modes.
///
/// The sign bits are embarrassingly parallel; the scale is not. mean|x| is a double sum whose
/// rounding depends on the order of the additions, so every backend adds in the one order fixed
/// by `gradcomp::onebit_sum_order`: blocks of 4096 elements; in a block, lane l (0..15) sums
/// elements l, l+16, l+32, ... in ascending order; a block's sum adds lanes 0..15 in order;
/// the total adds the block sums in block order. On the GPU that becomes three passes:
///
/// 1. one work item per (block, half): the half-block item owns lanes 8h..8h+7, so it walks
///    rows of 16 elements reading its 8 consecutive ones, packs them into one whole sign byte
///    and continues its 8 lane sums in order (signs and sums in one read of the input, and no
///    two items ever write the same byte);
/// 2. one item per block adds its 16 lane sums in lane order;
/// 3. one item adds the block sums in block order, writes the header and the scale.
///
/// Passes 1 and 2 are as parallel as the order allows; pass 3 is sequential by definition (one
/// double add per 4096 elements). A non-finite total is reported, so that a non-finite input
/// throws `numeric_error`, as the CPU codec does; waiting for that report is the one
/// synchronization in `compress`. Error feedback adds a fourth pass after it, which computes
/// each next residual p − (±scale): the scale is a statistic of the whole tensor, so the
/// residual cannot be written in the pass that reads p first.
///
/// Format: codec/format/onebit.hpp; element math and summation order: core/quant/onebit.hpp,
/// shared with the CPU codec and kernels.

#include <gradcomp/codec/format/onebit.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/quant/onebit.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace ops {

/// Elements per summation block (`onebit_sum_order::block`).
inline constexpr std::size_t onebit_block = onebit_sum_order::block;
/// Lanes per block (`onebit_sum_order::lanes`).
inline constexpr std::size_t onebit_lanes = onebit_sum_order::lanes;
static_assert(onebit_lanes == 16 && onebit_block % onebit_lanes == 0,
              "the half-block items below pack whole bytes only for 16 lanes");

/// Number of summation blocks for `n` elements.
GRADCOMP_HOST_DEVICE constexpr std::size_t onebit_blocks(std::size_t n) noexcept {
  return (n + onebit_block - 1) / onebit_block;
}

/// Pass 1 for item `item` = 2 * block + half: packs the signs of the elements in lanes
/// 8 half .. 8 half + 7 of that block, read through `in` (bit i % 8 of `bits[i / 8]` is
/// `x_i < 0`; unused high bits of the last byte are 0) and stores the 8 lane sums of |x_i|
/// (double, ascending order) at `lane_sums[16 block + 8 half .. + 8)`.
template <class In>
GRADCOMP_HOST_DEVICE void onebit_pack_half_block(In const& in, std::size_t n, std::size_t item,
                                                 std::byte* bits, double* lane_sums) noexcept {
  std::size_t const block = item / 2;
  std::size_t const half = item % 2;
  double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  std::size_t first = block * onebit_block + 8 * half;
  std::size_t const end = block * onebit_block + onebit_block;
  for (; first < end && first < n; first += onebit_lanes) {
    std::size_t const live = n - first < 8 ? n - first : 8;
    unsigned byte = 0;
    GRADCOMP_CUDA_UNROLL
    for (std::size_t k = 0; k < 8; ++k) {
      if (k < live) {
        float const v = in.at(first + k);
        byte |= static_cast<unsigned>(quant::is_negative(v)) << k;
        acc[k] += quant::abs_as_double(v);
      }
    }
    bits[first / 8] = static_cast<std::byte>(byte);
  }
  GRADCOMP_CUDA_UNROLL
  for (std::size_t k = 0; k < 8; ++k) lane_sums[block * onebit_lanes + 8 * half + k] = acc[k];
}

/// Pass 2: the canonical sum of block `block` from its 16 lane sums.
GRADCOMP_HOST_DEVICE inline double onebit_block_sum(double const* lane_sums,
                                                    std::size_t block) noexcept {
  double s = 0.0;
  for (std::size_t l = 0; l < onebit_lanes; ++l) s += lane_sums[block * onebit_lanes + l];
  return s;
}

/// Pass 3: the canonical total of `blocks` block sums.
GRADCOMP_HOST_DEVICE inline double onebit_total(double const* block_sums,
                                                std::size_t blocks) noexcept {
  double s = 0.0;
  for (std::size_t b = 0; b < blocks; ++b) s += block_sums[b];
  return s;
}

/// Writes the first 8 payload bytes: f32 scale, u32 reserved 0.
GRADCOMP_HOST_DEVICE inline void onebit_store_prefix(std::byte* payload, float scale) noexcept {
  detail::store_f32_le(payload, scale);
  detail::store_u32_le(payload + 4, 0);
}

/// The decoded value of element `i`: ±scale from its sign bit. The sign is set on the bits: a
/// float negation would flush a subnormal scale under -ftz.
GRADCOMP_HOST_DEVICE inline float onebit_value(std::byte const* bits, float scale,
                                               std::size_t i) noexcept {
  std::uint32_t const neg = (static_cast<std::uint32_t>(bits[i / 8]) >> (i % 8)) & 1u;
  return gradcomp::detail::bit_cast<float>(gradcomp::detail::bit_cast<std::uint32_t>(scale) ^
                                           (neg << 31));
}

}  // namespace ops

namespace algo {

/// Scratch layout of `onebit_encode` for `n` elements, in doubles: the total, then 16 lane
/// sums per block, then one sum per block.
struct onebit_workspace {
  double* total;
  double* lane_sums;
  double* block_sums;

  /// Doubles needed for `n` elements.
  static constexpr std::size_t doubles(std::size_t n) noexcept {
    return 1 + (ops::onebit_lanes + 1) * ops::onebit_blocks(n);
  }
  /// Carves the layout out of `base`, which must hold `doubles(n)` doubles.
  static onebit_workspace at(double* base, std::size_t n) noexcept {
    std::size_t const blocks = ops::onebit_blocks(n);
    return {base, base + 1, base + 1 + ops::onebit_lanes * blocks};
  }
};

namespace onebit_detail {

template <class In>
struct pack_fn {
  In in;
  std::size_t n;
  std::byte* bits;
  double* lane_sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t item) const noexcept {
    ops::onebit_pack_half_block(in, n, item, bits, lane_sums);
  }
};

struct block_fn {
  double const* lane_sums;
  double* block_sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t b) const noexcept {
    block_sums[b] = ops::onebit_block_sum(lane_sums, b);
  }
};

struct finish_fn {
  detail::header_image header;
  double const* block_sums;
  std::size_t blocks;
  std::size_t n;
  bool scaled;
  std::byte* out;
  double* total;
  detail::status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const noexcept {
    header.store(out);
    double const t = ops::onebit_total(block_sums, blocks);
    *total = t;
    if ((gradcomp::detail::bit_cast<std::uint64_t>(t) & 0x7ff0000000000000ull) ==
        0x7ff0000000000000ull) {
      detail::report(&status->bucket, 0);  // a non-finite element; the packet is not valid
    }
    ops::onebit_store_prefix(out + header_bytes, quant::onebit_scale(t, n, scaled));
  }
};

template <class In>
struct residual_fn {
  In in;
  std::byte const* payload;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    float const p = in.at(i);
    in.settle(i, p, ops::onebit_value(payload + 8, detail::load_f32_le(payload), i));
  }
};

template <element T>
struct decode_fn {
  std::byte const* payload;
  T* out;
  float alpha;
  bool add;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    float const v = ops::onebit_value(payload + 8, detail::load_f32_le(payload), i);
    detail::store_decoded(out, i, v, alpha, add);
  }
};

}  // namespace onebit_detail

/// Writes the onebit packet of the n elements of `in` with header `header` (whose variant
/// selects the scaling) to `out` and the canonical total of |x| to `*ws.total`, on the Thrust
/// policy `exec`. A non-finite total is reported as bucket 0 to `status`; the packet is then
/// not valid.
template <class Policy, class In>
void onebit_encode(Policy&& exec, detail::header_image const& header, bool scaled, In const& in,
                   std::size_t n, std::byte* out, onebit_workspace ws,
                   detail::status_words* status) {
  using thrust::counting_iterator;
  std::size_t const blocks = ops::onebit_blocks(n);
  std::byte* const bits = out + header_bytes + onebit_format::prefix_bytes;
  thrust::for_each_n(exec, counting_iterator<std::size_t>(0), 2 * blocks,
                     onebit_detail::pack_fn<In>{in, n, bits, ws.lane_sums});
  thrust::for_each_n(exec, counting_iterator<std::size_t>(0), blocks,
                     onebit_detail::block_fn{ws.lane_sums, ws.block_sums});
  thrust::for_each_n(
      exec, counting_iterator<std::size_t>(0), 1,
      onebit_detail::finish_fn{header, ws.block_sums, blocks, n, scaled, out, ws.total, status});
}

/// Decodes `n` elements of the onebit payload `payload` (scale, reserved word, sign bits) into
/// `out` (or adds `alpha` times them).
template <class Policy, element T>
void onebit_decode(Policy&& exec, std::byte const* payload, std::size_t n, T* out, float alpha,
                   bool add) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::size_t>(0), n,
                     onebit_detail::decode_fn<T>{payload, out, alpha, add});
}

}  // namespace algo

/// The onebit codec on a CUDA stream (see file comment and cuda/detail/codec_base.cuh for the
/// operations). `inspect` and decoding check the scale, the reserved word and the padding bits
/// on the probed bytes before anything is decoded.
class onebit_codec : public detail::device_codec<onebit_codec> {
  friend class detail::device_codec<onebit_codec>;

 public:
  using scaling = onebit_format::scaling;
  static constexpr codec_id id = onebit_format::id;

  /// A onebit codec with the given scaling (default: mean |x|).
  constexpr explicit onebit_codec(scaling s = scaling::mean_abs) noexcept : format_{s} {}

  [[nodiscard]] constexpr scaling scale_mode() const noexcept { return format_.mode; }
  [[nodiscard]] constexpr onebit_format wire_format() const noexcept { return format_; }

 private:
  struct scratch {
    detail::status_words* status;
    double* sums;
  };
  static scratch carve(detail::arena& a, std::size_t n) {
    scratch s{};
    s.status = a.take<detail::status_words>(1);
    s.sums = a.take<double>(algo::onebit_workspace::doubles(n));
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const& h, In const& in,
                    std::size_t n, std::byte* out) const {
    algo::onebit_encode(exec, detail::make_header_image(h),
                        h.variant == static_cast<std::uint8_t>(scaling::mean_abs), in, n, out,
                        algo::onebit_workspace::at(ws.sums, n), ws.status);
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const&, detail::header_image const&,
                    packet_header const&, In const& in, std::size_t n, std::byte* out,
                    random_stream const&) const {
    if constexpr (In::feedback) {
      thrust::for_each_n(exec, thrust::counting_iterator<std::size_t>(0), n,
                         algo::onebit_detail::residual_fn<In>{in, out + header_bytes});
    }
  }

  [[nodiscard]] static std::pair<std::uint64_t, std::uint64_t> bucket_range(std::uint64_t,
                                                                            std::uint64_t n) {
    return {0, n};
  }

  // The payload checks of the CPU decoder, on the probed bytes: scale and reserved word, then
  // the padding bits of the packet's last byte (the signs of elements 8 floor(n/8) .. n-1).
  static void check_probe(packet_header const& h, detail::packet_probe const& p) {
    (void)onebit_format::checked_scale(h, p.head + header_bytes);
    onebit_format::check_padding(h.count, p.last);
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const&, packet_header const&, std::byte const* payload, T* out,
              std::size_t n, float alpha, bool add) const {
    algo::onebit_decode(exec, payload, n, out, alpha, add);
    return false;
  }

  onebit_format format_;
};

GRADCOMP_CUDA_NAMESPACE_END
