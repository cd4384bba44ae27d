// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The random-dithering codecs on the GPU: `gradcomp::cuda::qsgd_codec`, `terngrad_codec` and
/// `dithering_codec` (linear or natural levels, max or L2 norm), with the packets of the CPU
/// codecs of codec/dithering.hpp (format: codec/format/dither.hpp; element math and the
/// canonical norm order: core/quant/dither.hpp, shared with the CPU kernels).
///
/// Passes: each bucket's norm in the canonical order (cuda/detail/stats.cuh), written to the
/// packet with the bucket's quantizer constants; one wait for the check (a NaN, an infinity or
/// a norm beyond float32 is the CPU's `numeric_error`); then the bit-packed codes
/// (cuda/detail/codes.cuh), draws through `random_stream`. Decoding checks the scales and the
/// padding bits first and every code while decoding, as the CPU does (a bad code leaves the
/// output unspecified).

#include <gradcomp/codec/format/dither.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/dither.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/codes.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/stats.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <math.h>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace ops {

/// The scale (norm) of a bucket from its max statistic: NaN (a non-finite element) stays.
GRADCOMP_HOST_DEVICE inline float dither_scale(float absmax) noexcept { return absmax; }

/// The scale (norm) of a bucket from its canonical sum of squares: f32(sqrt(sum)), NaN when
/// the sum is not finite (a non-finite element).
GRADCOMP_HOST_DEVICE inline float dither_scale(double sumsq) noexcept {
  std::uint64_t const bits = gradcomp::detail::bit_cast<std::uint64_t>(sumsq);
  if ((bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) {
    return gradcomp::detail::bit_cast<float>(0x7fc00000u);
  }
  return static_cast<float>(sqrt(sumsq));
}

}  // namespace ops

namespace algo {
namespace dither_detail {

template <class Partial>
struct finish_fn {
  std::byte* payload;
  quant::dither_bucket* kb;
  quant::dither_shape shape;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k, Partial const& p) const {
    float const scale = ops::dither_scale(p);
    if (!(scale <= FLT_MAX)) {
      detail::report(&status->bucket, k);
      return;
    }
    detail::store_f32_le(payload + 4 * k, scale);
    kb[k] = quant::make_dither_bucket(scale, shape);
  }
};

struct code {
  detail::bucket_geometry geo;
  quant::dither_bucket const* kb;
  quant::dither_shape shape;

  template <class Draws>
  GRADCOMP_HOST_DEVICE std::uint32_t encode(std::uint64_t i, float v, Draws& draw) const {
    return quant::dither_code(v, kb[geo.bucket_of(i)], shape, draw(i));
  }
  GRADCOMP_HOST_DEVICE float decode(std::uint64_t i, std::uint32_t c) const {
    bool ok = true;
    return quant::dither_value(c, kb[geo.bucket_of(i)].step, shape, ok);
  }
};

GRADCOMP_HOST_DEVICE inline float scale_at(std::byte const* payload, std::uint64_t k) noexcept {
  return detail::load_f32_le(payload + 4 * k);
}

// Checks bucket k's scale; item 0 also checks the padding bits of the code stream's last byte
// and reports them as bucket `nb`, after every real bucket, as the CPU checks them after the
// scales.
struct prefix_fn {
  std::byte const* payload;
  std::uint64_t nb;
  std::uint64_t code_bits;
  std::byte const* last;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k) const {
    if (!gradcomp::detail::valid_dither_scale(scale_at(payload, k))) {
      detail::report(&status->bucket, k);
    }
    if (k == 0 && code_bits % 8 != 0 && (static_cast<unsigned>(*last) >> (code_bits % 8)) != 0) {
      detail::report(&status->bucket, nb);
    }
  }
};

struct decoder {
  detail::bucket_geometry geo;
  std::byte const* payload;
  std::byte const* codes;
  quant::dither_shape shape;

