// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::int4_codec`: symmetric 4-bit quantization with one absmax scale per bucket
/// on the GPU, with the packets of the CPU `gradcomp::int4_codec` (format: codec/format/int4.hpp;
/// element math: core/quant/int4.hpp, shared with the CPU kernels).
///
/// Passes: each bucket's largest magnitude (cuda/detail/stats.cuh, `absmax_stat`: max |x|, +0
/// for a bucket of zeros, NaN for a bucket holding a NaN or an infinity), written to the packet
/// as the scale f32(m / 7) with the bucket's encoding multiplier; one wait for the finiteness
/// check (the CPU's `numeric_error`, naming the first non-finite element); then the 4-bit codes
/// (cuda/detail/codes.cuh, two a byte, element 2i in the low nibble). Decoding checks every
/// scale on the device first (finite, 0 <= s <= f32(FLT_MAX / 7), else the CPU's
/// `format_error`) and accepts every nibble, as the CPU does.

#include <gradcomp/codec/format/int4.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/int4.hpp>
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

namespace algo {

/// Per-bucket constants of the int4 encoding passes.
struct int4_constants {
  float* inv;    ///< encoding multiplier (`quant::int4_inverse`)
  float* scale;  ///< decoding scale (for error feedback)
};

namespace int4_detail {

struct finish_fn {
  std::byte* payload;
  int4_constants c;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k, float m) const {
    if (m != m) {  // a NaN or an infinity in the bucket
      detail::report(&status->bucket, k);
      return;
    }
    float const s = quant::int4_scale(m);
    detail::store_f32_le(payload + 4 * k, s);
    c.inv[k] = quant::int4_inverse(m);
    c.scale[k] = s;
  }
};

struct code {
  detail::bucket_geometry geo;
  int4_constants c;

  template <class Draws>
  GRADCOMP_HOST_DEVICE std::uint32_t encode(std::uint64_t i, float v, Draws&) const {
    return quant::int4_nibble(v, c.inv[geo.bucket_of(i)]);
  }
  GRADCOMP_HOST_DEVICE float decode(std::uint64_t i, std::uint32_t q) const {
    return quant::int4_value(static_cast<std::uint8_t>(q), c.scale[geo.bucket_of(i)]);
  }
};

struct prefix_fn {
  std::byte const* payload;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k) const {
    if (!int4_format::valid_scale(detail::load_f32_le(payload + 4 * k))) {
      detail::report(&status->bucket, k);
    }
  }
};

// Decoding reads each element's scale from the packet (whose bucket length may differ from
// the codec's own), so it needs no per-bucket workspace.
struct decoder {
  detail::bucket_geometry geo;
  std::byte const* payload;
  std::byte const* codes;

  GRADCOMP_HOST_DEVICE float value(std::uint64_t i, bool&) const {
    auto const byte = static_cast<unsigned>(codes[i / 2]);
    auto const nibble = static_cast<std::uint8_t>((byte >> (4 * (i & 1))) & 0xfu);
    return quant::int4_value(nibble, detail::load_f32_le(payload + 4 * geo.bucket_of(i)));
  }
};

}  // namespace int4_detail

}  // namespace algo

/// The int4 codec on a CUDA stream (see file comment and cuda/detail/codec_base.cuh for the
/// operations: two-phase `compress`, `compress_with_feedback`, `decompress`,
/// `decompress_add`, `inspect`, `workspace_bytes`).
class int4_codec : public detail::device_codec<int4_codec> {
  friend class detail::device_codec<int4_codec>;

 public:
  static constexpr codec_id id = int4_format::id;
  /// Per-rank scales (supports) differ: packets are gathered, as the CPU codec's.
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  /// Biased (nearest rounding or a selection), as the CPU codec: use it under error feedback.
  static constexpr bool unbiased = false;

  /// `bucket` elements per scale (0 = the whole tensor).
  explicit int4_codec(std::uint32_t bucket = 64) : format_{bucket} {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return format_.bucket; }
  [[nodiscard]] int4_format wire_format() const noexcept { return format_; }

 private:
  struct scratch {
    detail::status_words* status;
    detail::stats_workspace<detail::absmax_stat> stats;
    algo::int4_constants c;
  };
  scratch carve(detail::arena& a, std::size_t n) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    scratch s{};
    s.status = a.take<detail::status_words>(1);
    s.stats = detail::stats_workspace<detail::absmax_stat>::carve(a, geo);
    s.c.inv = a.take<float>(geo.buckets);
    s.c.scale = a.take<float>(geo.buckets);
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const&, In const& in,
                    std::size_t n, std::byte* out) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    detail::bucket_stats<detail::absmax_stat>(
        exec, geo, in, ws.stats, algo::int4_detail::finish_fn{out + header_bytes, ws.c, ws.status});
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const& ws, detail::header_image const& img,
                    packet_header const&, In const& in, std::size_t n, std::byte* out,
                    random_stream const& rs) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    std::byte* const codes = out + header_bytes + int4_format::codes_offset(format_.bucket, n);
    detail::encode_codes(exec, algo::int4_detail::code{geo, ws.c}, in, img, out, codes, n, 4, rs);
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
                       algo::int4_detail::prefix_fn{payload, ws.status});
    return nb > 0;
  }
  static void throw_prefix_error(packet_header const&, std::byte const* payload, std::uint64_t k,
                                 cudaStream_t stream) {
    std::byte scale[4];
    detail::copy_to_host(scale, payload + 4 * k, sizeof scale, stream);
    detail::synchronize(stream);
    int4_format::check_scale(k, detail::load_f32_le(scale));
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const& ws, packet_header const& h, std::byte const* payload,
              T* out, std::size_t n, float alpha, bool add) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(h.param0, n);
    std::byte const* codes = payload + int4_format::codes_offset(h.param0, n);
    detail::decode_elements(exec, algo::int4_detail::decoder{geo, payload, codes}, out, n, alpha,
                            add, &ws.status->element);
    return false;
  }

  int4_format format_;
};

GRADCOMP_CUDA_NAMESPACE_END
