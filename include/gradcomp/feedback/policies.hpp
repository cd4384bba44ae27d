// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Error-feedback policies: `no_feedback`, `residual_feedback` (EF-SGD: Seide et al. 2014,
/// Karimireddy et al. 2019) and `ef21_feedback` (Richtárik et al. 2021).
///
/// Guarantees: a policy rejects a non-finite gradient with `numeric_error` before changing its
/// state (a NaN would otherwise stay in the residual forever), and any exception from the codec
/// also leaves the state as it was. After any committed step the state is finite: the codecs
/// saturate a finite value beyond a 16-bit wire type's range at its largest finite value
/// (core/quant/half.hpp), so the excess stays in the residual, and a commit whose next state
/// would still not be finite (a packet that decodes to ±inf or NaN) is refused with
/// `numeric_error`, the state unchanged. Residual feedback conserves gradient mass:
/// sum of decoded packets + residual = sum of gradients, step after step, whatever the codec's
/// settings at each step.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cpu/kernels/feedback.hpp>
#include <gradcomp/cpu/kernels/finite.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

namespace detail {

/// One float buffer plus scratch space of the same size.
struct float_state {
  std::vector<float> data;     ///< the policy's state (residual or estimate); empty = all zero
  std::vector<float> scratch;  ///< working buffer, not part of the state

  [[nodiscard]] std::span<float const> values() const noexcept { return data; }
  bool staged = false;         ///< `scratch` holds a staged input awaiting its commit
  bool prepared = false;       ///< `scratch` holds the next state, awaiting `apply`
  void assign(std::span<float const> v) { data.assign(v.begin(), v.end()); }

  // Ends a stage; a commit without a stage is a usage error.
  void take_stage(char const* who) {
    if (!staged) {
      throw config_error(std::string("gradcomp: ") + who +
                         ": commit without a staged input (call stage first, once per commit)");
    }
    staged = false;
    prepared = false;
  }
  // Marks `scratch` as the prepared next state after checking that it is finite (else
  // `numeric_error`, nothing prepared, `data` unchanged).
  void prepare_checked(char const* who, codec_context const& ctx) {
    if (!cpu::kernels::all_finite(scratch.data(), scratch.size(), cpu::effective_isa(ctx.isa))) {
      throw numeric_error(std::string("gradcomp: ") + who +
                          ": the committed packet leaves a non-finite state (it decodes to an "
                          "infinity or NaN); the state was left unchanged");
    }
    prepared = true;
  }
  // Makes the prepared next state current.
  void apply(char const* who) {
    if (!prepared) throw config_error(std::string("gradcomp: ") + who + ": apply without a prepared commit");
    prepared = false;
    data.swap(scratch);
  }

  // Checks the size against an existing state and sizes the scratch buffer. Never changes
  // `data`: a fresh state stays empty (meaning zero) until a step has succeeded.
  void prepare(std::size_t n, char const* who) {
    if (!data.empty() && data.size() != n) {
      throw config_error(std::string("gradcomp: ") + who + " state holds " +
                         std::to_string(data.size()) + " elements but the gradient has " +
                         std::to_string(n) + " (one state per tensor id)");
    }
    scratch.resize(n);
  }
};

// The error of a combine that found a non-finite value: the gradient's first non-finite
// element, else an overflow of the state.
template <element T>
[[noreturn]] void throw_combine_error(tensor_view<T const> g, char const* who) {
  T const* x = g.data();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(to_float(x[i]))) throw_nonfinite_gradient(who, to_float(x[i]), i, g.id());
  }
  throw_state_overflow(who, g.id());
}

// scratch = data + sign * g (data empty = zero), checking finiteness; throws numeric_error
// before any change to data. Vectorized and split over the context's threads.
template <element T>
void combine_checked(float_state& s, tensor_view<T const> g, float sign, char const* who,
                     codec_context const& ctx) {
  std::size_t const n = g.size();
  float* out = s.scratch.data();
  T const* x = g.data();
  float const* d = s.data.empty() ? nullptr : s.data.data();
  std::atomic<bool> ok{true};
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t b, std::size_t e) {
    bool good;
    if constexpr (std::same_as<T, float>) {
      good = cpu::kernels::combine(d != nullptr ? d + b : nullptr, x + b, sign, out + b, e - b, level);
    } else {
      for (std::size_t i = b; i < e; ++i) out[i] = to_float(x[i]);  // exact widening
      good = cpu::kernels::combine(d != nullptr ? d + b : nullptr, out + b, sign, out + b, e - b, level);
    }
    if (!good) ok.store(false, std::memory_order_relaxed);
  });
  if (!ok.load()) throw_combine_error(g, who);
}