  GRADCOMP_HOST_DEVICE float value(std::uint64_t i, bool& ok) const {
    float const step = quant::make_dither_bucket(scale_at(payload, geo.bucket_of(i)), shape).step;
    return quant::dither_value(quant::get_code(codes, i, shape.width), step, shape, ok);
  }
};

}  // namespace dither_detail
}  // namespace algo

namespace detail {

/// What the three dithering codecs share (as codec/dithering.hpp's `dither_codec_base`):
/// `Self` provides `format_type` and `config()`.
template <class Self>
class dither_codec_base : public device_codec<Self> {
  friend class device_codec<Self>;

 public:
  /// The wire format of this codec's packets.
  [[nodiscard]] auto wire_format() const noexcept {
    return dither_packets<typename Self::format_type>{self().config()};
  }

 private:
  Self const& self() const noexcept { return static_cast<Self const&>(*this); }

  struct scratch {
    status_words* status;
    stats_workspace<sumsq_stat> l2;
    stats_workspace<absmax_stat> max;
    quant::dither_bucket* kb;
  };
  scratch carve(arena& a, std::size_t n) const {
    gradcomp::detail::dither_config const cfg = self().config();
    bucket_geometry const geo = bucket_geometry::of(cfg.bucket, n);
    scratch s{};
    s.status = a.take<status_words>(1);
    if (cfg.norm == dither_norm::l2) {
      s.l2 = stats_workspace<sumsq_stat>::carve(a, geo);
    } else {
      s.max = stats_workspace<absmax_stat>::carve(a, geo);
    }
    s.kb = a.take<quant::dither_bucket>(geo.buckets);
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const&, In const& in,
                    std::size_t n, std::byte* out) const {
    gradcomp::detail::dither_config const cfg = self().config();
    bucket_geometry const geo = bucket_geometry::of(cfg.bucket, n);
    std::byte* const payload = out + header_bytes;
    if (cfg.norm == dither_norm::l2) {
      bucket_stats<sumsq_stat>(
          exec, geo, in, ws.l2,
          algo::dither_detail::finish_fn<double>{payload, ws.kb, cfg.shape(), ws.status});
    } else {
      bucket_stats<absmax_stat>(
          exec, geo, in, ws.max,
          algo::dither_detail::finish_fn<float>{payload, ws.kb, cfg.shape(), ws.status});
    }
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const& ws, header_image const& img, packet_header const&,
                    In const& in, std::size_t n, std::byte* out, random_stream const& rs) const {
    gradcomp::detail::dither_config const cfg = self().config();
    bucket_geometry const geo = bucket_geometry::of(cfg.bucket, n);
    quant::dither_shape const shape = cfg.shape();
    std::byte* const codes = out + header_bytes + 4 * geo.buckets;
    detail::encode_codes(exec, algo::dither_detail::code{geo, ws.kb, shape}, in, img, out, codes, n,
                         shape.width, rs);
  }

  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> bucket_range(std::uint64_t k,
                                                                     std::uint64_t n) const {
    bucket_geometry const geo = bucket_geometry::of(self().config().bucket, n);
    return {geo.begin(k), geo.end(k)};
  }
  static void throw_finite_bucket_error(std::uint64_t, std::uint64_t first) {
    gradcomp::detail::throw_norm_overflow(Self::format_type::id, first);
  }

