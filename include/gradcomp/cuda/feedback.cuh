// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The rules of error feedback on the device: what `cuda::device_compressor<C, Rule>`
/// (cuda/collective.cuh) does at each phase of a step, with its state in device memory.
///
/// - `device_residual_rule` — `residual_feedback`: p = g + e, e ← p − D(C(p)), fused with the
///   codec's compression (`stream_codec::compress_with_feedback`);
/// - `device_ef21_rule` — `ef21_feedback`: p = g − h (as −(h − g)), h ← h + D(C(p)); its
///   receiver side keeps H per tensor: H ← H + io, io ← H;
/// - `device_dgc_rule` — `dgc_feedback`: clipping (Σ g² in the canonical order, one 8-byte read
///   per step), u ← m·u + g, v ← v + u, p = v; then v ← v − D(C(v)) and u ← 0 on the packet's
///   support (every coordinate for a codec that is not sparse).
///
/// Each rule's element math is core/quant/feedback.hpp's, called by the CPU policies too, in
/// the CPU's order of operations: packets, states and outputs are byte for byte those of
/// `compressor<C_cpu, F>` with the CPU codec of the same format. The element-wise work runs as
/// one fused pass per phase on the codec's stream; a non-finite input is reported by the pass
/// and thrown as the CPU policy's `numeric_error` after one wait, before any state changes.
///
/// Costs beyond the codec's: EF21 and DGC stage their input p in a device buffer per tensor
/// (the residual rule does not: its codec reads g + e in its own pass); DGC with clipping reads
/// Σ g² on the host once per tensor and step; DGC with a sparse codec decodes the packet a
/// second time to mark its support (n floats of scratch; nothing read on the host).

#include <gradcomp/cuda/config.cuh>

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/feedback.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cuda/detail/codec_base.cuh>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>
#include <gradcomp/cuda/memory.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// One tensor's error-feedback state in device memory and its step in progress (what
/// `device_compressor` keeps per tensor id; the rules read and write it).
struct device_feedback_slot {
  device_buffer state;    ///< the committed state, `floats` floats (none: all zero)
  device_buffer next;     ///< the next state, staged or prepared
  device_buffer input;    ///< the staged input p (EF21; residual's `stage_input`), or scratch
  device_buffer support;  ///< DGC: a sparse packet's support, marked NaN
  device_buffer status;   ///< the passes' status words
  std::size_t floats = 0;             ///< floats of `state` (0: empty, meaning zero)
  std::size_t next_floats = 0;        ///< floats of `next`, once made current
  std::size_t n = 0;                  ///< elements of the staged step
  std::span<float const> staged_in;   ///< the staged input p (device), while `staged`
  bool staged = false;                ///< a stage awaits its commit
  bool fused = false;                 ///< the stage already wrote the next state
  bool prepared = false;              ///< `next` holds the committed next state

  explicit device_feedback_slot(cudaStream_t s = nullptr) : state(s), next(s), input(s), support(s), status(s) {}

  /// The committed state (device; empty when zero).
  [[nodiscard]] std::span<float const> current() const noexcept {
    return {reinterpret_cast<float const*>(state.data()), floats};
  }
  /// `b` resized to `count` floats, as a span.
  static std::span<float> floats_of(device_buffer& b, std::size_t count) {
    b.resize(count * sizeof(float));
    return {reinterpret_cast<float*>(b.data()), count};
  }
  /// Fresh status words (both `no_index`), enqueued on the buffer's stream.
  status_words* fresh_status() {
    status.resize(sizeof(status_words));
    fill_bytes(status.data(), 0xff, sizeof(status_words), status.stream());
    return reinterpret_cast<status_words*>(status.data());
  }
};

/// Runs `fn(i)` for i in [0, n) on `stream`.
template <class Fn>
void for_each_index(cudaStream_t stream, std::size_t n, Fn const& fn) {
  if (n == 0) return;
  translate_thrust_errors([&] {
    thrust::for_each(policy(stream), thrust::counting_iterator<std::uint64_t>(0),
                     thrust::counting_iterator<std::uint64_t>(n), fn);
  });
}

/// p_i = e_i + g_i (residual) or g_i − e_i as −(e_i − g_i) (EF21, `ef21`), e null for zero; a
/// non-finite result is reported.
struct combine_fn {
  float const* e;
  float const* g;
  bool ef21;
  float* out;
  status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const noexcept {
    float const ei = e != nullptr ? e[i] : 0.0f;
    float const v = ef21 ? quant::ef21_increment(ei, g[i]) : quant::feedback_combine(ei, g[i], 1.0f);
    if (!finite(v)) report(&status->element, i);
    out[i] = v;
  }
};

