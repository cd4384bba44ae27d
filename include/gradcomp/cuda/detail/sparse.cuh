// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Shared front end of the CUDA sparsifiers (top-k, approximate top-k, threshold, random-k):
/// their workspace, the passes that write and read the sparse payload of codec/format/sparse.hpp,
/// residual error feedback, and the order of the synchronizations. The device counterpart of
/// codec/detail/sparse.hpp; the element codecs' front end is cuda/detail/codec_base.cuh.
///
/// A codec derives from `sparse_device_codec<Self>` and supplies:
///
/// - `struct format` with `id` and `static void validate(packet_header const&)` (the checks of
///   `checked_header`), `max_compressed_bytes(n)`, and `sparse_scratch carve(arena&, n)`;
/// - `template <class In> sparse_encoded encode(sparse_scratch const&, In const&, n, dtype,
///   std::byte* out, cudaStream_t, random_stream const&) const` — selects, writes the packet
///   (waiting for the stream where the packet's size or an error depends on the data) and
///   returns its header and the selected indices (in the workspace), so that error feedback
///   can subtract what the packet carries;
/// - `template <element T> void decode(sparse_scratch const&, packet_header const&,
///   packet_probe const&, std::byte const* payload, T* out, n, alpha, add, cudaStream_t,
///   random_stream const&) const`.
///
/// The packet size depends on the data (the delta encoding's width, threshold's count), so
/// `compress` waits for the stream before it returns, unlike the element codecs.

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/codec/format/sparse.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/quant/half.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/primitives.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// The selection key of a float: its bits without the sign, which order like |x| for finite
/// values (and put every NaN and infinity above them, at 0x7f800000 and up).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t magnitude_key(float v) noexcept {
  return gradcomp::detail::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
}

/// Keys at or above this one belong to NaNs and infinities.
inline constexpr std::uint32_t nonfinite_key = 0x7f800000u;

/// What the selection passes share through device memory (one per call, in the workspace).
struct select_state {
  std::uint32_t prefix;          ///< top-k: the bits of the k-th largest key found so far
  std::uint32_t known;           ///< top-k: which bits of `prefix` are known
  unsigned long long need;       ///< top-k: rank of the k-th key among those with `prefix`
  unsigned long long ties;       ///< top-k: elements whose key equals the k-th largest
  unsigned long long count;      ///< items a compaction kept
  std::uint32_t last_tie;        ///< top-k: index of the last tie selected
  std::uint32_t nonfinite;       ///< top-k: 1 when the first histogram saw a NaN or infinity
  unsigned width_bits;           ///< OR of the delta entries of the selected indices
  std::uint32_t pad;
};

/// Lowers nothing, raises bits: `*word |= bits` (atomic on the GPU; skips the atomic when the
/// bits are already there, which is the common case once the top bits are set).
GRADCOMP_HOST_DEVICE inline void or_into(unsigned* word, unsigned bits) noexcept {
#if defined(__CUDA_ARCH__)
  if ((*word | bits) != *word) atomicOr(word, bits);
#else
  *word |= bits;
#endif
}

/// Workspace of the sparsifiers. `wide` holds n 64-bit words: the delta decoder's positions,
/// or two arrays of n 32-bit indices, `a` and `b` (candidates and selection, or random-k's
/// coordinates before and after sorting).
struct sparse_scratch {
  status_words* status;
  select_state* state;
  unsigned* hist;  ///< 2048 bins
  std::uint64_t* wide;
  std::uint32_t* a;
  std::uint32_t* b;
  void* temp;  ///< CUB's temporary storage
  std::size_t temp_bytes;
};

/// What a codec's workspace must hold temporary storage for: `histogram` bytes (the codec's
/// own query, see `histogram_temp_bytes`), and compactions, scans and sorts of n items.
struct sparse_needs {
  std::size_t histogram = 0;
  bool select = false;
  bool scan = false;
  bool sort = false;
};

