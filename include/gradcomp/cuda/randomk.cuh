// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::random_k_codec` and `gradcomp::cuda::scaled_random_k_codec`: k coordinates
/// drawn without replacement on the GPU, with the packets of the CPU codecs of the same names
/// (format: codec/format/randomk.hpp; front end: cuda/detail/sparse.cuh).
///
/// The coordinates are the CPU's: the keyed Feistel permutation π of core/feistel.hpp (round
/// keys from Philox4x32-10 through `random_stream::block`, keyed by (seed, step, tensor id)),
/// evaluated for the ranks 0..k−1 by one work item each, then sorted ascending (CUB's
/// `DeviceRadixSort` on the bits of n − 1); k = n gives every coordinate. The work is O(k),
/// independent of n. The values (times n/k for the scaled codec, rounded to float as the CPU
/// rounds it) are gathered in coordinate order. Compression does not wait for the stream
/// (the packet's size is known in advance), except with error feedback, which checks that
/// p = e + g is finite everywhere first, as `residual_feedback` does.
///
/// Decoding regenerates the coordinates from the decoder's seed and step (the `rs` argument;
/// the tensor id is the packet's) after checking the packet's check word against them: a
/// packet decoded under another seed or step is the CPU's `format_error`.

#include <gradcomp/codec/format/randomk.hpp>
#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/core/feistel.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/primitives.cuh>
#include <gradcomp/cuda/detail/sparse.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace algo::randomk_detail {

struct permute_fn {
  feistel_permutation pi;
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const { out[j] = pi(j); }
};

struct iota_fn {
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    out[j] = static_cast<std::uint32_t>(j);
  }
};

struct header_fn {
  detail::header_image img;
  std::uint32_t check;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const {
    img.store(out);
    detail::store_u32_le(out + header_bytes, check);
  }
};

/// The k coordinates of stream `rs` over n elements, ascending, into `ws.b` (`ws.a` holds them
/// in rank order).
inline void coordinates(detail::sparse_scratch const& ws, std::uint64_t n, std::uint64_t k,
                        random_stream const& rs, cudaStream_t stream) {
  if (k == 0) return;
  auto exec = detail::policy(stream);
  thrust::counting_iterator<std::uint64_t> const first(0);
  if (k == n) {
    thrust::for_each_n(exec, first, k, iota_fn{ws.b});
    return;
  }
  thrust::for_each_n(exec, first, k,
                     permute_fn{gradcomp::detail::randomk::permutation(n, rs), ws.a});
  int bits = 1;
  while (bits < 32 && (std::uint64_t{1} << bits) < n) ++bits;  // coordinates are < n
  detail::sort_keys(ws.temp, ws.temp_bytes, ws.a, ws.b, k, bits, stream);
}

}  // namespace algo::randomk_detail

/// Random-k on a CUDA stream, unscaled (`random_k_codec`) or scaled by n/k
/// (`scaled_random_k_codec`); see the file comment and cuda/detail/sparse.cuh.
template <bool Scaled>
class basic_random_k_codec : public detail::sparse_device_codec<basic_random_k_codec<Scaled>> {
  friend class detail::sparse_device_codec<basic_random_k_codec<Scaled>>;

 public:
  static constexpr codec_id id = codec_id::random_k;
  /// Whether values are sent multiplied by n/k.
  static constexpr bool scaled = Scaled;
  /// As the CPU codec: ranks sharing the seed and step select the same coordinates, so the
  /// collectives all-reduce the values (`values_of`); unbiased when scaled.
  static constexpr aggregation_kind aggregation = aggregation_kind::shared_support;
  static constexpr bool unbiased = Scaled;
  struct format {
    static constexpr codec_id id = codec_id::random_k;
    static void validate(packet_header const& h) { gradcomp::detail::randomk::validate(h); }
  };

  /// Keeps 1% of the elements, values in f32.
  basic_random_k_codec() noexcept = default;

  /// Keeps min(k, n) elements (k = 0: none).
  static basic_random_k_codec count(std::uint64_t k, sparse_values values = sparse_values::f32) {
    return basic_random_k_codec(detail::sparse_budget::of_count(k, values));
  }

  /// Keeps max(1, floor(r n)) elements of n > 0; 0 < r <= 1.
  static basic_random_k_codec ratio(double r, sparse_values values = sparse_values::f32) {
    return basic_random_k_codec(detail::sparse_budget::of_ratio(r, values, "random_k"));
  }

