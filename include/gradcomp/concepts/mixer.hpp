// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The `parameter_mixer` concept: the communication a decentralized optimizer needs, split in
/// two so that it can overlap computation. `start_mixing(x, step)` launches the exchange of the
/// local parameters for schedule step `step`; `wait_mixing(x)` completes it and overwrites `x`
/// with sum_j w_ij x_j (row i of W^(step)). Between the two calls the caller leaves `x`
/// untouched, so a mixer may send straight from it. A type opts in with
/// `using mixer_concept = gradcomp::mixer_tag;`.

#include <gradcomp/config.hpp>

#include <concepts>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Opt-in tag for the `parameter_mixer` concept.
struct mixer_tag {};

/// Non-blocking gossip of a flat parameter span.
///
/// Required of `M` (with `m` an `M&`): `M::mixer_concept` derived from `mixer_tag`;
/// `m.start_mixing(std::span<float const> x, std::uint64_t step)`; `m.wait_mixing(std::span<float>
/// x)`, where `x` is the span given to the matching `start_mixing`. At most one mixing is
/// outstanding at a time.
template <class M>
concept parameter_mixer = std::derived_from<typename M::mixer_concept, mixer_tag> &&
    requires(M& m, std::span<float const> cx, std::span<float> x, std::uint64_t step) {
  m.start_mixing(cx, step);
  m.wait_mixing(x);
};

GRADCOMP_NAMESPACE_END
