// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::threshold_codec`: every element with |x| >= v on the GPU, with the packets
/// of the CPU `gradcomp::threshold_codec` (format: codec/format/sparse.hpp; front end:
/// cuda/detail/sparse.cuh).
///
/// One stable compaction (CUB's `DeviceSelect::If`) over the n elements keeps the indices whose
/// key `bits(x) & 0x7fffffff` is at least v's (a −0 threshold reads as 0, as on the CPU), in
/// index order, and flags NaNs and infinities. The host waits for the count (the packet's size
/// depends on it; a non-finite element throws the CPU codec's `numeric_error` naming the first
/// one), then for the delta encoding's width, and writes the packet.

#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/primitives.cuh>
#include <gradcomp/cuda/detail/sparse.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace algo::threshold_detail {

/// Keeps key >= the threshold's key; reports the first non-finite element.
template <class In>
struct keep_fn {
  In in;
  std::uint32_t threshold_key;
  detail::status_words* status;
  GRADCOMP_HOST_DEVICE bool operator()(std::uint32_t i) const {
    std::uint32_t const key = detail::magnitude_key(in.at(i));
    if (key >= detail::nonfinite_key) detail::report(&status->element, i);
    return key >= threshold_key;
  }
};

}  // namespace algo::threshold_detail

/// The threshold sparsifier on a CUDA stream (see the file comment, and
/// cuda/detail/sparse.cuh for the operations).
class threshold_codec : public detail::sparse_device_codec<threshold_codec> {
  friend class detail::sparse_device_codec<threshold_codec>;

 public:
  static constexpr codec_id id = codec_id::threshold;
  using format = detail::sparse_format<codec_id::threshold>;
  /// As the CPU codec: packets are gathered, decoded and summed (`stream_codec`'s traits).
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Keeps |x| >= `value` (finite, >= 0, else `config_error`); values sent as `values`.
  explicit threshold_codec(float value = 0.0f, sparse_values values = sparse_values::f32)
      : value_(value), values_(values) {
    if (!std::isfinite(value) || value < 0.0f) {
      throw config_error("gradcomp: threshold value must be finite and >= 0, got " +
                         std::to_string(value));
    }
    gradcomp::detail::sparse::check_values(values);
  }

  [[nodiscard]] float value() const noexcept { return value_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return values_; }

  /// Worst case: every element selected, absolute indices (as the CPU codec).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    gradcomp::detail::check_packet_elements(id, n);
    return header_bytes +
           n * static_cast<std::size_t>(4 + gradcomp::detail::sparse::value_bytes(values_));
  }

  /// The cost per *selected* element, as the CPU codec's (32 index bits and the value bits).
  [[nodiscard]] double bits_per_element() const noexcept {
    return gradcomp::detail::sparse::nominal_bits(false, 1.0, values_, 32.0);
  }

 private:
  static void check_size(std::uint64_t n) { detail::check_sparse_size(id, n); }

  static detail::sparse_scratch carve(detail::arena& a, std::size_t n) {
    return detail::carve_sparse(a, n, {0, true, true, false});
  }

  template <class In>
  detail::sparse_encoded encode(detail::sparse_scratch const& ws, In const& in, std::size_t n,
                                dtype t, std::byte* out, cudaStream_t stream,
                                random_stream const& rs) const {
    std::uint32_t const tk = detail::magnitude_key(value_);  // -0 reads as 0
    detail::select_if(ws.temp, ws.temp_bytes, thrust::counting_iterator<std::uint32_t>(0), n,
                      algo::threshold_detail::keep_fn<In>{in, tk, ws.status}, ws.b,
                      &ws.state->count, stream);
    detail::sparse_report const r = detail::read_report(ws, stream);
    if (r.status.element != detail::no_index) {
      detail::throw_sparse_nonfinite(in, n, id, stream, static_cast<tensor_id>(rs.tensor));
    }
    return detail::write_sparse_packet(ws, in, ws.b, r.state.count, n, id, t, values_, out, stream);
  }

  template <element T>
  void decode(detail::sparse_scratch const& ws, packet_header const& h, detail::packet_probe const&,
              std::byte const* payload, T* out, std::size_t n, float alpha, bool add,
              cudaStream_t stream, random_stream const&) const {
    detail::decode_sparse_packet(ws, h, payload, out, n, alpha, add, stream);
  }

  float value_;
  sparse_values values_;
};

GRADCOMP_CUDA_NAMESPACE_END