/// Carves (or, with a counting arena, sizes) a sparsifier's workspace for n elements.
inline sparse_scratch carve_sparse(arena& a, std::uint64_t n, sparse_needs needs) {
  sparse_scratch s{};
  s.status = a.take<status_words>(1);
  s.state = a.take<select_state>(1);
  s.hist = a.take<unsigned>(2048);
  s.wide = a.take<std::uint64_t>(static_cast<std::size_t>(n));
  s.a = reinterpret_cast<std::uint32_t*>(s.wide);
  s.b = s.a == nullptr ? nullptr : s.a + n;
  std::size_t t = 0;
  t = std::max(t, needs.histogram);
  if (needs.select) t = std::max(t, select_temp_bytes(n));
  if (needs.scan) t = std::max(t, scan_temp_bytes(n));
  if (needs.sort) t = std::max(t, sort_temp_bytes(n));
  s.temp = a.take<std::byte>(t);
  s.temp_bytes = t;
  return s;
}

/// The state and the status words, read by the host (waits for `stream`).
struct sparse_report {
  select_state state;
  status_words status;
};
inline sparse_report read_report(sparse_scratch const& ws, cudaStream_t stream) {
  sparse_report r{};
  copy_to_host(&r.state, ws.state, sizeof r.state, stream);
  copy_to_host(&r.status, ws.status, sizeof r.status, stream);
  synchronize(stream);
  return r;
}

/// What `encode` wrote: the header, and the m selected indices (ascending, in the workspace).
struct sparse_encoded {
  packet_header header;
  std::uint32_t const* idx;
  std::uint64_t m;
  std::uint64_t values_offset;  ///< of the value section, from the packet's start
};

namespace sparse_ops {

/// Calls `in.at(i)` for every element (the finiteness check of error feedback's p).
template <class In>
struct touch_fn {
  In in;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const { (void)in.at(i); }
};

/// ORs the delta entries of `idx` into `*word`.
struct width_fn {
  std::uint32_t const* idx;
  unsigned* word;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    or_into(word, gradcomp::detail::sparse::delta_entry(idx, j));
  }
};

struct absolute_index_fn {
  std::uint32_t const* idx;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const { store_u32_le(out + 4 * j, idx[j]); }
};

struct delta_word_fn {
  std::uint32_t const* idx;
  std::uint64_t m;
  unsigned b;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t w) const {
    store_u32_le(out + 4 * w, gradcomp::detail::sparse::delta_word(idx, m, b, w));
  }
};

/// Value j of the packet: element idx[j] of the input, times `scale` when `scaled` (random-k),
/// rounded to the value type.
template <class In>
struct value_fn {
  In in;
  std::uint32_t const* idx;
  std::byte* vals;
  sparse_values v;
  bool scaled;
  float scale;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    float const f = in.at(idx[j]);
    gradcomp::detail::sparse::store_value(v, vals, j, scaled ? gradcomp::quant::scale_saturated(f, scale) : f);
  }
};

/// next[i] = p_i (error feedback, before the selected elements are corrected).
template <class In>
struct keep_fn {
  In in;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const { in.next[i] = in.at(i); }
};

/// next[idx[j]] = fma(-1, x̂_j, next[idx[j]]): what `decompress_add(packet, p, -1)` leaves.
struct subtract_fn {
  float* next;
  std::uint32_t const* idx;
  std::byte const* vals;
  sparse_values v;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    float* o = next + idx[j];
    *o = fmaf(-1.0f, gradcomp::detail::sparse::value_at(v, vals, j), *o);
  }
};

template <element T>
struct zero_fn {
  T* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const { out[i] = from_float<T>(0.0f); }
};

/// Index sources of the decoding scatter.
struct packet_index {
  std::byte const* p;
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const { return load_u32_le(p + 4 * j); }
};
struct wide_index {
  std::uint64_t const* pos;
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const { return pos[j]; }
};
struct narrow_index {
  std::uint32_t const* idx;
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const { return idx[j]; }
};

/// out[index(j)] = x̂_j, or fma(alpha, x̂_j, out[index(j)]).
template <element T, class Index>
struct scatter_fn {
  T* out;
  Index index;
  std::byte const* vals;
  sparse_values v;
  float alpha;
  bool add;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    store_decoded(out, index(j), gradcomp::detail::sparse::value_at(v, vals, j), alpha, add);
  }
};

