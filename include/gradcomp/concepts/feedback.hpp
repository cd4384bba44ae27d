// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `feedback_policy` concept: an error-feedback rule composed with any codec. A policy opts
/// in with `using feedback_concept = gradcomp::feedback_tag;`, names its per-tensor `state`, and
/// provides `compress(codec, state, gradient, out, ctx)` returning the packet size.

#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `feedback_policy` concept.
struct feedback_tag {};

/// Identifies a policy in serialized state.
enum class feedback_id : std::uint8_t { none = 0, residual = 1, ef21 = 2, dgc = 3 };

/// An error-feedback policy usable with codec `C`.
///
/// Required of `F`: `F::feedback_concept` derived from `feedback_tag`; `F::id`
/// (`feedback_id`); a default-constructible `F::state` with `std::span<float const>
/// values() const` (what is saved) and `void assign(std::span<float const>)` (what is
/// restored); and `f.compress(c, state, tensor_view<T const>, std::span<std::byte>,
/// codec_context const&)` for each element type, returning the packet size and leaving the state
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
    };

GRADCOMP_NAMESPACE_END
