// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `dgc_feedback`: Deep Gradient Compression (Lin et al., ICLR 2018) as an error-feedback policy,
/// meant for `topk_codec` (any codec works). Per tensor it keeps the momentum u and the
/// accumulated, not yet sent, update v. One step with gradient g, momentum m, on N workers:
///
/// 1. local gradient clipping: g ← g · min(1, c / ‖g‖₂) with c = clip_norm / √N (the paper
///    scales the global threshold by N^-1/2 so that the sum of N clipped gradients stays
///    within it); off when clip_norm is 0;
/// 2. momentum correction: u ← m·u + g, v ← v + u;
/// 3. send C(v) (top-k of v with `topk_codec`);
/// 4. v ← v − D(C(v)); momentum factor masking: u ← 0 on the packet's support, the
///    coordinates it selected (`sparse_packet_support`; also where a selected value decodes to
///    zero). A codec that is not sparse (topk, approx_topk, threshold, random_k) sends every
///    coordinate, so u ← 0 everywhere.
///
/// With f32 values, v is exactly 0 on the support after step 4, as in the paper; with f16/bf16
/// values it keeps the rounding error of the sent values, so nothing is lost: the sum of all
/// decoded packets plus v equals the sum of the momentum-corrected updates u (conservation).
/// With m = 0 and no clipping, the policy is residual feedback: same packets, v = the residual.
/// The sparsity warm-up is `dgc_warmup` (adapt/schedule.hpp): replace the codec between steps
/// with `dgc_topk(schedule, step)`.
///
/// State: u and v, saved by `values()` as one buffer [u | v] of 2n floats (so `compressor`'s
/// saved record for the tensor holds 2n values). A non-finite gradient (or an update that
/// overflows float32) is a `numeric_error`, and every exception leaves the state unchanged.
/// Element-wise work runs on the context's pool with fixed chunks: the result does not depend
/// on the thread count.

#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/quant/dither.hpp>
#include <gradcomp/core/quant/feedback.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cpu/kernels/dither.hpp>
#include <gradcomp/cpu/kernels/finite.hpp>
#include <gradcomp/cpu/parallel.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// DGC error feedback (see file comment).
class dgc_feedback {
 public:
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::dgc;

  /// Per-tensor state: u and v (all zero until the first step succeeds).
  class state {
   public:
    /// [u | v], 2n floats (empty before the first step).
    [[nodiscard]] std::span<float const> values() const noexcept { return data_; }

    /// Restores [u | v] as `values()` gave it; an odd length is a `format_error`.
    void assign(std::span<float const> v) {
      if (v.size() % 2 != 0) {
        throw format_error(
            "gradcomp: dgc_feedback state must hold [momentum | accumulation], an even "
            "number of floats, got " +
            std::to_string(v.size()));
      }
      data_.assign(v.begin(), v.end());
    }

    /// The momentum u (empty before the first step).
    [[nodiscard]] std::span<float const> momentum() const noexcept {
      return std::span<float const>(data_).first(data_.size() / 2);
    }
    /// The accumulated unsent update v (empty before the first step).
    [[nodiscard]] std::span<float const> accumulation() const noexcept {
      return std::span<float const>(data_).last(data_.size() / 2);
    }

   private:
    friend class dgc_feedback;
    std::vector<float> data_;     // [u | v]
    std::vector<float> next_;     // [u | v] of the step in progress
    std::vector<float> decoded_;  // D(C(v)) of the step in progress
    bool staged_ = false;         // next_ holds a staged step awaiting its commit
    bool prepared_ = false;       // next_ holds the committed next state, awaiting apply
  };

  /// Momentum 0.9, no clipping, one worker.
  dgc_feedback() noexcept = default;

  /// DGC with momentum `momentum` (0 <= m < 1), gradient clipping to `clip_norm` / √`workers`
  /// in L2 norm (clip_norm 0: none; else positive and finite), `workers` >= 1.
  explicit dgc_feedback(float momentum, double clip_norm = 0.0, std::uint32_t workers = 1)
      : momentum_(momentum), clip_norm_(clip_norm), workers_(workers) {
    quant::check_dgc_parameters(momentum, clip_norm, workers);
  }