/// Absolute indices: reports the first position whose index is not below `count` or not above
/// its predecessor.
struct check_absolute_fn {
  std::byte const* p;
  std::uint64_t count;
  status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    std::uint32_t const at = load_u32_le(p + 4 * j);
    if (at >= count || (j > 0 && at <= load_u32_le(p + 4 * (j - 1)))) report(&status->element, j);
  }
};

/// Delta terms: entry 0, then entry j + 1 (the gap), whose prefix sums are the positions.
struct delta_term_fn {
  std::byte const* p;
  unsigned b;
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const {
    return gradcomp::detail::sparse::read_delta_entry(p, j, b) + (j > 0 ? 1u : 0u);
  }
};

/// Delta positions: reports the first at or beyond `count` (positions ascend strictly, so it
/// is the one a sequential decoder stops at); one item checks the padding bits.
struct check_delta_fn {
  std::uint64_t const* pos;
  std::uint64_t count;
  status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t j) const {
    if (pos[j] >= count) report(&status->element, j);
  }
};
struct check_padding_fn {
  std::byte const* p;
  std::uint64_t m;
  unsigned b;
  status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t) const {
    if (!gradcomp::detail::sparse::delta_padding_clear(p, m, b)) report(&status->bucket, 0);
  }
};

}  // namespace sparse_ops

/// Writes the sparse packet (codec/format/sparse.hpp) of the m ascending indices `idx` of
/// input `in` (n elements, header dtype `t`): one pass for the delta width, one wait for it
/// (the encoding and the size depend on it), then the header, indices and values.
template <class In>
sparse_encoded write_sparse_packet(sparse_scratch const& ws, In const& in, std::uint32_t const* idx,
                                   std::uint64_t m, std::uint64_t n, codec_id id, dtype t,
                                   sparse_values v, std::byte* out, cudaStream_t stream) {
  auto exec = policy(stream);
  thrust::counting_iterator<std::uint64_t> const first(0);
  fill_bytes(&ws.state->width_bits, 0, sizeof(unsigned), stream);
  if (m > 0) thrust::for_each_n(exec, first, m, sparse_ops::width_fn{idx, &ws.state->width_bits});
  unsigned const width = read_report(ws, stream).state.width_bits;
  packet_header const h =
      gradcomp::detail::sparse::plan(id, t, n, m, gradcomp::detail::bit_width(width), v);
  thrust::for_each_n(exec, first, 1, header_store_fn{make_header_image(h), out});
  std::byte* const indices = out + header_bytes;
  std::uint64_t const ib = gradcomp::detail::sparse::index_bytes(h.variant, m, h.param1);
  if (gradcomp::detail::sparse::is_delta(h.variant)) {
    if (ib > 0) {
      thrust::for_each_n(exec, first, ib / 4, sparse_ops::delta_word_fn{idx, m, h.param1, indices});
    }
  } else if (m > 0) {
    thrust::for_each_n(exec, first, m, sparse_ops::absolute_index_fn{idx, indices});
  }
  if (m > 0) {
    thrust::for_each_n(exec, first, m, sparse_ops::value_fn<In>{in, idx, indices + ib, v, false, 1.0f});
  }
  return {h, idx, m, header_bytes + ib};
}

