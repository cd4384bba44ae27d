// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The element passes of the CUDA codecs: encoding every element into a stream of w-bit codes
/// (w = 8 for int8 and natural, 1 + bit_width(s) for the dithering codecs), and decoding every
/// element into the output.
///
/// Encoding works on the 128-element groups of core/philox.hpp. A work item owns L consecutive
/// lanes (L = 8 / gcd(w, 8), the fewest whose codes fill whole bytes) of the group's 8 rows of
/// 16: elements 128 g + 16 k + L m + j, k = 0..7, j = 0..L-1. It writes whole bytes only, so
/// no two items touch one byte, and with the Philox layout of core/philox.hpp the 8 elements of
/// one lane share one Philox call (`draw_cache`): one call per 8 elements. Consecutive items
/// read consecutive runs of L elements.
///
/// A code `C` provides `std::uint32_t encode(std::uint64_t i, float v, Draws& draw) const` (the
/// code of element i of value v; `draw(i)` gives its 16-bit draw) and `float decode(
/// std::uint64_t i, std::uint32_t code) const` (its decoded value, used by error feedback). A
/// decoder `D` provides `float value(std::uint64_t i, bool& ok) const`, clearing `ok` for a
/// code no encoder writes.

#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// Lanes per encoding work item for codes of `width` bits (1, 2, 4 or 8).
GRADCOMP_HOST_DEVICE constexpr unsigned lanes_per_item(unsigned width) noexcept {
  unsigned lanes = 1;
  while ((lanes * width) % 8 != 0) lanes *= 2;
  return lanes;
}

namespace codes_detail {

template <unsigned L, class C, class In>
struct encode_fn {
  C code;
  In in;
  header_image header;
  std::byte* packet;
  std::byte* stream;  ///< the code stream inside the packet
  std::uint64_t stream_bytes;
  std::uint64_t n;
  unsigned width;
  random_stream rs;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t item) const {
    if (item == 0) header.store(packet);
    constexpr std::uint64_t per_group = 16 / L;
    std::uint64_t const g = item / per_group;
    std::uint64_t const m = item % per_group;
    draw_cache<L> draws(rs);
    for (unsigned k = 0; k < 8; ++k) {
      std::uint64_t const first = 128 * g + 16 * k + L * m;
      if (first >= n) break;
      std::uint64_t pos = first * width / 8;  // whole bytes: L * width is a multiple of 8
      std::uint32_t acc = 0;
      unsigned bits = 0;
      for (unsigned j = 0; j < L; ++j) {
        std::uint64_t const i = first + j;
        std::uint32_t c = 0;
        if (i < n) {
          float const v = in.at(i);
          c = code.encode(i, v, draws);
          if constexpr (In::feedback) in.settle(i, v, code.decode(i, c));
        }
        acc |= c << bits;
        bits += width;
        for (; bits >= 8; bits -= 8, acc >>= 8, ++pos) {
          if (pos < stream_bytes) stream[pos] = static_cast<std::byte>(acc & 0xffu);
        }
      }
    }
  }
};

template <class D, element T>
struct decode_fn {
  D dec;
  T* out;
  float alpha;
  bool add;
  unsigned long long* bad;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const {
    bool ok = true;
    float const v = dec.value(i, ok);
    if (!ok) report(bad, i);
    store_decoded(out, i, v, alpha, add);
  }
};

}  // namespace codes_detail

/// Writes the header image to `packet` and the `width`-bit codes of elements [0, n) of `in` to
/// the code stream at `stream` (ceil(n width / 8) bytes; unused bits of the last byte 0), on
/// the Thrust policy `exec`. With an error-feedback input, also stores each next residual.
template <class C, class Policy, class In>
void encode_codes(Policy&& exec, C const& code, In const& in, header_image const& header,
                  std::byte* packet, std::byte* stream, std::uint64_t n, unsigned width,
                  random_stream const& rs) {
  std::uint64_t const stream_bytes = (n * width + 7) / 8;
  std::uint64_t const groups = (n + 127) / 128;
  auto launch = [&](auto lanes) {
    constexpr unsigned L = decltype(lanes)::value;
    std::uint64_t const items = groups * (16 / L);
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), items > 0 ? items : 1,
                       codes_detail::encode_fn<L, C, In>{code, in, header, packet, stream,
                                                         stream_bytes, n, width, rs});
  };
  switch (lanes_per_item(width)) {
    case 1: launch(std::integral_constant<unsigned, 1>{}); break;
    case 2: launch(std::integral_constant<unsigned, 2>{}); break;
    case 4: launch(std::integral_constant<unsigned, 4>{}); break;
    default: launch(std::integral_constant<unsigned, 8>{}); break;
  }
}

/// Decodes elements [0, n) into `out` (`out = x̂`, or with `add` `out = fma(alpha, x̂, out)`);
/// the first element whose code the decoder rejects is reported to `*bad`.
template <class D, class Policy, element T>
void decode_elements(Policy&& exec, D const& dec, T* out, std::uint64_t n, float alpha, bool add,
                     unsigned long long* bad) {
  thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), n,
                     codes_detail::decode_fn<D, T>{dec, out, alpha, add, bad});
}

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
