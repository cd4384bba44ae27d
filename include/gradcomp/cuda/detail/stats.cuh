// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Per-bucket statistics of the bucketed CUDA codecs (int8's range, natural's largest exponent,
/// the dithering codecs' max and L2 norms), computed in the canonical order of
/// core/quant/dither.hpp, which is the order the L2 norm needs and serves the others as well:
///
/// 1. one work item per (bucket, block of `quant::norm_block` elements from the bucket's start,
///    lane 0..15): the lane's elements l, l + 16, ... of the block, in ascending order — 16
///    consecutive items read 16 consecutive elements;
/// 2. one item per block: its 16 lane partials merged in lane order (for buckets of at most
///    one block, this item is the bucket's and finishes it);
/// 3. one item per bucket: its block partials merged in block order, then `finish`.
///
/// A statistic `S` provides `partial` (a trivially copyable value), `static partial empty()`,
/// `static void add(partial&, float v, std::uint64_t i)` (element i of value v, in ascending
/// order) and `static void merge(partial& acc, partial const& next)` (the next lane or block).
/// `finish(k, partial)` receives each bucket's result exactly once.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/core/quant/dither.hpp>
#include <gradcomp/cuda/config.cuh>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// The buckets and blocks of an n-element tensor cut into buckets of `bucket` elements.
struct bucket_geometry {
  std::uint64_t n = 0;
  std::uint64_t blen = 1;  ///< bucket length
  std::uint64_t buckets = 0;
  std::uint64_t blocks = 1;  ///< norm blocks per bucket (of a full bucket)

  static constexpr std::uint64_t lanes = quant::norm_lanes;
  static constexpr std::uint64_t block = quant::norm_block;

  GRADCOMP_HOST_DEVICE static constexpr bucket_geometry of(std::uint32_t bucket,
                                                           std::uint64_t n) noexcept {
    std::uint64_t const blen = gradcomp::detail::bucket_length(bucket, n);
    return {n, blen, gradcomp::detail::bucket_count(bucket, n), (blen + block - 1) / block};
  }
  /// First element of bucket k.
  GRADCOMP_HOST_DEVICE constexpr std::uint64_t begin(std::uint64_t k) const noexcept {
    return k * blen;
  }
  /// One past the last element of bucket k.
  GRADCOMP_HOST_DEVICE constexpr std::uint64_t end(std::uint64_t k) const noexcept {
    return n - k * blen < blen ? n : k * blen + blen;
  }
  /// The bucket of element i.
  GRADCOMP_HOST_DEVICE constexpr std::uint64_t bucket_of(std::uint64_t i) const noexcept {
    if (blen <= 0xffffffffu && i <= 0xffffffffu) {  // 32-bit division where it is enough
      return static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(blen);
    }
    return i / blen;
  }
  [[nodiscard]] constexpr std::uint64_t lane_items() const noexcept {
    return buckets * blocks * lanes;
  }
  [[nodiscard]] constexpr std::uint64_t block_items() const noexcept { return buckets * blocks; }
};

namespace stats_detail {

template <class S, class In>
struct lane_fn {
  bucket_geometry geo;
  In in;
  typename S::partial* lanes;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t t) const {
    std::uint64_t const lane = t % bucket_geometry::lanes;
    std::uint64_t const blk = (t / bucket_geometry::lanes) % geo.blocks;
    std::uint64_t const k = t / (bucket_geometry::lanes * geo.blocks);
    std::uint64_t const first = geo.begin(k) + blk * bucket_geometry::block;
    std::uint64_t const bucket_end = geo.end(k);
    std::uint64_t const last =
        bucket_end - first < bucket_geometry::block ? bucket_end : first + bucket_geometry::block;
    typename S::partial p = S::empty();
    if (first < bucket_end) {
      for (std::uint64_t i = first + lane; i < last; i += bucket_geometry::lanes) {
        S::add(p, in.at(i), i);
      }
    }
    lanes[t] = p;
  }
};

template <class S>
GRADCOMP_HOST_DEVICE typename S::partial merge_lanes(typename S::partial const* lanes,
                                                     std::uint64_t block) {
  typename S::partial acc = S::empty();
  for (std::uint64_t l = 0; l < bucket_geometry::lanes; ++l) {
    S::merge(acc, lanes[block * bucket_geometry::lanes + l]);
  }
  return acc;
}

template <class S, class Finish>
struct block_fn {
  typename S::partial const* lanes;
  typename S::partial* blocks;
  Finish finish;  // used when a bucket is one block
  bool direct;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t b) const {
    typename S::partial const p = merge_lanes<S>(lanes, b);
    if (direct) {
      finish(b, p);
    } else {
      blocks[b] = p;
    }
  }
};

template <class S, class Finish>
struct bucket_fn {
  typename S::partial const* blocks;
  std::uint64_t per_bucket;
  Finish finish;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k) const {
    typename S::partial acc = S::empty();
    for (std::uint64_t b = 0; b < per_bucket; ++b) S::merge(acc, blocks[k * per_bucket + b]);
    finish(k, acc);
  }
};

}  // namespace stats_detail

/// Workspace of `bucket_stats` for geometry `geo`: lane partials, then block partials.
template <class S>
struct stats_workspace {
  typename S::partial* lanes;
  typename S::partial* blocks;