  template <class Policy>
  bool decode_prefix(Policy&& exec, scratch const& ws, packet_header const& h,
                     std::byte const* payload) const {
    gradcomp::detail::dither_config const cfg = Self::format_type::config_of(h);
    std::uint64_t const nb = cfg.buckets(h.count);
    if (nb == 0) return false;
    std::uint64_t const code_bits = h.count * cfg.shape().width;
    std::byte const* last = payload + h.payload_bytes - 1;
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), nb,
                       algo::dither_detail::prefix_fn{payload, nb, code_bits, last, ws.status});
    return true;
  }
  static void throw_prefix_error(packet_header const& h, std::byte const* payload, std::uint64_t k,
                                 cudaStream_t stream) {
    gradcomp::detail::dither_config const cfg = Self::format_type::config_of(h);
    codec_id const id = Self::format_type::id;
    if (k == cfg.buckets(h.count)) {
      std::byte last{};
      copy_to_host(&last, payload + h.payload_bytes - 1, 1, stream);
      synchronize(stream);
      gradcomp::detail::check_dither_padding(id, h.count, cfg.shape().width, last);
      return;
    }
    std::byte s[4];
    copy_to_host(s, payload + 4 * k, sizeof s, stream);
    synchronize(stream);
    gradcomp::detail::check_dither_scale(id, k, algo::dither_detail::scale_at(s, 0));
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const& ws, packet_header const& h, std::byte const* payload,
              T* out, std::size_t n, float alpha, bool add) const {
    gradcomp::detail::dither_config const cfg = Self::format_type::config_of(h);
    bucket_geometry const geo = bucket_geometry::of(cfg.bucket, n);
    decode_elements(
        exec, algo::dither_detail::decoder{geo, payload, payload + 4 * geo.buckets, cfg.shape()},
        out, n, alpha, add, &ws.status->element);
    return true;
  }
  static void throw_bad_code(packet_header const& h) {
    gradcomp::detail::throw_bad_dither_code(Self::format_type::id,
                                            Self::format_type::config_of(h).s);
  }
};

}  // namespace detail

/// QSGD on a CUDA stream: per bucket of `bucket` elements (0 = whole tensor), s linear levels of
/// the bucket's L2 norm (see `gradcomp::qsgd_codec`).
class qsgd_codec : public detail::dither_codec_base<qsgd_codec> {
 public:
  using format_type = qsgd_format;
  static constexpr codec_id id = format_type::id;

  /// `levels` = s in [1, 32767] (else `config_error`).
  explicit qsgd_codec(std::uint32_t levels = 7, std::uint32_t bucket = 512)
      : cfg_(format_type::configure(levels, bucket)) {}
  [[nodiscard]] gradcomp::detail::dither_config config() const noexcept { return cfg_; }
  [[nodiscard]] std::uint32_t levels() const noexcept { return cfg_.s; }
  [[nodiscard]] std::uint32_t bucket() const noexcept { return cfg_.bucket; }

 private:
  gradcomp::detail::dither_config cfg_;
};

/// TernGrad on a CUDA stream: per bucket, levels {-m, 0, m}, m = max |x| (see
/// `gradcomp::terngrad_codec`).
class terngrad_codec : public detail::dither_codec_base<terngrad_codec> {
 public:
  using format_type = terngrad_format;
  static constexpr codec_id id = format_type::id;

  explicit terngrad_codec(std::uint32_t bucket = 512) noexcept
      : cfg_(format_type::configure(bucket)) {}
  [[nodiscard]] gradcomp::detail::dither_config config() const noexcept { return cfg_; }
  [[nodiscard]] std::uint32_t bucket() const noexcept { return cfg_.bucket; }

 private:
  gradcomp::detail::dither_config cfg_;
};

/// Random dithering on a CUDA stream: linear or natural levels, max or L2 norm (see
/// `gradcomp::dithering_codec`).
class dithering_codec : public detail::dither_codec_base<dithering_codec> {
 public:
  using format_type = dithering_format;
  static constexpr codec_id id = format_type::id;

  /// `levels` = s (linear: 1..32767, natural: 1..30; else `config_error`).
  explicit dithering_codec(std::uint32_t levels = 2,
                           dither_partition partition = dither_partition::linear,
                           dither_norm norm = dither_norm::max, std::uint32_t bucket = 512)
      : cfg_(format_type::configure(levels, partition, norm, bucket)) {}
  [[nodiscard]] gradcomp::detail::dither_config config() const noexcept { return cfg_; }

 private:
  gradcomp::detail::dither_config cfg_;
};

GRADCOMP_CUDA_NAMESPACE_END
