// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::topk_codec` and `gradcomp::cuda::approx_topk_codec`: the k elements of
/// largest |x| on the GPU, exactly, with the packets of the CPU `gradcomp::topk_codec` and
/// `gradcomp::approx_topk_codec` (format: codec/format/sparse.hpp; front end:
/// cuda/detail/sparse.cuh).
///
/// **Selection: a radix select over the keys** `bits(x) & 0x7fffffff` (|x|'s order for finite
/// floats), in the manner of NVIDIA's AIR top-k (SC'23): each pass reads its candidates once,
/// filtering them by the key bits found so far and building the histogram of the next digit
/// in the same read; a device-side step picks the digit that holds the k-th largest key:
///
/// 1. the histogram of the top digit (key bits 20-30, 2048 bins) over all n elements; its bins
///    at 0x7f8 and above are the NaNs and infinities, which end the call (one wait, below);
/// 2. one stable compaction of every element whose key is at or above the boundary digit
///    (the candidates: the k selected and the rest of the boundary bucket), in index order;
/// 3. over the candidates, the histograms of bits 10-19 and 0-9 of the keys that match the
///    digits chosen so far: the k-th largest key T, and `need`, how many of the elements with
///    key T the selection takes;
/// 4. ties, as on the CPU (codec/topk.hpp): every key > T, and the *first* `need` elements
///    with key == T (lowest indices): a compaction of the ties among the candidates gives the
///    index L of the need-th, and a last stable compaction of the candidates keeps key > T or
///    (key == T and index <= L). The indices come out ascending.
///
/// The histograms, compactions and the scan are CUB's (cuda/detail/primitives.cuh) on the
/// caller's workspace; the digit choices are single work items, so the passes run back to back
/// on the stream. The host waits twice: after step 2 (a NaN or infinity throws the CPU codec's
/// `numeric_error`; the candidates' count sizes step 3) and after the delta encoding's width
/// (the packet's size). The result is the CPU codec's for every n and k: both take the same
/// set, whatever path their passes take.
///
/// approx_topk: the CPU codec selects one tensor with exact top-k's selection at the target
/// k (codec/approx_topk.hpp); so does this one, writing the approx_topk codec id.

#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/primitives.cuh>
#include <gradcomp/cuda/detail/sparse.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace algo::topk_detail {

/// The digit of key bits [shift, shift + bits) of candidate j (element `cand[j]`, or element j
/// without a candidate list), or `no_bin` when its key does not start with the bits found so
/// far (`st`; null: no filter).
template <class In>
struct digit_sample {
  In in;
  std::uint32_t const* cand;
  detail::select_state const* st;
  unsigned shift;
  std::uint32_t mask;
  GRADCOMP_HOST_DEVICE int operator()(std::uint64_t j) const {
    std::uint64_t const i = cand != nullptr ? cand[j] : j;
    std::uint32_t const key = detail::magnitude_key(in.at(i));
    if (st != nullptr && (key & st->known) != st->prefix) return detail::no_bin;
    return static_cast<int>((key >> shift) & mask);
  }
};

struct init_fn {
  detail::select_state* st;
  std::uint64_t k;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const {
    st->prefix = 0;
    st->known = 0;
    st->need = k;
    st->ties = 0;
    st->count = 0;
    st->last_tie = 0;
    st->nonfinite = 0;
  }
};

/// Picks the digit at `shift` (of `width` bins) that holds the need-th largest key among those
/// matching the prefix, scanning the bins from the top as the CPU's `finish` does. The first
/// digit's choice also looks for NaNs and infinities.
struct choose_fn {
  unsigned const* hist;
  detail::select_state* st;
  unsigned shift;
  std::uint32_t width;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const {
    if (st->nonfinite != 0) return;
    if (shift == 20) {
      for (std::uint32_t d = detail::nonfinite_key >> 20; d < width; ++d) {
        if (hist[d] != 0) {
          st->nonfinite = 1;
          st->prefix = ~0u;  // above every key: nothing is a candidate
          st->known = ~0u;
          return;
        }
      }
    }
    unsigned long long need = st->need;
    std::uint32_t d = width;
    while (d > 0) {
      --d;
      if (hist[d] >= need) break;
      need -= hist[d];
    }
    st->prefix |= d << shift;
    st->known |= (width - 1) << shift;
    st->need = need;
    if (shift == 0) st->ties = hist[d];
  }
};

