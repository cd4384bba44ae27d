// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::chunk_topk_codec`: chunk-wise top-k on the GPU, with the packets of the CPU
/// `gradcomp::chunk_topk_codec` (format: codec/format/chunk_topk.hpp; 2-/4-bit value codes:
/// core/quant/int4.hpp; 16-bit values: core/quant/half.hpp).
///
/// Passes, one work item per chunk unless said otherwise:
/// 1. statistics: the chunk's largest magnitude (its step for the coded values, written to the
///    packet) and an exact radix select of its k-th largest magnitude t, 8 bits at a time from
///    the top, which also gives how many elements equal to t are kept (the first ones by index,
///    the CPU's tie rule); a NaN or an infinity reports the chunk (one wait, then the CPU's
///    `numeric_error` naming the first non-finite element);
/// 2. selection: the chunk's kept elements in ascending order, their indices and raw value
///    fields into the workspace (error feedback stores every next residual here);
/// 3. packing: one work item per byte of the value and index sections, each composed from the
///    fields it holds (no two items write one byte), and the header.
///
/// Decoding checks every chunk first (step, strictly ascending indices inside the chunk,
/// finite values), which reports the first bad chunk; the host then re-reads the packet to
/// throw the CPU's `format_error` for it, and the tensor is untouched. Then one work item per
/// chunk decodes it.

#include <gradcomp/codec/format/chunk_topk.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/quant/int4.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

namespace algo {
namespace chunk_topk_detail {

/// The geometry of a packet: chunks, kept counts, sections. Made on the host (`make`), which
/// also computes the field widths (the format's `index_bits` is a host constexpr function).
struct layout {
  std::uint64_t n = 0;
  std::uint32_t chunk = 2;
  std::uint32_t k = 1;
  chunk_values values = chunk_values::f32;
  unsigned vb = 32;  ///< bits per value
  unsigned ib = 1;   ///< bits per index (log2 of the chunk)

  static layout make(std::uint64_t n, std::uint32_t chunk, std::uint32_t k, chunk_values v) {
    return {n, chunk, k, v, chunk_topk_format::value_bits(v), chunk_topk_format::index_bits(chunk)};
  }

