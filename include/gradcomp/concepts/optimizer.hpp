// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `local_optimizer` concept: an optimizer that updates one flat parameter span in place
/// from a gradient span of the same length, with a learning rate that can change between steps.
/// A type opts in with `using optimizer_concept = gradcomp::optimizer_tag;`. The decentralized
/// and gossip wrappers in `optim/` compose with any such type.

#include <gradcomp/config.hpp>

#include <concepts>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `local_optimizer` concept.
struct optimizer_tag {};

/// An in-place first-order optimizer on flat float spans.
///
/// Required of `O` (with `o` an `O&`, `co` an `O const&`): `O::optimizer_concept` derived from
/// `optimizer_tag`; `o.step(std::span<float> x, std::span<float const> g)` applying one update
/// to `x` (it throws `config_error` if the lengths differ or disagree with its state);
/// `o.set_lr(double)` and `co.lr()` for learning-rate schedules.
template <class O>
concept local_optimizer = std::derived_from<typename O::optimizer_concept, optimizer_tag> &&
    requires(O& o, O const& co, std::span<float> x, std::span<float const> g, double lr) {
  o.step(x, g);
  o.set_lr(lr);
  { co.lr() } -> std::convertible_to<double>;
};

GRADCOMP_NAMESPACE_END