/// Decodes a validated sparse packet (codec/format/sparse.hpp) into `out`: checks every index
/// on the device and waits once (the output is untouched when the CPU codec would reject the
/// packet, with its message), then zeroes `out` (unless `add`) and scatters the values.
template <element T>
void decode_sparse_packet(sparse_scratch const& ws, packet_header const& h, std::byte const* payload,
                          T* out, std::uint64_t n, float alpha, bool add, cudaStream_t stream) {
  auto exec = policy(stream);
  thrust::counting_iterator<std::uint64_t> const first(0);
  std::uint64_t const m = h.param0;
  bool const delta = gradcomp::detail::sparse::is_delta(h.variant);
  unsigned const b = h.param1;
  if (m > 0) {
    if (delta) {
      inclusive_sum(ws.temp, ws.temp_bytes, over_positions(sparse_ops::delta_term_fn{payload, b}),
                    ws.wide, m, stream);
      thrust::for_each_n(exec, first, m, sparse_ops::check_delta_fn{ws.wide, h.count, ws.status});
      thrust::for_each_n(exec, first, 1, sparse_ops::check_padding_fn{payload, m, b, ws.status});
    } else {
      thrust::for_each_n(exec, first, m, sparse_ops::check_absolute_fn{payload, h.count, ws.status});
    }
    status_words const st = read_report(ws, stream).status;
    if (st.element != no_index) {
      std::uint64_t at = 0;
      if (delta) {
        copy_to_host(&at, ws.wide + st.element, sizeof at, stream);
      } else {
        std::byte raw[4];
        copy_to_host(raw, payload + 4 * st.element, sizeof raw, stream);
        synchronize(stream);
        at = load_u32_le(raw);
      }
      synchronize(stream);
      gradcomp::detail::sparse::throw_bad_index(h, st.element, at);
    }
    if (st.bucket != no_index) gradcomp::detail::sparse::throw_bad_padding(h);
  }
  if (!add && n > 0) thrust::for_each_n(exec, first, n, sparse_ops::zero_fn<T>{out});
  if (m == 0) return;
  auto const v = static_cast<sparse_values>(h.variant & 3u);
  std::byte const* vals = payload + gradcomp::detail::sparse::index_bytes(h.variant, m, b);
  if (delta) {
    thrust::for_each_n(exec, first, m,
                       sparse_ops::scatter_fn<T, sparse_ops::wide_index>{
                           out, sparse_ops::wide_index{ws.wide}, vals, v, alpha, add});
  } else {
    thrust::for_each_n(exec, first, m,
                       sparse_ops::scatter_fn<T, sparse_ops::packet_index>{
                           out, sparse_ops::packet_index{payload}, vals, v, alpha, add});
  }
}

/// Throws, for a compression whose input held a NaN or infinity (found by the selection
/// passes), the CPU's exception: `residual_feedback`'s for an error-feedback input, else the
/// codec `who`'s `numeric_error` naming the first one.
template <class In>
[[noreturn]] void throw_sparse_nonfinite(In const& in, std::uint64_t n, codec_id who,
                                         cudaStream_t stream, tensor_id tensor) {
  if constexpr (In::feedback) {
    throw_combine_error(in, n, stream, tensor);
  } else {
    std::uint64_t const bad =
        translate_thrust_errors([&] { return first_nonfinite(policy(stream), in, 0, n); });
    gradcomp::detail::throw_nonfinite(who, bad, value_at(in.x, bad < n ? bad : 0, stream));
  }
}

template <class Self>
class sparse_device_codec : public allocating_encoders<Self> {
 public:
  using allocating_encoders<Self>::compress;
  using allocating_encoders<Self>::compress_with_feedback;