  GRADCOMP_HOST_DEVICE std::uint64_t chunks() const noexcept { return (n + chunk - 1) / chunk; }
  GRADCOMP_HOST_DEVICE std::uint64_t kept() const noexcept {
    if (n == 0) return 0;
    std::uint64_t const last = n - (chunks() - 1) * chunk;
    return (chunks() - 1) * k + (last < k ? last : k);
  }
  GRADCOMP_HOST_DEVICE unsigned value_bits() const noexcept { return vb; }
  GRADCOMP_HOST_DEVICE unsigned index_bits() const noexcept { return ib; }
  GRADCOMP_HOST_DEVICE bool quantized() const noexcept {
    return values == chunk_values::int2 || values == chunk_values::int4;
  }
  GRADCOMP_HOST_DEVICE std::uint64_t begin(std::uint64_t c) const noexcept { return c * chunk; }
  GRADCOMP_HOST_DEVICE std::uint64_t length(std::uint64_t c) const noexcept {
    std::uint64_t const b = c * chunk;
    return n - b < chunk ? n - b : chunk;
  }
  GRADCOMP_HOST_DEVICE std::uint64_t kept_in(std::uint64_t c) const noexcept {
    std::uint64_t const L = length(c);
    return L < k ? L : k;
  }
  GRADCOMP_HOST_DEVICE std::uint64_t values_offset() const noexcept {
    return quantized() ? 4 * chunks() : 0;
  }
  GRADCOMP_HOST_DEVICE std::uint64_t indices_offset() const noexcept {
    return values_offset() + (kept() * vb + 7) / 8;
  }
};

/// The magnitude key of a finite float (its bits without the sign).
GRADCOMP_HOST_DEVICE inline std::uint32_t key_of(float v) noexcept {
  return gradcomp::detail::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
}

/// Field j (w bits, 1..32) of a section packed least significant bit first; reads no byte past
/// the field's last.
GRADCOMP_HOST_DEVICE inline std::uint32_t field(std::byte const* section, std::uint64_t j,
                                                unsigned w) noexcept {
  std::uint64_t const pos = j * w;
  std::byte const* p = section + pos / 8;
  unsigned const shift = static_cast<unsigned>(pos % 8);
  std::uint64_t acc = 0;
  for (unsigned q = 0; 8 * q < shift + w; ++q) acc |= static_cast<std::uint64_t>(p[q]) << (8 * q);
  return static_cast<std::uint32_t>((acc >> shift) & ((std::uint64_t{1} << w) - 1));
}

/// The decoded value of a raw value field (`step`: the chunk's, for codes).
GRADCOMP_HOST_DEVICE inline float value_of(chunk_values v, std::uint32_t raw, float step) noexcept {
  switch (v) {
    case chunk_values::f16: return half_bits_to_float(static_cast<std::uint16_t>(raw));
    case chunk_values::bf16: return bfloat16_bits_to_float(static_cast<std::uint16_t>(raw));
    case chunk_values::int2: return quant::magnitude_value(static_cast<std::uint8_t>(raw), step, 2);
    case chunk_values::int4: return quant::magnitude_value(static_cast<std::uint8_t>(raw), step, 4);
    case chunk_values::f32: break;
  }
  return gradcomp::detail::bit_cast<float>(raw);
}

/// The raw value field of kept element value `x` (`inv`: the chunk's multiplier, for codes).
GRADCOMP_HOST_DEVICE inline std::uint32_t raw_of(chunk_values v, float x, float inv,
                                                 unsigned bits) noexcept {
  switch (v) {
    case chunk_values::f16: return quant::half_bits_saturated(x);
    case chunk_values::bf16: return quant::bfloat16_bits_saturated(x);
    case chunk_values::int2:
    case chunk_values::int4: return quant::magnitude_code(x, inv, bits);
    case chunk_values::f32: break;
  }
  return gradcomp::detail::bit_cast<std::uint32_t>(x);
}

/// Per-chunk results of the statistics pass.
struct chunk_state {
  std::uint32_t* threshold;  ///< t: the kc-th largest key
  std::uint32_t* equal;      ///< elements equal to t that are kept (the first ones)
  float* step;               ///< decoding step (codes)
  float* inv;                ///< encoding multiplier (codes)
};

template <class In>
struct stats_fn {
  layout lay;
  In in;
  chunk_state st;
  std::byte* payload;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t c) const {
    std::uint64_t const b = lay.begin(c), L = lay.length(c), kc = lay.kept_in(c);
    std::uint32_t top = 0;
    for (std::uint64_t i = 0; i < L; ++i) {
      std::uint32_t const key = key_of(in.at(b + i));
      if (key >= 0x7f800000u) {
        detail::report(&status->bucket, c);
        return;
      }
      top = key > top ? key : top;
    }
    if (lay.quantized()) {
      float const m = gradcomp::detail::bit_cast<float>(top);
      unsigned const vb = lay.value_bits();
      float const step = quant::magnitude_step(m, vb);
      st.step[c] = step;
      st.inv[c] = quant::magnitude_inverse(m, vb);
      detail::store_f32_le(payload + 4 * c, step);
    }
    std::uint32_t t = 0;
    std::uint64_t remaining = L;  // kc == L: every element
    if (kc < L) {
      // Radix select of the kc-th largest key, 8 bits at a time from the top: `prefix` holds
      // the digits found, `remaining` the rank of the target among the keys that share them.
      std::uint32_t prefix = 0, mask = 0;
      remaining = kc;
      for (int shift = 24; shift >= 0; shift -= 8) {
        std::uint32_t hist[256];
        for (unsigned d = 0; d < 256; ++d) hist[d] = 0;
        for (std::uint64_t i = 0; i < L; ++i) {
          std::uint32_t const key = key_of(in.at(b + i));
          if ((key & mask) == prefix) ++hist[(key >> shift) & 0xffu];
        }
        unsigned d = 255;
        while (hist[d] < remaining) remaining -= hist[d--];  // stops: the bins hold the target
        prefix |= static_cast<std::uint32_t>(d) << shift;
        mask |= 0xffu << shift;
      }
      t = prefix;
    }
    st.threshold[c] = t;
    st.equal[c] = static_cast<std::uint32_t>(remaining);
  }
};

/// Kept elements of a chunk into the workspace (fields j = c k + 0, 1, ...); with error
/// feedback, every next residual of the chunk.
template <class In>
struct select_fn {
  layout lay;
  In in;
  chunk_state st;
  std::uint32_t* kept_index;
  std::uint32_t* kept_raw;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t c) const {
    std::uint64_t const b = lay.begin(c), L = lay.length(c);
    std::uint32_t const t = st.threshold[c];
    std::uint64_t equal = st.equal[c];
    unsigned const vb = lay.value_bits();
    float const step = lay.quantized() ? st.step[c] : 0.0f;
    float const inv = lay.quantized() ? st.inv[c] : 0.0f;
    std::uint64_t j = c * lay.k;
    for (std::uint64_t i = 0; i < L; ++i) {
      float const v = in.at(b + i);
      std::uint32_t const key = key_of(v);
      bool take = key > t;
      if (!take && key == t && equal > 0) {
        take = true;
        --equal;
      }
      float decoded = 0.0f;
      if (take) {
        std::uint32_t const raw = raw_of(lay.values, v, inv, vb);
        kept_index[j] = static_cast<std::uint32_t>(i);
        kept_raw[j] = raw;
        ++j;
        if constexpr (In::feedback) decoded = value_of(lay.values, raw, step);
      }
      if constexpr (In::feedback) in.settle(b + i, v, decoded);
    }
  }
};

