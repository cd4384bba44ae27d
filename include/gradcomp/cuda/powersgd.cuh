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
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/gemm_order.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/packet.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>
#include <gradcomp/cuda/memory.cuh>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

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

/// PowerSGD of one matrix on a CUDA stream (see the file comment). Not thread-safe. The
/// single-process step is `compress`; the multi-rank step is its three phases, `begin`,
/// `after_p_reduced` and `finish`, with the factors all-reduced in between (as
/// `gradcomp::powersgd_state`'s, which `cuda::powersgd_session` drives through
/// `all_reduce_low_rank`), then `reconstruct`.
class powersgd_state {
 public:
  /// A state for a rows × cols matrix (tensor `id`); allocates its device buffers on `stream`.
  /// Throws `config_error` for rank 0 or a shape whose element count overflows.
  powersgd_state(std::size_t rows, std::size_t cols, powersgd_options const& opt = {},
                 tensor_id id = tensor_id{0}, cudaStream_t stream = nullptr)
      : rows_(rows), cols_(cols), opt_(opt), id_(id), mem_(stream) {
    if (opt.rank == 0) throw config_error("gradcomp: powersgd rank must be at least 1, got 0");
    if (cols != 0 && rows > SIZE_MAX / 4 / cols) {
      throw config_error("gradcomp: powersgd matrix shape " + gradcomp::detail::psgd::shape_text(rows, cols) +
                         " has too many elements");
    }
    mode_ = powersgd_mode_for(rows, cols, opt.rank, opt.min_elements);
    allocate();
  }
  /// A deep copy (device copies on the source's stream): what a multi-rank step keeps to
  /// restore when it fails on any rank.
  powersgd_state(powersgd_state const& o)
      : rows_(o.rows_), cols_(o.cols_), opt_(o.opt_), id_(o.id_), mode_(o.mode_), mem_(o.mem_.stream()),
        q_started_(o.q_started_), p_started_(o.p_started_), m_valid_(o.m_valid_), pending_(o.pending_), has_result_(o.has_result_),
        phase_(o.phase_) {
    allocate();
    cudaStream_t const st = mem_.stream();
    std::size_t const r = opt_.rank;
    bool const low = mode_ == powersgd_mode::low_rank;
    detail::copy_on_device(buf_.m, o.buf_.m, 4 * size(), st);
    if (low) {
      detail::copy_on_device(buf_.p, o.buf_.p, 4 * r * rows_, st);
      detail::copy_on_device(buf_.q, o.buf_.q, 4 * r * cols_, st);
      detail::copy_on_device(buf_.q_prev, o.buf_.q_prev, 4 * r * cols_, st);
    }
  }
  powersgd_state& operator=(powersgd_state const& o) {
    if (this != &o) *this = powersgd_state(o);
    return *this;
  }
  powersgd_state(powersgd_state&&) noexcept = default;
  powersgd_state& operator=(powersgd_state&&) noexcept = default;
  ~powersgd_state() = default;

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] std::uint32_t rank() const noexcept { return opt_.rank; }
  [[nodiscard]] powersgd_mode mode() const noexcept { return mode_; }
  [[nodiscard]] tensor_id id() const noexcept { return id_; }
  [[nodiscard]] bool has_result() const noexcept { return has_result_; }
  /// The stream the state's buffers were allocated on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return mem_.stream(); }

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
    return detail::translate_thrust_errors([&] {
      (void)begin(d_g, stream, rs);
      (void)after_p_reduced(stream, rs);
      finish(1.0f, stream);
      write_packet(d_out, dtype_of<T>, stream);
      return packet_bytes();
    });
  }

  /// Phase 1 of a multi-rank step, `gradcomp::powersgd_state::begin` on the device: M ← g + e,
  /// P ← M Q (Q started from the seed of `rs`, which every rank shares). Returns the device
  /// buffer to all-reduce in place: P (r × rows, column by column) or, dense, M. Throws
  /// `config_error` while a step is in progress, the CPU's `numeric_error` (state unchanged)
  /// for a non-finite gradient (unless `check_finite` is off).
  template <element T>
  std::span<float> begin(T const* d_g, cudaStream_t stream, random_stream const& rs) {
    namespace ps = algo::powersgd_detail;
    if (phase_ != phase::idle) {
      throw config_error("gradcomp: powersgd begin() called while a step is in progress (phase " +
                         std::to_string(static_cast<unsigned>(phase_)) + "); call finish() or abort() first");
    }
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    std::size_t const n = size(), r = opt_.rank;
    if (opt_.check_finite && n > 0) {
      detail::fill_bytes(buf_.status, 0xff, sizeof(detail::status_words), stream);
      thrust::for_each_n(exec, first, n, ps::nonfinite_fn<T>{d_g, buf_.status});
      std::uint64_t const bad = detail::read_status(buf_.status, stream).element;
      if (bad != detail::no_index) {
        gradcomp::detail::psgd::throw_nonfinite_gradient(detail::value_at(d_g, bad, stream), bad, cols_, id_);
      }
    }
    has_result_ = false;
    if (mode_ == powersgd_mode::dense) {
      if (n > 0) thrust::for_each_n(exec, first, n, ps::update_fn<T>{d_g, buf_.m, nullptr, nullptr, rows_, cols_, 0, true, false});
      m_valid_ = true;  // as the CPU's M, which holds the matrix now (cleared by a failed step)
      phase_ = phase::p_ready;
      return {buf_.m, n};
    }
    if (!q_started_) {  // the CPU's Gaussian start, on the host (see the file comment)
      std::vector<float> q(r * cols_);
      gradcomp::detail::psgd::fill_gaussian(q.data(), q.size(),
                                            random_stream{rs.seed, 0xffffffffu, static_cast<std::uint32_t>(id_)}, 0);
      detail::copy_from_host(buf_.q, q.data(), 4 * q.size(), stream);
      detail::synchronize(stream);
      q_started_ = true;
    }
    // M ← g + e (e = M − P Qᵀ while a reconstruction is pending), P ← M Q.
    bool const fresh = !m_valid_ || !opt_.error_feedback;
    thrust::for_each_n(exec, first, n,
                       ps::update_fn<T>{d_g, buf_.m, buf_.p, buf_.q, rows_, cols_, opt_.rank, fresh, pending_ && !fresh});
    thrust::for_each_n(exec, first, r * rows_, ps::project_fn{buf_.m, buf_.q, buf_.p, rows_, cols_});
    m_valid_ = true;
    p_started_ = true;
    pending_ = false;
    phase_ = phase::p_ready;
    return {buf_.p, r * rows_};
  }

  /// Phase 2, after P was all-reduced in place: P is orthonormalized on the host (the CPU's
  /// code, keyed by `rs`'s seed and step) and Q ← Mᵀ P. Returns Q (r × cols) to all-reduce;
  /// empty for a dense matrix. A non-finite P abandons the step (its gradient stays in the
  /// residual) and throws the CPU's `numeric_error`.
  std::span<float> after_p_reduced(cudaStream_t stream, random_stream const& rs) {
    expect_phase(phase::p_ready, "after_p_reduced");
    if (mode_ == powersgd_mode::dense) {
      phase_ = phase::q_ready;
      return {};
    }
    namespace ps = algo::powersgd_detail;
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    std::size_t const r = opt_.rank;
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
    phase_ = phase::q_ready;
    return {buf_.q, r * cols_};
  }

  /// Phase 3, after Q was all-reduced in place: Q ← scale · Q (dense: M), one rounded product
  /// as on the host. A non-finite result abandons the step (the previous Q is restored) and
  /// throws the CPU's `numeric_error`.
  void finish(float scale, cudaStream_t stream) {
    expect_phase(phase::q_ready, "finish");
    bool const dense = mode_ == powersgd_mode::dense;
    float* const v = dense ? buf_.m : buf_.q;
    std::size_t const len = dense ? size() : std::size_t{opt_.rank} * cols_;
    if (scale != 1.0f && len > 0) {
      thrust::transform(detail::policy(stream), v, v + len, v, detail::scale_by{scale});
    }
    if (first_nonfinite_float(v, len, stream) != len) {
      if (dense) {
        m_valid_ = false;
        phase_ = phase::idle;
      } else {
        thrust::for_each_n(detail::policy(stream), thrust::counting_iterator<std::uint64_t>(0), len,
                           algo::powersgd_detail::copy_fn{buf_.q_prev, buf_.q});
        abandon_overflow(stream);
      }
      gradcomp::detail::psgd::throw_nonfinite_q(id_);
    }
    if (!dense) pending_ = true;
    has_result_ = true;
    phase_ = phase::idle;
  }

  /// Abandons a step in progress (a failed collective): the warm-start Q is restored and the
  /// step's gradient stays in the residual, as `gradcomp::powersgd_state::abort`. No effect
  /// when idle.
  void abort(cudaStream_t stream) {
    if (phase_ == phase::idle) return;
    if (mode_ == powersgd_mode::dense) {
      m_valid_ = false;
    } else if (phase_ == phase::q_ready) {
      thrust::for_each_n(detail::policy(stream), thrust::counting_iterator<std::uint64_t>(0),
                         std::size_t{opt_.rank} * cols_, algo::powersgd_detail::copy_fn{buf_.q_prev, buf_.q});
    }
    pending_ = false;
    has_result_ = false;
    phase_ = phase::idle;
  }

  /// Writes the state as `gradcomp::powersgd_state::save_exact` writes the CPU's (shape, rank,
  /// Q, M, P, both flags; a buffer the CPU would hold empty is written empty), copied to the
  /// host after the work on `stream`; the bytes are the CPU state's after the same steps.
  /// `config_error` in the middle of a step.
  void save_exact(gradcomp::detail::byte_writer& w, cudaStream_t stream) const {
    if (phase_ != phase::idle) throw config_error("gradcomp: powersgd state: save in the middle of a step");
    std::size_t const r = opt_.rank;
    w.put_u64(rows_);
    w.put_u64(cols_);
    w.put_u64(r);
    w.put_floats(host_copy(buf_.q, q_started_ ? r * cols_ : 0, stream));
    w.put_floats(host_copy(buf_.m, m_valid_ ? size() : 0, stream));
    w.put_floats(host_copy(buf_.p, p_started_ ? r * rows_ : 0, stream));
    w.put_bool(pending_);
    w.put_bool(has_result_);
  }
  /// Restores what `save_exact` (of either backend) wrote, for the same shape and rank,
  /// copying it to the device on `stream`; `format_error` (and no change) otherwise.
  void load_exact(gradcomp::detail::byte_reader& rd, cudaStream_t stream) {
    std::size_t const r = opt_.rank;
    if (rd.get_u64() != rows_ || rd.get_u64() != cols_ || rd.get_u64() != r) {
      rd.fail("PowerSGD state saved for another shape or rank");
    }
    std::vector<float> const q = rd.get_floats(), m = rd.get_floats(), p = rd.get_floats();
    bool const pending = rd.get_bool(), has_result = rd.get_bool();
    bool const low = mode_ == powersgd_mode::low_rank;
    if ((!q.empty() && (!low || q.size() != r * cols_)) || (!m.empty() && m.size() != size()) ||
        (!p.empty() && (!low || p.size() != r * rows_)) || (pending && (p.empty() || q.empty()))) {
      rd.fail("PowerSGD state has factors or a residual of the wrong size");
    }
    if (!q.empty()) detail::copy_from_host(buf_.q, q.data(), 4 * q.size(), stream);
    if (!m.empty()) detail::copy_from_host(buf_.m, m.data(), 4 * m.size(), stream);
    if (!p.empty()) detail::copy_from_host(buf_.p, p.data(), 4 * p.size(), stream);
    detail::synchronize(stream);
    q_started_ = !q.empty();
    m_valid_ = !m.empty();
    p_started_ = !p.empty();
    pending_ = pending;
    has_result_ = has_result;
    phase_ = phase::idle;
  }

  /// `d_out` = M̂ (P Qᵀ, or the reduced dense matrix) of the last finished step, rows · cols
  /// floats of device memory, the bits of `gradcomp::powersgd_state::reconstruct`.
  void reconstruct(float* d_out, cudaStream_t stream) const {
    if (!has_result_ || phase_ != phase::idle) {
      throw config_error("gradcomp: powersgd reconstruct() needs a finished step");
    }
    if (size() == 0) return;
    detail::translate_thrust_errors([&] {
      auto exec = detail::policy(stream);
      thrust::counting_iterator<std::uint64_t> const first(0);
      if (mode_ == powersgd_mode::dense) {
        thrust::for_each_n(exec, first, size(), algo::powersgd_detail::copy_fn{buf_.m, d_out});
      } else {
        thrust::for_each_n(exec, first, size(),
                           algo::powersgd_detail::product_fn{buf_.p, buf_.q, nullptr, d_out, rows_, cols_, opt_.rank});
      }
    });
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
  enum class phase : std::uint8_t { idle, p_ready, q_ready };

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
  // The buffers, in one device allocation made once (a `device_buffer`: device memory to the
  // collectives, also in the host emulation).
  void allocate() {
    detail::arena a(nullptr);
    (void)carve(a);
    mem_.resize(a.used() + detail::arena::slack);
    detail::arena b(mem_.data());
    buf_ = carve(b);
  }

  // A host copy of n device floats (none: empty), after the work on `stream`.
  static std::vector<float> host_copy(float const* d, std::size_t n, cudaStream_t stream) {
    std::vector<float> h(n);
    if (n != 0) {
      detail::copy_to_host(h.data(), d, 4 * n, stream);
      detail::synchronize(stream);
    }
    return h;
  }

  void expect_phase(phase want, char const* op) const {
    if (phase_ != want) {
      throw config_error(std::string("gradcomp: powersgd ") + op + "() called in phase " +
                         std::to_string(static_cast<unsigned>(phase_)) + ", expected " +
                         std::to_string(static_cast<unsigned>(want)));
    }
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
    phase_ = phase::idle;
    if (first_nonfinite_float(buf_.m, size(), stream) != size()) m_valid_ = false;
  }

  // The packet of the finished step: header, then P and Q (or the dense matrix), f32.
  void write_packet(std::byte* d_out, dtype t, cudaStream_t stream) const {
    packet_header h;
    h.codec = codec_id::powersgd;
    h.type = t;
    bool const dense = mode_ == powersgd_mode::dense;
    h.variant = dense ? gradcomp::detail::psgd::variant_dense : gradcomp::detail::psgd::variant_low_rank;
    h.count = size();
    h.payload_bytes = 4 * wire_floats();
    h.param0 = static_cast<std::uint32_t>(cols_);
    h.param1 = dense ? 0 : opt_.rank;
    auto exec = detail::policy(stream);
    thrust::counting_iterator<std::uint64_t> const first(0);
    thrust::for_each_n(exec, first, 1, detail::header_store_fn{detail::make_header_image(h), d_out});
    std::byte* const payload = d_out + header_bytes;
    std::size_t const r = opt_.rank;
    if (dense) {
      if (size() > 0) thrust::for_each_n(exec, first, size(), algo::powersgd_detail::store_fn{buf_.m, payload});
      return;
    }
    thrust::for_each_n(exec, first, r * rows_, algo::powersgd_detail::store_fn{buf_.p, payload});
    thrust::for_each_n(exec, first, r * cols_, algo::powersgd_detail::store_fn{buf_.q, payload + 4 * r * rows_});
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
  device_buffer mem_;
  buffers buf_{};
  bool q_started_ = false;
  bool p_started_ = false;  // P was computed once (the CPU's P is not empty)
  bool m_valid_ = false;   // M holds the last step's matrix (the residual once corrected)
  bool pending_ = false;   // M̂ = P Qᵀ of the last step is still to be subtracted from M
  bool has_result_ = false;
  phase phase_ = phase::idle;
};

/// PowerSGD of one rows × cols device tensor as a `low_rank_session` (concepts/
/// low_rank_session.hpp), the device counterpart of `gradcomp::powersgd_session`: the library's
/// low-rank collective (`all_reduce_low_rank`, collective/low_rank.hpp) all-reduces its
/// factors P and Q in device memory over a communicator for device memory (the NCCL adapter,
/// comm/nccl.cuh), and `out` receives the result there. Outputs, factors and residuals are the
/// CPU session's bit for bit; the agreement round's fingerprint is the CPU session's
/// (`detail::psgd::session_fingerprint`), so ranks of both kinds agree. A step that fails on any
/// rank restores the state taken before it (`snapshot`, a device copy of the residual).
class powersgd_session {
 public:
  using low_rank_session_concept = low_rank_session_tag;

  /// A session for a rows × cols matrix (row-major) with the given options, for tensor `id`,
  /// its work enqueued on `stream` (use the communicator's).
  powersgd_session(std::size_t rows, std::size_t cols, powersgd_options const& opt = {},
                   tensor_id id = tensor_id{0}, cudaStream_t stream = nullptr)
      : state_(rows, cols, opt, id, stream), zeros_(stream) {}

  /// The device state (factors, residual).
  [[nodiscard]] powersgd_state& state() noexcept { return state_; }
  [[nodiscard]] powersgd_state const& state() const noexcept { return state_; }
  /// The memory space of the factors (collective/memory.hpp): device memory on the stream.
  [[nodiscard]] device_memory memory() const noexcept { return device_memory{state_.stream()}; }

  /// Shape, rank and mode (the CPU session's fingerprint); `config_error` unless n = rows · cols.
  [[nodiscard]] std::uint64_t shape_fingerprint(std::size_t n) const {
    check_size(n);
    return gradcomp::detail::psgd::session_fingerprint(state_.rows(), state_.cols(), state_.rank(), state_.mode());
  }

  /// Phase 1 on the device: error feedback and P = M Q; `g` (device memory) empty
  /// contributes zeros. The seed of `ctx` starts Q (every rank passes the same).
  void begin(tensor_view<float const> g, std::size_t n, codec_context const& ctx) {
    check_size(n);
    cudaStream_t const st = state_.stream();
    state_.abort(st);  // a step left half-way by a failed collective
    float const* d = g.data();
    if (g.empty() && n != 0) {
      zeros_.resize(4 * n);
      detail::fill_bytes(zeros_.data(), 0, 4 * n, st);
      d = reinterpret_cast<float const*>(zeros_.data());
    }
    first_ = detail::translate_thrust_errors([&] { return state_.begin(d, st, stream_of(ctx)); });
  }

  /// 2 (P, Q) for a low-rank matrix, 1 (the matrix) for a dense one.
  [[nodiscard]] std::size_t factor_count() const noexcept {
    return gradcomp::detail::psgd::session_factor_count(state_.mode());
  }
  /// Floats of factor `i`: P (rank × rows) or the dense matrix, then Q (rank × cols).
  [[nodiscard]] std::size_t factor_size(std::size_t i) const noexcept {
    return gradcomp::detail::psgd::session_factor_size(state_.mode(), state_.rows(), state_.cols(), state_.rank(), i);
  }
  /// Factor 0 is what `begin` computed; factor 1 (Q) is computed from the summed P. Device
  /// memory, summed in place by the collective.
  std::span<float> factor(std::size_t i, codec_context const& ctx) {
    if (i == 0) return first_;
    if (i == 1 && state_.mode() == powersgd_mode::low_rank) {
      return detail::translate_thrust_errors([&] { return state_.after_p_reduced(state_.stream(), stream_of(ctx)); });
    }
    throw config_error("gradcomp: cuda powersgd_session has no factor " + std::to_string(i) + " (it has " +
                       std::to_string(factor_count()) + ")");
  }

  /// A device copy of the whole state, taken by `all_reduce_low_rank` before a step.
  [[nodiscard]] powersgd_state snapshot() const { return state_; }
  /// The state in the CPU session's checkpoint format (`powersgd_state::save_exact`), copied to
  /// the host after the work on the session's stream.
  void save_exact(gradcomp::detail::byte_writer& w) const { state_.save_exact(w, state_.stream()); }
  /// Restores what `save_exact` (of either backend) wrote; `format_error` and no change else.
  void load_exact(gradcomp::detail::byte_reader& r) {
    state_.load_exact(r, state_.stream());
    first_ = {};
  }
  /// Puts back a `snapshot`.
  void restore(powersgd_state s) {
    state_ = std::move(s);
    first_ = {};
  }

  /// out (device memory) = alpha · P Qᵀ (or alpha · the summed dense matrix); Q becomes the
  /// next warm start.
  void finish(std::span<float> out, float alpha, codec_context const& ctx) {
    cudaStream_t const st = state_.stream();
    detail::translate_thrust_errors([&] {
      if (state_.mode() == powersgd_mode::dense) (void)state_.after_p_reduced(st, stream_of(ctx));
      state_.finish(alpha, st);
    });
    state_.reconstruct(out.data(), st);
  }

 private:
  static random_stream stream_of(codec_context const& ctx) noexcept { return random_stream{ctx.seed, ctx.step, 0}; }
  void check_size(std::size_t n) const {
    if (n != state_.size()) {
      throw config_error("gradcomp: cuda powersgd_session is for a " + std::to_string(state_.rows()) + " × " +
                         std::to_string(state_.cols()) + " matrix (" + std::to_string(state_.size()) +
                         " elements), the tensor has " + std::to_string(n));
    }
  }

  powersgd_state state_;
  device_buffer zeros_;
  std::span<float> first_;
};

static_assert(low_rank_session<powersgd_session>);

/// The PowerSGD session `gradient_pipeline` makes for a tensor of a device source whose memory
/// space is `mem` (found by argument-dependent lookup on `device_memory`; pipeline/pipeline.hpp):
/// a `powersgd_session` on `mem`'s stream with the rank, `min_elements`, `error_feedback` and
/// `check_finite` of `opt` (a `gradcomp::powersgd_options`; its GEMM backend does not apply:
/// the device follows the built-in kernel's order, byte for byte the CPU's with
/// `backend=builtin`).
template <class Options>
powersgd_session make_low_rank_session(device_memory const& mem, std::size_t rows, std::size_t cols,
                                       Options const& opt, tensor_id id) {
  powersgd_options o;
  o.rank = opt.rank;
  o.min_elements = opt.min_elements;
  o.error_feedback = opt.error_feedback;
  o.check_finite = opt.check_finite;
  return powersgd_session(rows, cols, o, id, mem.stream);
}

GRADCOMP_CUDA_NAMESPACE_END