/// Candidates: key at or above the boundary digit.
template <class In>
struct at_least_fn {
  In in;
  detail::select_state const* st;
  GRADCOMP_HOST_DEVICE bool operator()(std::uint32_t i) const {
    return detail::magnitude_key(in.at(i)) >= st->prefix;
  }
};

/// Ties: key equal to the k-th largest.
template <class In>
struct tie_fn {
  In in;
  detail::select_state const* st;
  GRADCOMP_HOST_DEVICE bool operator()(std::uint32_t i) const {
    return detail::magnitude_key(in.at(i)) == st->prefix;
  }
};

/// L: the index of the need-th tie (ties ascending in `ties`).
struct last_tie_fn {
  std::uint32_t const* ties;
  detail::select_state* st;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const {
    if (st->nonfinite == 0 && st->need > 0) st->last_tie = ties[st->need - 1];
  }
};

/// The selection: key > T, or key == T at an index up to L.
template <class In>
struct selected_fn {
  In in;
  detail::select_state const* st;
  GRADCOMP_HOST_DEVICE bool operator()(std::uint32_t i) const {
    std::uint32_t const key = detail::magnitude_key(in.at(i));
    return key > st->prefix || (key == st->prefix && i <= st->last_tie);
  }
};

/// The radix select of the file comment and the packet of its k elements (codec `id`, naming
/// `id` in the error of a non-finite input).
template <class In>
detail::sparse_encoded select_and_write(detail::sparse_scratch const& ws, In const& in,
                                        std::uint64_t n, std::uint64_t k, codec_id id, dtype t,
                                        sparse_values v, std::byte* out, cudaStream_t stream,
                                        tensor_id tensor) {
  auto exec = detail::policy(stream);
  thrust::counting_iterator<std::uint64_t> const one(0);
  detail::select_state* const st = ws.state;
  thrust::for_each_n(exec, one, 1, init_fn{st, k});
  detail::histogram(ws.temp, ws.temp_bytes,
                    detail::over_positions(digit_sample<In>{in, nullptr, nullptr, 20, 2047}),
                    ws.hist, 2048, n, stream);
  thrust::for_each_n(exec, one, 1, choose_fn{ws.hist, st, 20, 2048});
  if (k > 0) {
    detail::select_if(ws.temp, ws.temp_bytes, thrust::counting_iterator<std::uint32_t>(0), n,
                      at_least_fn<In>{in, st}, ws.a, &st->count, stream);
  }
  detail::sparse_report const r = detail::read_report(ws, stream);
  if (r.state.nonfinite != 0 || (In::feedback && r.status.element != detail::no_index)) {
    detail::throw_sparse_nonfinite(in, n, id, stream, tensor);
  }
  if (k > 0) {
    std::uint64_t const c = r.state.count;
    for (unsigned shift : {10u, 0u}) {
      detail::histogram(ws.temp, ws.temp_bytes,
                        detail::over_positions(digit_sample<In>{in, ws.a, st, shift, 1023}),
                        ws.hist, 1024, c, stream);
      thrust::for_each_n(exec, one, 1, choose_fn{ws.hist, st, shift, 1024});
    }
    detail::select_if(ws.temp, ws.temp_bytes, static_cast<std::uint32_t const*>(ws.a), c,
                      tie_fn<In>{in, st}, ws.b, &st->count, stream);
    thrust::for_each_n(exec, one, 1, last_tie_fn{ws.b, st});
    detail::select_if(ws.temp, ws.temp_bytes, static_cast<std::uint32_t const*>(ws.a), c,
                      selected_fn<In>{in, st}, ws.b, &st->count, stream);
  }
  return detail::write_sparse_packet(ws, in, ws.b, k, n, id, t, v, out, stream);
}

/// The shared body of the two top-k codecs: the workspace, the encoding at k, the decoding.
template <codec_id Id>
struct topk_packets {
  using format = detail::sparse_format<Id>;

