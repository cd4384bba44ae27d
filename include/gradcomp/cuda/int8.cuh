// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::int8_codec`: 8-bit min-max quantization per bucket on the GPU, nearest or
/// stochastic rounding, with the packets of the CPU `gradcomp::int8_codec` (format:
/// codec/format/int8.hpp; element math: core/quant/int8.hpp, shared with the CPU kernels).
///
/// Passes: the bucket ranges (cuda/detail/stats.cuh; a range whose minimum or maximum is zero
/// takes the sign of the bucket's first zero, as the CPU's sequential scan does), written to
/// the packet with each bucket's encoding constants; one wait for the finiteness check; then
/// the codes (cuda/detail/codes.cuh), stochastic draws through `random_stream`. Decoding checks
/// every bucket's range on the device first (finite lo <= hi, else the CPU's `format_error`).

#include <gradcomp/codec/format/int8.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/int8.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/codes.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/stats.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace ops {

/// The range of bucket `k` from its statistic: NaN bounds (a non-finite element) stay; a zero
/// bound becomes the bucket's first zero element, `first_zero` (its value through the input).
GRADCOMP_HOST_DEVICE inline void int8_settle_range(float& lo, float& hi,
                                                   float first_zero) noexcept {
  if (lo == 0.0f) lo = first_zero;
  if (hi == 0.0f) hi = first_zero;
}

}  // namespace ops

namespace algo {

/// Per-bucket constants of the int8 encoding passes.
struct int8_constants {
  quant::int8_bucket* encode;  ///< inv, bias
  float* lo;                   ///< lower end (decoding, for error feedback)
  float* step;                 ///< step (decoding, for error feedback)
};

namespace int8_detail {

template <class In>
struct finish_fn {
  In in;
  std::byte* payload;
  int8_constants c;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k,
                                       detail::range_stat::partial const& p) const {
    if (detail::range_stat::bad(p)) {
      detail::report(&status->bucket, k);
      return;
    }
    float lo = p.lo, hi = p.hi;
    if (lo == 0.0f || hi == 0.0f) ops::int8_settle_range(lo, hi, in.at(p.zero));
    detail::store_f32_le(payload + 8 * k, lo);
    detail::store_f32_le(payload + 8 * k + 4, hi);
    c.encode[k] = quant::make_int8_bucket(lo, hi);
    c.lo[k] = lo;
    c.step[k] = quant::int8_step(lo, hi);
  }
};

struct code {
  detail::bucket_geometry geo;
  int8_constants c;
  bool stochastic;

  template <class Draws>
  GRADCOMP_HOST_DEVICE std::uint32_t encode(std::uint64_t i, float v, Draws& draw) const {
    return quant::int8_code(v, c.encode[geo.bucket_of(i)], stochastic, stochastic ? draw(i) : 0u);
  }
  GRADCOMP_HOST_DEVICE float decode(std::uint64_t i, std::uint32_t q) const {
    std::uint64_t const k = geo.bucket_of(i);
    return quant::int8_value(static_cast<std::uint8_t>(q), c.lo[k], c.step[k]);
  }
};

struct prefix_fn {
  std::byte const* payload;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k) const {
    float const lo = detail::load_f32_le(payload + 8 * k);
    float const hi = detail::load_f32_le(payload + 8 * k + 4);
    if (!int8_format::valid_range(lo, hi)) detail::report(&status->bucket, k);
  }
};

// Decoding reads each element's range from the packet (whose bucket length may differ from
// the codec's own), so it needs no per-bucket workspace.
struct decoder {
  detail::bucket_geometry geo;
  std::byte const* payload;
  std::byte const* codes;

  GRADCOMP_HOST_DEVICE float value(std::uint64_t i, bool&) const {
    std::uint64_t const k = geo.bucket_of(i);
    float const lo = detail::load_f32_le(payload + 8 * k);
    float const hi = detail::load_f32_le(payload + 8 * k + 4);
    return quant::int8_value(static_cast<std::uint8_t>(codes[i]), lo, quant::int8_step(lo, hi));
  }
};

}  // namespace int8_detail

}  // namespace algo

/// The int8 codec on a CUDA stream (see file comment and cuda/detail/codec_base.cuh for the
/// operations: two-phase `compress`, `compress_with_feedback`, `decompress`,
/// `decompress_add`, `inspect`, `workspace_bytes`).
class int8_codec : public detail::device_codec<int8_codec> {
  friend class detail::device_codec<int8_codec>;

 public:
  static constexpr codec_id id = int8_format::id;

  /// `bucket` elements per [lo, hi] range (0 = the whole tensor); `config_error` for a rounding
  /// that is neither nearest nor stochastic.
  explicit int8_codec(std::uint32_t bucket = 512, int8_rounding rounding = int8_rounding::nearest)
      : format_{bucket, int8_format::checked_rounding(rounding)} {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return format_.bucket; }
  [[nodiscard]] int8_rounding rounding() const noexcept { return format_.rounding; }
  [[nodiscard]] int8_format wire_format() const noexcept { return format_; }

 private:
  struct scratch {
    detail::status_words* status;
    detail::stats_workspace<detail::range_stat> stats;
    algo::int8_constants c;
  };
  scratch carve(detail::arena& a, std::size_t n) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    scratch s{};
    s.status = a.take<detail::status_words>(1);
    s.stats = detail::stats_workspace<detail::range_stat>::carve(a, geo);
    s.c.encode = a.take<quant::int8_bucket>(geo.buckets);
    s.c.lo = a.take<float>(geo.buckets);
    s.c.step = a.take<float>(geo.buckets);
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const&, In const& in,
                    std::size_t n, std::byte* out) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    detail::bucket_stats<detail::range_stat>(
        exec, geo, in, ws.stats,
        algo::int8_detail::finish_fn<In>{in, out + header_bytes, ws.c, ws.status});
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const& ws, detail::header_image const& img,
                    packet_header const& h, In const& in, std::size_t n, std::byte* out,
                    random_stream const& rs) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    std::byte* const codes = out + header_bytes + int8_format::codes_offset(format_.bucket, n);
    detail::encode_codes(exec, algo::int8_detail::code{geo, ws.c, h.variant == 1}, in, img, out,
                         codes, n, 8, rs);
  }

  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> bucket_range(std::uint64_t k,
                                                                     std::uint64_t n) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    return {geo.begin(k), geo.end(k)};
  }

  template <class Policy>
  bool decode_prefix(Policy&& exec, scratch const& ws, packet_header const& h,
                     std::byte const* payload) const {
    std::uint64_t const nb = gradcomp::detail::bucket_count(h.param0, h.count);
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), nb,
                       algo::int8_detail::prefix_fn{payload, ws.status});
    return nb > 0;
  }
  static void throw_prefix_error(packet_header const&, std::byte const* payload, std::uint64_t k,
                                 cudaStream_t stream) {
    std::byte range[8];
    detail::copy_to_host(range, payload + 8 * k, sizeof range, stream);
    detail::synchronize(stream);
    int8_format::check_range(k, detail::load_f32_le(range), detail::load_f32_le(range + 4));
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const& ws, packet_header const& h, std::byte const* payload,
              T* out, std::size_t n, float alpha, bool add) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(h.param0, n);
    std::byte const* codes = payload + int8_format::codes_offset(h.param0, n);
    detail::decode_elements(exec, algo::int8_detail::decoder{geo, payload, codes}, out, n, alpha,
                            add, &ws.status->element);
    return false;
  }

  int8_format format_;
};

GRADCOMP_CUDA_NAMESPACE_END