/// Byte `q` of a section of `count` fields of w bits (`fields[j]`), and the header at item 0.
struct pack_fn {
  std::uint32_t const* fields;
  std::uint64_t count;
  unsigned w;
  std::byte* section;
  std::uint64_t bytes;
  detail::header_image header;
  std::byte* packet;
  bool write_header;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t q) const {
    if (q == 0 && write_header) header.store(packet);
    if (q >= bytes) return;
    std::uint64_t const lo = 8 * q;
    std::uint64_t acc = 0;
    for (std::uint64_t j = lo / w; j < count && j * w < lo + 8; ++j) {
      std::uint64_t const start = j * w;
      std::uint64_t const f = fields[j];
      acc |= start >= lo ? f << (start - lo) : f >> (lo - start);
    }
    section[q] = static_cast<std::byte>(acc & 0xffu);
  }
};

/// What `check_chunk` found wrong first in a chunk.
enum class chunk_fault : unsigned { none, step, index, value };

/// The CPU decoder's checks of chunk c, in its order: the step (codes), then per kept field
/// its index (strictly ascending, inside the chunk) and its value (finite). `index`/`prev`
/// receive the offending index and its predecessor.
GRADCOMP_HOST_DEVICE inline chunk_fault check_chunk(layout const& lay, std::byte const* payload,
                                                    std::uint64_t c, std::uint32_t& index,
                                                    std::uint32_t& prev) noexcept {
  unsigned const vb = lay.value_bits(), ib = lay.index_bits();
  if (lay.quantized() && !chunk_topk_format::valid_step(detail::load_f32_le(payload + 4 * c), vb)) {
    return chunk_fault::step;
  }
  std::byte const* vals = payload + lay.values_offset();
  std::byte const* idx = payload + lay.indices_offset();
  std::uint64_t const L = lay.length(c), kc = lay.kept_in(c), j0 = c * lay.k;
  prev = 0;
  for (std::uint64_t t = 0; t < kc; ++t) {
    std::uint32_t const i = field(idx, j0 + t, ib);
    if ((t > 0 && i <= prev) || i >= L) {
      index = i;
      return chunk_fault::index;
    }
    prev = i;
    if (!lay.quantized() && !detail::finite(value_of(lay.values, field(vals, j0 + t, vb), 0.0f))) {
      return chunk_fault::value;
    }
  }
  return chunk_fault::none;
}

struct prefix_fn {
  layout lay;
  std::byte const* payload;
  detail::status_words* status;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t c) const {
    std::uint32_t index = 0, prev = 0;
    if (check_chunk(lay, payload, c, index, prev) != chunk_fault::none) {
      detail::report(&status->bucket, c);
    }
  }
};