/// One step of a float state fused with compression (`fused_feedback_codec`): the packet of
/// p = state + sign * g (negated for EF21, `negate`) and the next state, which is
/// p − D(packet) (`alpha` −1, `refill_state` false) or state + D(packet) (`alpha` 1,
/// `refill_state` true), block by block in cache. Byte-identical to the stage / compress /
/// commit passes it replaces; the state changes only once the step has succeeded.
template <class C>
std::size_t fused_step(C const& c, float_state& s, tensor_view<float const> g, std::span<std::byte> out,
                       float sign, bool negate, float alpha, bool refill_state, char const* who,
                       codec_context const& ctx) {
  std::size_t const n = g.size();
  s.prepare(n, who);
  float* x = s.scratch.data();
  float const* gd = g.data();
  float const* d = s.data.empty() ? nullptr : s.data.data();
  std::atomic<bool> ok{true};
  cpu::isa const level = cpu::effective_isa(ctx.isa);
  auto fill = [&](std::size_t b, std::size_t e) {
    bool const good = cpu::kernels::combine(d != nullptr ? d + b : nullptr, gd + b, sign, x + b, e - b, level);
    if (!good) {
      ok.store(false, std::memory_order_relaxed);
      return false;
    }
    if (negate) {
      for (std::size_t i = b; i < e; ++i) x[i] = -x[i];
    }
    return true;
  };
  auto refill = [&](std::size_t b, std::size_t e) {
    if (!refill_state) return true;
    if (d != nullptr) {
      std::copy(d + b, d + e, x + b);
    } else {
      std::fill(x + b, x + e, 0.0f);
    }
    return true;
  };
  std::size_t const bytes = c.compress_fused(x, n, g.id(), out, block_fill(fill), block_fill(refill), alpha, ctx);
  if (!ok.load()) throw_combine_error(g, who);
  s.staged = false;
  s.prepared = false;
  s.prepare_checked(who, ctx);
  s.prepared = false;
  s.data.swap(s.scratch);
  return bytes;
}

/// The one-phase step of a two-phase policy: stage, compress the staged input, commit the
/// packet. Returns the packet size.
template <class F, class C, element T>
std::size_t stage_compress_commit(F const& f, C const& c, typename F::state& s, tensor_view<T const> g,
                                  std::span<std::byte> out, codec_context const& ctx) {
  std::span<float const> const p = f.stage(s, g, ctx);
  std::size_t const bytes = c.compress(tensor_view<float const>(p, g.id()), out, ctx);
  f.commit(c, s, std::span<std::byte const>(out.first(bytes)), ctx);
  return bytes;
}

}  // namespace detail

/// No error feedback: the gradient is compressed as it is.
struct no_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::none;

  /// Stateless (a conversion buffer for 16-bit gradients, not part of the state).
  struct state {
    [[nodiscard]] std::span<float const> values() const noexcept { return {}; }
    void assign(std::span<float const> v) {
      if (!v.empty()) throw format_error("gradcomp: no_feedback has no state to restore");
    }
    std::vector<float> scratch;
  };

  /// The input to compress is g itself (float32 gradients are not copied).
  template <element T>
  std::span<float const> stage(state& s, tensor_view<T const> g, codec_context const&) const {
    if constexpr (std::same_as<T, float>) {
      return g.span();
    } else {
      s.scratch.resize(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) s.scratch[i] = to_float(g[i]);
      return s.scratch;
    }
  }
  template <codec_operations C>
  void commit(C const&, state&, std::span<std::byte const>, codec_context const&) const {}
  template <codec_operations C>
  void prepare_commit(C const&, state&, std::span<std::byte const>, codec_context const&) const {}
  void apply_commit(state&) const noexcept {}
  void commit_lossless(state&) const noexcept {}

  template <codec_operations C, element T>
  std::size_t compress(C const& c, state&, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    return c.compress(g, out, ctx);
  }
};

/// EF-SGD residual feedback: p = g + e; send C(p); e ← p − D(C(p)).
///
/// Two phases: `stage` computes p = g + e (returned; e unchanged), the caller compresses p
/// (once or at several factors) and `commit` takes the packet actually sent: e ← p − D(sent).
/// `commit_lossless` records that p itself was delivered exactly (e ← 0).
struct residual_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::residual;
  /// The residual e (zero until the first step).
  using state = detail::float_state;

  template <element T>
  std::span<float const> stage(state& s, tensor_view<T const> g, codec_context const& ctx) const {
    s.prepare(g.size(), "residual_feedback");
    detail::combine_checked(s, g, 1.0f, "residual_feedback", ctx);
    s.staged = true;
    return s.scratch;
  }
  template <codec_operations C>
  void commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    prepare_commit(c, s, sent, ctx);
    apply_commit(s);
  }
  /// `commit` in two steps: the next residual is computed aside (the committed one still
  /// stands, e.g. while the packet is on the wire), then `apply_commit` makes it current.
  template <codec_operations C>
  void prepare_commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    s.take_stage("residual_feedback");
    c.decompress_add(sent, std::span<float>(s.scratch), -1.0f, ctx);
    s.prepare_checked("residual_feedback", ctx);
  }
  void apply_commit(state& s) const { s.apply("residual_feedback"); }
  void commit_lossless(state& s) const {
    s.take_stage("residual_feedback");
    s.data.clear();
  }

  /// One step: fused with compression where the codec can (`fused_feedback_codec`, float32
  /// gradients), else stage, compress and commit.
  template <codec_operations C, element T>
  std::size_t compress(C const& c, state& s, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    if constexpr (std::same_as<T, float> && fused_feedback_codec<C>) {
      if (c.fusable()) return detail::fused_step(c, s, g, out, 1.0f, false, -1.0f, false, "residual_feedback", ctx);
    }
    return detail::stage_compress_commit(*this, c, s, g, out, ctx);
  }
};