  template <class Arena>
  static stats_workspace carve(Arena& a, bucket_geometry const& geo) {
    stats_workspace w{};
    w.lanes = a.template take<typename S::partial>(geo.lane_items());
    w.blocks = a.template take<typename S::partial>(geo.blocks > 1 ? geo.block_items() : 0);
    return w;
  }
};

/// Runs statistic `S` over every bucket of `geo`, reading elements through `in` (see the file
/// comment), on the Thrust policy `exec`; `finish(k, partial)` is called once per bucket.
template <class S, class Policy, class In, class Finish>
void bucket_stats(Policy&& exec, bucket_geometry const& geo, In const& in,
                  stats_workspace<S> const& ws, Finish const& finish) {
  using thrust::counting_iterator;
  if (geo.buckets == 0) return;
  thrust::for_each_n(exec, counting_iterator<std::uint64_t>(0), geo.lane_items(),
                     stats_detail::lane_fn<S, In>{geo, in, ws.lanes});
  bool const direct = geo.blocks == 1;
  thrust::for_each_n(exec, counting_iterator<std::uint64_t>(0), geo.block_items(),
                     stats_detail::block_fn<S, Finish>{ws.lanes, ws.blocks, finish, direct});
  if (!direct) {
    thrust::for_each_n(exec, counting_iterator<std::uint64_t>(0), geo.buckets,
                       stats_detail::bucket_fn<S, Finish>{ws.blocks, geo.blocks, finish});
  }
}

// ---------------------------------------------------------------------------------------------
// The statistics.

/// Range [lo, hi] of a bucket, with the CPU's sequential tie rule: where the minimum (maximum)
/// is a zero, it is the bucket's first zero, whatever its sign (`zero` keeps that element's
/// index). A non-finite element makes the partial `bad` (NaN bounds).
struct range_stat {
  struct partial {
    float lo;
    float hi;
    std::uint64_t zero;  ///< index of the first ±0 seen, or ~0
  };
  GRADCOMP_HOST_DEVICE static partial empty() noexcept {
    return {
        gradcomp::detail::bit_cast<float>(0x7f800000u),  // +inf, -inf: any finite v replaces them
        gradcomp::detail::bit_cast<float>(0xff800000u), ~std::uint64_t{0}};
  }
  GRADCOMP_HOST_DEVICE static bool bad(partial const& p) noexcept { return p.lo != p.lo; }
  GRADCOMP_HOST_DEVICE static void add(partial& p, float v, std::uint64_t i) noexcept {
    if (bad(p)) return;
    if (!(v >= -FLT_MAX && v <= FLT_MAX)) {
      p.lo = p.hi = gradcomp::detail::bit_cast<float>(0x7fc00000u);
      return;
    }
    p.lo = v < p.lo ? v : p.lo;
    p.hi = v > p.hi ? v : p.hi;
    if (v == 0.0f && i < p.zero) p.zero = i;
  }
  GRADCOMP_HOST_DEVICE static void merge(partial& acc, partial const& next) noexcept {
    if (bad(acc)) return;
    if (bad(next)) {
      acc = next;
      return;
    }
    acc.lo = next.lo < acc.lo ? next.lo : acc.lo;
    acc.hi = next.hi > acc.hi ? next.hi : acc.hi;
    acc.zero = next.zero < acc.zero ? next.zero : acc.zero;
  }
};

/// Largest biased float32 exponent of a bucket (255 if it holds a NaN or infinity).
struct exponent_stat {
  using partial = unsigned;
  GRADCOMP_HOST_DEVICE static partial empty() noexcept { return 0; }
  GRADCOMP_HOST_DEVICE static void add(partial& p, float v, std::uint64_t) noexcept {
    unsigned const e = (gradcomp::detail::bit_cast<std::uint32_t>(v) >> 23) & 0xffu;
    p = e > p ? e : p;
  }
  GRADCOMP_HOST_DEVICE static void merge(partial& acc, partial const& next) noexcept {
    acc = next > acc ? next : acc;
  }
};

/// max |x| of a bucket, NaN if it holds a NaN or infinity.
struct absmax_stat {
  using partial = float;
  GRADCOMP_HOST_DEVICE static partial empty() noexcept { return 0.0f; }
  GRADCOMP_HOST_DEVICE static void add(partial& p, float v, std::uint64_t) noexcept {
    float const a = gradcomp::detail::bit_cast<float>(gradcomp::detail::bit_cast<std::uint32_t>(v) &
                                                      0x7fffffffu);
    if (!(a <= FLT_MAX)) {
      p = gradcomp::detail::bit_cast<float>(0x7fc00000u);
    } else if (p == p) {
      p = a > p ? a : p;
    }
  }
  GRADCOMP_HOST_DEVICE static void merge(partial& acc, partial const& next) noexcept {
    if (next != next) acc = next;
    if (acc == acc) acc = next > acc ? next : acc;
  }
};

/// Canonical sum of squares of a bucket, in double (core/quant/dither.hpp).
struct sumsq_stat {
  using partial = double;
  GRADCOMP_HOST_DEVICE static partial empty() noexcept { return 0.0; }
  GRADCOMP_HOST_DEVICE static void add(partial& p, float v, std::uint64_t) noexcept {
    p = quant::sumsq_step(p, v);
  }
  GRADCOMP_HOST_DEVICE static void merge(partial& acc, partial const& next) noexcept {
    acc += next;
  }
};

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
