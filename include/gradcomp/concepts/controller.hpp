// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `controller` concept: a rule that chooses the compression factor of each training step
/// from per-step statistics. A type opts in with
/// `using controller_concept = gradcomp::controller_tag;` and must then provide the operations
/// below; the concept checks both. The protocol types are in `gradcomp/concepts/step_protocol.hpp`.

#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>

#include <concepts>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `controller` concept.
struct controller_tag {};

/// A compression controller.
///
/// Required of `C` (with `c` a `C&`, `cc` a `C const&`, `s` a `step_stats const&`):
/// - `C::controller_concept` derived from `controller_tag`;
/// - `cc.plan()`: the `step_plan` of the coming step (convertible to `step_plan const&`);
///   it changes only in `decide`;
/// - `c.decide(s)`: takes the statistics of step `plan().step`, returns the `decision` for
///   that step and advances to the next step.
///
/// Agreement (all ranks apply the same decision): `plan()` and `decide()` are deterministic
/// functions of the sequence of `step_stats` passed in, with no clock, randomness or global
/// state. A pipeline that makes the statistics identical on every rank (`agree`) before each
/// `decide` therefore keeps every rank's controller in the same state and gets the same
/// decisions everywhere, with no other communication.
template <class C>
concept controller = std::derived_from<typename C::controller_concept, controller_tag> &&
    requires(C& c, C const& cc, step_stats const& s) {
  { cc.plan() } -> std::convertible_to<step_plan const&>;
  { c.decide(s) } -> std::same_as<decision>;
};

GRADCOMP_NAMESPACE_END
