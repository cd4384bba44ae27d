// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Compression controllers for the training example: who picks the compression factor of each
/// step.
///
/// The pipeline (gradcomp's `gradient_pipeline`, behind exchange.hpp) speaks gradcomp's
/// controller protocol: before a step it asks `ctrl.plan()` which factors to compress at
/// (`step_plan::measure`, multi-level), after compressing it reports `step_stats` (‖g_ef‖², ‖C(g_ef)‖² per measured factor, per-layer
/// norms, the last step's compute / compress / sync times), made identical on every rank, and
/// `ctrl.decide(stats)` answers what to send and how to update the residual (`decision`).
///
/// The controllers are the library's (`gradcomp/adapt/`): every `gradcomp::make_controller` spec
/// works (dense, static, schedule, dgc_warmup, gravac, accordion, ef_window).

#include <gradcomp/adapt/any_controller.hpp>

#include <string_view>

namespace train {

using gradcomp::agree;
using gradcomp::decision;
using gradcomp::residual_rule;
using gradcomp::send_kind;
using gradcomp::step_plan;
using gradcomp::step_stats;
using gradcomp::step_timing;
/// A controller chosen at run time.
using controller = gradcomp::any_controller;

/// Builds a controller from a spec (see `gradcomp::make_controller`).
inline controller make_controller(std::string_view spec) { return gradcomp::make_controller(spec); }

}  // namespace train
