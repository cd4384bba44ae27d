// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): rank-r compression of a gradient
/// matrix M (rows × cols) by one step of power iteration with a warm-started Q, with its own
/// error feedback. Aggregation kind low-rank: ranks all-reduce the factors, not the matrix.
///
/// One training step of one matrix on every rank (docs/algorithms.md, "PowerSGD"):
///
///     M ← g + e                                  (error feedback)
///     P ← M Q              all-reduce(P)         `begin` returns P to reduce
///     P ← orthonormalize(P)
///     Q ← Mᵀ P             all-reduce(Q)         `after_p_reduced` returns Q to reduce
///     Q ← scale · Q        (1/W averages)        `finish(scale)`
///     M̂ = P Qᵀ;  e ← M − M̂                       `reconstruct`, `residual`
///
/// Q is kept per tensor as the next step's starting point; it starts as the same Philox
/// Gaussian matrix on every rank (key = `codec_context::seed`). Matrices too small to gain
/// (r (rows + cols) ≥ rows · cols, or fewer than `min_elements` elements, which covers 1-D
/// tensors and biases) are sent dense in f32 instead, with no error (`powersgd_mode::dense`).
///
/// The state is what distinguishes PowerSGD from the stateless `codec` concept: the next
/// packet depends on the warm-start Q, so `compress` is not a const function of its input.
/// `powersgd_state` is therefore the protocol object for the collective layer (one per
/// tensor), and `powersgd` keeps one per tensor id and also offers a single-process form:
/// `compress` runs both phases locally and writes a packet (header + P + Q, f32;
/// docs/wire-format.md) that any rank decodes statelessly (`powersgd::decompress`, and
/// `decompress_any`).
///
/// Factors are stored column by column: column c of P is `p()[c * rows, (c + 1) * rows)`, of
/// Q `q()[c * cols, (c + 1) * cols)`, so M̂(i, j) = Σ_c P[c][i] Q[c][j].

#include <gradcomp/codec/format/common.hpp>
#include <gradcomp/codec/format/powersgd.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/feedback.hpp>
#include <gradcomp/cpu/kernels/finite.hpp>
#include <gradcomp/cpu/kernels/gemm.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/cpu/tuning.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Parameters of PowerSGD.
struct powersgd_options {
  /// Rank r of the approximation (≥ 1).
  std::uint32_t rank = 4;
  /// Matrices with fewer elements are sent dense.
  std::uint64_t min_elements = 4096;
  /// GEMM implementation (`automatic`: BLAS where compiled in, else the built-in kernel).
  cpu::gemm_backend backend = cpu::gemm_backend::automatic;
  /// Carry the residual e = M − M̂ into the next step (the paper's error feedback). Off, each
  /// step compresses its gradient alone; repeated steps on one matrix are then plain warm-started
  /// power iteration.
  bool error_feedback = true;
  /// Scan the gradient for NaN and infinities before the state changes (one extra read of
  /// the gradient; about a fifth of a step's memory traffic). Off, a non-finite gradient is
  /// still caught, as a non-finite P after the all-reduce (on every rank, so the ranks stay
  /// in agreement), but the residual of the tensor that held it is cleared instead of kept.
  bool check_finite = true;
};

/// Where a `powersgd_state` is in its step.
enum class powersgd_phase : std::uint8_t {
  idle = 0,     ///< between steps
  p_ready = 1,  ///< `begin` ran: the first buffer awaits its all-reduce
  q_ready = 2,  ///< `after_p_reduced` ran: Q awaits its all-reduce
};

namespace detail::psgd {

/// Throws `config_error` for a backend this program cannot run.
inline void check_backend(cpu::gemm_backend b) {
  if (b == cpu::gemm_backend::blas && !cpu::gemm_has_blas) {
    throw config_error(
        "gradcomp: powersgd backend 'blas' needs a program built with "
        "GRADCOMP_USE_CBLAS (link gradcomp::blas)");
  }
}

/// Index of the first non-finite value of x[0, n), or n.
template <class T>
std::size_t first_nonfinite(T const* x, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(to_float(x[i]))) return i;
  }
  return n;
}

/// Whether x[0, n) is all finite (one read, chunked over the context's pool).
inline bool all_finite(float const* x, std::size_t n, codec_context const& ctx) {
  std::atomic<bool> ok{true};
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
    if (!cpu::kernels::all_finite(x + b, e - b, level)) ok.store(false, std::memory_order_relaxed);
  });
  return ok.load();
}

}  // namespace detail::psgd

