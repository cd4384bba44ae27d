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
/// double add per 4096 elements). The total is copied back so that a non-finite input throws
/// `numeric_error`, as the CPU codec does; that copy is the one synchronization in `compress`.

#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <thrust/find.h>
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

/// `x < 0` for a float, from its bits: negative, not zero, not NaN. Unlike a float compare it
/// also holds for negative subnormals in code built with flush-to-zero (`-ftz=true`,
/// `--use_fast_math`), where the compare would see -0.
GRADCOMP_HOST_DEVICE constexpr bool is_negative(float v) noexcept {
  std::uint32_t const u = gradcomp::detail::bit_cast<std::uint32_t>(v);
  std::uint32_t const a = u & 0x7fffffffu;
  return (u >> 31) != 0 && a != 0 && a <= 0x7f800000u;
}

/// |v| as a double, exactly, also for subnormal `v` under flush-to-zero (where the float to
/// double conversion would give 0).
GRADCOMP_HOST_DEVICE constexpr double abs_as_double(float v) noexcept {
  std::uint32_t const a = gradcomp::detail::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
  if (a < 0x00800000u) return static_cast<double>(a) * 0x1p-149;  // zero or subnormal: a 2^-149
  return static_cast<double>(gradcomp::detail::bit_cast<float>(a));
}

/// `static_cast<float>(q)` for a non-negative `q`, rounding to nearest even, also where the
/// result is a float subnormal under flush-to-zero. Such a result is k 2^-149 with k the
/// integer nearest q 2^149 (ties to even); k = 2^23 is FLT_MIN, whose bits are also k.
GRADCOMP_HOST_DEVICE inline float to_float_nearest(double q) noexcept {
  if (q < 0x1p-126) {
    return gradcomp::detail::bit_cast<float>(static_cast<std::uint32_t>(rint(q * 0x1p149)));
  }
  return static_cast<float>(q);
}

/// Pass 1 for item `item` = 2 * block + half: packs the signs of the elements in lanes
/// 8 half .. 8 half + 7 of that block (bit i % 8 of `bits[i / 8]` is `x_i < 0`; unused high bits
/// of the last byte are 0) and stores the 8 lane sums of |x_i| (double, ascending order) at
/// `lane_sums[16 block + 8 half .. + 8)`.
GRADCOMP_HOST_DEVICE inline void onebit_pack_half_block(float const* x, std::size_t n,
                                                        std::size_t item, std::byte* bits,
                                                        double* lane_sums) noexcept {
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
        float const v = x[first + k];
        byte |= static_cast<unsigned>(is_negative(v)) << k;
        acc[k] += abs_as_double(v);
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

/// The scale the packet carries: mean |x| = float(total / n) (0 for n = 0) for variant 0
/// (`scaling::mean_abs`), 1 for variant 1 (`scaling::none`).
GRADCOMP_HOST_DEVICE inline float onebit_scale(double total, std::size_t n,
                                               std::uint8_t variant) noexcept {
  if (variant != static_cast<std::uint8_t>(gradcomp::onebit_codec::scaling::mean_abs)) {
    return 1.0f;
  }
  return n == 0 ? 0.0f : to_float_nearest(total / static_cast<double>(n));
}

/// Writes the first 8 payload bytes: f32 scale, u32 reserved 0.
GRADCOMP_HOST_DEVICE inline void onebit_store_prefix(std::byte* payload, float scale) noexcept {
  detail::store_u32_le(payload, gradcomp::detail::bit_cast<std::uint32_t>(scale));
  detail::store_u32_le(payload + 4, 0);
}

/// Decodes element `i` from the sign bits: `out[i] = ±scale`, or, if `add`,
/// `out[i] = fma(alpha, ±scale, out[i])`.
GRADCOMP_HOST_DEVICE inline void onebit_decode_element(std::byte const* bits, float scale,
                                                       float* out, std::size_t i, float alpha,
                                                       bool add) noexcept {
  // The sign is set on the bits: a float negation would flush a subnormal scale under -ftz.
  std::uint32_t const neg = (static_cast<std::uint32_t>(bits[i / 8]) >> (i % 8)) & 1u;
  float const v = gradcomp::detail::bit_cast<float>(
      gradcomp::detail::bit_cast<std::uint32_t>(scale) ^ (neg << 31));
  out[i] = add ? fmaf(alpha, v, out[i]) : v;
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

struct pack_fn {
  float const* x;
  std::size_t n;
  std::byte* bits;
  double* lane_sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t item) const noexcept {
    ops::onebit_pack_half_block(x, n, item, bits, lane_sums);
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
  std::uint8_t variant;
  std::byte* out;
  double* total;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const noexcept {
    header.store(out);
    double const t = ops::onebit_total(block_sums, blocks);
    *total = t;
    ops::onebit_store_prefix(out + header_bytes, ops::onebit_scale(t, n, variant));
  }
};

struct decode_fn {
  std::byte const* bits;
  float scale;
  float* out;
  float alpha;
  bool add;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    ops::onebit_decode_element(bits, scale, out, i, alpha, add);
  }
};

struct nonfinite_fn {
  GRADCOMP_HOST_DEVICE bool operator()(float v) const noexcept {
    return (gradcomp::detail::bit_cast<std::uint32_t>(v) & 0x7f800000u) == 0x7f800000u;
  }
};

}  // namespace onebit_detail

