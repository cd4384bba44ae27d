// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element-type codecs on the GPU: `gradcomp::cuda::identity_codec`, `fp16_codec` and
/// `bf16_codec`, writing and reading the packets of the CPU codecs of codec/cast.hpp (format:
/// codec/format/cast.hpp) for float32, float16 and bfloat16 device tensors. Every element is
/// rounded by the same `quant::half_bits_saturated` / `bfloat16_bits_saturated`
/// (core/quant/half.hpp: round to nearest even, a finite overflow saturates) — not
/// by `__float2half`, whose NaN results differ — and an input already of the payload's type is
/// copied bit for bit, as the CPU does.
///
/// The work is three layers, each usable on its own:
/// - `ops::` element functions (`GRADCOMP_HOST_DEVICE`), the only place the math lives;
/// - `algo::` functions that apply them over any Thrust execution policy;
/// - the codec classes (cuda/detail/codec_base.cuh), which build and check headers on the host
///   and run `algo::` on a stream (or, with Thrust's CPP device system, on the host; see
///   cuda/config.cuh).
///
/// None of them needs a synchronization to compress; error feedback waits once, for the
/// finiteness check of g + e.

#include <gradcomp/codec/format/cast.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace ops {

/// The wire bits of a float in payload type `Wire` (f32: its bits; f16, bf16: rounded to
/// nearest even, saturating a finite value beyond the range).
template <dtype Wire>
GRADCOMP_HOST_DEVICE constexpr std::uint32_t narrow_bits(float v) noexcept {
  if constexpr (Wire == dtype::f16) {
    return gradcomp::quant::half_bits_saturated(v);
  } else if constexpr (Wire == dtype::bf16) {
    return gradcomp::quant::bfloat16_bits_saturated(v);
  } else {
    return gradcomp::detail::bit_cast<std::uint32_t>(v);
  }
}

/// The float value of wire bits `b` of payload type `w`.
GRADCOMP_HOST_DEVICE constexpr float widen_bits(dtype w, std::uint32_t b) noexcept {
  switch (w) {
    case dtype::f16: return half_bits_to_float(static_cast<std::uint16_t>(b));
    case dtype::bf16: return bfloat16_bits_to_float(static_cast<std::uint16_t>(b));
    default: return gradcomp::detail::bit_cast<float>(b);
  }
}

/// Bytes of one payload element of type `w`.
GRADCOMP_HOST_DEVICE constexpr std::size_t wire_size(dtype w) noexcept {
  return w == dtype::f32 ? 4 : 2;
}

/// The raw bits of an element.
template <element T>
GRADCOMP_HOST_DEVICE constexpr std::uint32_t raw_bits(T v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return gradcomp::detail::bit_cast<std::uint32_t>(v);
  } else {
    return v.bits;
  }
}

/// Stores `bits` as element `i` of a payload of `size`-byte elements (little endian).
GRADCOMP_HOST_DEVICE inline void store_wire(std::byte* payload, std::uint64_t i, std::size_t size,
                                            std::uint32_t bits) noexcept {
  if (size == 2) {
    detail::store_u16_le(payload + 2 * i, static_cast<std::uint16_t>(bits));
  } else {
    detail::store_u32_le(payload + 4 * i, bits);
  }
}

/// Loads element `i` of a payload of `size`-byte elements.
GRADCOMP_HOST_DEVICE inline std::uint32_t load_wire(std::byte const* payload, std::uint64_t i,
                                                    std::size_t size) noexcept {
  return size == 2 ? detail::load_u16_le(payload + 2 * i) : detail::load_u32_le(payload + 4 * i);
}

}  // namespace ops

