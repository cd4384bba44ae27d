// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradcomp::cuda::powersgd_state`: PowerSGD (codec/powersgd.hpp) of one rows × cols matrix on
/// the GPU, single-process form: error feedback, P ← M Q, orthonormalize P, Q ← Mᵀ P, and the
/// packet (header, P, Q; or the dense matrix), byte for byte what the CPU's
/// `gradcomp::powersgd::compress` writes with the built-in GEMM. `decompress` and
/// `decompress_add` decode any powersgd packet statelessly (M̂ = P Qᵀ).
///
/// The GEMMs are our own work items, one per element of the result, each evaluating the CPU
/// kernel's arithmetic for that element (core/gemm_order.hpp): P(c, i) = dot form of row c of
/// Q and row i of M (16 lane sums); Q(c, j) = axpy form over the rows, fma after fma in row
/// order; M̂(i, j) and the residual correction = axpy form over the r factors. So the packets
/// are identical, not merely close. Two small steps run on the host, with the CPU's code
/// (codec/format/powersgd.hpp): the Philox Gaussian start of Q (its `log` and `cos` are the host
/// library's, which a device library does not reproduce to the bit), and the orthonormalization
/// of P (r columns of `rows` values, sums in double, two projections per column): P is copied
/// back and forth, the point where a multi-rank PowerSGD all-reduces it anyway.
///
/// The state's buffers (M, P, Q and the previous Q) are device memory allocated once by the
/// constructor; `compress` allocates nothing. It waits for the stream: for the finiteness check
/// of the gradient (`check_finite`), for P, and for the finiteness of Q.

#include <gradcomp/codec/format/powersgd.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/gemm_order.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

/// Parameters of the device PowerSGD (those of `gradcomp::powersgd_options` but the GEMM
/// backend: the device state always follows the built-in kernel's order).
struct powersgd_options {
  std::uint32_t rank = 4;             ///< rank r of the approximation (>= 1)
  std::uint64_t min_elements = 4096;  ///< matrices with fewer elements are sent dense
  bool error_feedback = true;         ///< carry e = M − M̂ into the next step
  bool check_finite = true;           ///< scan the gradient before the state changes
};

namespace algo::powersgd_detail {

/// Reports the first element of `x` (n values of T) that is not finite.
template <class T>
struct nonfinite_fn {
  T const* x;
  detail::status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const {
    if (!detail::finite(to_float(x[i]))) detail::report(&status->element, i);
  }
};

/// M ← g (fresh) or M + g, then M −= Pᵀ Q when the last reconstruction is still to be
/// subtracted (`correct`): element (i, j) = i · cols + j.
template <class T>
struct update_fn {
  T const* g;
  float* m;
  float const* p;
  float const* q;
  std::uint64_t rows, cols;
  std::uint32_t r;
  bool fresh, correct;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t e) const {
    float v = fresh ? to_float(g[e]) : m[e] + to_float(g[e]);
    if (correct) {
      std::uint64_t const i = e / cols, j = e % cols;
      v = gemm_order::axpy(-1.0f, p + i, rows, q + j, cols, r, 1.0f, v);
    }
    m[e] = v;
  }
};

/// P(c, i) = dot(Q row c, M row i): item c · rows + i.
struct project_fn {
  float const* m;
  float const* q;
  float* p;
  std::uint64_t rows, cols;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t e) const {
    std::uint64_t const c = e / rows, i = e % rows;
    p[e] = gemm_order::store_dot(gemm_order::dot(q + c * cols, 1, m + i * cols, 1, cols), 1.0f,
                                 0.0f, 0.0f);
  }
};

/// Q(c, j) = Σ_i P(c, i) M(i, j), fma after fma in row order: item c · cols + j.
struct back_project_fn {
  float const* m;
  float const* p;
  float* q;
  std::uint64_t rows, cols;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t e) const {
    std::uint64_t const c = e / cols, j = e % cols;
    q[e] = gemm_order::axpy(1.0f, p + c * rows, 1, m + j, cols, rows, 0.0f, 0.0f);
  }
};