/// EF21: the sender keeps an estimate h of its gradient; it sends C(g − h) and sets
/// h ← h + D(C(g − h)). h = sum of all decoded packets sent.
///
/// The packets are increments. A receiver tracks the gradient by adding the decoded increments
/// to its own copy of h: `receive` keeps that copy (one `receiver_state` per tensor, the sum or
/// average of all senders' h as the collective reduces them) and turns the collective's output
/// into the gradient estimate. `compressor` and the collectives call it, so a collective with
/// EF21 returns the estimate, not the increment.
struct ef21_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::ef21;
  /// The estimate h (zero until the first step).
  using state = detail::float_state;
  /// The receiver's estimate H (zero until the first output).
  using receiver_state = detail::float_state;

  template <element T>
  std::span<float const> stage(state& s, tensor_view<T const> g, codec_context const& ctx) const {
    s.prepare(g.size(), "ef21_feedback");
    // scratch = g - h  (computed as -(h - g))
    detail::combine_checked(s, g, -1.0f, "ef21_feedback", ctx);
    for (float& v : s.scratch) v = -v;
    s.staged = true;
    return s.scratch;
  }
  template <codec_operations C>
  void commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    prepare_commit(c, s, sent, ctx);
    apply_commit(s);
  }
  /// `commit` in two steps (as `residual_feedback::prepare_commit`): h + D(sent) is computed
  /// in the scratch buffer (g − h is no longer needed), then made current.
  template <codec_operations C>
  void prepare_commit(C const& c, state& s, std::span<std::byte const> sent, codec_context const& ctx) const {
    s.take_stage("ef21_feedback");
    if (s.data.empty()) {
      std::fill(s.scratch.begin(), s.scratch.end(), 0.0f);
    } else {
      std::copy(s.data.begin(), s.data.end(), s.scratch.begin());
    }
    c.decompress_add(sent, std::span<float>(s.scratch), 1.0f, ctx);
    s.prepare_checked("ef21_feedback", ctx);
  }
  void apply_commit(state& s) const { s.apply("ef21_feedback"); }
  void commit_lossless(state& s) const {
    s.take_stage("ef21_feedback");
    if (s.data.empty()) {
      s.data.swap(s.scratch);
    } else {
      for (std::size_t i = 0; i < s.data.size(); ++i) s.data[i] += s.scratch[i];
    }
  }

  /// Receiver side: H ← H + `io`, then `io` ← H (the collective's summed or averaged
  /// increments become the estimate). `config_error` if the size changed.
  void receive(receiver_state& r, std::span<float> io) const {
    if (r.data.empty()) {
      r.data.assign(io.size(), 0.0f);
    } else if (r.data.size() != io.size()) {
      throw config_error("gradcomp: ef21_feedback receiver state holds " + std::to_string(r.data.size()) +
                         " elements but the output has " + std::to_string(io.size()) +
                         " (one receiver state per tensor id)");
    }
    for (std::size_t i = 0; i < io.size(); ++i) {
      r.data[i] += io[i];
      io[i] = r.data[i];
    }
  }

  /// One step: fused with compression where the codec can (as `residual_feedback::compress`).
  template <codec_operations C, element T>
  std::size_t compress(C const& c, state& s, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    if constexpr (std::same_as<T, float> && fused_feedback_codec<C>) {
      if (c.fusable()) return detail::fused_step(c, s, g, out, -1.0f, true, 1.0f, true, "ef21_feedback", ctx);
    }
    return detail::stage_compress_commit(*this, c, s, g, out, ctx);
  }
};

namespace detail {
template <class C>
struct residual_feedback_of {
  using type = residual_feedback;
};
template <class C>
  requires requires { typename C::residual_feedback_type; }
struct residual_feedback_of<C> {
  using type = typename C::residual_feedback_type;
};
}  // namespace detail

/// The residual error feedback of codec `C`: `residual_feedback`, unless the codec names its
/// own as `C::residual_feedback_type` (a device codec, whose residuals live in device memory:
/// `cuda::stream_codec` names `cuda::device_residual_feedback`). The default feedback of
/// `two_way_compressor`.
template <class C>
using residual_feedback_for = typename detail::residual_feedback_of<C>::type;

GRADCOMP_NAMESPACE_END