/// Writes the onebit packet of `x[0, n)` with header `header` (whose variant selects the
/// scaling) to `out`, and the canonical total of |x| to `*ws.total`, on the Thrust policy
/// `exec`. The caller must reject a non-finite total; the packet is then not valid.
template <class Policy>
void onebit_encode(Policy&& exec, detail::header_image const& header, std::uint8_t variant,
                   float const* x, std::size_t n, std::byte* out, onebit_workspace ws) {
  using thrust::counting_iterator;
  std::size_t const blocks = ops::onebit_blocks(n);
  std::byte* const bits = out + header_bytes + 8;
  thrust::for_each_n(exec, counting_iterator<std::size_t>(0), 2 * blocks,
                     onebit_detail::pack_fn{x, n, bits, ws.lane_sums});
  thrust::for_each_n(exec, counting_iterator<std::size_t>(0), blocks,
                     onebit_detail::block_fn{ws.lane_sums, ws.block_sums});
  thrust::for_each_n(
      exec, counting_iterator<std::size_t>(0), 1,
      onebit_detail::finish_fn{header, ws.block_sums, blocks, n, variant, out, ws.total});
}

/// Decodes `n` elements from the sign bits `bits` with `scale` into `out` (or adds `alpha`
/// times them).
template <class Policy>
void onebit_decode(Policy&& exec, std::byte const* bits, float scale, std::size_t n, float* out,
                   float alpha, bool add) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::size_t>(0), n,
                     onebit_detail::decode_fn{bits, scale, out, alpha, add});
}

/// Index of the first non-finite element of `x[0, n)`, or `n`. Synchronous.
template <class Policy>
std::size_t first_nonfinite(Policy&& exec, float const* x, std::size_t n) {
  return static_cast<std::size_t>(thrust::find_if(exec, x, x + n, onebit_detail::nonfinite_fn{}) -
                                  x);
}

}  // namespace algo

/// The onebit codec on a CUDA stream (see file comment).
///
/// Pointers named `d_*` are device memory (host memory under Thrust's CPP device system).
/// `compress` needs scratch memory of `workspace_bytes(n)`: pass it in CUB's two-phase style
/// (call once with `d_temp == nullptr` to learn the size), or use the overload that allocates
/// it stream-ordered. Either way `compress` waits for `stream` once, to check the total.
class onebit_codec {
 public:
  /// The CPU codec whose wire format this one writes and reads.
  using host_codec = gradcomp::onebit_codec;
  using scaling = host_codec::scaling;
  static constexpr codec_id id = host_codec::id;

  /// A onebit codec with the given scaling (default: mean |x|).
  constexpr explicit onebit_codec(scaling s = scaling::mean_abs) noexcept : host_(s) {}

  [[nodiscard]] constexpr scaling scale_mode() const noexcept { return host_.scale_mode(); }