/// out(i, j) = Σ_c P(c, i) Q(c, j) (`residual`: M(i, j) − that).
struct product_fn {
  float const* p;
  float const* q;
  float const* m;  ///< null: the reconstruction; else the residual M − P Qᵀ
  float* out;
  std::uint64_t rows, cols;
  std::uint32_t r;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t e) const {
    std::uint64_t const i = e / cols, j = e % cols;
    out[e] = m == nullptr ? gemm_order::axpy(1.0f, p + i, rows, q + j, cols, r, 0.0f, 0.0f)
                          : gemm_order::axpy(-1.0f, p + i, rows, q + j, cols, r, 1.0f, m[e]);
  }
};

/// Decoding: out(i, j) = P Qᵀ (i, j) in the CPU's order for the output type: float outputs
/// fold alpha and the old value into the GEMM (alpha · P, beta = 1), the others round
/// P Qᵀ first and add it with one fma.
template <element T>
struct decode_fn {
  std::byte const* payload;
  T* out;
  std::uint64_t rows, cols;
  std::uint32_t r;
  bool dense;
  float alpha;
  bool add;
  GRADCOMP_HOST_DEVICE float factor(std::uint64_t at) const { return detail::load_f32_le(payload + 4 * at); }
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t e) const {
    if (dense) {
      detail::store_decoded(out, e, factor(e), alpha, add);
      return;
    }
    std::uint64_t const i = e / cols, j = e % cols;
    std::uint64_t const qb = std::uint64_t{r} * rows;
    if constexpr (std::same_as<T, float>) {
      float acc = add ? out[e] : 0.0f;
      float const a = add ? alpha : 1.0f;
      for (std::uint32_t c = 0; c < r; ++c) {
        acc = fmaf(gemm_order::product(a, factor(c * rows + i)), factor(qb + c * cols + j), acc);
      }
      out[e] = acc;
    } else {
      float acc = 0.0f;
      for (std::uint32_t c = 0; c < r; ++c) {
        acc = fmaf(gemm_order::product(1.0f, factor(c * rows + i)), factor(qb + c * cols + j), acc);
      }
      detail::store_decoded(out, e, acc, alpha, add);
    }
  }
};

/// Reports the first payload value (f32) that is not finite.
struct payload_check_fn {
  std::byte const* payload;
  detail::status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const {
    if (!detail::finite(detail::load_f32_le(payload + 4 * i))) detail::report(&status->element, i);
  }
};

/// Stores `count` floats of `src` as little-endian f32 at `out`.
struct store_fn {
  float const* src;
  std::byte* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const { detail::store_f32_le(out + 4 * i, src[i]); }
};

struct copy_fn {
  float const* src;
  float* dst;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const { dst[i] = src[i]; }
};

}  // namespace algo::powersgd_detail