  static detail::sparse_scratch carve(detail::arena& a, std::size_t n) {
    return detail::carve_sparse(a, n, {histogram_temp(n), true, true, false});
  }

  /// The histograms' temporary bytes: the largest CUB asks for over the inputs a codec takes
  /// (a tensor of each element type, or g + e), the first digit's 2048 bins being the most.
  static std::size_t histogram_temp(std::size_t n) {
    std::size_t t = 0;
    auto query = [&](auto in) {
      using In = decltype(in);
      t = std::max(t, detail::histogram_temp_bytes(
                          detail::over_positions(digit_sample<In>{in, nullptr, nullptr, 20, 2047}), n,
                          2048));
    };
    query(detail::plain_input<float>{});
    query(detail::plain_input<half>{});
    query(detail::plain_input<bfloat16>{});
    query(detail::feedback_input<float>{});
    query(detail::feedback_input<half>{});
    query(detail::feedback_input<bfloat16>{});
    return t;
  }

  template <element T>
  static void decode(detail::sparse_scratch const& ws, packet_header const& h,
                     detail::packet_probe const&, std::byte const* payload, T* out, std::size_t n,
                     float alpha, bool add, cudaStream_t stream, random_stream const&) {
    detail::decode_sparse_packet(ws, h, payload, out, n, alpha, add, stream);
  }
};

}  // namespace algo::topk_detail

/// Exact top-k on a CUDA stream (see the file comment, and cuda/detail/sparse.cuh for the
/// operations: two-phase `compress`, `compress_with_feedback`, `decompress`,
/// `decompress_add`, `inspect`, `workspace_bytes`).
class topk_codec : public detail::sparse_device_codec<topk_codec>,
                   private algo::topk_detail::topk_packets<codec_id::topk> {
  friend class detail::sparse_device_codec<topk_codec>;
  using packets = algo::topk_detail::topk_packets<codec_id::topk>;

 public:
  static constexpr codec_id id = codec_id::topk;
  using format = packets::format;
  /// As the CPU codec: packets are gathered, decoded and summed (`stream_codec`'s traits).
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Keeps 1% of the elements, values in f32.
  topk_codec() noexcept = default;

  /// Keeps min(k, n) elements (k = 0: none).
  static topk_codec count(std::uint64_t k, sparse_values values = sparse_values::f32) {
    return topk_codec(detail::sparse_budget::of_count(k, values));
  }

  /// Keeps max(1, floor(r n)) elements of n > 0; 0 < r <= 1 (else `config_error`).
  static topk_codec ratio(double r, sparse_values values = sparse_values::f32) {
    return topk_codec(detail::sparse_budget::of_ratio(r, values, "topk"));
  }

  /// This codec with another selection size (a `gradcomp::sparse_budget`, codec/budget.hpp),
  /// the value type kept: the CPU codec's `with_budget`.
  template <class Budget>
  [[nodiscard]] topk_codec with_budget(Budget const& b) const {
    return topk_codec(b_.with(b, "topk"));
  }

  [[nodiscard]] bool by_ratio() const noexcept { return b_.by_ratio; }
  [[nodiscard]] double ratio_value() const noexcept { return b_.ratio; }
  [[nodiscard]] std::uint64_t count_value() const noexcept { return b_.k; }
  [[nodiscard]] sparse_values value_type() const noexcept { return b_.values; }

  /// Elements selected from a tensor of n.
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept { return b_.k_for(n); }

  /// Header plus absolute indices plus values for k_for(n) elements, as the CPU codec.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    gradcomp::detail::check_packet_elements(id, n);
    return header_bytes + k_for(n) * (4 + b_.value_bytes());
  }

  /// Nominal wire bits per element, as the CPU codec's (absolute u32 indices and the values).
  [[nodiscard]] double bits_per_element() const noexcept { return b_.bits(32.0); }

 private:
  using packets::carve;
  using packets::decode;
  static void check_size(std::uint64_t n) { detail::check_sparse_size(id, n); }

  template <class In>
  detail::sparse_encoded encode(detail::sparse_scratch const& ws, In const& in, std::size_t n,
                                dtype t, std::byte* out, cudaStream_t stream,
                                random_stream const& rs) const {
    return algo::topk_detail::select_and_write(ws, in, n, k_for(n), id, t, b_.values, out,
                                               stream, static_cast<tensor_id>(rs.tensor));
  }

  explicit topk_codec(detail::sparse_budget b) noexcept : b_(b) {}

  detail::sparse_budget b_;
};