/// The PowerSGD state of one matrix and the phases of one step (see file comment). Not
/// thread-safe; the GEMMs inside run on the context's pool.
///
/// A step: `begin(g)` → all-reduce the returned span in place (sum) → `after_p_reduced()` →
/// all-reduce the returned span in place (sum; empty for a dense matrix) → `finish(1/W)` →
/// `reconstruct(out)` gives the averaged matrix. The caller's `g` need not outlive `begin`.
/// After an exception the state is back to `idle` and the step's gradient is kept in the
/// residual (nothing was sent), except where documented.
class powersgd_state {
 public:
  /// A state for a rows × cols matrix (tensor `id`). Throws `config_error` for rank 0 or a
  /// shape whose element count overflows.
  powersgd_state(std::size_t rows, std::size_t cols, powersgd_options const& opt = {},
                 tensor_id id = tensor_id{0})
      : rows_(rows),
        cols_(cols),
        rank_(opt.rank),
        backend_(opt.backend),
        feedback_(opt.error_feedback),
        check_(opt.check_finite),
        id_(id) {
    if (opt.rank == 0) {
      throw config_error("gradcomp: powersgd rank must be at least 1, got 0");
    }
    if (cols != 0 && rows > SIZE_MAX / 4 / cols) {
      throw config_error("gradcomp: powersgd matrix shape " + detail::psgd::shape_text(rows, cols) +
                         " has too many elements");
    }
    detail::psgd::check_backend(opt.backend);
    mode_ = powersgd_mode_for(rows, cols, opt.rank, opt.min_elements);
  }

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] std::uint32_t rank() const noexcept { return rank_; }
  [[nodiscard]] powersgd_mode mode() const noexcept { return mode_; }
  [[nodiscard]] powersgd_phase phase() const noexcept { return phase_; }
  [[nodiscard]] tensor_id id() const noexcept { return id_; }
  /// True once a step has finished (so `reconstruct` and `write_packet` have a result).
  [[nodiscard]] bool has_result() const noexcept { return has_result_; }

  /// Floats exchanged per step: r (rows + cols), or rows · cols when dense.
  [[nodiscard]] std::size_t wire_floats() const noexcept {
    return mode_ == powersgd_mode::dense ? size() : std::size_t{rank_} * (rows_ + cols_);
  }
  /// Size of this matrix's packet (header included).
  [[nodiscard]] std::size_t packet_bytes() const noexcept {
    return header_bytes + 4 * wire_floats();
  }

  /// Phase 1: M ← g + e, P ← M Q (Q initialized from Philox at the first step). Returns the
  /// buffer to all-reduce: P (r × rows, column by column) or, dense, the matrix itself.
  /// Throws `config_error` if `g` does not have rows · cols elements or a step is already in
  /// progress, `numeric_error` (state unchanged) if `g` holds a NaN or infinity (unless
  /// `powersgd_options::check_finite` is off).
  template <element T>
  std::span<float> begin(tensor_view<T const> g, codec_context const& ctx = {}) {
    if (phase_ != powersgd_phase::idle) {
      throw config_error("gradcomp: powersgd begin() called while a step is in progress (phase " +
                         std::to_string(static_cast<unsigned>(phase_)) +
                         "); call finish() or abort() first");
    }
    if (g.size() != size()) {
      throw config_error(
          "gradcomp: powersgd state of tensor " + std::to_string(static_cast<unsigned>(id_)) +
          " is for a " + detail::psgd::shape_text(rows_, cols_) + " matrix (" +
          std::to_string(size()) + " elements), the gradient has " + std::to_string(g.size()));
    }
    if (check_) check_finite(g, ctx);
    if (mode_ == powersgd_mode::dense) {
      m_.resize(size());
      for (std::size_t i = 0; i < size(); ++i) m_[i] = to_float(g[i]);
      phase_ = powersgd_phase::p_ready;
      has_result_ = false;
      return m_;
    }
    if (q_.empty()) init_q(ctx.seed);  // the seed all ranks share
    p_.resize(std::size_t{rank_} * rows_);
    bool const fresh = m_.empty() || !feedback_;
    m_.resize(size());
    update_and_project(g, fresh, ctx);
    pending_ = false;  // the last reconstruction is now subtracted from M
    has_result_ = false;
    phase_ = powersgd_phase::p_ready;
    return p_;
  }

  /// Convenience overload for a span (the state's tensor id).
  template <element T>
  std::span<float> begin(std::span<T const> g, codec_context const& ctx = {}) {
    return begin(tensor_view<T const>(g, id_), ctx);
  }

  /// Phase 2, after P was all-reduced in place: orthonormalizes P and computes Q ← Mᵀ P.
  /// Returns Q (r × cols, column by column) to all-reduce; empty for a dense matrix. Throws
  /// `numeric_error` if the reduced P is not finite (an overflow on some rank); the step is
  /// then abandoned and its gradient stays in the residual.
  std::span<float> after_p_reduced(codec_context const& ctx = {}) {
    expect_phase(powersgd_phase::p_ready, "after_p_reduced");
    if (mode_ == powersgd_mode::dense) {
      phase_ = powersgd_phase::q_ready;
      return {};
    }
    if (detail::psgd::first_nonfinite(p_.data(), p_.size()) != p_.size()) {
      abandon_overflow(ctx);
      detail::psgd::throw_nonfinite_p(id_);
    }
    detail::psgd::orthonormalize(
        p_.data(), rows_, rank_,
        random_stream{ctx.seed, ctx.step, static_cast<std::uint32_t>(id_)});
    q_prev_ = q_;
    cpu::gemm(cpu::transpose::no, cpu::transpose::no, rank_, cols_, rows_, 1.0f, p_.data(), rows_,
              m_.data(), cols_, 0.0f, q_.data(), cols_, ctx, backend_);
    phase_ = powersgd_phase::q_ready;
    return q_;
  }

  /// Phase 3, after Q was all-reduced in place: Q ← scale · Q (scale = 1/W averages the
  /// ranks' matrices); dense: the reduced matrix is scaled. Q becomes the next step's start.
  /// Throws `numeric_error` if the result is not finite (the step is then abandoned).
  void finish(float scale = 1.0f, codec_context const& ctx = {}) {
    expect_phase(powersgd_phase::q_ready, "finish");
    std::vector<float>& v = mode_ == powersgd_mode::dense ? m_ : q_;
    if (scale != 1.0f) {
      for (float& x : v) x *= scale;
    }
    if (detail::psgd::first_nonfinite(v.data(), v.size()) != v.size()) {
      if (mode_ == powersgd_mode::dense) {
        m_.clear();
        phase_ = powersgd_phase::idle;
      } else {
        q_ = q_prev_;
        abandon_overflow(ctx);
      }
      detail::psgd::throw_nonfinite_q(id_);
    }
    if (mode_ == powersgd_mode::low_rank) pending_ = true;
    has_result_ = true;
    phase_ = powersgd_phase::idle;
  }

  /// Abandons a step in progress (say, after a failed collective): the warm-start Q is
  /// restored and the step's gradient stays in the residual. No effect when idle.
  void abort() noexcept {
    if (phase_ == powersgd_phase::idle) return;
    if (mode_ == powersgd_mode::dense) {
      m_.clear();
    } else if (phase_ == powersgd_phase::q_ready) {
      q_.swap(q_prev_);
    }
    pending_ = false;
    has_result_ = false;
    phase_ = powersgd_phase::idle;
  }

  /// The factors (column by column; see file comment), and for a dense matrix the exchanged
  /// matrix. Valid after the phase that computes them.
  [[nodiscard]] std::span<float const> p() const noexcept { return p_; }
  [[nodiscard]] std::span<float const> q() const noexcept { return q_; }
  [[nodiscard]] std::span<float const> dense() const noexcept {
    return mode_ == powersgd_mode::dense ? std::span<float const>(m_) : std::span<float const>();
  }

  /// out = M̂ (= P Qᵀ, or the reduced dense matrix) of the last finished step.
  template <element T>
  void reconstruct(std::span<T> out, codec_context const& ctx = {}) const {
    write_result(out, 1.0f, false, ctx);
  }
  /// out += alpha · M̂.
  template <element T>
  void reconstruct_add(std::span<T> out, float alpha = 1.0f, codec_context const& ctx = {}) const {
    write_result(out, alpha, true, ctx);
  }

  /// The error-feedback residual e = M − M̂ carried into the next step (zeros when dense,
  /// before the first step, or without error feedback). Valid when idle.
  [[nodiscard]] std::vector<float> residual(codec_context const& ctx = {}) const {
    std::vector<float> e(size());
    if (mode_ == powersgd_mode::dense || m_.empty() || !feedback_) return e;
    std::copy(m_.begin(), m_.end(), e.begin());
    if (pending_) {
      cpu::gemm(cpu::transpose::yes, cpu::transpose::no, rows_, cols_, rank_, -1.0f, p_.data(),
                rows_, q_.data(), cols_, 1.0f, e.data(), cols_, ctx, backend_);
    }
    return e;
  }

  /// Writes the packet of the last finished step (`packet_bytes()` bytes: header, then P and Q
  /// column by column, or the dense matrix, all f32) and returns its size. `type` is the dtype
  /// of the compressed gradient, recorded in the header. Throws `config_error` if no step has
  /// finished or `out` is too small.
  std::size_t write_packet(std::span<std::byte> out, dtype type = dtype::f32) const {
    if (!has_result_ || phase_ != powersgd_phase::idle) {
      throw config_error("gradcomp: powersgd write_packet() needs a finished step");
    }
    if (out.size() < packet_bytes()) {
      throw config_error("gradcomp: output buffer of " + std::to_string(out.size()) +
                         " bytes is smaller than the " + std::to_string(packet_bytes()) +
                         "-byte powersgd packet");
    }
    packet_header h;
    h.codec = codec_id::powersgd;
    h.type = type;
    h.variant = mode_ == powersgd_mode::dense ? detail::psgd::variant_dense
                                              : detail::psgd::variant_low_rank;
    h.count = size();
    h.payload_bytes = 4 * wire_floats();
    h.param0 = static_cast<std::uint32_t>(cols_);
    h.param1 = mode_ == powersgd_mode::dense ? 0 : rank_;
    write_header(out, h);
    std::byte* w = out.data() + header_bytes;
    auto put = [&](std::vector<float> const& v) {
      for (float x : v) {
        detail::store_f32(w, x);
        w += 4;
      }
    };
    if (mode_ == powersgd_mode::dense) {
      put(m_);
    } else {
      put(p_);
      put(q_);
    }
    return packet_bytes();
  }

  /// Writes the exact state between steps — Q, the accumulated M, the last P and whether P Qᵀ
  /// is still to be subtracted from M — so that `load_exact` resumes bit for bit (`residual`
  /// and `restore` carry the same residual, rounded differently). `config_error` in the middle
  /// of a step.
  void save_exact(detail::byte_writer& w) const {
    if (phase_ != powersgd_phase::idle) throw config_error("gradcomp: powersgd state: save in the middle of a step");
    w.put_u64(rows_);
    w.put_u64(cols_);
    w.put_u64(rank_);
    w.put_floats(q_);
    w.put_floats(m_);
    w.put_floats(p_);
    w.put_bool(pending_);
    w.put_bool(has_result_);
  }
  /// Restores what `save_exact` wrote, for the same shape and rank; `format_error` (and no
  /// change) otherwise.
  void load_exact(detail::byte_reader& r) {
    if (r.get_u64() != rows_ || r.get_u64() != cols_ || r.get_u64() != rank_) {
      r.fail("PowerSGD state saved for another shape or rank");
    }
    std::vector<float> q = r.get_floats(), m = r.get_floats(), p = r.get_floats();
    bool const pending = r.get_bool(), has_result = r.get_bool();
    bool const low = mode_ == powersgd_mode::low_rank;
    if ((!q.empty() && (!low || q.size() != std::size_t{rank_} * cols_)) || (!m.empty() && m.size() != size()) ||
        (!p.empty() && (!low || p.size() != std::size_t{rank_} * rows_)) || (pending && (p.empty() || q.empty()))) {
      r.fail("PowerSGD state has factors or a residual of the wrong size");
    }
    q_ = std::move(q);
    m_ = std::move(m);
    p_ = std::move(p);
    q_prev_.clear();
    pending_ = pending;
    has_result_ = has_result;
    phase_ = powersgd_phase::idle;
  }

  /// Replaces the state by a saved one: the warm-start Q (r × cols; empty = not started) and
  /// the residual (rows · cols; empty = zero). Throws `config_error` on wrong sizes.
  void restore(std::span<float const> q, std::span<float const> residual) {
    if (!q.empty() && (mode_ == powersgd_mode::dense || q.size() != std::size_t{rank_} * cols_)) {
      throw config_error("gradcomp: powersgd restore: Q of " + std::to_string(q.size()) +
                         " values does not fit this " + detail::psgd::shape_text(rows_, cols_) +
                         " rank-" + std::to_string(rank_) + " state");
    }
    if (!residual.empty() && (mode_ == powersgd_mode::dense || residual.size() != size())) {
      throw config_error("gradcomp: powersgd restore: residual of " +
                         std::to_string(residual.size()) + " values does not fit this " +
                         detail::psgd::shape_text(rows_, cols_) + " state");
    }
    q_.assign(q.begin(), q.end());
    q_prev_.clear();
    m_.assign(residual.begin(), residual.end());
    p_.clear();
    pending_ = false;
    has_result_ = false;
    phase_ = powersgd_phase::idle;
  }

 private:
  template <element T>
  void check_finite(tensor_view<T const> g, codec_context const& ctx) const {
    bool ok;
    if constexpr (std::same_as<T, float>) {
      ok = detail::psgd::all_finite(g.data(), g.size(), ctx);
    } else {
      ok = detail::psgd::first_nonfinite(g.data(), g.size()) == g.size();
    }
    if (ok) return;
    std::size_t const at = detail::psgd::first_nonfinite(g.data(), g.size());
    detail::psgd::throw_nonfinite_gradient(to_float(g[at]), at, cols_, g.id());
  }

  void expect_phase(powersgd_phase want, char const* call) const {
    if (phase_ != want) {
      throw config_error(std::string("gradcomp: powersgd ") + call + "() called in phase " +
                         std::to_string(static_cast<unsigned>(phase_)) + ", expected phase " +
                         std::to_string(static_cast<unsigned>(want)) +
                         " (begin, after_p_reduced, finish, in that order)");
    }
  }

  // After a non-finite reduction: the step is dropped (its gradient stays in M, which is the
  // residual now); a residual that itself overflowed is cleared.
  void abandon_overflow(codec_context const& ctx) {
    pending_ = false;
    has_result_ = false;
    phase_ = powersgd_phase::idle;
    if (!detail::psgd::all_finite(m_.data(), m_.size(), ctx)) m_.clear();
  }

  void init_q(std::uint64_t seed) {
    q_.resize(std::size_t{rank_} * cols_);
    detail::psgd::fill_gaussian(
        q_.data(), q_.size(), random_stream{seed, 0xffffffffu, static_cast<std::uint32_t>(id_)}, 0);
  }

  // M ← g (+ M − P Qᵀ when a reconstruction is pending) and P ← M Q. With the built-in GEMM,
  // one task per block of rows does all three while the block is in cache.
  template <element T>
  void update_and_project(tensor_view<T const> g, bool fresh, codec_context const& ctx) {
    constexpr std::size_t block_rows = cpu::powersgd_block_rows;
    std::size_t const r = rank_;
    float* m = m_.data();
    float* p = p_.data();
    float const* q = q_.data();
    bool const correct = pending_ && !fresh;
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    auto add_rows = [&](std::size_t r0, std::size_t r1) {
      float* mb = m + r0 * cols_;
      T const* gb = g.data() + r0 * cols_;
      std::size_t const len = (r1 - r0) * cols_;
      if constexpr (std::same_as<T, float>) {
        if (fresh) {
          std::memcpy(mb, gb, len * sizeof(float));
        } else {
          cpu::kernels::combine(mb, gb, 1.0f, mb, len, level);
        }
      } else {
        for (std::size_t i = 0; i < len; ++i)
          mb[i] = fresh ? to_float(gb[i]) : mb[i] + to_float(gb[i]);
      }
    };
    bool const builtin = backend_ == cpu::gemm_backend::builtin ||
                         (backend_ == cpu::gemm_backend::automatic && !cpu::gemm_has_blas);
    std::size_t const blocks = (rows_ + block_rows - 1) / block_rows;
    auto run_blocks = [&](auto&& body) {
      auto task = [&](std::size_t t) {
        std::size_t const r0 = t * block_rows;
        body(r0, std::min(rows_, r0 + block_rows));
      };
      if (blocks > 1 && size() >= ctx.parallel_threshold) {
        ctx.threads().run(blocks, task);
      } else {
        for (std::size_t t = 0; t < blocks; ++t) task(t);
      }
    };
    if (builtin) {
      run_blocks([&](std::size_t r0, std::size_t r1) {
        add_rows(r0, r1);
        float* mb = m + r0 * cols_;
        if (correct) {  // M_b -= P_bᵀ Q: P_b(i, c) = p[c * rows + r0 + i]
          cpu::kernels::gemm_axpy_block(level, r1 - r0, cols_, r, -1.0f, p + r0, 1, rows_, q, cols_,
                                        1.0f, mb, cols_);
        }
        cpu::kernels::gemm_dot_block(level, r, r1 - r0, cols_, 1.0f, q, cols_, mb, cols_, 0.0f,
                                     p + r0, rows_);
      });
      return;
    }
    run_blocks([&](std::size_t r0, std::size_t r1) { add_rows(r0, r1); });
    if (correct) {
      cpu::gemm(cpu::transpose::yes, cpu::transpose::no, rows_, cols_, r, -1.0f, p, rows_, q, cols_,
                1.0f, m, cols_, ctx, backend_);
    }
    cpu::gemm(cpu::transpose::no, cpu::transpose::yes, r, rows_, cols_, 1.0f, q, cols_, m, cols_,
              0.0f, p, rows_, ctx, backend_);
  }

  template <element T>
  void write_result(std::span<T> out, float alpha, bool add, codec_context const& ctx) const {
    if (!has_result_ || phase_ != powersgd_phase::idle) {
      throw config_error("gradcomp: powersgd reconstruct() needs a finished step");
    }
    if (out.size() != size()) {
      throw config_error("gradcomp: powersgd reconstruct(): output has " +
                         std::to_string(out.size()) + " elements, the matrix " +
                         std::to_string(size()));
    }
    if (mode_ == powersgd_mode::dense) {
      for (std::size_t i = 0; i < size(); ++i) {
        out[i] =
            add ? from_float<T>(std::fma(alpha, m_[i], to_float(out[i]))) : from_float<T>(m_[i]);
      }
      return;
    }
    low_rank_product(p_.data(), q_.data(), rows_, cols_, rank_, out, alpha, add, ctx, backend_);
  }

 public:
  /// out = P Qᵀ, or out += alpha P Qᵀ (factors column by column), for any element type.
  template <element T>
  static void low_rank_product(float const* p, float const* q, std::size_t rows, std::size_t cols,
                               std::size_t r, std::span<T> out, float alpha, bool add,
                               codec_context const& ctx, cpu::gemm_backend backend) {
    if constexpr (std::same_as<T, float>) {
      cpu::gemm(cpu::transpose::yes, cpu::transpose::no, rows, cols, r, add ? alpha : 1.0f, p, rows,
                q, cols, add ? 1.0f : 0.0f, out.data(), cols, ctx, backend);
    } else {
      std::vector<float> tmp(rows * cols);
      cpu::gemm(cpu::transpose::yes, cpu::transpose::no, rows, cols, r, 1.0f, p, rows, q, cols,
                0.0f, tmp.data(), cols, ctx, backend);
      for (std::size_t i = 0; i < tmp.size(); ++i) {
        out[i] =
            add ? from_float<T>(std::fma(alpha, tmp[i], to_float(out[i]))) : from_float<T>(tmp[i]);
      }
    }
  }

 private:
  std::size_t rows_;
  std::size_t cols_;
  std::uint32_t rank_;
  powersgd_mode mode_ = powersgd_mode::low_rank;
  cpu::gemm_backend backend_;
  bool feedback_;
  bool check_;
  tensor_id id_;
  powersgd_phase phase_ = powersgd_phase::idle;
  std::vector<float> m_;       // low rank: M (or the residual, when idle); dense: the buffer
  std::vector<float> p_;       // r × rows
  std::vector<float> q_;       // r × cols: warm start, then the step's Q
  std::vector<float> q_prev_;  // Q before phase 2, restored by abort()
  bool pending_ = false;       // m_ still holds the last M; its M̂ = P Qᵀ is not yet subtracted
  bool has_result_ = false;
};

