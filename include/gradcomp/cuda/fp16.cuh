// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::fp16_codec`: the binary16 codec on the GPU. Its packets are byte-identical
/// to those of the CPU `gradcomp::fp16_codec` for the same float32 input: the same header, and
/// every element rounded by the same `float_to_half_bits` (round to nearest even, NaN quieted
/// with its payload truncated, overflow to infinity) — not by `__float2half`, whose NaN results
/// differ.
///
/// The work is three layers, each usable on its own:
/// - `ops::` element functions (`GRADCOMP_HOST_DEVICE`), the only place the math lives;
/// - `algo::` functions that apply them over any Thrust execution policy;
/// - the codec class, which builds and checks headers on the host and runs `algo::` on a
///   stream (or, with Thrust's CPP device system, on the host; see cuda/config.cuh).

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>

#include <cstddef>
#include <cstdint>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace ops {

/// Rounds element `i` of `x` to binary16 and stores it little-endian at `payload + 2 i`.
GRADCOMP_HOST_DEVICE inline void fp16_encode_element(float const* x, std::byte* payload,
                                                     std::size_t i) noexcept {
  detail::store_u16_le(payload + 2 * i, float_to_half_bits(x[i]));
}

/// Decodes element `i` of an fp16 payload into `out[i]`: `out[i] = x̂_i`, or, if `add`,
/// `out[i] = fma(alpha, x̂_i, out[i])` (one rounding, as the CPU codec does).
GRADCOMP_HOST_DEVICE inline void fp16_decode_element(std::byte const* payload, float* out,
                                                     std::size_t i, float alpha,
                                                     bool add) noexcept {
  float const v = half_bits_to_float(detail::load_u16_le(payload + 2 * i));
  out[i] = add ? fmaf(alpha, v, out[i]) : v;
}

}  // namespace ops

namespace algo {

namespace fp16_detail {

// One work item per element; items below header_bytes also write one header byte, so a
// packet takes a single launch.
struct encode_fn {
  detail::header_image header;
  float const* x;
  std::size_t n;
  std::byte* out;

  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    if (i < header_bytes) out[i] = header.bytes[i];
    if (i < n) ops::fp16_encode_element(x, out + header_bytes, i);
  }
};

struct decode_fn {
  std::byte const* payload;
  float* out;
  float alpha;
  bool add;

  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    ops::fp16_decode_element(payload, out, i, alpha, add);
  }
};

}  // namespace fp16_detail

/// Writes the fp16 packet of `x[0, n)` with header `header` to `out` (header + 2n bytes) on
/// the Thrust policy `exec`; asynchronous wherever `exec` is.
template <class Policy>
void fp16_encode(Policy&& exec, detail::header_image const& header, float const* x, std::size_t n,
                 std::byte* out) {
  std::size_t const items = n > header_bytes ? n : header_bytes;
  thrust::for_each_n(exec, thrust::counting_iterator<std::size_t>(0), items,
                     fp16_detail::encode_fn{header, x, n, out});
}

/// Decodes `n` elements of the fp16 payload `payload` into `out` (or adds `alpha` times them).
template <class Policy>
void fp16_decode(Policy&& exec, std::byte const* payload, std::size_t n, float* out, float alpha,
                 bool add) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::size_t>(0), n,
                     fp16_detail::decode_fn{payload, out, alpha, add});
}

}  // namespace algo

/// The fp16 codec on a CUDA stream (see file comment). Stateless; cheap to construct.
///
/// Pointers named `d_*` are device memory (host memory under Thrust's CPP device system).
/// `compress` is fully asynchronous. `decompress` and `decompress_add` first copy the packet's
/// header to the host and wait for `stream`, because a packet is never decoded unchecked; the
/// decode itself is then enqueued asynchronously.
class fp16_codec {
 public:
  /// The CPU codec whose wire format this one writes and reads.
  using host_codec = gradcomp::fp16_codec;
  static constexpr codec_id id = host_codec::id;

  /// Packet size for `n` elements (exact; header included).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const noexcept {
    return host_codec{}.max_compressed_bytes(n);
  }

  /// Writes the packet of `d_in[0, n)` (float32) to `d_out`, which must hold at least
  /// `max_compressed_bytes(n)` bytes, and returns the packet size. Enqueued on `stream`.
  std::size_t compress(float const* d_in, std::size_t n, std::byte* d_out,
                       cudaStream_t stream = nullptr) const {
    packet_header const h = host_codec{}.header_for(n, dtype::f32);
    detail::header_image const img = detail::make_header_image(h);
    detail::translate_thrust_errors(
        [&] { algo::fp16_encode(detail::policy(stream), img, d_in, n, d_out); });
    return static_cast<std::size_t>(h.packet_bytes());
  }

  /// The header of the `packet_bytes`-byte packet at `d_packet` after the checks the CPU codec
  /// makes (throws `format_error`); `n` must match its element count (else `config_error`).
  static packet_header inspect(std::byte const* d_packet, std::size_t packet_bytes, std::size_t n,
                               cudaStream_t stream = nullptr) {
    detail::packet_probe const p = detail::probe_packet(d_packet, packet_bytes, stream);
    return detail::checked_header<host_codec>(p, packet_bytes, n);
  }

  /// Decodes the packet into `d_out[0, n)`. Throws like the CPU codec for a malformed packet
  /// or a count that is not `n`; nothing is written then.
  void decompress(std::byte const* d_packet, std::size_t packet_bytes, float* d_out, std::size_t n,
                  cudaStream_t stream = nullptr) const {
    decode(d_packet, packet_bytes, d_out, n, 1.0f, false, stream);
  }

  /// Adds `alpha` times the decoded packet to `d_out[0, n)` (`fma(alpha, x̂, out)`).
  void decompress_add(std::byte const* d_packet, std::size_t packet_bytes, float* d_out,
                      std::size_t n, float alpha = 1.0f, cudaStream_t stream = nullptr) const {
    decode(d_packet, packet_bytes, d_out, n, alpha, true, stream);
  }

 private:
  static void decode(std::byte const* d_packet, std::size_t packet_bytes, float* d_out,
                     std::size_t n, float alpha, bool add, cudaStream_t stream) {
    (void)inspect(d_packet, packet_bytes, n, stream);
    detail::translate_thrust_errors([&] {
      algo::fp16_decode(detail::policy(stream), d_packet + header_bytes, n, d_out, alpha, add);
    });
  }
};

GRADCOMP_CUDA_NAMESPACE_END