/// DGC's stage: [nu | nv] from the gradient and [u0 | v0] (null: fresh), reported where it
/// leaves float32.
struct dgc_stage_fn {
  float const* g;
  float scale;
  float m;
  float const* u0;
  float const* v0;
  float* nu;
  float* nv;
  status_words* status;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const noexcept {
    bool const fresh = u0 == nullptr;
    quant::dgc_element const x = quant::dgc_momentum(g[i], scale, m, fresh, fresh ? 0.0f : u0[i], fresh ? 0.0f : v0[i]);
    nu[i] = x.u;
    nv[i] = x.v;
    if (!quant::dgc_finite(x)) report(&status->element, i);
  }
};

/// DGC's commit: v ← v − D(sent) (one rounding) and u ← 0 on the packet's support: where
/// `mark` is NaN (a sparse packet's coordinates, see `device_dgc_rule::prepare`), or everywhere
/// when `mark` is null (a codec that sends every coordinate).
struct dgc_commit_fn {
  float* nu;
  float* nv;
  float const* decoded;
  float const* mark;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const noexcept {
    nv[i] = nv[i] - decoded[i];
    if (mark == nullptr || mark[i] != mark[i]) nu[i] = 0.0f;
  }
};

/// h ← h + x (EF21's lossless commit), one rounding.
struct add_fn {
  float* h;
  float const* x;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const noexcept { h[i] = h[i] + x[i]; }
};

/// EF21's receiver: H ← H + io (H zero when `fresh`), io ← H.
struct receive_fn {
  float* h;
  float* io;
  bool fresh;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t i) const noexcept {
    float const s = (fresh ? 0.0f : h[i]) + io[i];
    h[i] = s;
    io[i] = s;
  }
};

/// Throws the policy `who`'s `numeric_error` when the pass that wrote `status` reported a
/// non-finite value (waits for `stream`): the gradient's first non-finite element, else an
/// overflow of the state.
inline void check_status(status_words const* status, float const* g, std::size_t n, cudaStream_t stream,
                         tensor_id id, char const* who) {
  if (read_status(status, stream).element == no_index) return;
  throw_combine_error(feedback_input<float>{g, nullptr, nullptr, nullptr}, n, stream, id, who);
}

/// Stages p = e + g (residual, `ef21` false) or g − h (EF21) into `s.input`.
inline std::span<float const> stage_combined(device_feedback_slot& s, tensor_view<float const> g, bool ef21,
                                             char const* who) {
  cudaStream_t const stream = s.input.stream();
  std::span<float> const p = device_feedback_slot::floats_of(s.input, g.size());
  status_words* const st = s.fresh_status();
  for_each_index(stream, g.size(),
                 combine_fn{s.floats == 0 ? nullptr : s.current().data(), g.data(), ef21, p.data(), st});
  check_status(st, g.data(), g.size(), stream, g.id(), who);
  return p;
}

}  // namespace detail

/// Residual error feedback (`residual_feedback`) as a rule of `device_compressor`: the state is
/// the residual e (n floats). `stage` is fused with compression (the codec writes the packet of
/// g + e and the next residual in its own passes); `stage_input` stages p = g + e for a dense
/// send, after which `prepare` computes p − D(sent) as `residual_feedback::prepare_commit`.
struct device_residual_rule {
  static constexpr feedback_id id = feedback_id::residual;
  /// The CPU policy's name, in errors.
  static constexpr char const* name = "residual_feedback";
  /// No receiver side.
  static constexpr bool receives = false;
  /// Floats of the state of an n-element tensor.
  static constexpr std::size_t state_floats(std::size_t n) noexcept { return n; }

  /// Fused stage: the packet of g + e into `out`, the next residual into `s.next`.
  template <class S>
  std::size_t stage(S const& c, detail::device_feedback_slot& s, tensor_view<float const> g,
                    std::span<std::byte> out, codec_context const& ctx) const {
    std::span<float> const next = detail::device_feedback_slot::floats_of(s.next, g.size());
    std::size_t const bytes = c.compress_with_feedback(g, s.current(), next, out, ctx);
    s.fused = true;
    s.next_floats = g.size();
    return bytes;
  }
  /// Stages p = g + e into `s.input` (a non-finite p: `residual_feedback`'s `numeric_error`).
  template <class S>
  std::span<float const> stage_input(S const&, detail::device_feedback_slot& s, tensor_view<float const> g,
                                     codec_context const&) const {
    return detail::stage_combined(s, g, false, name);
  }
  /// The next residual p − D(`sent`) (nothing to do after a fused stage, which wrote it).
  template <class S>
  void prepare(S const& c, detail::device_feedback_slot& s, std::span<std::byte const> sent,
               codec_context const& ctx) const {
    if (s.fused) return;
    std::span<float> const next = detail::device_feedback_slot::floats_of(s.next, s.n);
    detail::copy_on_device(next.data(), s.staged_in.data(), s.n * sizeof(float), s.next.stream());
    c.decompress_add(sent, next, -1.0f, ctx);
    s.next_floats = s.n;
  }
  /// p was delivered exactly: e ← 0.
  void lossless(detail::device_feedback_slot& s) const { s.floats = 0; }
};