/// PowerSGD over many tensors: one `powersgd_state` per tensor id, the single-process
/// `compress` (both phases locally, one packet), the stateless packet decoder, and save/load
/// of every tensor's warm-start Q and residual. Not a `codec` (see file comment).
class powersgd {
 public:
  static constexpr codec_id id = codec_id::powersgd;
  static constexpr aggregation_kind aggregation = aggregation_kind::low_rank;
  static constexpr bool unbiased = false;

  /// Throws `config_error` for rank 0.
  explicit powersgd(powersgd_options opt = {}) : opt_(opt) {
    if (opt.rank == 0) throw config_error("gradcomp: powersgd rank must be at least 1, got 0");
    detail::psgd::check_backend(opt.backend);
  }

  [[nodiscard]] powersgd_options const& options() const noexcept { return opt_; }

  /// The state of tensor `tid`, created for a rows × cols matrix on first use. Throws
  /// `config_error` if it exists with another shape.
  powersgd_state& state(tensor_id tid, std::size_t rows, std::size_t cols) {
    auto it = states_.find(tid);
    if (it == states_.end()) {
      it = states_.emplace(tid, powersgd_state(rows, cols, opt_, tid)).first;
    } else if (it->second.rows() != rows || it->second.cols() != cols) {
      throw config_error("gradcomp: powersgd tensor " + std::to_string(static_cast<unsigned>(tid)) +
                         " was a " +
                         detail::psgd::shape_text(it->second.rows(), it->second.cols()) +
                         " matrix, now " + detail::psgd::shape_text(rows, cols));
    }
    return it->second;
  }
  /// The state of tensor `tid`, or null.
  [[nodiscard]] powersgd_state* find(tensor_id tid) noexcept {
    auto it = states_.find(tid);
    return it == states_.end() ? nullptr : &it->second;
  }
  /// Number of tensors with state.
  [[nodiscard]] std::size_t tensors() const noexcept { return states_.size(); }
  /// Forgets all state.
  void reset() noexcept { states_.clear(); }

