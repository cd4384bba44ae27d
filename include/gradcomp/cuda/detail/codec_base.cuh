// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Shared front end of the CUDA codecs (the device counterpart of codec/detail/codec_base.hpp):
/// workspace queries, header writing, packet checks, the order of the passes and the
/// synchronizations, and the translation of what the kernels report into the CPU codecs'
/// exceptions. A codec derives from `device_codec<Self>` and supplies:
///
/// - `wire_format()` — its format object (codec/format/): `header_for`, `validate`,
///   `max_compressed_bytes`;
/// - `scratch carve(arena&, std::size_t n) const` — its workspace, a struct with a member
///   `status_words* status`; the same call sizes and carves it;
/// - `void encode_codes(policy, scratch, header image, header, in, n, packet, random_stream)
///   const` — enqueues the packet's passes that no error depends on (and, for an
///   error-feedback input, the next residual);
/// - `bool decode(policy, scratch, header, payload, out, n, alpha, add) const` — enqueues the
///   decoding; returns whether it reports codes no encoder writes (then `throw_bad_code`);
///
/// and, where it has them:
///
/// - `bool encode_stats(policy, scratch, header, in, n, packet) const` — enqueues the passes
///   whose results decide whether the input can be encoded (bucket statistics, which report
///   the first bad bucket); returns whether it enqueued any;
/// - `bucket_range(k, n) const` (a pair of element indices) and `throw_finite_bucket_error(k,
///   first) const` — what a reported bucket covers, and the error of a finite bucket the
///   codec refuses;
/// - `static void check_probe(packet_header const&, packet_probe const&)` — payload checks on
///   the probed bytes (onebit's scale, padding bits);
/// - `bool decode_prefix(policy, scratch, header, payload) const` — enqueues checks of the
///   per-bucket values, which report the first bad bucket; then `throw_prefix_error(header,
///   payload, k, stream) const` throws the CPU codec's exception for bucket k;
/// - `void throw_bad_code(packet_header const&) const`.
///
/// Every call is ordered on its stream. The host waits for the stream where it must look at
/// what the device computed: once in `compress` of the bucketed codecs and onebit (the bucket
/// statistics, for the finiteness checks; the code pass is enqueued after that and not waited
/// for), once in error feedback, and once or twice in decoding (the header; then the bucket
/// values of the bucketed codecs; natural and dithering check their codes after decoding, as
/// the CPU does, and leave the output unspecified when they find a bad one).

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

template <class In>
struct nonfinite_at {
  In in;
  GRADCOMP_HOST_DEVICE bool operator()(std::uint64_t i) const { return !finite(in.at(i)); }
};

/// Index of the first element in [b, e) whose value through `in` is not finite, or `e`.
/// Synchronous.
template <class Policy, class In>
std::uint64_t first_nonfinite(Policy&& exec, In const& in, std::uint64_t b, std::uint64_t e) {
  thrust::counting_iterator<std::uint64_t> const first(b);
  thrust::counting_iterator<std::uint64_t> const last(e);
  return b + static_cast<std::uint64_t>(thrust::find_if(exec, first, last, nonfinite_at<In>{in}) -
                                        first);
}

/// Element `i` of a backend tensor, read by the host.
template <element T>
float value_at(T const* d_x, std::uint64_t i, cudaStream_t stream) {
  T v{};
  copy_to_host(&v, d_x + i, sizeof(T), stream);
  synchronize(stream);
  return to_float(v);
}

/// The element functions' statuses, read by the host (waits for `stream`).
inline status_words read_status(status_words const* d_status, cudaStream_t stream) {
  status_words s{no_index, no_index};
  copy_to_host(&s, d_status, sizeof s, stream);
  synchronize(stream);
  return s;
}

/// The two-phase protocol's first step for codec `id`, whose operation `op` on n elements needs
/// `need` workspace bytes: with a null workspace sets `temp_bytes` and returns false (a query);
/// with too small a workspace throws `config_error`; else returns true.
inline bool workspace_ready(codec_id id, std::size_t need, void* d_temp, std::size_t& temp_bytes,
                            std::size_t n, char const* op) {
  if (d_temp == nullptr) {
    temp_bytes = need;
    return false;
  }
  if (temp_bytes < need) {
    throw config_error(std::string("gradcomp: cuda ") + codec_name(id) + " " + op + " of " +
                       std::to_string(n) + " elements needs " + std::to_string(need) +
                       " workspace bytes, got " + std::to_string(temp_bytes));
  }
  return true;
}