template <element T>
struct decode_fn {
  layout lay;
  std::byte const* payload;
  T* out;
  float alpha;
  bool add;

  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t c) const {
    std::uint64_t const b = lay.begin(c), L = lay.length(c), kc = lay.kept_in(c), j0 = c * lay.k;
    unsigned const vb = lay.value_bits(), ib = lay.index_bits();
    float const step = lay.quantized() ? detail::load_f32_le(payload + 4 * c) : 0.0f;
    std::byte const* vals = payload + lay.values_offset();
    std::byte const* idx = payload + lay.indices_offset();
    // The kept indices ascend (checked before): one pass over the chunk, merging them in. A
    // float output with add is touched only where a value is kept; 16-bit outputs go through
    // float and back everywhere, as the CPU codec's decompress_add does (so -0 + 0 -> +0).
    constexpr bool all = !std::is_same_v<T, float>;
    std::uint64_t t = 0;
    std::uint64_t next = kc > 0 ? field(idx, j0, ib) : L;
    for (std::uint64_t i = 0; i < L; ++i) {
      float v = 0.0f;
      bool const kept = i == next;
      if (kept) {
        v = value_of(lay.values, field(vals, j0 + t, vb), step);
        ++t;
        next = t < kc ? field(idx, j0 + t, ib) : L;
      }
      if (kept || !add || all) detail::store_decoded(out, b + i, v, alpha, add);
    }
  }
};

}  // namespace chunk_topk_detail
}  // namespace algo

/// The chunk top-k codec on a CUDA stream (see file comment and cuda/detail/codec_base.cuh for
/// the operations: two-phase `compress`, `compress_with_feedback`, `decompress`,
/// `decompress_add`, `inspect`, `workspace_bytes`).
class chunk_topk_codec : public detail::device_codec<chunk_topk_codec> {
  friend class detail::device_codec<chunk_topk_codec>;

 public:
  static constexpr codec_id id = chunk_topk_format::id;
  /// Per-rank scales (supports) differ: packets are gathered, as the CPU codec's.
  static constexpr aggregation_kind aggregation = aggregation_kind::gather;
  /// Biased (nearest rounding or a selection), as the CPU codec: use it under error feedback.
  static constexpr bool unbiased = false;

  /// Keeps `k` of every `chunk` elements (chunk a power of two in 2..65536, 1 <= k <= chunk),
  /// values of type `values`; `config_error` otherwise (the CPU codec's message).
  explicit chunk_topk_codec(std::uint32_t chunk = 4096, std::uint32_t k = 64,
                            chunk_values values = chunk_values::f32)
      : format_(chunk_topk_format::checked(chunk, k, values)) {}
  [[nodiscard]] std::uint32_t chunk() const noexcept { return format_.chunk; }
  [[nodiscard]] std::uint32_t k() const noexcept { return format_.k; }
  [[nodiscard]] chunk_values values() const noexcept { return format_.values; }
  [[nodiscard]] chunk_topk_format wire_format() const noexcept { return format_; }

 private:
  using layout = algo::chunk_topk_detail::layout;

  [[nodiscard]] layout layout_of(std::size_t n) const {
    return layout::make(n, format_.chunk, format_.k, format_.values);
  }
  static layout layout_of(packet_header const& h) {
    return layout::make(h.count, h.param0, h.param1, static_cast<chunk_values>(h.variant));
  }

  struct scratch {
    detail::status_words* status;
    algo::chunk_topk_detail::chunk_state st;
    std::uint32_t* kept_index;
    std::uint32_t* kept_raw;
  };
  scratch carve(detail::arena& a, std::size_t n) const {
    layout const lay = layout_of(n);
    scratch s{};
    s.status = a.take<detail::status_words>(1);
    s.st.threshold = a.take<std::uint32_t>(lay.chunks());
    s.st.equal = a.take<std::uint32_t>(lay.chunks());
    s.st.step = a.take<float>(lay.chunks());
    s.st.inv = a.take<float>(lay.chunks());
    s.kept_index = a.take<std::uint32_t>(lay.kept());
    s.kept_raw = a.take<std::uint32_t>(lay.kept());
    return s;
  }