  /// Exact packet size for a rows × cols matrix; `config_error` for more than
  /// `max_packet_elements` elements (the size would overflow).
  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t rows, std::size_t cols) const {
    if (cols != 0 && rows > max_packet_elements / cols) {
      throw config_error("gradcomp: powersgd: cannot size a packet of " + std::to_string(rows) +
                         " x " + std::to_string(cols) +
                         " elements (at most 2^56; the size would overflow)");
    }
    bool const dense =
        powersgd_mode_for(rows, cols, opt_.rank, opt_.min_elements) == powersgd_mode::dense;
    return header_bytes + 4 * (dense ? rows * cols : std::size_t{opt_.rank} * (rows + cols));
  }

  /// Single-process step of tensor `g` (shape rows × cols, row-major): error feedback, both
  /// power-iteration phases with no other rank, and the packet written to `out`; returns its
  /// size. Throws `config_error` (shape, buffer), `numeric_error` (non-finite input; state
  /// unchanged).
  template <element T>
  std::size_t compress(tensor_view<T const> g, std::size_t rows, std::size_t cols,
                       std::span<std::byte> out, codec_context const& ctx = {}) {
    if (cols != 0 && rows > SIZE_MAX / cols) {
      throw config_error("gradcomp: powersgd shape " + detail::psgd::shape_text(rows, cols) +
                         " overflows");
    }
    if (rows * cols != g.size()) {
      throw config_error("gradcomp: powersgd shape " + detail::psgd::shape_text(rows, cols) +
                         " has " + std::to_string(rows * cols) + " elements, the tensor " +
                         std::to_string(g.size()));
    }
    if (out.size() < max_compressed_bytes(rows, cols)) {
      throw config_error("gradcomp: output buffer of " + std::to_string(out.size()) +
                         " bytes is smaller than the " +
                         std::to_string(max_compressed_bytes(rows, cols)) +
                         "-byte powersgd packet");
    }
    powersgd_state& s = state(g.id(), rows, cols);
    s.begin(g, ctx);
    try {
      s.after_p_reduced(ctx);
      s.finish(1.0f, ctx);
    } catch (...) {
      s.abort();
      throw;
    }
    return s.write_packet(out, dtype_of<T>);
  }

  /// Convenience overload for a span (tensor id 0).
  template <element T>
  std::size_t compress(std::span<T const> g, std::size_t rows, std::size_t cols,
                       std::span<std::byte> out, codec_context const& ctx = {}) {
    return compress(tensor_view<T const>(g), rows, cols, out, ctx);
  }

  /// Header of `packet` after full validation as a powersgd packet (`format_error` otherwise).
  static packet_header inspect(std::span<std::byte const> packet) {
    packet_header const h = read_header(packet);
    detail::psgd::validate(h);
    std::byte const* v = packet.data() + header_bytes;
    for (std::uint64_t i = 0; i < h.payload_bytes / 4; ++i) {
      if (!std::isfinite(detail::load_f32(v + 4 * i))) detail::psgd::throw_nonfinite_value(i);
    }
    return h;
  }

  /// Decodes `packet` into `out` (which must have the packet's element count): out = P Qᵀ.
  template <element T>
  static void decompress(std::span<std::byte const> packet, std::span<T> out,
                         codec_context const& ctx = {}) {
    decode(packet, out, 1.0f, false, ctx);
  }
  /// Adds `alpha` times the decoded packet to `out`.
  template <element T>
  static void decompress_add(std::span<std::byte const> packet, std::span<T> out,
                             float alpha = 1.0f, codec_context const& ctx = {}) {
    decode(packet, out, alpha, true, ctx);
  }

  /// Serializes every tensor's warm-start Q and residual (docs/wire-format.md, "PowerSGD
  /// state"; version 2, ending in a CRC32C of every byte before it). Throws `config_error` if a
  /// tensor is in the middle of a step.
  [[nodiscard]] std::vector<std::byte> save(codec_context const& ctx = {}) const {
    std::vector<std::byte> out(16);
    std::memcpy(out.data(), "GCPS", 4);
    out[4] = std::byte{2};
    detail::store_le<std::uint32_t>(out.data() + 8, static_cast<std::uint32_t>(states_.size()));
    for (auto const& [tid, s] : states_) {
      if (s.phase() != powersgd_phase::idle) {
        throw config_error("gradcomp: powersgd save(): tensor " +
                           std::to_string(static_cast<unsigned>(tid)) +
                           " is in the middle of a step");
      }
      std::vector<float> const e =
          s.mode() == powersgd_mode::low_rank ? s.residual(ctx) : std::vector<float>{};
      bool const has_q = s.mode() == powersgd_mode::low_rank && !s.q().empty();
      std::size_t const at = out.size();
      out.resize(at + 32);
      std::byte* h = out.data() + at;
      detail::store_le<std::uint32_t>(h, static_cast<std::uint32_t>(tid));
      h[4] = static_cast<std::byte>(s.mode());
      h[5] = static_cast<std::byte>((has_q ? 1u : 0u) | (e.empty() ? 0u : 2u));
      detail::store_le<std::uint32_t>(h + 8, s.rank());
      detail::store_le<std::uint64_t>(h + 16, s.rows());
      detail::store_le<std::uint64_t>(h + 24, s.cols());
      auto put = [&](std::span<float const> v) {
        std::size_t const w = out.size();
        out.resize(w + 4 * v.size());
        for (std::size_t i = 0; i < v.size(); ++i) detail::store_f32(out.data() + w + 4 * i, v[i]);
      };
      if (has_q) put(s.q());
      put(e);
    }
    std::uint32_t const crc = detail::crc32c_table(out);  // version 2: the CRC32C trailer
    std::size_t const end = out.size();
    out.resize(end + 4);
    detail::store_le<std::uint32_t>(out.data() + end, crc);
    return out;
  }

  /// Restores state written by `save` (replacing all current state). Throws `format_error` on a
  /// malformed or corrupted buffer (the checksum is checked first; a version 1 state, which has
  /// none, is refused) or one saved with another rank or dense threshold; the current state is
  /// kept then.
  void load(std::span<std::byte const> in) {
    auto fail = [](std::string const& what) {
      throw format_error("gradcomp: powersgd state: " + what);
    };
    if (in.size() < 16 || std::memcmp(in.data(), "GCPS", 4) != 0) fail("missing \"GCPS\" magic");
    if (static_cast<unsigned>(in[4]) == 1) {
      fail("version 1 carries no checksum (saved by a gradcomp from before state checksums, or "
           "corrupted); it is refused");
    }
    if (static_cast<unsigned>(in[4]) != 2) {
      fail("unsupported version " + std::to_string(static_cast<unsigned>(in[4])));
    }
    if (in.size() < 20) fail("truncated (no room for the checksum)");
    if (detail::crc32c_table(in.first(in.size() - 4)) != detail::load_le<std::uint32_t>(in.data() + in.size() - 4)) {
      fail("checksum (CRC32C) mismatch: the state is corrupted");
    }
    in = in.first(in.size() - 4);
    if (in[5] != std::byte{0} || in[6] != std::byte{0} || in[7] != std::byte{0} ||
        detail::load_le<std::uint32_t>(in.data() + 12) != 0) {
      fail("reserved header bytes are not zero");
    }
    std::uint32_t const count = detail::load_le<std::uint32_t>(in.data() + 8);
    std::map<tensor_id, powersgd_state> restored;
    std::size_t at = 16;
    auto take = [&](std::uint64_t n, std::uint32_t t) {
      if (n > (in.size() - at) / 4) fail("tensor record " + std::to_string(t) + " is truncated");
      std::vector<float> v(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = detail::load_f32(in.data() + at + 4 * i);
      at += 4 * v.size();
      return v;
    };
    for (std::uint32_t t = 0; t < count; ++t) {
      if (in.size() - at < 32) fail("truncated tensor record " + std::to_string(t));
      std::byte const* h = in.data() + at;
      auto const tid = static_cast<tensor_id>(detail::load_le<std::uint32_t>(h));
      auto const mode = static_cast<std::uint8_t>(h[4]);
      auto const flags = static_cast<std::uint8_t>(h[5]);
      std::uint32_t const rank = detail::load_le<std::uint32_t>(h + 8);
      std::uint64_t const rows = detail::load_le<std::uint64_t>(h + 16);
      std::uint64_t const cols = detail::load_le<std::uint64_t>(h + 24);
      at += 32;
      if (h[6] != std::byte{0} || h[7] != std::byte{0} ||
          detail::load_le<std::uint32_t>(h + 12) != 0 || (flags & ~3u) != 0 || mode > 1) {
        fail("tensor record " + std::to_string(t) + " has unknown mode, flags or reserved bits");
      }
      if (rank != opt_.rank) {
        fail("tensor record " + std::to_string(t) + " was saved with rank " + std::to_string(rank) +
             ", this powersgd has rank " + std::to_string(opt_.rank));
      }
      if (cols != 0 && rows > (in.size() / 4) / cols) {
        fail("tensor record " + std::to_string(t) + " claims a matrix larger than the buffer");
      }
      if (powersgd_mode_for(rows, cols, rank, opt_.min_elements) !=
          static_cast<powersgd_mode>(mode)) {
        fail("tensor record " + std::to_string(t) + " (" +
             detail::psgd::shape_text(static_cast<std::size_t>(rows),
                                      static_cast<std::size_t>(cols)) +
             ") has a mode this powersgd's options would not choose");
      }
      if (mode == 1 && flags != 0)
        fail("dense tensor record " + std::to_string(t) + " carries data");
      if (restored.count(tid) != 0) {
        fail("tensor id " + std::to_string(static_cast<unsigned>(tid)) + " appears twice");
      }
      std::vector<float> const q =
          (flags & 1u) != 0 ? take(std::uint64_t{rank} * cols, t) : std::vector<float>{};
      std::vector<float> const e = (flags & 2u) != 0 ? take(rows * cols, t) : std::vector<float>{};
      powersgd_state s(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), opt_, tid);
      s.restore(q, e);
      restored.emplace(tid, std::move(s));
    }
    if (at != in.size()) fail(std::to_string(in.size() - at) + " trailing bytes");
    states_ = std::move(restored);
  }

 private:
  template <element T>
  static void decode(std::span<std::byte const> packet, std::span<T> out, float alpha, bool add,
                     codec_context const& ctx) {
    packet_header const h = inspect(packet);
    if (h.count != out.size()) {
      throw config_error("gradcomp: powersgd packet holds " + std::to_string(h.count) +
                         " elements, the output span has " + std::to_string(out.size()));
    }
    std::byte const* v = packet.data() + header_bytes;
    std::vector<float> vals(static_cast<std::size_t>(h.payload_bytes / 4));
    if (!vals.empty()) {  // memcpy with a null pointer is undefined even for 0 bytes
      std::memcpy(vals.data(), v, vals.size() * 4);  // little-endian host (codec_base asserts it)
    }
    if (h.variant == detail::psgd::variant_dense) {
      for (std::size_t i = 0; i < out.size(); ++i) {
        out[i] = add ? from_float<T>(std::fma(alpha, vals[i], to_float(out[i])))
                     : from_float<T>(vals[i]);
      }
      return;
    }
    std::size_t const cols = h.param0, r = h.param1,
                      rows = static_cast<std::size_t>(h.count / cols);
    powersgd_state::low_rank_product(vals.data(), vals.data() + r * rows, rows, cols, r, out, alpha,
                                     add, ctx, cpu::gemm_backend::automatic);
  }

  powersgd_options opt_;
  std::map<tensor_id, powersgd_state> states_;
};

