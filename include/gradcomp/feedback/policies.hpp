// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Error-feedback policies: `no_feedback`, `residual_feedback` (EF-SGD: Seide et al. 2014,
/// Karimireddy et al. 2019) and `ef21_feedback` (Richtárik et al. 2021).
///
/// Guarantees: a policy rejects a non-finite gradient with `numeric_error` before changing its
/// state (a NaN would otherwise stay in the residual forever), and any exception from the codec
/// also leaves the state as it was. Residual feedback conserves gradient mass:
/// sum of decoded packets + residual = sum of gradients, step after step, whatever the codec's
/// settings at each step.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cpu/kernels/feedback.hpp>
#include <gradcomp/cpu/parallel.hpp>

#include <atomic>
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
  void assign(std::span<float const> v) { data.assign(v.begin(), v.end()); }

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
  if (!ok.load()) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(to_float(x[i]))) {
        throw numeric_error(std::string("gradcomp: ") + who + " got the non-finite gradient value " +
                            std::to_string(to_float(x[i])) + " at element " + std::to_string(i) +
                            " of tensor " + std::to_string(static_cast<unsigned>(g.id())) +
                            "; the state was left unchanged");
      }
    }
    throw numeric_error(std::string("gradcomp: ") + who + " state overflowed float32 on tensor " +
                        std::to_string(static_cast<unsigned>(g.id())));
  }
}

}  // namespace detail

/// No error feedback: the gradient is compressed as it is.
struct no_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::none;

  /// Stateless.
  struct state {
    [[nodiscard]] std::span<float const> values() const noexcept { return {}; }
    void assign(std::span<float const> v) {
      if (!v.empty()) throw format_error("gradcomp: no_feedback has no state to restore");
    }
  };

  template <codec_operations C, element T>
  std::size_t compress(C const& c, state&, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    return c.compress(g, out, ctx);
  }
};

/// EF-SGD residual feedback: p = g + e; send C(p); e ← p − D(C(p)).
struct residual_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::residual;
  /// The residual e (zero until the first step).
  using state = detail::float_state;

  template <codec_operations C, element T>
  std::size_t compress(C const& c, state& s, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    s.prepare(g.size(), "residual_feedback");
    detail::combine_checked(s, g, 1.0f, "residual_feedback", ctx);
    std::size_t const bytes = c.compress(tensor_view<float const>(s.scratch, g.id()), out, ctx);
    c.decompress_add(std::span<std::byte const>(out.first(bytes)), std::span<float>(s.scratch), -1.0f, ctx);
    s.data.swap(s.scratch);
    return bytes;
  }
};

/// EF21: the sender keeps an estimate h of its gradient; it sends C(g − h) and sets
/// h ← h + D(C(g − h)). A receiver that adds the decoded packets to its own copy of h (or of
/// the sum of all senders' h) tracks the gradient. h = sum of all decoded packets sent.
struct ef21_feedback {
  using feedback_concept = feedback_tag;
  static constexpr feedback_id id = feedback_id::ef21;
  /// The estimate h (zero until the first step).
  using state = detail::float_state;

  template <codec_operations C, element T>
  std::size_t compress(C const& c, state& s, tensor_view<T const> g, std::span<std::byte> out,
                       codec_context const& ctx) const {
    s.prepare(g.size(), "ef21_feedback");
    // scratch = g - h  (computed as -(h - g))
    detail::combine_checked(s, g, -1.0f, "ef21_feedback", ctx);
    for (float& v : s.scratch) v = -v;
    std::size_t const bytes = c.compress(tensor_view<float const>(s.scratch, g.id()), out, ctx);
    if (s.data.empty()) s.data.assign(g.size(), 0.0f);
    c.decompress_add(std::span<std::byte const>(out.first(bytes)), std::span<float>(s.data), 1.0f, ctx);
    return bytes;
  }
};

GRADCOMP_NAMESPACE_END