/// EF21 (`ef21_feedback`) as a rule of `device_compressor`: the state is the sender's estimate
/// h (n floats). `stage_input` stages the increment p = g − h (computed as −(h − g)), the codec
/// compresses it, `prepare` computes h + D(sent); the receiver side keeps H per tensor.
struct device_ef21_rule {
  static constexpr feedback_id id = feedback_id::ef21;
  /// The CPU policy's name, in errors.
  static constexpr char const* name = "ef21_feedback";
  /// The collectives' outputs go through `receive`.
  static constexpr bool receives = true;
  /// Floats of the state of an n-element tensor.
  static constexpr std::size_t state_floats(std::size_t n) noexcept { return n; }

  /// Stages p = g − h into `s.input` (a non-finite p: `ef21_feedback`'s `numeric_error`).
  template <class S>
  std::span<float const> stage_input(S const&, detail::device_feedback_slot& s, tensor_view<float const> g,
                                     codec_context const&) const {
    return detail::stage_combined(s, g, true, name);
  }
  /// The next estimate h + D(`sent`) (h zero before the first step), as
  /// `ef21_feedback::prepare_commit`.
  template <class S>
  void prepare(S const& c, detail::device_feedback_slot& s, std::span<std::byte const> sent,
               codec_context const& ctx) const {
    std::span<float> const next = detail::device_feedback_slot::floats_of(s.next, s.n);
    if (s.floats == 0) {
      detail::fill_bytes(next.data(), 0, s.n * sizeof(float), s.next.stream());
    } else {
      detail::copy_on_device(next.data(), s.state.data(), s.n * sizeof(float), s.next.stream());
    }
    c.decompress_add(sent, next, 1.0f, ctx);
    s.next_floats = s.n;
  }
  /// p was delivered exactly: h ← h + p (h ← p when h is zero).
  void lossless(detail::device_feedback_slot& s) const {
    if (s.floats == 0) {
      std::swap(s.state, s.input);
    } else {
      detail::for_each_index(s.state.stream(), s.n,
                             detail::add_fn{reinterpret_cast<float*>(s.state.data()), s.staged_in.data()});
    }
    s.floats = s.n;
  }
  /// Receiver side: H ← H + `io`, `io` ← H (device memory; H zero before the first output).
  /// `h` holds H (`floats` floats); an output of another size is a `config_error`.
  void receive(device_buffer& h, std::size_t& floats, std::span<float> io) const {
    bool const fresh = floats == 0;
    if (!fresh && floats != io.size()) {
      throw config_error("gradcomp: ef21_feedback receiver state holds " + std::to_string(floats) +
                         " elements but the output has " + std::to_string(io.size()) +
                         " (one receiver state per tensor id)");
    }
    std::span<float> const hs = detail::device_feedback_slot::floats_of(h, io.size());
    detail::for_each_index(h.stream(), io.size(), detail::receive_fn{hs.data(), io.data(), fresh});
    floats = io.size();
  }
};

/// DGC (`dgc_feedback`) as a rule of `device_compressor`: the state is [u | v] (2n floats, the
/// layout of `dgc_feedback::state::values()`). Same parameters and checks as `dgc_feedback`.
class device_dgc_rule {
 public:
  static constexpr feedback_id id = feedback_id::dgc;
  /// The CPU policy's name, in errors.
  static constexpr char const* name = "dgc_feedback";
  /// No receiver side.
  static constexpr bool receives = false;
  /// Floats of the state of an n-element tensor: momentum and accumulation.
  static constexpr std::size_t state_floats(std::size_t n) noexcept { return 2 * n; }