namespace algo {

namespace cast_detail {

// `Wire` is the payload type, or `dtype{}` for identity (the input's own type). One work item
// per element; item 0 also writes the header.
template <dtype Wire, class In>
struct encode_fn {
  detail::header_image header;
  In in;
  std::uint64_t n;
  std::byte* out;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const {
    if (i == 0) header.store(out);
    if (i >= n) return;
    using T = std::conditional_t<In::feedback, float, typename In::element_type>;
    constexpr dtype wire = Wire == dtype{} ? dtype_of<T> : Wire;
    std::uint32_t bits;
    float v = 0.0f;
    if constexpr (wire == dtype_of<T>) {
      auto const raw = in.raw(i);
      bits = ops::raw_bits(raw);
      v = to_float(raw);
    } else {
      v = in.at(i);
      bits = ops::narrow_bits<wire>(v);
    }
    ops::store_wire(out + header_bytes, i, ops::wire_size(wire), bits);
    if constexpr (In::feedback) in.settle(i, v, ops::widen_bits(wire, bits));
  }
};

template <element T>
struct decode_fn {
  std::byte const* payload;
  dtype wire;
  T* out;
  float alpha;
  bool add;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const {
    std::uint32_t const bits = ops::load_wire(payload, i, ops::wire_size(wire));
    if (!add && wire == dtype_of<T>) {  // the same type: a copy, NaN payloads included
      if constexpr (std::is_same_v<T, float>) {
        out[i] = gradcomp::detail::bit_cast<float>(bits);
      } else {
        out[i] = T::from_bits(static_cast<std::uint16_t>(bits));
      }
      return;
    }
    detail::store_decoded(out, i, ops::widen_bits(wire, bits), alpha, add);
  }
};

}  // namespace cast_detail

/// Writes the packet (header `header`) of the n elements of `in` with payload type `Wire`
/// (`dtype{}`: the input's own type) to `out`, on the Thrust policy `exec`.
template <dtype Wire, class Policy, class In>
void cast_encode(Policy&& exec, detail::header_image const& header, In const& in, std::uint64_t n,
                 std::byte* out) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), n > 0 ? n : 1,
                     cast_detail::encode_fn<Wire, In>{header, in, n, out});
}

/// Decodes n elements of payload type `wire` into `out` (or adds `alpha` times them).
template <class Policy, element T>
void cast_decode(Policy&& exec, std::byte const* payload, dtype wire, T* out, std::uint64_t n,
                 float alpha, bool add) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), n,
                     cast_detail::decode_fn<T>{payload, wire, out, alpha, add});
}

}  // namespace algo

namespace detail {

/// The element-type codecs: `Format` is `identity_format` or `half_cast_format<Wire>`.
template <class Format, dtype Wire>
class cast_codec : public device_codec<cast_codec<Format, Wire>> {
  friend class device_codec<cast_codec>;

 public:
  static constexpr codec_id id = Format::id;

  [[nodiscard]] static constexpr Format wire_format() noexcept { return {}; }

 private:
  struct scratch {
    status_words* status;
  };
  static scratch carve(arena& a, std::size_t) { return {a.take<status_words>(1)}; }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const&, header_image const& img, packet_header const&,
                    In const& in, std::size_t n, std::byte* out, random_stream const&) const {
    algo::cast_encode<Wire>(exec, img, in, n, out);
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const&, packet_header const& h, std::byte const* payload,
              T* out, std::size_t n, float alpha, bool add) const {
    algo::cast_decode(exec, payload, Wire == dtype{} ? h.type : Wire, out, n, alpha, add);
    return false;
  }
};

}  // namespace detail

/// The identity codec on a CUDA stream: the tensor as it is, in its own element type.
using identity_codec = detail::cast_codec<identity_format, dtype{}>;
/// The fp16 codec on a CUDA stream (binary16, round to nearest even).
using fp16_codec = detail::cast_codec<fp16_format, dtype::f16>;
/// The bf16 codec on a CUDA stream (bfloat16, round to nearest even).
using bf16_codec = detail::cast_codec<bf16_format, dtype::bf16>;

GRADCOMP_CUDA_NAMESPACE_END