  /// This codec with another selection size (a `gradcomp::sparse_budget`, codec/budget.hpp),
  /// the value type kept: the CPU codec's `with_budget`.
  template <class Budget>
  [[nodiscard]] basic_random_k_codec with_budget(Budget const& b) const {
    return basic_random_k_codec(b_.with(b, "random_k"));
  }

  [[nodiscard]] sparse_values value_type() const noexcept { return b_.values; }

  /// Elements selected from a tensor of n (the rule of `topk_codec::k_for`).
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept { return b_.k_for(n); }

  /// Exact packet size: header, check word, k_for(n) values.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    gradcomp::detail::check_packet_elements(id, n);
    return header_bytes + 4 + k_for(n) * b_.value_bytes();
  }

  /// Value bits per element, as the CPU codec's (no indices on the wire).
  [[nodiscard]] double bits_per_element() const noexcept { return b_.bits(0.0); }

  /// Where the values of a packet with the validated header `h` are (after the check word;
  /// codec/format/randomk.hpp): what `stream_codec::value_section` hands the collectives.
  [[nodiscard]] static value_section values_of(packet_header const& h) noexcept {
    return gradcomp::detail::randomk::values_of(h);
  }

 private:
  static void check_size(std::uint64_t n) { gradcomp::detail::randomk::check_size(n); }

  static detail::sparse_scratch carve(detail::arena& a, std::size_t n) {
    return detail::carve_sparse(a, n, {0, false, false, true});
  }

  template <class In>
  detail::sparse_encoded encode(detail::sparse_scratch const& ws, In const& in, std::size_t n,
                                dtype t, std::byte* out, cudaStream_t stream,
                                random_stream const& rs) const {
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    if constexpr (In::feedback) {  // residual_feedback checks all of p before compressing
      if (n > 0) thrust::for_each_n(exec, first, n, detail::sparse_ops::touch_fn<In>{in});
      if (detail::read_report(ws, stream).status.element != detail::no_index) {
        detail::throw_combine_error(in, n, stream, static_cast<tensor_id>(rs.tensor));
      }
    }
    std::uint64_t const k = k_for(n);
    std::uint64_t const vb = gradcomp::detail::sparse::value_bytes(b_.values);
    auto const variant = static_cast<std::uint8_t>(static_cast<unsigned>(b_.values) | (Scaled ? 4u : 0u));
    packet_header const h{id, t, variant, n, 4 + k * vb, static_cast<std::uint32_t>(k), rs.tensor};
    thrust::for_each_n(exec, first, 1,
                       algo::randomk_detail::header_fn{detail::make_header_image(h),
                                                       gradcomp::detail::randomk::check_word(rs), out});
    algo::randomk_detail::coordinates(ws, n, k, rs, stream);
    if (k > 0) {
      thrust::for_each_n(exec, first, k,
                         detail::sparse_ops::value_fn<In>{
                             in, ws.b, out + header_bytes + 4, b_.values, Scaled,
                             gradcomp::detail::randomk::scale(Scaled, n, k)});
    }
    return {h, ws.b, k, header_bytes + 4};
  }

  template <element T>
  void decode(detail::sparse_scratch const& ws, packet_header const& h, detail::packet_probe const& p,
              std::byte const* payload, T* out, std::size_t n, float alpha, bool add,
              cudaStream_t stream, random_stream const& rs) const {
    gradcomp::detail::randomk::check(h, detail::load_u32_le(p.head + header_bytes), rs.seed, rs.step);
    std::uint64_t const k = h.param0;
    algo::randomk_detail::coordinates(ws, h.count, k, random_stream{rs.seed, rs.step, h.param1},
                                      stream);
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    if (!add && n > 0) thrust::for_each_n(exec, first, n, detail::sparse_ops::zero_fn<T>{out});
    if (k == 0) return;
    thrust::for_each_n(exec, first, k,
                       detail::sparse_ops::scatter_fn<T, detail::sparse_ops::narrow_index>{
                           out, detail::sparse_ops::narrow_index{ws.b}, payload + 4,
                           static_cast<sparse_values>(h.variant & 3u), alpha, add});
  }

  explicit basic_random_k_codec(detail::sparse_budget b) noexcept : b_(b) {}

  detail::sparse_budget b_;
};

/// Random-k with values sent as is (biased: E[x̂] = (k/n) x).
using random_k_codec = basic_random_k_codec<false>;
/// Random-k with values scaled by n/k (unbiased).
using scaled_random_k_codec = basic_random_k_codec<true>;

GRADCOMP_CUDA_NAMESPACE_END
