// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::natural_codec`: natural compression (stochastic rounding to a power of two)
/// on the GPU, with the packets of the CPU `gradcomp::natural_codec` (format:
/// codec/format/natural.hpp; element math: core/quant/natural.hpp, shared with the CPU kernels).
///
/// Passes: each bucket's largest exponent (cuda/detail/stats.cuh), written to the packet; one
/// wait for the check (a NaN, an infinity or |x| >= 2^127 is the CPU's `numeric_error`); then
/// the codes (cuda/detail/codes.cuh), draws through `random_stream`. Decoding checks the
/// exponent bytes first and every code while decoding, as the CPU does (a bad code leaves the
/// output unspecified).

#include <gradcomp/codec/format/natural.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/natural.hpp>
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
namespace natural_detail {

struct finish_fn {
  std::byte* emax;  // the packet's exponent bytes
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k, unsigned e) const {
    if (e > natural_format::max_exponent) {
      detail::report(&status->bucket, k);
      return;
    }
    emax[k] = static_cast<std::byte>(e);
  }
};

struct code {
  detail::bucket_geometry geo;
  std::byte const* emax;

  template <class Draws>
  GRADCOMP_HOST_DEVICE std::uint32_t encode(std::uint64_t i, float v, Draws& draw) const {
    return quant::natural_code(v, static_cast<unsigned>(emax[geo.bucket_of(i)]), draw(i));
  }
  GRADCOMP_HOST_DEVICE float decode(std::uint64_t i, std::uint32_t c) const {
    bool ok = true;
    return quant::natural_value(static_cast<std::uint8_t>(c),
                                static_cast<unsigned>(emax[geo.bucket_of(i)]), ok);
  }
};

struct prefix_fn {
  std::byte const* emax;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t k) const {
    if (static_cast<unsigned>(emax[k]) > natural_format::max_exponent) {
      detail::report(&status->bucket, k);
    }
  }
};

struct decoder {
  detail::bucket_geometry geo;
  std::byte const* emax;
  std::byte const* codes;

  GRADCOMP_HOST_DEVICE float value(std::uint64_t i, bool& ok) const {
    return quant::natural_value(static_cast<std::uint8_t>(codes[i]),
                                static_cast<unsigned>(emax[geo.bucket_of(i)]), ok);
  }
};

}  // namespace natural_detail
}  // namespace algo

/// The natural codec on a CUDA stream (see file comment and cuda/detail/codec_base.cuh for the
/// operations).
class natural_codec : public detail::device_codec<natural_codec> {
  friend class detail::device_codec<natural_codec>;

 public:
  static constexpr codec_id id = natural_format::id;

  /// `bucket` elements per exponent byte (0 = whole tensor).
  explicit natural_codec(std::uint32_t bucket = 512) noexcept : format_{bucket} {}
  [[nodiscard]] std::uint32_t bucket() const noexcept { return format_.bucket; }
  [[nodiscard]] natural_format wire_format() const noexcept { return format_; }

 private:
  struct scratch {
    detail::status_words* status;
    detail::stats_workspace<detail::exponent_stat> stats;
  };
  scratch carve(detail::arena& a, std::size_t n) const {
    scratch s{};
    s.status = a.take<detail::status_words>(1);
    s.stats = detail::stats_workspace<detail::exponent_stat>::carve(
        a, detail::bucket_geometry::of(format_.bucket, n));
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const&, In const& in,
                    std::size_t n, std::byte* out) const {
    detail::bucket_stats<detail::exponent_stat>(
        exec, detail::bucket_geometry::of(format_.bucket, n), in, ws.stats,
        algo::natural_detail::finish_fn{out + header_bytes, ws.status});
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const&, detail::header_image const& img,
                    packet_header const&, In const& in, std::size_t n, std::byte* out,
                    random_stream const& rs) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    std::byte* const payload = out + header_bytes;
    detail::encode_codes(exec, algo::natural_detail::code{geo, payload}, in, img, out,
                         payload + natural_format::codes_offset(format_.bucket, n), n, 8, rs);
  }

  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> bucket_range(std::uint64_t k,
                                                                     std::uint64_t n) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(format_.bucket, n);
    return {geo.begin(k), geo.end(k)};
  }
  static void throw_finite_bucket_error(std::uint64_t, std::uint64_t first) {
    natural_format::throw_too_large(first);
  }

  template <class Policy>
  bool decode_prefix(Policy&& exec, scratch const& ws, packet_header const& h,
                     std::byte const* payload) const {
    std::uint64_t const nb = gradcomp::detail::bucket_count(h.param0, h.count);
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), nb,
                       algo::natural_detail::prefix_fn{payload, ws.status});
    return nb > 0;
  }
  static void throw_prefix_error(packet_header const&, std::byte const* payload, std::uint64_t k,
                                 cudaStream_t stream) {
    std::byte e{};
    detail::copy_to_host(&e, payload + k, 1, stream);
    detail::synchronize(stream);
    natural_format::check_exponent(k, static_cast<unsigned>(e));
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const& ws, packet_header const& h, std::byte const* payload,
              T* out, std::size_t n, float alpha, bool add) const {
    detail::bucket_geometry const geo = detail::bucket_geometry::of(h.param0, n);
    detail::decode_elements(exec,
                            algo::natural_detail::decoder{
                                geo, payload, payload + natural_format::codes_offset(h.param0, n)},
                            out, n, alpha, add, &ws.status->element);
    return true;
  }
  static void throw_bad_code(packet_header const&) { natural_format::throw_bad_code(); }

  natural_format format_;
};

GRADCOMP_CUDA_NAMESPACE_END
