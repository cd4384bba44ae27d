// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `feedback_policy` concept: an error-feedback rule composed with any codec. A policy opts
/// in with `using feedback_concept = gradcomp::feedback_tag;`, names its per-tensor `state`, and
/// provides the two phases of a step — `stage(state, gradient, ctx)` returns the float32 input
/// to compress (g + residual, g − h, ...) without changing the state, `commit(codec, state,
/// sent_packet, ctx)` updates the state for exactly the packet that was sent (which may come
/// from another factor than a first compression, or from a multi-level re-compression),
/// `commit_lossless(state)` records that the staged input itself was delivered exactly;
/// `prepare_commit` + `apply_commit` split `commit` so that the next state is computed while
/// the committed one still stands (a pipeline commits only after its exchange succeeded) — and
/// `compress(codec, state, gradient, out, ctx)`, the one-phase step, returning the packet size.
/// A policy whose packets are increments also has a receiver side (`receiver_state`,
/// `receive(receiver_state, output)`), see `ef21_feedback`. `one_phase_feedback` asks only for
/// the state and the one-phase step.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `feedback_policy` concept.
struct feedback_tag {};

namespace detail {

/// The `numeric_error` of error-feedback policy `who` given a gradient of tensor `tensor` whose
/// element `index` is the non-finite `value`. Shared by the CPU policies and the CUDA backend's
/// fused feedback, so both report it in the same words.
[[noreturn]] inline void throw_nonfinite_gradient(char const* who, float value, std::size_t index,
                                                  tensor_id tensor) {
  throw numeric_error(std::string("gradcomp: ") + who + " got the non-finite gradient value " +
                      std::to_string(value) + " at element " + std::to_string(index) +
                      " of tensor " + std::to_string(static_cast<unsigned>(tensor)) +
                      "; the state was left unchanged");
}

/// The `numeric_error` of error-feedback policy `who` whose state overflowed float32 on a
/// finite gradient of tensor `tensor`.
[[noreturn]] inline void throw_state_overflow(char const* who, tensor_id tensor) {
  throw numeric_error(std::string("gradcomp: ") + who + " state overflowed float32 on tensor " +
                      std::to_string(static_cast<unsigned>(tensor)));
}

}  // namespace detail

/// Identifies a policy in serialized state.
enum class feedback_id : std::uint8_t { none = 0, residual = 1, ef21 = 2, dgc = 3 };

/// An error-feedback policy usable with codec `C`.
///
/// Required of `F`: `F::feedback_concept` derived from `feedback_tag`; `F::id`
/// (`feedback_id`); a default-constructible `F::state` with `std::span<float const>
/// values() const` (what is saved) and `void assign(std::span<float const>)` (what is
/// restored); `f.stage(state, tensor_view<T const>, codec_context const&)` returning
/// `std::span<float const>` (valid until the next call on the state), `f.commit(c, state,
/// std::span<std::byte const>, codec_context const&)` and `f.commit_lossless(state)`; and
/// `f.compress(c, state, tensor_view<T const>, std::span<std::byte>, codec_context const&)` for
/// each element type, returning the packet size. Any of them leaves the committed state
/// unchanged if it throws.
template <class F, class C>
concept feedback_policy =
    codec_operations<C> && std::derived_from<typename F::feedback_concept, feedback_tag> &&
    std::default_initializable<typename F::state> &&
    requires(F const& f, C const& c, typename F::state& s, typename F::state const& cs,
             tensor_view<float const> g32, tensor_view<half const> g16,
             std::span<std::byte> out, std::span<float const> vals, codec_context const& ctx) {
      { F::id } -> std::convertible_to<feedback_id>;
      { cs.values() } -> std::convertible_to<std::span<float const>>;
      s.assign(vals);
      { f.compress(c, s, g32, out, ctx) } -> std::same_as<std::size_t>;
      { f.compress(c, s, g16, out, ctx) } -> std::same_as<std::size_t>;
      { f.stage(s, g32, ctx) } -> std::convertible_to<std::span<float const>>;
      { f.stage(s, g16, ctx) } -> std::convertible_to<std::span<float const>>;
      f.commit(c, s, std::span<std::byte const>(out), ctx);
      f.prepare_commit(c, s, std::span<std::byte const>(out), ctx);
      f.apply_commit(s);
      f.commit_lossless(s);
    };

/// A policy that runs whole steps with codec `C` (the one-phase `compress`), with or without
/// the two phases of `feedback_policy`: what two-way compression asks of its worker and server
/// feedback (collective/two_way.hpp). Required of `F`: `F::feedback_concept` derived from
/// `feedback_tag`; `F::id`; a default-constructible, copyable `F::state` with `values()` (in
/// the codec's memory space); and `f.compress(c, state, tensor_view<float const>,
/// std::span<std::byte>, codec_context const&)` returning the packet size and leaving the state
/// unchanged if it throws. Every `feedback_policy` whose state is copyable is one; so is a
/// device policy whose state lives in device memory (`cuda::device_residual_feedback`,
/// cuda/collective.cuh), which has no host stage to hand out.
template <class F, class C>
concept one_phase_feedback =
    codec_operations<C> && std::derived_from<typename F::feedback_concept, feedback_tag> &&
    std::default_initializable<typename F::state> && std::copy_constructible<typename F::state> &&
    requires(F const& f, C const& c, typename F::state& s, typename F::state const& cs,
             tensor_view<float const> g32, std::span<std::byte> out, codec_context const& ctx) {
      { F::id } -> std::convertible_to<feedback_id>;
      { cs.values() } -> std::convertible_to<std::span<float const>>;
      { f.compress(c, s, g32, out, ctx) } -> std::same_as<std::size_t>;
    };

/// A feedback policy whose packets are increments that receivers must accumulate
/// (`ef21_feedback`): `f.receive(receiver_state&, std::span<float>)` turns a collective's output
/// into the estimate.
template <class F>
concept receiving_feedback = requires(F const& f, typename F::receiver_state& r, std::span<float> io) {
  f.receive(r, io);
};

GRADCOMP_NAMESPACE_END