/// Builds a `powersgd` from a spec `powersgd[:key=value[,key=value...]]` with keys `rank`
/// (default 4), `min_elements` (default 4096) and `backend=automatic|builtin|blas`. Unknown
/// keys or bad values raise `config_error` (grammar and messages: `spec_options`,
/// core/spec.hpp). (`make_codec` cannot hold PowerSGD: it is stateful.)
inline powersgd make_powersgd(std::string_view spec) {
  spec_options o(spec, "powersgd");
  if (o.name() != "powersgd") {
    throw config_error("gradcomp: make_powersgd needs a spec starting with 'powersgd', got '" +
                       std::string(spec) + "'");
  }
  powersgd_options opt;
  std::uint64_t const r = o.count("rank", opt.rank, UINT32_MAX);
  if (r == 0) throw config_error("gradcomp: powersgd rank must be in 1..2^32-1, got 0");
  opt.rank = static_cast<std::uint32_t>(r);
  opt.min_elements = o.count("min_elements", opt.min_elements);
  constexpr cpu::gemm_backend backends[] = {cpu::gemm_backend::automatic,
                                            cpu::gemm_backend::builtin, cpu::gemm_backend::blas};
  if (o.has("backend")) {
    opt.backend = backends[o.choice("backend", {"automatic", "builtin", "blas"})];
  }
  o.finish({"rank", "min_elements", "backend"});
  return powersgd(opt);
}

GRADCOMP_NAMESPACE_END