  /// Packet size for `n` elements (exact; header included).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    return host_.max_compressed_bytes(n);
  }

  /// Scratch bytes `compress` needs for `n` elements (any alignment of the scratch pointer).
  [[nodiscard]] static constexpr std::size_t workspace_bytes(std::size_t n) noexcept {
    return algo::onebit_workspace::doubles(n) * sizeof(double) + alignof(double) - 1;
  }

  /// Two-phase compress. With `d_temp == nullptr`, sets `temp_bytes` to `workspace_bytes(n)`,
  /// does nothing else and returns 0. Otherwise writes the packet of `d_in[0, n)` to `d_out`
  /// (at least `max_compressed_bytes(n)` bytes), using `d_temp` (`temp_bytes` >= the
  /// workspace size, else `config_error`), and returns the packet size. Throws `numeric_error`
  /// (the CPU codec's message) if an element is NaN or infinite.
  std::size_t compress(void* d_temp, std::size_t& temp_bytes, float const* d_in, std::size_t n,
                       std::byte* d_out, cudaStream_t stream = nullptr) const {
    std::size_t const need = workspace_bytes(n);
    if (d_temp == nullptr) {
      temp_bytes = need;
      return 0;
    }
    if (temp_bytes < need) {
      throw config_error("gradcomp: cuda onebit compress of " + std::to_string(n) +
                         " elements needs " + std::to_string(need) + " workspace bytes, got " +
                         std::to_string(temp_bytes));
    }
    auto const addr = reinterpret_cast<std::uintptr_t>(d_temp);
    auto* const base =
        reinterpret_cast<double*>((addr + alignof(double) - 1) / alignof(double) * alignof(double));
    algo::onebit_workspace const ws = algo::onebit_workspace::at(base, n);

    packet_header const h = host_.header_for(n, dtype::f32);
    detail::header_image const img = detail::make_header_image(h);
    detail::translate_thrust_errors(
        [&] { algo::onebit_encode(detail::policy(stream), img, h.variant, d_in, n, d_out, ws); });
    double total = 0.0;
    detail::copy_to_host(&total, ws.total, sizeof total, stream);
    detail::synchronize(stream);
    if (!std::isfinite(total)) {
      std::size_t const bad = detail::translate_thrust_errors(
          [&] { return algo::first_nonfinite(detail::policy(stream), d_in, n); });
      float value = 0.0f;
      if (bad < n) {
        detail::copy_to_host(&value, d_in + bad, sizeof value, stream);
        detail::synchronize(stream);
      }
      gradcomp::detail::throw_nonfinite(id, bad, value);
    }
    return static_cast<std::size_t>(h.packet_bytes());
  }

  /// Compress with scratch allocated (and freed) stream-ordered on `stream`.
  std::size_t compress(float const* d_in, std::size_t n, std::byte* d_out,
                       cudaStream_t stream = nullptr) const {
    std::size_t bytes = workspace_bytes(n);
    detail::scratch const temp(bytes, stream);
    return compress(temp.get(), bytes, d_in, n, d_out, stream);
  }

  /// The header of the `packet_bytes`-byte packet at `d_packet` after the checks the CPU codec
  /// makes (throws `format_error`); `n` must match its element count (else `config_error`).
  static packet_header inspect(std::byte const* d_packet, std::size_t packet_bytes, std::size_t n,
                               cudaStream_t stream = nullptr) {
    detail::packet_probe const p = detail::probe_packet(d_packet, packet_bytes, stream);
    packet_header const h = detail::checked_header<host_codec>(p, packet_bytes, n);
    (void)checked_scale(h, p);
    return h;
  }

  /// Decodes the packet into `d_out[0, n)`. Throws like the CPU codec for a malformed packet
  /// (bad header, scale, reserved word or padding bits) or a count that is not `n`.
  void decompress(std::byte const* d_packet, std::size_t packet_bytes, float* d_out, std::size_t n,
                  cudaStream_t stream = nullptr) const {
    decode(d_packet, packet_bytes, d_out, n, 1.0f, false, stream);
  }

  /// Adds `alpha` times the decoded packet to `d_out[0, n)` (`fma(alpha, ±scale, out)`).
  void decompress_add(std::byte const* d_packet, std::size_t packet_bytes, float* d_out,
                      std::size_t n, float alpha = 1.0f, cudaStream_t stream = nullptr) const {
    decode(d_packet, packet_bytes, d_out, n, alpha, true, stream);
  }

 private:
  // The payload checks of the CPU decoder, on the probed bytes; returns the scale.
  static float checked_scale(packet_header const& h, detail::packet_probe const& p) {
    float const scale = onebit_format::checked_scale(h, p.head + header_bytes);
    // The packet's last byte holds the sign bits of elements 8 floor(n/8) .. n-1.
    onebit_format::check_padding(h.count, p.last);
    return scale;
  }

  static void decode(std::byte const* d_packet, std::size_t packet_bytes, float* d_out,
                     std::size_t n, float alpha, bool add, cudaStream_t stream) {
    detail::packet_probe const p = detail::probe_packet(d_packet, packet_bytes, stream);
    packet_header const h = detail::checked_header<host_codec>(p, packet_bytes, n);
    float const scale = checked_scale(h, p);
    detail::translate_thrust_errors([&] {
      algo::onebit_decode(detail::policy(stream), d_packet + header_bytes + 8, scale, n, d_out,
                          alpha, add);
    });
  }

  host_codec host_;
};

GRADCOMP_CUDA_NAMESPACE_END