/// The error of policy `who` (`residual_feedback` unless named) for a non-finite value computed
/// from feedback input `in` (n elements of tensor `tensor`): the gradient's first non-finite
/// element, else an overflow of the state. Waits for `stream`.
template <class In>
[[noreturn]] void throw_combine_error(In const& in, std::uint64_t n, cudaStream_t stream,
                                      tensor_id tensor, char const* who = "residual_feedback") {
  plain_input<typename In::element_type> const grad{in.g};
  std::uint64_t const bad =
      translate_thrust_errors([&] { return first_nonfinite(policy(stream), grad, 0, n); });
  if (bad < n) {
    gradcomp::detail::throw_nonfinite_gradient(who, value_at(in.g, bad, stream), bad, tensor);
  }
  gradcomp::detail::throw_state_overflow(who, tensor);
}

/// The encoders that allocate their workspace (stream-ordered, `cudaMallocAsync` on `stream`)
/// and call `Self`'s two-phase forms; shared by the element codecs and the sparsifiers.
template <class Self>
class allocating_encoders {
 public:
  /// `compress` with its workspace allocated and freed stream-ordered on `stream`.
  template <element T>
  std::size_t compress(T const* d_in, std::size_t n, std::byte* d_out,
                       cudaStream_t stream = nullptr, random_stream const& rs = {}) const {
    Self const& self = static_cast<Self const&>(*this);
    std::size_t bytes = self.workspace_bytes(n);
    scratch const temp(bytes, stream);
    return self.compress(temp.get(), bytes, d_in, n, d_out, stream, rs);
  }

  /// `compress_with_feedback` with its workspace allocated stream-ordered on `stream`.
  template <element T>
  std::size_t compress_with_feedback(T const* d_grad, float const* d_residual,
                                     float* d_next_residual, std::size_t n, std::byte* d_out,
                                     cudaStream_t stream = nullptr,
                                     random_stream const& rs = {}) const {
    Self const& self = static_cast<Self const&>(*this);
    std::size_t bytes = self.workspace_bytes(n);
    scratch const temp(bytes, stream);
    return self.compress_with_feedback(temp.get(), bytes, d_grad, d_residual, d_next_residual, n,
                                       d_out, stream, rs);
  }
};

template <class Self>
class device_codec : public allocating_encoders<Self> {
 public:
  using allocating_encoders<Self>::compress;
  using allocating_encoders<Self>::compress_with_feedback;