/// Approximate top-k on a CUDA stream: exact top-k at the target k with the approx_topk codec
/// id, as the CPU codec selects a single tensor (see the file comment). `sample` and
/// `tolerance` are checked as on the CPU and size `max_compressed_bytes` (the window's top).
class approx_topk_codec : public detail::sparse_device_codec<approx_topk_codec>,
                          private algo::topk_detail::topk_packets<codec_id::approx_topk> {
  friend class detail::sparse_device_codec<approx_topk_codec>;
  using packets = algo::topk_detail::topk_packets<codec_id::approx_topk>;

 public:
  static constexpr codec_id id = codec_id::approx_topk;
  using format = packets::format;
  /// As the CPU codec: packets are gathered, decoded and summed (`stream_codec`'s traits).
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  static constexpr bool unbiased = false;

  /// Aims at 1% of the elements within ±10%, sample fraction 0.001, values in f32.
  approx_topk_codec() noexcept = default;

  /// Aims at min(k, n) elements (k = 0: none).
  static approx_topk_codec count(std::uint64_t k, double sample = 0.001, double tolerance = 0.1,
                                 sparse_values values = sparse_values::f32) {
    return approx_topk_codec(detail::sparse_budget::of_count(k, values), sample, tolerance);
  }

  /// Aims at max(1, floor(r n)) elements of n > 0; 0 < r <= 1.
  static approx_topk_codec ratio(double r, double sample = 0.001, double tolerance = 0.1,
                                 sparse_values values = sparse_values::f32) {
    return approx_topk_codec(detail::sparse_budget::of_ratio(r, values, "approx_topk"), sample,
                             tolerance);
  }

  /// This codec with another selection size (a `gradcomp::sparse_budget`, codec/budget.hpp),
  /// sample fraction, tolerance and value type kept: the CPU codec's `with_budget`.
  template <class Budget>
  [[nodiscard]] approx_topk_codec with_budget(Budget const& b) const {
    return approx_topk_codec(b_.with(b, "approx_topk"), sample_, tolerance_);
  }

  [[nodiscard]] double sample_fraction() const noexcept { return sample_; }
  [[nodiscard]] double tolerance() const noexcept { return tolerance_; }
  [[nodiscard]] sparse_values value_type() const noexcept { return b_.values; }

  /// Target count k for a tensor of n (the rule of `topk_codec::k_for`).
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept { return b_.k_for(n); }

  /// Header plus absolute indices plus values for the most elements the window allows, as the
  /// CPU codec.
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    gradcomp::detail::check_packet_elements(id, n);
    std::uint64_t const hi = gradcomp::detail::sparse::approx_window(k_for(n), tolerance_).second;
    std::size_t const m = n < hi ? n : static_cast<std::size_t>(hi);
    return header_bytes + m * (4 + b_.value_bytes());
  }

  /// Nominal wire bits per element at the target k, as the CPU codec's.
  [[nodiscard]] double bits_per_element() const noexcept { return b_.bits(32.0); }

 private:
  using packets::carve;
  using packets::decode;
  static void check_size(std::uint64_t n) { detail::check_sparse_size(id, n); }

  approx_topk_codec(detail::sparse_budget b, double sample, double tolerance)
      : b_(b), sample_(sample), tolerance_(tolerance) {
    gradcomp::detail::sparse::check_approx(sample, tolerance);
  }

  template <class In>
  detail::sparse_encoded encode(detail::sparse_scratch const& ws, In const& in, std::size_t n,
                                dtype t, std::byte* out, cudaStream_t stream,
                                random_stream const& rs) const {
    return algo::topk_detail::select_and_write(ws, in, n, k_for(n), id, t, b_.values, out,
                                               stream, static_cast<tensor_id>(rs.tensor));
  }

  detail::sparse_budget b_;
  double sample_ = 0.001;
  double tolerance_ = 0.1;
};

GRADCOMP_CUDA_NAMESPACE_END