  /// Workspace bytes of every operation of this codec on `n` elements (any alignment of the
  /// workspace pointer): about 8 n bytes (candidate and selection indices, or the delta
  /// decoder's positions) plus CUB's temporary storage.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t n) const {
    arena a(nullptr);
    (void)self().carve(a, n);
    return a.used() + arena::slack;
  }

  /// Two-phase compress (CUB's style; see cuda/detail/codec_base.cuh): with `d_temp ==
  /// nullptr` sets `temp_bytes` and returns 0; otherwise writes the packet of `d_in[0, n)` to
  /// `d_out` (at least `max_compressed_bytes(n)` bytes) and returns its size, after waiting
  /// for the stream (the size depends on the data). Random-k draws from `rs`; the others
  /// ignore it. A NaN or infinity throws the CPU codec's `numeric_error`.
  template <element T>
  std::size_t compress(void* d_temp, std::size_t& temp_bytes, T const* d_in, std::size_t n,
                       std::byte* d_out, cudaStream_t stream = nullptr,
                       random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "compress")) return 0;
    Self::check_size(n);
    arena a(d_temp);
    sparse_scratch const ws = self().carve(a, n);
    fill_bytes(ws.status, 0xff, sizeof(status_words), stream);
    return translate_thrust_errors([&] {
      return static_cast<std::size_t>(
          self().encode(ws, plain_input<T>{d_in}, n, dtype_of<T>, d_out, stream, rs).header.packet_bytes());
    });
  }

  /// Residual error feedback fused with compression (as cuda/detail/codec_base.cuh's): writes
  /// the packet of p = e + g (dtype f32; tensor `rs.tensor`) and `d_next_residual` = p −
  /// D(packet): p off the selection, fma(−1, x̂, p) on it, what `residual_feedback::compress`
  /// keeps, bit for bit. The selection passes read p; after the last wait the packet's values
  /// are written, then one pass writes p and one corrects the selected elements. A non-finite
  /// p throws `residual_feedback`'s `numeric_error` before `d_next_residual` is written (it may
  /// equal `d_residual`).
  template <element T>
  std::size_t compress_with_feedback(void* d_temp, std::size_t& temp_bytes, T const* d_grad,
                                     float const* d_residual, float* d_next_residual, std::size_t n,
                                     std::byte* d_out, cudaStream_t stream = nullptr,
                                     random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "compress_with_feedback")) return 0;
    Self::check_size(n);
    arena a(d_temp);
    sparse_scratch const ws = self().carve(a, n);
    fill_bytes(ws.status, 0xff, sizeof(status_words), stream);
    feedback_input<T> const in{d_grad, d_residual, d_next_residual, ws.status};
    return translate_thrust_errors([&] {
      sparse_encoded const r = self().encode(ws, in, n, dtype::f32, d_out, stream, rs);
      auto exec = policy(stream);
      thrust::counting_iterator<std::uint64_t> const first(0);
      if (n > 0) thrust::for_each_n(exec, first, n, sparse_ops::keep_fn<feedback_input<T>>{in});
      if (r.m > 0) {
        thrust::for_each_n(exec, first, r.m,
                           sparse_ops::subtract_fn{d_next_residual, r.idx, d_out + r.values_offset,
                                                   static_cast<sparse_values>(r.header.variant & 3u)});
      }
      return static_cast<std::size_t>(r.header.packet_bytes());
    });
  }

  /// Two-phase decompress: `d_out[0, n)` = x̂ (zero off the selection). Random-k regenerates
  /// its coordinates from `rs`'s seed and step (the tensor id is the packet's) and checks the
  /// packet's check word against them; the others ignore `rs`. A malformed packet throws what
  /// the CPU codec throws, and `d_out` is untouched.
  template <element T>
  void decompress(void* d_temp, std::size_t& temp_bytes, std::byte const* d_packet,
                  std::size_t packet_bytes, T* d_out, std::size_t n, cudaStream_t stream = nullptr,
                  random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "decompress")) return;
    run_decode(d_temp, d_packet, packet_bytes, d_out, n, 1.0f, false, stream, rs);
  }

  /// `decompress` with its workspace allocated stream-ordered on `stream`.
  template <element T>
  void decompress(std::byte const* d_packet, std::size_t packet_bytes, T* d_out, std::size_t n,
                  cudaStream_t stream = nullptr, random_stream const& rs = {}) const {
    std::size_t bytes = workspace_bytes(n);
    scratch const temp(bytes, stream);
    decompress(temp.get(), bytes, d_packet, packet_bytes, d_out, n, stream, rs);
  }

  /// Two-phase decompress-add: `d_out[i] = fma(alpha, x̂_i, d_out[i])` at the selected
  /// elements only (in float, then converted to `T`), as the CPU codec's `decompress_add`.
  template <element T>
  void decompress_add(void* d_temp, std::size_t& temp_bytes, std::byte const* d_packet,
                      std::size_t packet_bytes, T* d_out, std::size_t n, float alpha = 1.0f,
                      cudaStream_t stream = nullptr, random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "decompress_add")) return;
    run_decode(d_temp, d_packet, packet_bytes, d_out, n, alpha, true, stream, rs);
  }

  /// `decompress_add` with its workspace allocated stream-ordered on `stream`.
  template <element T>
  void decompress_add(std::byte const* d_packet, std::size_t packet_bytes, T* d_out, std::size_t n,
                      float alpha = 1.0f, cudaStream_t stream = nullptr,
                      random_stream const& rs = {}) const {
    std::size_t bytes = workspace_bytes(n);
    scratch const temp(bytes, stream);
    decompress_add(temp.get(), bytes, d_packet, packet_bytes, d_out, n, alpha, stream, rs);
  }

  /// The header of the packet at `d_packet` after the CPU codec's header checks (fields and
  /// payload size; not the indices or the check word); `n` must match its element count (else
  /// `config_error`). Waits for `stream`.
  static packet_header inspect(std::byte const* d_packet, std::size_t packet_bytes, std::size_t n,
                               cudaStream_t stream = nullptr) {
    return checked_header<typename Self::format>(probe_packet(d_packet, packet_bytes, stream),
                                                 packet_bytes, n);
  }

 private:
  Self const& self() const noexcept { return static_cast<Self const&>(*this); }

  bool workspace_ready(void* d_temp, std::size_t& temp_bytes, std::size_t n, char const* op) const {
    return detail::workspace_ready(Self::id, workspace_bytes(n), d_temp, temp_bytes, n, op);
  }

  template <element T>
  void run_decode(void* d_temp, std::byte const* d_packet, std::size_t packet_bytes, T* d_out,
                  std::size_t n, float alpha, bool add, cudaStream_t stream,
                  random_stream const& rs) const {
    packet_probe const p = probe_packet(d_packet, packet_bytes, stream);
    packet_header const h = checked_header<typename Self::format>(p, packet_bytes, n);
    arena a(d_temp);
    sparse_scratch const ws = self().carve(a, n);
    fill_bytes(ws.status, 0xff, sizeof(status_words), stream);
    translate_thrust_errors([&] {
      self().decode(ws, h, p, d_packet + header_bytes, d_out, n, alpha, add, stream, rs);
    });
  }
};