  /// The largest packet for `n` elements (that of float32 input); exact for the codecs whose
  /// packet size does not depend on the input type (all but identity).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const {
    return self().wire_format().max_compressed_bytes(n);
  }

  /// Workspace bytes of every operation of this codec on `n` elements (any alignment of the
  /// workspace pointer). The two-phase overloads report it for a null workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t n) const {
    arena a(nullptr);
    (void)self().carve(a, n);
    return a.used() + arena::slack;
  }

  /// Two-phase compress (CUB's style). With `d_temp == nullptr`, sets `temp_bytes` to
  /// `workspace_bytes(n)`, does nothing else and returns 0. Otherwise writes the packet of
  /// `d_in[0, n)` to `d_out` (at least `max_compressed_bytes(n)` bytes) using the workspace
  /// (`temp_bytes` at least the size asked for, else `config_error`) and returns the packet
  /// size. Stochastic codecs draw from `rs` (seed, step, tensor id), as the CPU codec does from
  /// the context's seed and step and the tensor's id. A NaN or infinite element, or one the
  /// codec cannot encode, throws the CPU codec's `numeric_error`; the packet is then invalid.
  template <element T>
  std::size_t compress(void* d_temp, std::size_t& temp_bytes, T const* d_in, std::size_t n,
                       std::byte* d_out, cudaStream_t stream = nullptr,
                       random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "compress")) return 0;
    packet_header const h = self().wire_format().header_for(n, dtype_of<T>);
    arena a(d_temp);
    run_encode(self().carve(a, n), h, plain_input<T>{d_in}, n, d_out, stream, rs, tensor_id{});
    return static_cast<std::size_t>(h.packet_bytes());
  }

  /// Residual error feedback fused with compression, for gradient `d_grad[0, n)` of tensor
  /// `rs.tensor` and residual `d_residual` (float32; null for zero, a first step): writes the
  /// packet of p = e + g (its header's dtype is f32, as `residual_feedback` compresses a
  /// float32 p) and the next residual p − D(packet) to `d_next_residual`, byte for byte what
  /// `residual_feedback::compress` writes and keeps. Workspace as in `compress`.
  ///
  /// A non-finite p throws `residual_feedback`'s `numeric_error` (naming the first non-finite
  /// gradient element, else the overflowed state), before the codec's own errors. On any
  /// error `d_next_residual` is not written, except for identity, fp16 and bf16, whose single
  /// pass writes it before the check; `d_next_residual` may equal `d_residual` (in place),
  /// which for those three leaves the residual unspecified after an error.
  template <element T>
  std::size_t compress_with_feedback(void* d_temp, std::size_t& temp_bytes, T const* d_grad,
                                     float const* d_residual, float* d_next_residual, std::size_t n,
                                     std::byte* d_out, cudaStream_t stream = nullptr,
                                     random_stream const& rs = {}) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "compress_with_feedback")) return 0;
    packet_header const h = self().wire_format().header_for(n, dtype::f32);
    arena a(d_temp);
    auto const ws = self().carve(a, n);
    run_encode(ws, h, feedback_input<T>{d_grad, d_residual, d_next_residual, ws.status}, n, d_out,
               stream, rs, static_cast<tensor_id>(rs.tensor));
    return static_cast<std::size_t>(h.packet_bytes());
  }

  /// Two-phase decompress: `d_out[0, n) = x̂` (converted to `T` as the CPU codec converts it;
  /// a packet of `T`'s own type is copied bit for bit by the element-type codecs). A malformed
  /// packet, or one of another element count, throws what the CPU codec throws.
  template <element T>
  void decompress(void* d_temp, std::size_t& temp_bytes, std::byte const* d_packet,
                  std::size_t packet_bytes, T* d_out, std::size_t n,
                  cudaStream_t stream = nullptr) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "decompress")) return;
    run_decode(d_temp, d_packet, packet_bytes, d_out, n, 1.0f, false, stream);
  }

  /// `decompress` with its workspace allocated stream-ordered on `stream`.
  template <element T>
  void decompress(std::byte const* d_packet, std::size_t packet_bytes, T* d_out, std::size_t n,
                  cudaStream_t stream = nullptr) const {
    std::size_t bytes = workspace_bytes(n);
    scratch const temp(bytes, stream);
    decompress(temp.get(), bytes, d_packet, packet_bytes, d_out, n, stream);
  }

  /// Two-phase decompress-add: `d_out = fma(alpha, x̂, d_out)` (in float, one rounding, then
  /// converted to `T`), as the CPU codec's `decompress_add`.
  template <element T>
  void decompress_add(void* d_temp, std::size_t& temp_bytes, std::byte const* d_packet,
                      std::size_t packet_bytes, T* d_out, std::size_t n, float alpha = 1.0f,
                      cudaStream_t stream = nullptr) const {
    if (!workspace_ready(d_temp, temp_bytes, n, "decompress_add")) return;
    run_decode(d_temp, d_packet, packet_bytes, d_out, n, alpha, true, stream);
  }

  /// `decompress_add` with its workspace allocated stream-ordered on `stream`.
  template <element T>
  void decompress_add(std::byte const* d_packet, std::size_t packet_bytes, T* d_out, std::size_t n,
                      float alpha = 1.0f, cudaStream_t stream = nullptr) const {
    std::size_t bytes = workspace_bytes(n);
    scratch const temp(bytes, stream);
    decompress_add(temp.get(), bytes, d_packet, packet_bytes, d_out, n, alpha, stream);
  }

  /// The header of the `packet_bytes`-byte packet at `d_packet` after the checks the CPU codec
  /// makes before decoding anything (header fields, payload size, and what the probed bytes
  /// hold); `n` must match its element count (else `config_error`). Waits for `stream`.
  static packet_header inspect(std::byte const* d_packet, std::size_t packet_bytes, std::size_t n,
                               cudaStream_t stream = nullptr) {
    packet_probe const p = probe_packet(d_packet, packet_bytes, stream);
    using format = decltype(std::declval<Self const&>().wire_format());
    packet_header const h = checked_header<format>(p, packet_bytes, n);
    if constexpr (requires { Self::check_probe(h, p); }) Self::check_probe(h, p);
    return h;
  }

 private:
  Self const& self() const noexcept { return static_cast<Self const&>(*this); }

  bool workspace_ready(void* d_temp, std::size_t& temp_bytes, std::size_t n, char const* op) const {
    return detail::workspace_ready(Self::id, workspace_bytes(n), d_temp, temp_bytes, n, op);
  }

  template <class Scratch, class In>
  void run_encode(Scratch const& ws, packet_header const& h, In const& in, std::size_t n,
                  std::byte* d_out, cudaStream_t stream, random_stream const& rs,
                  tensor_id tensor) const {
    header_image const img = make_header_image(h);
    fill_bytes(ws.status, 0xff, sizeof(status_words), stream);
    bool stats = false;
    if constexpr (requires { self().encode_stats(policy(stream), ws, h, in, n, d_out); }) {
      stats = translate_thrust_errors(
          [&] { return self().encode_stats(policy(stream), ws, h, in, n, d_out); });
    }
    if (stats) throw_encode_errors(read_status(ws.status, stream), in, n, stream, tensor);
    translate_thrust_errors(
        [&] { self().encode_codes(policy(stream), ws, img, h, in, n, d_out, rs); });
    if (!stats && In::feedback) {
      throw_encode_errors(read_status(ws.status, stream), in, n, stream, tensor);
    }
  }

  template <class In>
  void throw_encode_errors(status_words const& st, In const& in, std::size_t n, cudaStream_t stream,
                           tensor_id tensor) const {
    if constexpr (In::feedback) {
      if (st.element != no_index) throw_combine_error(in, n, stream, tensor);
    }
    if constexpr (requires { self().bucket_range(st.bucket, n); }) {
      if (st.bucket == no_index) return;
      auto const [b, e] = self().bucket_range(st.bucket, n);
      if constexpr (!In::feedback) {  // with feedback, a non-finite p was reported above
        std::uint64_t const bad =
            translate_thrust_errors([&] { return first_nonfinite(policy(stream), in, b, e); });
        if (bad < e) {
          gradcomp::detail::throw_nonfinite(Self::id, bad, value_at(in.x, bad, stream));
        }
      }
      if constexpr (requires { self().throw_finite_bucket_error(st.bucket, b); }) {
        self().throw_finite_bucket_error(st.bucket, b);
      }
      throw numeric_error(std::string("gradcomp: cuda ") + codec_name(Self::id) +
                          " cannot encode the bucket at element " + std::to_string(b));
    }
  }

  template <element T>
  void run_decode(void* d_temp, std::byte const* d_packet, std::size_t packet_bytes, T* d_out,
                  std::size_t n, float alpha, bool add, cudaStream_t stream) const {
    packet_header const h = inspect(d_packet, packet_bytes, n, stream);
    std::byte const* payload = d_packet + header_bytes;
    arena a(d_temp);
    auto const ws = self().carve(a, n);
    fill_bytes(ws.status, 0xff, sizeof(status_words), stream);
    if constexpr (requires { self().decode_prefix(policy(stream), ws, h, payload); }) {
      bool const prefix = translate_thrust_errors(
          [&] { return self().decode_prefix(policy(stream), ws, h, payload); });
      if (prefix) {
        status_words const st = read_status(ws.status, stream);
        if (st.bucket != no_index) self().throw_prefix_error(h, payload, st.bucket, stream);
      }
    }
    bool const codes = translate_thrust_errors(
        [&] { return self().decode(policy(stream), ws, h, payload, d_out, n, alpha, add); });
    if constexpr (requires { self().throw_bad_code(h); }) {
      if (codes && read_status(ws.status, stream).element != no_index) self().throw_bad_code(h);
    }
  }
};

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