  /// Momentum 0.9, no clipping, one worker (`dgc_feedback`'s defaults).
  device_dgc_rule() noexcept = default;
  /// Momentum `momentum` in [0, 1), clipping to `clip_norm` / √`workers` (0: none); the
  /// `config_error`s of `dgc_feedback`.
  explicit device_dgc_rule(float momentum, double clip_norm = 0.0, std::uint32_t workers = 1)
      : momentum_(momentum), clip_norm_(clip_norm), workers_(workers) {
    quant::check_dgc_parameters(momentum, clip_norm, workers);
  }
  /// The momentum m.
  [[nodiscard]] float momentum() const noexcept { return momentum_; }
  /// The global clipping norm (0: none).
  [[nodiscard]] double clip_norm() const noexcept { return clip_norm_; }
  /// The number of workers the norm is shared by.
  [[nodiscard]] std::uint32_t workers() const noexcept { return workers_; }
  /// The bound each worker clips its gradient to: clip_norm / √workers.
  [[nodiscard]] double local_clip_norm() const noexcept { return clip_norm_ / std::sqrt(static_cast<double>(workers_)); }

  /// Clipping and momentum correction into `s.next` = [u | v]; returns v, the input to
  /// compress. Σ g² is `device_memory::sum_of_squares` (the canonical order of the CPU's).
  template <class S>
  std::span<float const> stage_input(S const& c, detail::device_feedback_slot& s, tensor_view<float const> g,
                                     codec_context const&) const {
    std::size_t const n = g.size();
    cudaStream_t const stream = c.stream();
    float scale = 1.0f;
    if (clip_norm_ != 0.0) {
      double const sq = device_memory{stream}.sum_of_squares(g.span());
      if (!std::isfinite(sq)) {
        detail::throw_combine_error(detail::feedback_input<float>{g.data(), nullptr, nullptr, nullptr}, n, stream,
                                    g.id(), name);
      }
      scale = quant::dgc_clip_scale(sq, local_clip_norm());
    }
    std::span<float> const next = detail::device_feedback_slot::floats_of(s.next, 2 * n);
    bool const fresh = s.floats == 0;
    float const* const u0 = fresh ? nullptr : s.current().data();
    detail::status_words* const st = s.fresh_status();
    detail::for_each_index(stream, n,
                           detail::dgc_stage_fn{g.data(), scale, momentum_, u0, fresh ? nullptr : u0 + n,
                                                next.data(), next.data() + n, st});
    detail::check_status(st, g.data(), n, stream, g.id(), name);
    return next.last(n);
  }
  /// v ← v − D(`sent`) and u ← 0 on `sent`'s support (every coordinate for a codec that is
  /// not sparse), as `dgc_feedback::prepare_commit`. The support of a sparse packet (the
  /// coordinates of `sparse_packet_support`, whatever their values decode to) is found on the
  /// device: the packet decoded once more with a quiet-NaN scale into zeros, fma(NaN, x̂, 0),
  /// is NaN exactly at the coordinates it carries, a value that decodes to zero included.
  template <class S>
  void prepare(S const& c, detail::device_feedback_slot& s, std::span<std::byte const> sent,
               codec_context const& ctx) const {
    std::size_t const n = s.n;
    cudaStream_t const stream = c.stream();
    std::span<float> const decoded = detail::device_feedback_slot::floats_of(s.input, n);
    c.decompress(sent, decoded, ctx);
    constexpr codec_id cid = S::id;
    constexpr bool sparse = cid == codec_id::topk || cid == codec_id::approx_topk || cid == codec_id::threshold ||
                            cid == codec_id::random_k;  // `sparse_packet_support`'s codecs
    float const* mark = nullptr;
    if constexpr (sparse) {
      std::span<float> const m = detail::device_feedback_slot::floats_of(s.support, n);
      detail::fill_bytes(m.data(), 0, m.size_bytes(), stream);
      c.decompress_add(sent, m, std::numeric_limits<float>::quiet_NaN(), ctx);
      mark = m.data();
    }
    float* const nu = reinterpret_cast<float*>(s.next.data());
    detail::for_each_index(stream, n, detail::dgc_commit_fn{nu, nu + n, decoded.data(), mark});
    s.next_floats = 2 * n;
  }
  /// v was delivered exactly: u ← 0, v ← 0.
  void lossless(detail::device_feedback_slot& s) const {
    std::span<float> const next = detail::device_feedback_slot::floats_of(s.next, 2 * s.n);
    detail::fill_bytes(next.data(), 0, next.size_bytes(), s.next.stream());
    std::swap(s.state, s.next);
    s.floats = 2 * s.n;
  }

 private:
  float momentum_ = 0.9f;
  double clip_norm_ = 0.0;
  std::uint32_t workers_ = 1;
};

GRADCOMP_CUDA_NAMESPACE_END