  template <class Policy, class In>
  bool encode_stats(Policy&& exec, scratch const& ws, packet_header const&, In const& in,
                    std::size_t n, std::byte* out) const {
    layout const lay = layout_of(n);
    thrust::for_each_n(
        exec, thrust::counting_iterator<std::uint64_t>(0), lay.chunks(),
        algo::chunk_topk_detail::stats_fn<In>{lay, in, ws.st, out + header_bytes, ws.status});
    return true;
  }

  template <class Policy, class In>
  void encode_codes(Policy&& exec, scratch const& ws, detail::header_image const& img,
                    packet_header const&, In const& in, std::size_t n, std::byte* out,
                    random_stream const&) const {
    using algo::chunk_topk_detail::pack_fn;
    layout const lay = layout_of(n);
    thrust::for_each_n(
        exec, thrust::counting_iterator<std::uint64_t>(0), lay.chunks(),
        algo::chunk_topk_detail::select_fn<In>{lay, in, ws.st, ws.kept_index, ws.kept_raw});
    std::uint64_t const K = lay.kept();
    std::byte* const payload = out + header_bytes;
    std::uint64_t const vbytes = (K * lay.value_bits() + 7) / 8;
    std::uint64_t const ibytes = (K * lay.index_bits() + 7) / 8;
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), vbytes > 0 ? vbytes : 1,
                       pack_fn{ws.kept_raw, K, lay.value_bits(), payload + lay.values_offset(),
                               vbytes, img, out, true});
    if (ibytes > 0) {
      thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), ibytes,
                         pack_fn{ws.kept_index, K, lay.index_bits(), payload + lay.indices_offset(),
                                 ibytes, img, out, false});
    }
  }

  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> bucket_range(std::uint64_t c,
                                                                     std::uint64_t n) const {
    layout const lay = layout_of(n);
    return {lay.begin(c), lay.begin(c) + lay.length(c)};
  }

  template <class Policy>
  bool decode_prefix(Policy&& exec, scratch const& ws, packet_header const& h,
                     std::byte const* payload) const {
    layout const lay = layout_of(h);
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), lay.chunks(),
                       algo::chunk_topk_detail::prefix_fn{lay, payload, ws.status});
    return lay.chunks() > 0;
  }
  // The CPU decoder's message for the first bad chunk c, from a host copy of the payload.
  static void throw_prefix_error(packet_header const& h, std::byte const* payload, std::uint64_t c,
                                 cudaStream_t stream) {
    using algo::chunk_topk_detail::chunk_fault;
    std::vector<std::byte> host(static_cast<std::size_t>(h.payload_bytes));
    detail::copy_to_host(host.data(), payload, host.size(), stream);
    detail::synchronize(stream);
    layout const lay = layout_of(h);
    std::uint32_t index = 0, prev = 0;
    switch (algo::chunk_topk_detail::check_chunk(lay, host.data(), c, index, prev)) {
      case chunk_fault::step:
        throw format_error("gradcomp: chunk_topk packet has step " +
                           std::to_string(detail::load_f32_le(host.data() + 4 * c)) + " at chunk " +
                           std::to_string(c) +
                           " (expected finite, 0 <= step <= FLT_MAX / 2^(bits-1))");
      case chunk_fault::index:
        throw format_error("gradcomp: chunk_topk packet has index " + std::to_string(index) +
                           " after " + std::to_string(prev) + " in chunk " + std::to_string(c) +
                           " of " + std::to_string(lay.length(c)) +
                           " elements (expected strictly ascending indices inside the chunk)");
      case chunk_fault::value:
        throw format_error("gradcomp: chunk_topk packet has a non-finite value at chunk " +
                           std::to_string(c));
      case chunk_fault::none: break;
    }
    throw format_error("gradcomp: chunk_topk packet rejected at chunk " + std::to_string(c));
  }

  template <class Policy, element T>
  bool decode(Policy&& exec, scratch const&, packet_header const& h, std::byte const* payload,
              T* out, std::size_t, float alpha, bool add) const {
    layout const lay = layout_of(h);
    thrust::for_each_n(exec, thrust::counting_iterator<std::uint64_t>(0), lay.chunks(),
                       algo::chunk_topk_detail::decode_fn<T>{lay, payload, out, alpha, add});
    return false;
  }

  chunk_topk_format format_;
};

GRADCOMP_CUDA_NAMESPACE_END
