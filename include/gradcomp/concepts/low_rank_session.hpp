// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `low_rank_session` concept: a stateful low-rank compressor of one tensor (PowerSGD and
/// its kin) seen as a sequence of factors to sum over ranks. The collective layer
/// (`collective/low_rank.hpp`) drives it over any communicator:
///
/// ```
/// s.begin(g, n, ctx);                       // local: error feedback, M = g + e, P = M Q, ...
/// for i in [0, s.factor_count()):           // e.g. 2 for PowerSGD: P, then Q
///   f = s.factor(i, ctx);                   // local: the next factor, from the summed ones
///   all-reduce f (float32 sum, in place)
/// s.finish(out, alpha, ctx);                // local: out = alpha * decompressed sum, update e
/// ```
///
/// A session keeps its state (the warm-start Q, the residual) between steps, one session per
/// tensor. Every rank must call it with the same n and the same shape parameters; the
/// collective checks `shape_fingerprint(n)` on all ranks before any factor moves.

#include <gradcomp/concepts/context.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `low_rank_session` concept.
struct low_rank_session_tag {};

/// A low-rank compression session (see file comment).
///
/// Required of `S` (with `s` an `S&`, `cs` an `S const&`, `g` a `tensor_view<float const>`,
/// `out` a `std::span<float>`, `n` and `i` `std::size_t`, `ctx` a `codec_context const&`):
/// - `S::low_rank_session_concept` derived from `low_rank_session_tag`;
/// - `cs.shape_fingerprint(n)` (`std::uint64_t`): identifies everything that fixes the factor
///   shapes for an n-element tensor (matrix shape, rank), equal on ranks that agree;
/// - `s.begin(g, n, ctx)`: starts a step for an n-element tensor; `g` is empty on a rank that
///   contributes nothing this step (its factors are then zero); may throw on bad input, before
///   any communication;
/// - `cs.factor_count()` (`std::size_t`): the number of factors of a step;
/// - `s.factor(i, ctx)` (`std::span<float>`): factor i, computed from the summed factors
///   before it; the collective sums it in place over all ranks;
/// - `s.finish(out, alpha, ctx)`: writes `alpha` times the decompressed sum into `out`
///   (n elements) and ends the step.
template <class S>
concept low_rank_session =
    std::derived_from<typename S::low_rank_session_concept, low_rank_session_tag> &&
    requires(S& s, S const& cs, tensor_view<float const> g, std::span<float> out, std::size_t n,
             std::size_t i, float alpha, codec_context const& ctx) {
      { cs.shape_fingerprint(n) } -> std::same_as<std::uint64_t>;
      s.begin(g, n, ctx);
      { cs.factor_count() } -> std::same_as<std::size_t>;
      { s.factor(i, ctx) } -> std::same_as<std::span<float>>;
      s.finish(out, alpha, ctx);
    };

GRADCOMP_NAMESPACE_END