  [[nodiscard]] float momentum() const noexcept { return momentum_; }
  [[nodiscard]] double clip_norm() const noexcept { return clip_norm_; }
  [[nodiscard]] std::uint32_t workers() const noexcept { return workers_; }
  /// The L2 bound each worker clips its gradient to: clip_norm / √workers (0: no clipping).
  [[nodiscard]] double local_clip_norm() const noexcept {
    return clip_norm_ / std::sqrt(static_cast<double>(workers_));
  }

  /// Stage of a DGC step: clipping and momentum correction into the step in progress;
  /// returns v + u, the input to compress. The state is unchanged until `commit`.
  template <element T>
  std::span<float const> stage(state& s, tensor_view<T const> g, codec_context const& ctx) const {
    std::size_t const n = g.size();
    if (!s.data_.empty() && s.data_.size() != 2 * n) {
      throw config_error("gradcomp: dgc_feedback state holds " +
                         std::to_string(s.data_.size() / 2) + " elements but the gradient has " +
                         std::to_string(n) + " (one state per tensor id)");
    }
    s.staged_ = false;
    s.next_.resize(2 * n);
    float const scale = clip_scale(g, ctx);
    momentum_step(s, g, scale, ctx);
    s.staged_ = true;
    return std::span<float const>(s.next_).last(n);
  }