/// PowerSGD of one matrix on a CUDA stream (see the file comment). Not thread-safe.
class powersgd_state {
 public:
  /// A state for a rows × cols matrix (tensor `id`); allocates its device buffers. Throws
  /// `config_error` for rank 0 or a shape whose element count overflows.
  powersgd_state(std::size_t rows, std::size_t cols, powersgd_options const& opt = {},
                 tensor_id id = tensor_id{0})
      : rows_(rows), cols_(cols), opt_(opt), id_(id) {
    if (opt.rank == 0) throw config_error("gradcomp: powersgd rank must be at least 1, got 0");
    if (cols != 0 && rows > SIZE_MAX / 4 / cols) {
      throw config_error("gradcomp: powersgd matrix shape " + gradcomp::detail::psgd::shape_text(rows, cols) +
                         " has too many elements");
    }
    mode_ = powersgd_mode_for(rows, cols, opt.rank, opt.min_elements);
    detail::arena a(nullptr);
    (void)carve(a);
    mem_ = std::make_unique<detail::scratch>(a.used() + detail::arena::slack, nullptr);
    detail::arena b(mem_->get());
    buf_ = carve(b);
  }

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] std::uint32_t rank() const noexcept { return opt_.rank; }
  [[nodiscard]] powersgd_mode mode() const noexcept { return mode_; }
  [[nodiscard]] tensor_id id() const noexcept { return id_; }
  [[nodiscard]] bool has_result() const noexcept { return has_result_; }

  /// Size of this matrix's packet (header included), as the CPU's.
  [[nodiscard]] std::size_t packet_bytes() const noexcept { return header_bytes + 4 * wire_floats(); }

  /// One single-process step of gradient `d_g` (rows · cols elements, row-major, device
  /// memory): writes the packet (`packet_bytes()`) to `d_out` and returns its size; the header's
  /// dtype is T's. `rs` gives the seed (Q's start, at the first step) and the step (a dependent
  /// column's replacement); its tensor is ignored (the state's id is used, as the CPU keys its
  /// states by the gradient's id). A non-finite gradient throws the CPU's `numeric_error` and
  /// leaves the state unchanged; a non-finite P or Q abandons the step as the CPU does.
  template <element T>
  std::size_t compress(T const* d_g, std::byte* d_out, cudaStream_t stream = nullptr,
                       random_stream const& rs = {}) {
    return detail::translate_thrust_errors([&] { return step(d_g, d_out, stream, rs); });
  }

  /// The residual e = M − M̂ carried into the next step (zeros when dense, before the first
  /// step, or without error feedback), into `d_out` (rows · cols floats).
  void residual(float* d_out, cudaStream_t stream = nullptr) const {
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    if (mode_ == powersgd_mode::dense || !m_valid_ || !opt_.error_feedback) {
      detail::fill_bytes(d_out, 0, 4 * size(), stream);
      return;
    }
    detail::translate_thrust_errors([&] {
      if (pending_) {
        thrust::for_each_n(exec, first, size(),
                           algo::powersgd_detail::product_fn{buf_.p, buf_.q, buf_.m, d_out, rows_,
                                                             cols_, opt_.rank});
      } else {
        thrust::for_each_n(exec, first, size(), algo::powersgd_detail::copy_fn{buf_.m, d_out});
      }
    });
  }

  /// Decodes a powersgd packet into `d_out` (n elements): out = M̂, converted to T. A
  /// malformed packet throws what `gradcomp::powersgd::decompress` throws (header, payload
  /// size, non-finite values, then the element count), with `d_out` untouched. Waits for
  /// `stream` twice (the header, the payload check).
  template <element T>
  static void decompress(std::byte const* d_packet, std::size_t packet_bytes, T* d_out,
                         std::size_t n, cudaStream_t stream = nullptr) {
    decode(d_packet, packet_bytes, d_out, n, 1.0f, false, stream);
  }

  /// `d_out = fma(alpha, M̂, d_out)` as `gradcomp::powersgd::decompress_add` computes it. (The
  /// decoders are static, like the CPU's; each takes a 16-byte status word stream-ordered.)
  template <element T>
  static void decompress_add(std::byte const* d_packet, std::size_t packet_bytes, T* d_out,
                             std::size_t n, float alpha = 1.0f, cudaStream_t stream = nullptr) {
    decode(d_packet, packet_bytes, d_out, n, alpha, true, stream);
  }

 private:
  struct buffers {
    float* m;
    float* p;
    float* q;
    float* q_prev;
    detail::status_words* status;
  };

  buffers carve(detail::arena& a) const {
    std::size_t const r = opt_.rank;
    bool const low = mode_ == powersgd_mode::low_rank;
    buffers s{};
    s.m = a.take<float>(size());
    s.p = a.take<float>(low ? r * rows_ : 0);
    s.q = a.take<float>(low ? r * cols_ : 0);
    s.q_prev = a.take<float>(low ? r * cols_ : 0);
    s.status = a.take<detail::status_words>(1);
    return s;
  }

  [[nodiscard]] std::size_t wire_floats() const noexcept {
    return mode_ == powersgd_mode::dense ? size() : std::size_t{opt_.rank} * (rows_ + cols_);
  }

  /// The first index of the n floats at `d` that is not finite, or n (waits).
  std::uint64_t first_nonfinite_float(float const* d, std::uint64_t n, cudaStream_t stream) const {
    detail::fill_bytes(buf_.status, 0xff, sizeof(detail::status_words), stream);
    if (n > 0) {
      thrust::for_each_n(detail::policy(stream), thrust::counting_iterator<std::uint64_t>(0), n,
                         algo::powersgd_detail::nonfinite_fn<float>{d, buf_.status});
    }
    std::uint64_t const bad = detail::read_status(buf_.status, stream).element;
    return bad == detail::no_index ? n : bad;
  }

  // After a non-finite reduction: the step is dropped; a residual that overflowed is cleared.
  void abandon_overflow(cudaStream_t stream) {
    pending_ = false;
    has_result_ = false;
    if (first_nonfinite_float(buf_.m, size(), stream) != size()) m_valid_ = false;
  }

  void write_header(std::byte* d_out, dtype t, cudaStream_t stream) const {
    packet_header h;
    h.codec = codec_id::powersgd;
    h.type = t;
    bool const dense = mode_ == powersgd_mode::dense;
    h.variant = dense ? gradcomp::detail::psgd::variant_dense : gradcomp::detail::psgd::variant_low_rank;
    h.count = size();
    h.payload_bytes = 4 * wire_floats();
    h.param0 = static_cast<std::uint32_t>(cols_);
    h.param1 = dense ? 0 : opt_.rank;
    thrust::for_each_n(detail::policy(stream), thrust::counting_iterator<std::uint64_t>(0), 1,
                       detail::header_store_fn{detail::make_header_image(h), d_out});
  }

  template <element T>
  std::size_t step(T const* d_g, std::byte* d_out, cudaStream_t stream, random_stream const& rs) {
    namespace ps = algo::powersgd_detail;
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    std::size_t const n = size(), r = opt_.rank;
    if (opt_.check_finite && n > 0) {
      detail::fill_bytes(buf_.status, 0xff, sizeof(detail::status_words), stream);
      thrust::for_each_n(exec, first, n, ps::nonfinite_fn<T>{d_g, buf_.status});
      std::uint64_t const bad = detail::read_status(buf_.status, stream).element;
      if (bad != detail::no_index) {
        gradcomp::detail::psgd::throw_nonfinite_gradient(detail::value_at(d_g, bad, stream), bad,
                                                         cols_, id_);
      }
    }
    std::byte* const payload = d_out + header_bytes;
    if (mode_ == powersgd_mode::dense) {
      has_result_ = false;
      if (n > 0) thrust::for_each_n(exec, first, n, ps::update_fn<T>{d_g, buf_.m, nullptr, nullptr, rows_, cols_, 0, true, false});
      if (first_nonfinite_float(buf_.m, n, stream) != n) gradcomp::detail::psgd::throw_nonfinite_q(id_);
      write_header(d_out, dtype_of<T>, stream);
      if (n > 0) thrust::for_each_n(exec, first, n, ps::store_fn{buf_.m, payload});
      has_result_ = true;
      return packet_bytes();
    }
    if (!q_started_) {  // the CPU's Gaussian start, on the host (see the file comment)
      std::vector<float> q(r * cols_);
      gradcomp::detail::psgd::fill_gaussian(q.data(), q.size(), random_stream{rs.seed, 0xffffffffu, static_cast<std::uint32_t>(id_)}, 0);
      detail::copy_from_host(buf_.q, q.data(), 4 * q.size(), stream);
      detail::synchronize(stream);
      q_started_ = true;
    }
    // Phase 1: M ← g + e (e = M − P Qᵀ while a reconstruction is pending), P ← M Q.
    bool const fresh = !m_valid_ || !opt_.error_feedback;
    thrust::for_each_n(exec, first, n,
                       ps::update_fn<T>{d_g, buf_.m, buf_.p, buf_.q, rows_, cols_, opt_.rank, fresh,
                                        pending_ && !fresh});
    thrust::for_each_n(exec, first, r * rows_, ps::project_fn{buf_.m, buf_.q, buf_.p, rows_, cols_});
    m_valid_ = true;
    pending_ = false;
    has_result_ = false;
    // Phase 2: orthonormalize P on the host, Q ← Mᵀ P.
    std::vector<float> p(r * rows_);
    detail::copy_to_host(p.data(), buf_.p, 4 * p.size(), stream);
    detail::synchronize(stream);
    for (float v : p) {
      if (!detail::finite(v)) {
        abandon_overflow(stream);
        gradcomp::detail::psgd::throw_nonfinite_p(id_);
      }
    }
    gradcomp::detail::psgd::orthonormalize(p.data(), rows_, r,
                                           random_stream{rs.seed, rs.step, static_cast<std::uint32_t>(id_)});
    detail::copy_from_host(buf_.p, p.data(), 4 * p.size(), stream);
    thrust::for_each_n(exec, first, r * cols_, ps::copy_fn{buf_.q, buf_.q_prev});
    thrust::for_each_n(exec, first, r * cols_, ps::back_project_fn{buf_.m, buf_.p, buf_.q, rows_, cols_});
    // Phase 3 (one rank: scale 1): a non-finite Q restores the previous one.
    if (first_nonfinite_float(buf_.q, r * cols_, stream) != r * cols_) {
      thrust::for_each_n(exec, first, r * cols_, ps::copy_fn{buf_.q_prev, buf_.q});
      abandon_overflow(stream);
      gradcomp::detail::psgd::throw_nonfinite_q(id_);
    }
    pending_ = true;
    has_result_ = true;
    write_header(d_out, dtype_of<T>, stream);
    thrust::for_each_n(exec, first, r * rows_, ps::store_fn{buf_.p, payload});
    thrust::for_each_n(exec, first, r * cols_, ps::store_fn{buf_.q, payload + 4 * r * rows_});
    return packet_bytes();
  }

  template <element T>
  static void decode(std::byte const* d_packet, std::size_t packet_bytes, T* d_out, std::size_t n,
                     float alpha, bool add, cudaStream_t stream) {
    detail::packet_probe const probe = detail::probe_packet(d_packet, packet_bytes, stream);
    packet_header const h = detail::read_probed_header(probe, packet_bytes);
    gradcomp::detail::psgd::validate(h);
    std::byte const* payload = d_packet + header_bytes;
    std::uint64_t const values = h.payload_bytes / 4;
    detail::translate_thrust_errors([&] {
      auto exec = detail::policy(stream);
      thrust::counting_iterator<std::uint64_t> const first(0);
      if (values > 0) {
        detail::scratch const st(sizeof(detail::status_words), stream);
        auto* status = static_cast<detail::status_words*>(st.get());
        detail::fill_bytes(status, 0xff, sizeof(detail::status_words), stream);
        thrust::for_each_n(exec, first, values, algo::powersgd_detail::payload_check_fn{payload, status});
        std::uint64_t const bad = detail::read_status(status, stream).element;
        if (bad != detail::no_index) gradcomp::detail::psgd::throw_nonfinite_value(bad);
      }
      if (h.count != n) {
        throw config_error("gradcomp: powersgd packet holds " + std::to_string(h.count) +
                           " elements, the output span has " + std::to_string(n));
      }
      if (n == 0) return;
      bool const dense = h.variant == gradcomp::detail::psgd::variant_dense;
      std::uint64_t const cols = h.param0;
      std::uint64_t const rows = dense ? 0 : h.count / cols;
      thrust::for_each_n(exec, first, n,
                         algo::powersgd_detail::decode_fn<T>{payload, d_out, rows, cols, h.param1,
                                                             dense, alpha, add});
    });
  }

  std::size_t rows_;
  std::size_t cols_;
  powersgd_options opt_;
  tensor_id id_;
  powersgd_mode mode_ = powersgd_mode::low_rank;
  std::unique_ptr<detail::scratch> mem_;
  buffers buf_{};
  bool q_started_ = false;
  bool m_valid_ = false;   // M holds the last step's matrix (the residual once corrected)
  bool pending_ = false;   // M̂ = P Qᵀ of the last step is still to be subtracted from M
  bool has_result_ = false;
};

GRADCOMP_CUDA_NAMESPACE_END