/// The selection size of top-k, approximate top-k and random-k (a count, or a ratio of n) and
/// their value type, with the CPU codecs' rules and checks.
struct sparse_budget {
  bool by_ratio = true;
  double ratio = 0.01;
  std::uint64_t k = 0;
  sparse_values values = sparse_values::f32;

  /// min(k, n) elements (k = 0: none).
  static sparse_budget of_count(std::uint64_t k, sparse_values v) {
    gradcomp::detail::sparse::check_values(v);
    return {false, 0.01, k, v};
  }
  /// max(1, floor(r n)) elements of n > 0; 0 < r <= 1, else `config_error` naming `codec`.
  static sparse_budget of_ratio(double r, sparse_values v, char const* codec) {
    gradcomp::detail::sparse::check_ratio(r, codec);
    gradcomp::detail::sparse::check_values(v);
    return {true, r, 0, v};
  }
  /// This budget with the selection size of `b` (a `gradcomp::sparse_budget`, codec/budget.hpp:
  /// a count or a factor), the value type kept; the checks of `of_count` and `of_ratio`.
  template <class Budget>
  [[nodiscard]] sparse_budget with(Budget const& b, char const* codec) const {
    return b.by_count() ? of_count(b.count_value(), values) : of_ratio(b.ratio(), values, codec);
  }
  /// Elements selected from a tensor of n.
  [[nodiscard]] std::size_t k_for(std::size_t n) const noexcept {
    return gradcomp::detail::sparse::kept_count(by_ratio, ratio, k, n);
  }
  /// Bytes of one selected element's value.
  [[nodiscard]] std::size_t value_bytes() const noexcept {
    return static_cast<std::size_t>(gradcomp::detail::sparse::value_bytes(values));
  }
  /// Nominal wire bits per element with `index_bits` per selected element (the CPU codecs'
  /// rule, codec/format/sparse.hpp's `nominal_bits`).
  [[nodiscard]] double bits(double index_bits) const noexcept {
    return gradcomp::detail::sparse::nominal_bits(by_ratio, ratio, values, index_bits);
  }
};

/// The header checks of the sparse payload for codec `Id` (`checked_header`'s format).
template <codec_id Id>
struct sparse_format {
  static constexpr codec_id id = Id;
  static void validate(packet_header const& h) { gradcomp::detail::sparse::validate(h); }
};

/// The `config_error` of a sparsifier handed more elements than its u32 indices address.
inline void check_sparse_size(codec_id id, std::uint64_t n) {
  if (n > UINT32_MAX) {
    throw config_error(std::string("gradcomp: ") + codec_name(id) + " handles at most " +
                       std::to_string(UINT32_MAX) + " elements per tensor, got " + std::to_string(n));
  }
}

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