  /// Commits the packet `sent` (compressed from the staged v): v ← v − D(sent), and momentum
  /// factor masking u ← 0 on the packet's selected support.
  template <codec_operations C>
  void commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    prepare_commit(c, s, sent, ctx);
    apply_commit(s);
  }
  /// `commit` in two steps: the next [u | v] is computed aside, then made current.
  template <codec_operations C>
  void prepare_commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    take_stage(s);
    std::size_t const n = s.next_.size() / 2;
    s.decoded_.resize(n);
    c.decompress(sent, std::span<float>(s.decoded_), ctx);
    std::optional<std::vector<std::uint32_t>> const support = sparse_packet_support(sent, ctx);
    // v ← v − D(C(v)); u ← 0 on the selected support. Nothing below throws.
    float* nu = s.next_.data();
    float* nv = s.next_.data() + n;
    float const* d = s.decoded_.data();
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        nv[i] = nv[i] - d[i];  // one rounding, as residual feedback's decompress_add(−1)
        if (!support) nu[i] = 0.0f;
      }
    });
    if (support) {
      for (std::uint32_t i : *support) nu[i] = 0.0f;  // indices validated below n
    }
    if (!cpu::kernels::all_finite(nv, n, cpu::effective_isa(ctx.isa))) {
      throw numeric_error(
          "gradcomp: dgc_feedback: the committed packet leaves a non-finite state "
          "(it decodes to an infinity or NaN); the state was left unchanged");
    }
    s.prepared_ = true;
  }
  void apply_commit(state& s) const {
    if (!s.prepared_) throw config_error("gradcomp: dgc_feedback: apply without a prepared commit");
    s.prepared_ = false;
    s.data_.swap(s.next_);
  }

  /// Commits a lossless delivery of the staged v: every coordinate was sent, so v ← 0 and
  /// (masking on the full support) u ← 0.
  void commit_lossless(state& s) const {
    take_stage(s);
    std::fill(s.next_.begin(), s.next_.end(), 0.0f);
    s.data_.swap(s.next_);
  }

  /// One DGC step on gradient `g` (see file comment): stage, compress, commit; returns the
  /// packet size.
  template <codec_operations C, element T>
  std::size_t compress(C const& c, state& s, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    return detail::stage_compress_commit(*this, c, s, g, out, ctx);
  }

 private:
  // min(1, c / ‖g‖) as a float (1 when clipping is off or ‖g‖ <= c); checks g for non-finite
  // values when it reads g anyway. Σ g² is summed in the canonical order (core/quant/dither.hpp:
  // blocks of `norm_block` by `block_sumsq`, added in block order), as `canonical_sumsq` and the
  // device's `device_memory::sum_of_squares` do: the blocks on the context's pool, their sums in
  // order, so the result depends neither on the thread count nor on the backend.
  template <element T>
  float clip_scale(tensor_view<T const> g, codec_context const& ctx) const {
    if (clip_norm_ == 0.0) return 1.0f;
    constexpr std::size_t block = quant::norm_block;
    std::size_t const n = g.size();
    T const* x = g.data();
    std::vector<double> part((n + block - 1) / block);
    cpu::isa const level = cpu::effective_isa(ctx.isa);
    cpu::for_each_chunk(n, block, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      [[maybe_unused]] std::vector<float> wide;
      for (std::size_t s = b; s < e; s += block) {
        std::size_t const len = e - s < block ? e - s : block;
        if constexpr (std::same_as<T, float>) {
          part[s / block] = cpu::kernels::block_sumsq(x + s, len, level);
        } else {
          wide.resize(len);
          for (std::size_t i = 0; i < len; ++i) wide[i] = to_float(x[s + i]);  // exact
          part[s / block] = cpu::kernels::block_sumsq(wide.data(), len, level);
        }
      }
    });
    double sq = 0.0;
    for (double p : part) sq += p;  // block order
    if (!std::isfinite(sq)) throw_nonfinite(g);
    return quant::dgc_clip_scale(sq, local_clip_norm());
  }

  // next = [m·u + scale·g | v + (m·u + scale·g)], checking that both stay finite.
  template <element T>
  void momentum_step(state& s, tensor_view<T const> g, float scale,
                     codec_context const& ctx) const {
    std::size_t const n = g.size();
    T const* x = g.data();
    bool const fresh = s.data_.empty();
    float const* u0 = fresh ? nullptr : s.data_.data();
    float const* v0 = fresh ? nullptr : s.data_.data() + n;
    float* nu = s.next_.data();
    float* nv = s.next_.data() + n;
    float const m = momentum_;
    std::atomic<bool> ok{true};
    cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
      bool bad = false;
      for (std::size_t i = b; i < e; ++i) {
        quant::dgc_element const uv = quant::dgc_momentum(to_float(x[i]), scale, m, fresh, fresh ? 0.0f : u0[i],
                                                          fresh ? 0.0f : v0[i]);
        nu[i] = uv.u;
        nv[i] = uv.v;
        bad |= !quant::dgc_finite(uv);
      }
      if (bad) ok.store(false, std::memory_order_relaxed);
    });
    if (!ok.load()) throw_nonfinite(g);
  }

  // Names the first non-finite gradient value, or reports an overflow of the state.
  template <element T>
  [[noreturn]] static void throw_nonfinite(tensor_view<T const> g) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!std::isfinite(to_float(g[i]))) {
        throw numeric_error("gradcomp: dgc_feedback got the non-finite gradient value " +
                            std::to_string(to_float(g[i])) + " at element " + std::to_string(i) +
                            " of tensor " + std::to_string(static_cast<unsigned>(g.id())) +
                            "; the state was left unchanged");
      }
    }
    throw numeric_error(
        "gradcomp: dgc_feedback momentum or accumulation overflowed float32 on tensor " +
        std::to_string(static_cast<unsigned>(g.id())) + "; the state was left unchanged");
  }

  static void take_stage(state& s) {
    if (!s.staged_) {
      throw config_error("gradcomp: dgc_feedback: commit without a staged input (call stage first, once per commit)");
    }
    s.staged_ = false;
    s.prepared_ = false;
  }

  float momentum_ = 0.9f;
  double clip_norm_ = 0.0;
  std::uint32_t workers_ = 1;
};

GRADCOMP_NAMESPACE_END
